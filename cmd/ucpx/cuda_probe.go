package main

import (
	"errors"
	"fmt"

	"github.com/ucpx/ucpx/cgo/cuda"
)

// probeCUDA loads the CUDA driver at run time (libcuda is never linked).
func probeCUDA() cudaStatus {
	if err := cuda.Load(); err != nil {
		reason := err.Error()
		if !errors.Is(err, cuda.ErrNoDriver) {
			reason = "driver failed: " + reason
		}
		return cudaStatus{Reason: reason}
	}
	st := cudaStatus{Driver: true}
	if v, err := cuda.DriverVersion(); err == nil {
		st.DriverVersion = fmt.Sprintf("%d.%d", v/1000, (v%1000)/10)
	}
	n, err := cuda.DeviceCount()
	if err != nil {
		st.Reason = "device count: " + err.Error()
	}
	st.Devices = n
	return st
}

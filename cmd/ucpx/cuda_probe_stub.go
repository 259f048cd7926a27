//go:build !ucpx_cuda

package main

// probeCUDA without the CUDA layer linked in.
//
// TODO(cuda): cgo/cuda cannot be linked into the same binary as cgo/ucx yet: both
// define the C symbol ucpx_init (cgo/cuda/shim.c and cgo/ucx/glue.c), so the link
// fails with "multiple definition of `ucpx_init'". Once cgo/cuda renames its symbol,
// delete this file and the build constraint of cuda_probe.go, which calls
// cuda.Load() (errors.Is(err, cuda.ErrNoDriver) -> "no (reason)"),
// cuda.DriverVersion() and cuda.DeviceCount().
func probeCUDA() cudaStatus {
	return cudaStatus{Reason: "CUDA layer not built"}
}

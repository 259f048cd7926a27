package stream

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// Selection says which backend Open returns.
type Selection int

const (
	// Auto picks CUDA when a driver and a device are present, the host backend otherwise.
	Auto Selection = iota
	// Host always picks the host backend.
	Host
	// CUDA picks the CUDA backend (device 0) and fails where it is unavailable.
	CUDA
)

func (s Selection) String() string {
	switch s {
	case Auto:
		return "auto"
	case Host:
		return "host"
	case CUDA:
		return "cuda"
	}
	return fmt.Sprintf("Selection(%d)", int(s))
}

// EnvBackend is the environment variable SelectionFromEnv reads: host, cuda or auto.
const EnvBackend = "UCPX_BACKEND"

// ParseSelection parses "host", "cuda" or "auto" (any case; "" means auto).
func ParseSelection(s string) (Selection, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "auto":
		return Auto, nil
	case "host":
		return Host, nil
	case "cuda":
		return CUDA, nil
	}
	return Auto, fmt.Errorf("stream: backend %q: want host, cuda or auto: %w", s, ErrInvalidArgument)
}

// SelectionFromEnv returns the selection named by UCPX_BACKEND (Auto when unset). An
// unknown value returns Auto and an error, so callers can choose to warn and go on.
func SelectionFromEnv() (Selection, error) {
	sel, err := ParseSelection(os.Getenv(EnvBackend))
	if err != nil {
		return Auto, fmt.Errorf("%s: %w", EnvBackend, err)
	}
	return sel, nil
}

// Open returns a backend. Auto tries CUDA device 0 and falls back to the host backend on
// any error (no libcuda, no device, a broken driver); Host never touches CUDA; CUDA
// returns the reason CUDA could not be opened; the error always wraps ErrNotSupported and
// keeps the CUDA layer's cause (cuda.ErrNoDriver where there is no driver).
func Open(sel Selection) (Backend, error) {
	switch sel {
	case Host:
		return NewHostBackend(), nil
	case CUDA:
		b, err := openCUDA(0)
		if err == nil {
			return b, nil
		}
		// Whatever kept CUDA from opening, to this caller the backend is unavailable:
		// make errors.Is(err, ErrNotSupported) hold while keeping the cause's own
		// sentinel (cuda.ErrNoDriver and the like) in the chain.
		if !errors.Is(err, ErrNotSupported) {
			err = fmt.Errorf("%w: %w", ErrNotSupported, err)
		}
		return nil, fmt.Errorf("stream: open cuda: %w", err)
	case Auto:
		if b, err := openCUDA(0); err == nil {
			return b, nil
		}
		return NewHostBackend(), nil
	}
	return nil, fmt.Errorf("stream: open %v: %w", sel, ErrInvalidArgument)
}

// OpenCUDADevice returns the CUDA backend of device ordinal (as CUDA numbers the
// devices this process sees: CUDA_VISIBLE_DEVICES applies), for a process that drives
// another GPU than the first (one rank per GPU). Errors are Open(CUDA)'s, and an
// ordinal the process does not see is ErrInvalidArgument.
func OpenCUDADevice(ordinal int) (Backend, error) {
	b, err := openCUDA(ordinal)
	if err == nil {
		return b, nil
	}
	if !errors.Is(err, ErrNotSupported) && !errors.Is(err, ErrInvalidArgument) {
		err = fmt.Errorf("%w: %w", ErrNotSupported, err)
	}
	return nil, fmt.Errorf("stream: open cuda device %d: %w", ordinal, err)
}

package stream

import "fmt"

// openCUDA is a temporary stand-in until cuda.go provides the CUDA backend. Delete
// this file when it does.
func openCUDA(device int) (Backend, error) {
	return nil, fmt.Errorf("stream: cuda backend: %w", ErrNotSupported)
}

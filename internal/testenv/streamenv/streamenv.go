// Package streamenv opens stream backends for tests, with the skip-or-fail rule of
// internal/testenv. It is apart from testenv because it imports the stream package,
// whose own internal tests use testenv.
package streamenv

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/testenv"
	"github.com/ucpx/ucpx/stream"
)

// CUDABackend opens the CUDA stream backend of device 0 for the test (closed at its
// end), skipping or failing as testenv.RequireGPU does; where a GPU is there, the
// backend must open.
func CUDABackend(t testing.TB) stream.Backend {
	t.Helper()
	testenv.RequireGPU(t)
	b, err := stream.Open(stream.CUDA)
	require.NoError(t, err, "cuda backend")
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// HostBackend opens a host stream backend for the test (closed at its end).
func HostBackend(t testing.TB) stream.Backend {
	t.Helper()
	b, err := stream.Open(stream.Host)
	require.NoError(t, err, "host backend")
	t.Cleanup(func() { _ = b.Close() })
	return b
}

package stream

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseSelection(t *testing.T) {
	for in, want := range map[string]Selection{
		"": Auto, "auto": Auto, "AUTO": Auto, " host ": Host, "Host": Host, "cuda": CUDA, "CUDA": CUDA,
	} {
		got, err := ParseSelection(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	_, err := ParseSelection("gpu")
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.Equal(t, "auto", Auto.String())
	require.Equal(t, "host", Host.String())
	require.Equal(t, "cuda", CUDA.String())
	require.Equal(t, "Selection(9)", Selection(9).String())
}

func TestSelectionFromEnv(t *testing.T) {
	t.Setenv(EnvBackend, "")
	sel, err := SelectionFromEnv()
	require.NoError(t, err)
	require.Equal(t, Auto, sel)

	t.Setenv(EnvBackend, "host")
	sel, err = SelectionFromEnv()
	require.NoError(t, err)
	require.Equal(t, Host, sel)

	t.Setenv(EnvBackend, "cuda")
	sel, err = SelectionFromEnv()
	require.NoError(t, err)
	require.Equal(t, CUDA, sel)

	t.Setenv(EnvBackend, "tpu")
	sel, err = SelectionFromEnv()
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.Contains(t, err.Error(), EnvBackend)
	require.Equal(t, Auto, sel)
}

func TestOpen(t *testing.T) {
	b, err := Open(Host)
	require.NoError(t, err)
	require.Equal(t, KindHost, b.Kind())
	require.NoError(t, b.Close())

	_, err = Open(Selection(42))
	require.ErrorIs(t, err, ErrInvalidArgument)

	// Auto never fails: CUDA where it opens, the host backend otherwise.
	auto, err := Open(Auto)
	require.NoError(t, err)
	defer auto.Close()

	cb, cerr := Open(CUDA)
	if cerr == nil {
		defer cb.Close()
		require.Equal(t, KindCUDA, cb.Kind())
		require.Equal(t, KindCUDA, auto.Kind(), "Auto prefers CUDA where it opens")
		return
	}
	require.ErrorIs(t, cerr, ErrNotSupported)
	require.Nil(t, cb)
	require.Equal(t, KindHost, auto.Kind(), "Auto falls back to the host backend")
}

// OpenCUDADevice: device 0 opens where Open(CUDA) does; an ordinal past the devices is
// ErrInvalidArgument there, and without CUDA every ordinal is ErrNotSupported.
func TestOpenCUDADevice(t *testing.T) {
	cb, cerr := Open(CUDA)
	b, err := OpenCUDADevice(0)
	if cerr != nil {
		require.ErrorIs(t, err, ErrNotSupported)
		require.Nil(t, b)
		_, err = OpenCUDADevice(7)
		require.ErrorIs(t, err, ErrNotSupported)
		return
	}
	defer cb.Close()
	require.NoError(t, err)
	defer b.Close()
	require.Equal(t, KindCUDA, b.Kind())
	_, err = OpenCUDADevice(1 << 20)
	require.ErrorIs(t, err, ErrInvalidArgument)
	_, err = OpenCUDADevice(-1)
	require.ErrorIs(t, err, ErrInvalidArgument)
}

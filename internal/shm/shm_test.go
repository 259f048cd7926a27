package shm

import (
	"os"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/errs"
)

func TestCreateOpen(t *testing.T) {
	s, err := Create(100)
	require.NoError(t, err)
	require.Len(t, s.Mem, os.Getpagesize())
	p, err := Open(os.Getpid(), s.FD, len(s.Mem))
	require.NoError(t, err)
	// Two mappings of the same pages.
	*(*uint64)(unsafe.Pointer(&p.Mem[8])) = 0x1234
	require.EqualValues(t, 0x1234, *(*uint64)(unsafe.Pointer(&s.Mem[8])))
	require.NotEqual(t, uintptr(unsafe.Pointer(&s.Mem[0])), uintptr(unsafe.Pointer(&p.Mem[0])))
	require.NoError(t, s.Close())
	// The peer's mapping outlives the owner's.
	*(*uint64)(unsafe.Pointer(&p.Mem[16])) = 7
	require.NoError(t, p.Close())
	require.ErrorIs(t, p.Close(), errs.Closed)
}

// What a peer names is opened only if it is a sealed segment of the size it claims.
func TestOpenRefuses(t *testing.T) {
	s, err := Create(4096)
	require.NoError(t, err)
	defer s.Close()
	_, err = Open(os.Getpid(), s.FD, 2*len(s.Mem))
	require.ErrorIs(t, err, errs.InvalidParam, "wrong size")
	_, err = Open(os.Getpid(), s.FD, 100)
	require.ErrorIs(t, err, errs.InvalidParam, "not whole pages")

	f, err := os.CreateTemp(t.TempDir(), "plain")
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Truncate(int64(len(s.Mem))))
	_, err = Open(os.Getpid(), int(f.Fd()), len(s.Mem))
	require.ErrorIs(t, err, errs.InvalidParam, "a plain file")

	_, err = Open(os.Getpid(), 1<<20, len(s.Mem))
	require.ErrorIs(t, err, errs.Unsupported, "no such fd")
	_, err = Open(0, s.FD, len(s.Mem))
	require.ErrorIs(t, err, errs.InvalidParam)
}

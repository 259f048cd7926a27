package cuda_test

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/internal/testenv"
)

// AllocationOf names the allocation containing an address, with a buffer id that a
// buffer freed and allocated again (even at the same address) does not share; only
// cuMemAlloc memory is legacy-IPC capable. The device UUID is stable and not zero.
func TestAllocationOf(t *testing.T) {
	ctx := newContext(t)
	const n = 1 << 20
	m, err := ctx.MemAlloc(n)
	require.NoError(t, err)
	a, err := ctx.AllocationOf(m.Ptr() + 4096)
	require.NoError(t, err)
	require.Equal(t, m.Ptr(), a.Base)
	require.GreaterOrEqual(t, a.Size, uint64(n))
	require.NotZero(t, a.BufferID)
	require.True(t, a.LegacyIPC, "cuMemAlloc memory is legacy-IPC capable")
	base, id := m.Ptr(), a.BufferID
	require.NoError(t, m.Close())
	// Allocate until the driver hands the same address out again (it usually does at
	// once): the buffer id must differ.
	var held []*cuda.DeviceMemory
	defer func() {
		for _, h := range held {
			h.Close()
		}
	}()
	for range 16 {
		m2, err := ctx.MemAlloc(n)
		require.NoError(t, err)
		held = append(held, m2)
		a2, err := ctx.AllocationOf(m2.Ptr())
		require.NoError(t, err)
		require.NotEqual(t, id, a2.BufferID, "buffer ids are never reused")
		if m2.Ptr() == base {
			t.Logf("reallocated at %#x: buffer id %d -> %d", base, id, a2.BufferID)
			break
		}
	}
	pinned := hostMem(t, ctx, 4096, 0)
	if pa, err := ctx.AllocationOf(pinned.Addr()); err == nil {
		require.False(t, pa.LegacyIPC, "pinned host memory is not exportable with cuIpcGetMemHandle")
	}
	goMem := make([]byte, 64)
	_, err = ctx.AllocationOf(uintptr(unsafe.Pointer(&goMem[0])))
	require.ErrorIs(t, err, cuda.ErrInvalidValue, "memory the driver does not know")
	dev := testenv.RequireGPU(t)
	u, err := dev.UUID()
	require.NoError(t, err)
	require.NotEqual(t, [16]byte{}, u)
	u2, err := dev.UUID()
	require.NoError(t, err)
	require.Equal(t, u, u2)
}

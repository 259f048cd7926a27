package protocol

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// importOnce maps a's allocation for peer and returns the reference to all of it.
func importOnce(t *testing.T, f *fakeIPC, im *IPCImporter, peer IPCPeer, a IPCAllocation) (IPCRef, uintptr) {
	t.Helper()
	h, err := f.IPCGetMemHandle(uintptr(a.Base))
	require.NoError(t, err)
	require.NoError(t, im.Handle(peer, IPCMessage{Kind: IPCExport, Alloc: a, Handle: h}))
	ref := IPCRef{Alloc: a}
	p, err := im.Resolve(peer, ref, int(a.Size))
	require.NoError(t, err)
	return ref, p
}

// A second export at a mapped base whose handle does not open leaves the mapping
// as it was: open, resolving, at the same address.
func TestIPCBoundFailedOpenAtMappedBase(t *testing.T) {
	f := newFakeIPC()
	im := NewIPCImporter(f)
	a := f.alloc(0x10000000, 1<<20, true)
	ref, p := importOnce(t, f, im, 1, a)
	bad := a
	bad.BufferID += 100
	var garbage IPCHandle
	garbage[0] = 0xee
	require.Error(t, im.Handle(1, IPCMessage{Kind: IPCExport, Alloc: bad, Handle: garbage}))
	require.Zero(t, f.closed, "the mapping was not closed")
	require.Len(t, f.opens, 1)
	got, err := im.Resolve(1, ref, 4096)
	require.NoError(t, err)
	require.Equal(t, p, got)
	require.Equal(t, 1, im.Mapped())
	require.NoError(t, im.Release(1, a))
	require.Equal(t, 1, f.closed)
	require.Empty(t, f.opens)
}

// A newer allocation at a mapped base while the old mapping is referenced: the old
// one stops resolving but stays open until its last reference is given back.
func TestIPCBoundReplacedWhileReferenced(t *testing.T) {
	f := newFakeIPC()
	im := NewIPCImporter(f)
	const base, size = 0x10000000, 1 << 20
	a1 := f.alloc(base, size, true)
	ref1, p1 := importOnce(t, f, im, 1, a1)
	f.free(base)
	a2 := f.alloc(base, size, true)
	ref2, p2 := importOnce(t, f, im, 1, a2)
	require.NotEqual(t, p1, p2)
	require.Zero(t, f.closed, "the old mapping is still referenced")
	require.Equal(t, 1, im.Mapped())
	require.Equal(t, 1, im.Retired())
	_, err := im.Resolve(1, ref1, 8)
	require.ErrorIs(t, err, ErrInvalidParam, "a retired mapping does not resolve")
	require.Equal(t, a1.BufferID, f.mappedBuffer(p1), "but is still mapped")

	require.NoError(t, im.Release(1, a1))
	require.Equal(t, 1, f.closed)
	require.Zero(t, im.Retired())
	got, err := im.Resolve(1, ref2, 8)
	require.NoError(t, err)
	require.Equal(t, p2, got)
	require.NoError(t, im.Release(1, a2))
	require.Equal(t, 2, f.closed)
	require.Empty(t, f.opens)
}

// An export claiming more than the allocation its handle names is refused with
// ErrInvalidParam, and the mapping it made is closed; one already there stays.
func TestIPCBoundClaimedSize(t *testing.T) {
	f := newFakeIPC()
	im := NewIPCImporter(f)
	a := f.alloc(0x10000000, 4096, true)
	h, err := f.IPCGetMemHandle(uintptr(a.Base))
	require.NoError(t, err)
	big := a
	big.Size = 1 << 30
	require.ErrorIs(t, im.Handle(1, IPCMessage{Kind: IPCExport, Alloc: big, Handle: h}), ErrInvalidParam)
	require.Equal(t, 1, f.opened)
	require.Equal(t, 1, f.closed)
	require.Empty(t, f.opens)
	require.Zero(t, im.Mapped())
	_, err = im.Resolve(1, IPCRef{Alloc: big, Offset: 8192}, 8)
	require.ErrorIs(t, err, ErrInvalidParam)

	ref, p := importOnce(t, f, im, 1, a)
	require.ErrorIs(t, im.Handle(1, IPCMessage{Kind: IPCExport, Alloc: big, Handle: h}), ErrInvalidParam)
	require.Equal(t, 2, f.closed, "only the refused open was closed")
	got, err := im.Resolve(1, ref, 4096)
	require.NoError(t, err)
	require.Equal(t, p, got)
	require.Equal(t, 1, im.Mapped())
}

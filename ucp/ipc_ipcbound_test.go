package ucp

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/testenv/fakeipc"
	"github.com/ucpx/ucpx/protocol"
)

// forgeIPCKey is a device region's key as a hostile but authenticated B could pack
// it: any allocation claim and handle, sealed with B's key.
func forgeIPCKey(p *pair, a protocol.IPCAllocation, h protocol.IPCHandle, base, length uint64) []byte {
	return forgeIPCKeyOf(p, newKeyID(), a, h, base, length)
}

// forgeIPCKeyOf is forgeIPCKey under the key id of a region B exports (a key of no
// open region is refused in this process).
func forgeIPCKeyOf(p *pair, keyID uint64, a protocol.IPCAllocation, h protocol.IPCHandle, base, length uint64) []byte {
	kb := p.ctxB.trust
	msg := protocol.IPCMessage{Kind: protocol.IPCExport, Alloc: a, Handle: h}
	return sealRkey(kb.seal, kb.id, keyID, base, length, ipcPayload(msg))
}

// putGetIPC checks that a put and a get through rk move the right bytes of alloc.
func putGetIPC(t *testing.T, p *pair, rk *Rkey, alloc *fakeipc.Alloc, seed int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	src := pattern(4096, seed)
	r, err := p.epA.PutNbx(src, rk.Base()+64, rk, nil)
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
	require.Equal(t, src, alloc.Bytes()[64:64+4096])
	back := make([]byte, 4096)
	g, err := p.epA.GetNbx(back, rk.Base()+64, rk, nil)
	require.NoError(t, err)
	require.NoError(t, g.Wait(ctx))
	require.Equal(t, src, back)
}

// A second key at the base of a mapped allocation, with a new buffer id and a
// handle that does not open, leaves the first key's mapping open and working.
func TestIPCBoundFailedOpenKeepsMapping(t *testing.T) {
	p, _ := ipcPair(t)
	const n = 64 << 10
	alloc, _, rk := mappedRegion(t, p, n)
	base := alloc.Ptr()
	require.Equal(t, 1, fakeipc.Mapped(base))
	a := alloc.Allocation()
	a.BufferID += 1 << 32
	var garbage protocol.IPCHandle
	for i := range garbage {
		garbage[i] = byte(i*37 + 1)
	}
	before := fakeipc.Stats()
	_, err := p.epA.UnpackRkey(forgeIPCKey(p, a, garbage, uint64(base), n))
	require.Error(t, err)
	require.Equal(t, before.Closes, fakeipc.Stats().Closes, "nothing unmapped")
	require.Equal(t, 1, fakeipc.Mapped(base), "the first key's mapping is still open")
	putGetIPC(t, p, rk, alloc, 1)
}

// A second valid key at the same base (the same handle, another buffer id) while the
// first is held: the first mapping is not closed until its key is.
func TestIPCBoundReplacedMappingLivesWithItsKey(t *testing.T) {
	p, _ := ipcPair(t)
	const n = 64 << 10
	alloc, m, rk1 := mappedRegion(t, p, n)
	base := alloc.Ptr()
	a := alloc.Allocation()
	a.BufferID += 1 << 32
	before := fakeipc.Stats()
	rk2, err := p.epA.UnpackRkey(forgeIPCKeyOf(p, m.keyID, a, alloc.Handle(), uint64(base), n))
	require.NoError(t, err)
	require.Equal(t, before.Closes, fakeipc.Stats().Closes, "the first mapping is still referenced")
	require.Equal(t, 2, fakeipc.Mapped(base), "both opens held")
	putGetIPC(t, p, rk1, alloc, 2)
	putGetIPC(t, p, rk2, alloc, 3)

	require.NoError(t, rk1.Close())
	require.Eventually(t, func() bool { return fakeipc.Mapped(base) == 1 }, 5*time.Second, time.Millisecond, "closing the first key unmaps its mapping")
	require.Equal(t, 1, fakeipc.Stats().Closes-before.Closes)
	putGetIPC(t, p, rk2, alloc, 4)
	require.NoError(t, rk2.Close())
	require.Eventually(t, func() bool { return fakeipc.Mapped(base) == 0 }, 5*time.Second, time.Millisecond)
}

// A key claiming a larger allocation than the one its handle names is refused at
// unpack with ErrInvalidParam, and what it opened is closed again; a mapping already
// there stays.
func TestIPCBoundClaimedSizeChecked(t *testing.T) {
	p, _ := ipcPair(t)
	alloc := fakeipc.Malloc(4096)
	defer alloc.Free()
	base := alloc.Ptr()
	forged := alloc.Allocation()
	forged.Size = 1 << 20
	before := fakeipc.Stats()
	_, err := p.epA.UnpackRkey(forgeIPCKey(p, forged, alloc.Handle(), uint64(base), forged.Size))
	require.ErrorIs(t, err, ErrInvalidParam)
	after := fakeipc.Stats()
	require.Equal(t, 1, after.Opens-before.Opens)
	require.Equal(t, 1, after.Closes-before.Closes, "the mapping it opened is closed")
	require.Zero(t, fakeipc.Mapped(base))

	// Next to a genuine key of the same allocation.
	const n = 64 << 10
	alloc2, _, rk := mappedRegion(t, p, n)
	base2 := alloc2.Ptr()
	forged = alloc2.Allocation()
	forged.Size = n + 4096
	_, err = p.epA.UnpackRkey(forgeIPCKey(p, forged, alloc2.Handle(), uint64(base2), forged.Size))
	require.ErrorIs(t, err, ErrInvalidParam)
	require.Equal(t, 1, fakeipc.Mapped(base2), "only the genuine key's mapping")
	putGetIPC(t, p, rk, alloc2, 5)
}

package ucp

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/testenv/fakeipc"
)

// exported is the number of allocations c's export cache holds.
func exported(c *Context) int { return c.ipc.exp.Exported() }

// An allocation's export lives as long as a region of it: closing the last region
// drops it from the exporter's cache, after the revocation unmapped the peer's
// mapping. Many short-lived allocations, each registered, used by the peer and
// closed, leave the cache and the peer empty.
func TestIPCExportGoesWithItsRegions(t *testing.T) {
	inRevokeModes(t, func(t *testing.T) {
		p, _ := ipcPair(t)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		before := fakeipc.Stats()
		const n, rounds = 8192, 24
		for i := range rounds {
			// Every allocation lives to the end of the test: each has a base of its own.
			alloc := fakeipc.Malloc(2 * n)
			t.Cleanup(alloc.Free)
			m, packed := deviceRegion(t, p.ctxB, alloc, 0, n)
			m2, _ := deviceRegion(t, p.ctxB, alloc, n, n) // a second region of it
			require.Equal(t, 1, exported(p.ctxB), "round %d: one export per allocation", i)
			rk, err := p.epA.UnpackRkey(packed)
			require.NoError(t, err)
			src := pattern(n, int64(i))
			r, err := p.epA.PutNbx(src, rk.Base(), rk, nil)
			require.NoError(t, err)
			require.NoError(t, r.Wait(ctx))
			require.Equal(t, src, alloc.Bytes()[:n])
			require.Equal(t, 1, fakeipc.Mapped(alloc.Ptr()))
			waitImported(t, m, p.ctxA, 1)

			stop := background(p.a)
			require.NoError(t, m.Close())
			stop()
			require.Zero(t, fakeipc.Mapped(alloc.Ptr()), "round %d: the peer unmapped the closed region's allocation", i)
			_, err = p.epA.PutNbx(src, rk.Base(), rk, nil)
			require.ErrorIs(t, err, ErrRevoked)
			require.Equal(t, 1, exported(p.ctxB), "round %d: the second region still holds the export", i)
			require.NoError(t, m2.Close())
			require.Zero(t, exported(p.ctxB), "round %d: the last region closed, the export goes", i)
			require.NoError(t, rk.Close())
		}
		st := fakeipc.Stats()
		require.Equal(t, rounds, st.Exports-before.Exports)
		require.Equal(t, st.Opens-before.Opens, st.Closes-before.Closes, "every mapping closed")
	})
}

// A context's Close drops the exports of its regions, and a region its Close refused
// leaves none behind.
func TestIPCExportGoesWithItsContext(t *testing.T) {
	_, cb := fakeDeviceContexts(t)
	for range 3 {
		alloc := fakeipc.Malloc(4096)
		t.Cleanup(alloc.Free)
		_, err := cb.MemMapPtr(alloc.Ptr(), 4096, MemoryCUDA)
		require.NoError(t, err)
	}
	require.Equal(t, 3, exported(cb))
	require.NoError(t, cb.Close())
	require.Zero(t, exported(cb))
	alloc := fakeipc.Malloc(4096)
	t.Cleanup(alloc.Free)
	_, err := cb.MemMapPtr(alloc.Ptr(), 4096, MemoryCUDA)
	require.ErrorIs(t, err, ErrClosed)
	require.Zero(t, exported(cb))
}

// pullExports is the number of allocations c exported for pulls.
func pullExports(c *Context) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pulls)
}

// Pulled messages of allocations the user frees (never registered, so no Close tells
// ucpx) do not pile up exports at the sender nor mappings at the receiver: the freed
// ones are found by their buffer ids and revoked, and a live one keeps its export.
func TestPullExportsOfFreedAllocationsGo(t *testing.T) {
	old := minPullsSweep
	minPullsSweep = 4
	t.Cleanup(func() { minPullsSweep = old }) // after the workers stopped
	const n, rounds = 4096, 40
	p, ctx, live, _ := amPullPair(t, n)
	msgs := amInbox(t, p.b, 25)
	before := fakeipc.Stats()
	send := func(alloc *fakeipc.Alloc, seed int64) {
		t.Helper()
		copy(alloc.Bytes(), pattern(n, seed))
		sr, err := p.epA.AmSendNbx(25, nil, DeviceBuffer(alloc.Ptr(), n), devParam)
		require.NoError(t, err)
		require.Equal(t, pattern(n, seed), recvPulledAM(t, ctx, sr, nextMessage(t, msgs), n))
	}
	send(live, 1000)
	p.ctxA.mu.Lock()
	liveExport := p.ctxA.pulls[uint64(live.Ptr())]
	p.ctxA.mu.Unlock()
	// Allocated up front, so that no freed base comes back: each is a new export.
	allocs := make([]*fakeipc.Alloc, rounds)
	for i := range allocs {
		allocs[i] = fakeipc.Malloc(n)
	}
	bound := minPullsSweep + 1
	for i, alloc := range allocs {
		send(alloc, int64(i))
		alloc.Free()
		require.LessOrEqual(t, pullExports(p.ctxA), bound, "after %d allocations", i+1)
	}
	send(live, 1001)
	p.ctxA.mu.Lock()
	require.Same(t, liveExport, p.ctxA.pulls[uint64(live.Ptr())], "the live allocation kept its export")
	p.ctxA.mu.Unlock()
	require.Eventually(t, func() bool { return exported(p.ctxA) <= bound }, 5*time.Second, time.Millisecond,
		"the sender's export cache holds the live allocations and at most a few freed ones")
	requireKeysHeld(t, p.b, bound, bound, "the receiver's keys of freed allocations")
	require.Eventually(t, func() bool {
		st := fakeipc.Stats()
		return (st.Opens-before.Opens)-(st.Closes-before.Closes) <= bound
	}, 5*time.Second, time.Millisecond, "the receiver's mappings of freed allocations are closed")
}

package ucp

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/testenv/fakeipc"
)

// pullKeysHeld is what w keeps of its peers' keys: the pull keys in its endpoints'
// lookups and every unpacked key.
func pullKeysHeld(w *Worker) (lookup, rkeys int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ep := range w.eps {
		lookup += len(ep.pullKeys)
	}
	return lookup, len(w.rkeys)
}

// requireKeysHeld waits (a revocation's last step may run on another goroutine) until
// w holds at most lookup pull keys and rkeys keys.
func requireKeysHeld(t *testing.T, w *Worker, lookup, rkeys int, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		l, r := pullKeysHeld(w)
		if l <= lookup && r <= rkeys {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d pull keys, %d keys unpacked; want at most %d and %d", what, l, r, lookup, rkeys)
		}
		time.Sleep(time.Millisecond)
	}
}

func endpointCount(w *Worker) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.eps)
}

// revokePullExport revokes the export pulls of alloc went by, as the sender's pullKey
// does when the allocation at its base is another one, and frees alloc.
func revokePullExport(t *testing.T, c *Context, alloc *fakeipc.Alloc) {
	t.Helper()
	c.mu.Lock()
	e := c.pulls[uint64(alloc.Ptr())]
	delete(c.pulls, uint64(alloc.Ptr()))
	c.mu.Unlock()
	require.NotNil(t, e, "the allocation was exported for pulls")
	require.NoError(t, e.memh.Close())
	alloc.Free()
}

// A sender pulling from one allocation after another, each revoked once used, leaves
// its receiver no key of them: revoked pull keys are destroyed, not kept until the
// worker closes.
func TestPullKeysOfRevokedAllocationsGo(t *testing.T) {
	inRevokeModes(t, func(t *testing.T) {
		const n, rounds = 8192, 24
		p, ctx, _, _ := amPullPair(t, 64)
		msgs := amInbox(t, p.b, 21)
		for i := 0; i < rounds; i++ {
			alloc := fakeipc.Malloc(n)
			copy(alloc.Bytes(), pattern(n, int64(i)))
			// A pulled active message, then a pulled tag message, of the allocation.
			sr, err := p.epA.AmSendNbx(21, nil, DeviceBuffer(alloc.Ptr(), n), devParam)
			require.NoError(t, err)
			host := recvPulledAM(t, ctx, sr, nextMessage(t, msgs), n)
			require.Equal(t, pattern(n, int64(i)), host)
			clear(host)
			tr, err := p.b.TagRecvNbx(host, 22, MaxTag, nil)
			require.NoError(t, err)
			sr, err = p.epA.TagSendNbx(DeviceBuffer(alloc.Ptr(), n), 22, devParam)
			require.NoError(t, err)
			require.NoError(t, tr.Wait(ctx))
			require.NoError(t, sr.Wait(ctx))
			require.Equal(t, pattern(n, int64(i)), host)
			revokePullExport(t, p.ctxA, alloc)
		}
		requireKeysHeld(t, p.b, 0, 0, "after 24 revoked allocations")
	})
}

// A key revoked while a pulled message that needs it is held stays until that message
// is done with, then goes.
func TestPullKeyRevokedInUseGoesAfterPull(t *testing.T) {
	inRevokeModes(t, func(t *testing.T) {
		const n = 4096
		p, ctx, _, _ := amPullPair(t, 64)
		msgs := amInbox(t, p.b, 23)
		alloc := fakeipc.Malloc(n)
		sr, err := p.epA.AmSendNbx(23, nil, DeviceBuffer(alloc.Ptr(), n), devParam)
		require.NoError(t, err)
		m := nextMessage(t, msgs) // retained: its pull is in flight
		revokePullExport(t, p.ctxA, alloc)
		_, rkeys := pullKeysHeld(p.b)
		require.Equal(t, 1, rkeys, "the held message's key stays")
		_, err = m.RecvData(make([]byte, n), nil)
		require.ErrorIs(t, err, ErrRevoked)
		m.Release()
		require.NoError(t, sr.Wait(ctx))
		requireKeysHeld(t, p.b, 0, 0, "the key went with its last pull")
	})
}

// An endpoint holds at most maxPullKeys keys of pulls: the least recently used one no
// pull in flight holds goes (its mapping released), one a held message needs stays.
func TestPullKeysCapped(t *testing.T) {
	old := maxPullKeys
	maxPullKeys = 3
	t.Cleanup(func() { maxPullKeys = old }) // after the workers stopped
	const n, allocs = 4096, 12
	p, ctx, _, _ := amPullPair(t, 64)
	msgs := amInbox(t, p.b, 24)
	send := func(alloc *fakeipc.Alloc) (*Request, *AmMessage) {
		sr, err := p.epA.AmSendNbx(24, nil, DeviceBuffer(alloc.Ptr(), n), devParam)
		require.NoError(t, err)
		return sr, nextMessage(t, msgs)
	}
	before := fakeipc.Stats()
	held := fakeipc.Malloc(n)
	t.Cleanup(held.Free)
	copy(held.Bytes(), pattern(n, 99))
	hsr, hm := send(held) // its key is in use until it is received
	for i := 0; i < allocs; i++ {
		alloc := fakeipc.Malloc(n)
		t.Cleanup(alloc.Free)
		copy(alloc.Bytes(), pattern(n, int64(i)))
		sr, m := send(alloc)
		require.Equal(t, pattern(n, int64(i)), recvPulledAM(t, ctx, sr, m, n))
		lookup, rkeys := pullKeysHeld(p.b)
		require.LessOrEqual(t, lookup, maxPullKeys, "after %d allocations", i+1)
		require.LessOrEqual(t, rkeys, maxPullKeys, "after %d allocations", i+1)
	}
	host := make([]byte, n)
	rr, err := hm.RecvData(host, nil)
	require.NoError(t, err, "the held message's key was not evicted")
	require.NoError(t, rr.Wait(ctx))
	require.NoError(t, hsr.Wait(ctx))
	require.Equal(t, pattern(n, 99), host)
	require.Eventually(t, func() bool {
		st := fakeipc.Stats()
		return (st.Opens-before.Opens)-(st.Closes-before.Closes) <= maxPullKeys
	}, 5*time.Second, time.Millisecond, "evicted keys' mappings are released")
}

// pullSenders is a receiving worker and a sending context, with the fake device; the
// receiver progresses in the background. Senders connect to it by address only, so
// the receiver makes its endpoints back itself.
func pullSenders(t *testing.T) (ca *Context, wb *Worker, ctx context.Context) {
	t.Helper()
	ca, cb := fakeDeviceContexts(t)
	wb, err := cb.NewWorker(WorkerParams{})
	require.NoError(t, err)
	t.Cleanup(background(wb))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ca, wb, ctx
}

// newPullSender is a worker of ca connected to wb by address, progressing in the
// background until stop (or the test's end).
func newPullSender(t *testing.T, ca *Context, wb *Worker) (wa *Worker, ep *Endpoint, stop func()) {
	t.Helper()
	wa, err := ca.NewWorker(WorkerParams{})
	require.NoError(t, err)
	addr, err := wb.Address()
	require.NoError(t, err)
	ep, err = wa.ConnectAddress(addr, nil)
	require.NoError(t, err)
	stopped := false
	bg := background(wa)
	stop = func() {
		if !stopped {
			stopped = true
			bg()
		}
	}
	t.Cleanup(stop)
	return wa, ep, stop
}

// pullTagTo sends n bytes of src as a pulled tag message on ep and receives it on
// recv; it returns the receive's and the send's results.
func pullTagTo(t *testing.T, ctx context.Context, ep *Endpoint, recv *Worker, tag uint64, src *fakeipc.Alloc, n int) (recvErr, sendErr error) {
	t.Helper()
	host := make([]byte, n)
	rr, err := recv.TagRecvNbx(host, tag, MaxTag, nil)
	require.NoError(t, err)
	sr, err := ep.TagSendNbx(DeviceBuffer(src.Ptr(), n), tag, devParam)
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return rr.Wait(wctx), sr.Wait(wctx)
}

// The endpoint a receiver made itself to answer a sender's pulls is closed and
// forgotten (with its keys) once that sender fails; a restarted sender's endpoint
// does not add to it.
func TestPullInternalEndpointClosedOnFailure(t *testing.T) {
	const n = 8192
	ca, wb, ctx := pullSenders(t)
	src := fakeipc.Malloc(n)
	t.Cleanup(src.Free)
	wa, ep, stop := newPullSender(t, ca, wb)
	rerr, serr := pullTagTo(t, ctx, ep, wb, 5, src, n)
	require.NoError(t, rerr)
	require.NoError(t, serr)
	require.Equal(t, 1, endpointCount(wb), "the endpoint back to the sender")
	_, rkeys := pullKeysHeld(wb)
	require.Equal(t, 1, rkeys)

	stop()
	require.NoError(t, wa.Close()) // the sender fails
	require.Eventually(t, func() bool { return endpointCount(wb) == 0 }, 10*time.Second, time.Millisecond,
		"the failed internal endpoint is closed and removed")
	_, rkeys = pullKeysHeld(wb)
	require.Zero(t, rkeys, "its keys went with it")
	require.True(t, wb.ctx.peerDead(ca.trust.id), "revocations still see the sender dead")

	// The sender's context comes back with another worker.
	_, ep2, _ := newPullSender(t, ca, wb)
	rerr, serr = pullTagTo(t, ctx, ep2, wb, 6, src, n)
	require.NoError(t, rerr)
	require.NoError(t, serr)
	require.Equal(t, 1, endpointCount(wb), "one endpoint back, to the live sender")
}

// A receiver makes at most maxInternalEndpoints endpoints itself: a pull from a
// sender past them fails here, and its sender is answered as for any failed pull
// (its send completes) instead of another endpoint being kept.
func TestPullInternalEndpointsCapped(t *testing.T) {
	old := maxInternalEndpoints
	maxInternalEndpoints = 2
	t.Cleanup(func() { maxInternalEndpoints = old }) // after the workers stopped
	const n = 8192
	ca, wb, ctx := pullSenders(t)
	src := fakeipc.Malloc(n)
	t.Cleanup(src.Free)
	copy(src.Bytes(), pattern(n, 7))
	for i := 0; i < 2; i++ {
		_, ep, _ := newPullSender(t, ca, wb)
		require.Equal(t, pattern(n, 7), pullAMToHost(t, ctx, ep, wb, uint(30+i), src, n))
	}
	require.Equal(t, 2, endpointCount(wb))

	_, ep, _ := newPullSender(t, ca, wb)
	msgs := amInbox(t, wb, 32)
	sr, err := ep.AmSendNbx(32, nil, DeviceBuffer(src.Ptr(), n), devParam)
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, sr.Wait(wctx), "the refused active message's send completes")
	select {
	case m := <-msgs:
		m.Release()
		t.Fatal("a pull past the cap reached the handler")
	default:
	}
	rerr, serr := pullTagTo(t, ctx, ep, wb, 33, src, n)
	require.ErrorIs(t, rerr, ErrExceedsLimit, "the receive of a refused pull")
	require.NoError(t, serr, "the refused tag message's send completes")
	require.Equal(t, 2, endpointCount(wb), "no endpoint past the cap")
}

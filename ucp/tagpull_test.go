package ucp

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/ucx"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/internal/testenv/fakeipc"
	"github.com/ucpx/ucpx/protocol"
)

var devParam = &RequestParam{MemoryType: MemoryCUDA}

// pullSource is amPullPair with the source allocation filled with pattern(n, seed),
// which it returns.
func pullSource(t *testing.T, n int, seed int64) (p *pair, ctx context.Context, src, dst *fakeipc.Alloc, data []byte) {
	t.Helper()
	p, ctx, src, dst = amPullPair(t, n)
	data = pattern(n, seed)
	copy(src.Bytes(), data)
	return p, ctx, src, dst, data
}

// A tag message of a device buffer to a peer CUDA IPC reaches carries a descriptor:
// whatever receive matches it pulls the data (into host memory, into device memory
// without staging copies, posted before or after the message came), and the send
// completes only once it did. One export and one mapping serve every message of an
// allocation.
func TestTagPull(t *testing.T) {
	const size = 1 << 20
	p, ctx, src, dst, data := pullSource(t, size, 11)
	before := fakeipc.Stats()
	for i, n := range []int{4096, 64<<10 + 3, size - 4096} {
		off := 4096 * (i % 2)
		want := checksum(data[off : off+n])
		tag := uint64(100 + i)
		sbuf := DeviceBuffer(src.Ptr()+uintptr(off), n)

		// Unexpected: the send first; it waits for its receiver.
		sr, err := p.epA.TagSendNbx(sbuf, tag, devParam)
		require.NoError(t, err)
		time.Sleep(10 * time.Millisecond)
		require.False(t, sr.Done(), "the send completes once its receiver pulled")
		host := make([]byte, n+7)
		rr, err := p.b.TagRecvNbx(host, tag, MaxTag, nil)
		require.NoError(t, err)
		require.NoError(t, rr.Wait(ctx))
		require.Equal(t, n, rr.Length())
		require.Equal(t, tag, rr.SenderTag(), "ucpx's bits never show")
		require.Equal(t, want, checksum(host[:n]), "size %d into host memory", n)
		require.NoError(t, sr.Wait(ctx))

		// Expected, into device memory: staged in name only, the pull fills it.
		clear(dst.Bytes())
		copiesBefore := fakeipc.Stats().DeviceCopies
		rr, err = p.b.TagRecvNbx(DeviceBuffer(dst.Ptr(), n), tag, MaxTag, devParam)
		require.NoError(t, err)
		sr, err = p.epA.TagSendNbx(sbuf, tag, devParam)
		require.NoError(t, err)
		require.NoError(t, rr.Wait(ctx))
		require.NoError(t, sr.Wait(ctx))
		require.Equal(t, n, rr.Length())
		require.Equal(t, want, checksum(dst.Bytes()[:n]), "size %d into device memory", n)
		require.Equal(t, 1, fakeipc.Stats().DeviceCopies-copiesBefore, "one device-to-device copy, none through staging")

		// The blocking receive.
		sr, err = p.epA.TagSendNbx(sbuf, tag, devParam)
		require.NoError(t, err)
		clear(host)
		got, stag, err := p.b.TagRecv(ctx, host, tag, MaxTag)
		require.NoError(t, err)
		require.Equal(t, n, got)
		require.Equal(t, tag, stag)
		require.Equal(t, want, checksum(host[:n]), "size %d, blocking receive", n)
		require.NoError(t, sr.Wait(ctx))

		// The fused send-then-receive, its reply pulled.
		sr, err = p.epA.TagSendNbx(sbuf, tag, devParam)
		require.NoError(t, err)
		ping, err := p.a.TagRecvNbx(make([]byte, 4), 99, MaxTag, nil)
		require.NoError(t, err)
		clear(host)
		got, stag, err = p.epB.TagSendRecv(ctx, []byte("ping"), 99, host, tag, MaxTag)
		require.NoError(t, err)
		require.Equal(t, n, got)
		require.Equal(t, tag, stag)
		require.Equal(t, want, checksum(host[:n]), "size %d, TagSendRecv", n)
		require.NoError(t, ping.Wait(ctx))
		require.NoError(t, sr.Wait(ctx))
	}
	st := fakeipc.Stats()
	require.Equal(t, 1, st.Exports-before.Exports, "one export per allocation")
	require.Equal(t, 1, st.Opens-before.Opens, "one mapping per allocation")
	require.Zero(t, p.a.StagingStats().Bytes, "the sender staged nothing")
}

// Receives shorter than a pulled message complete with ErrMessageTruncated and copy
// nothing; the sends complete, also where the receive could not hold even the
// descriptor (answered by tag), and also when that one sits between two good
// messages of the same tag.
func TestTagPullTruncated(t *testing.T) {
	const n = 64 << 10
	p, ctx, src, _, data := pullSource(t, n, 12)
	sbuf := DeviceBuffer(src.Ptr(), n)
	for _, short := range []int{n - 1, 8, 0} {
		sr, err := p.epA.TagSendNbx(sbuf, 7, devParam)
		require.NoError(t, err)
		buf := make([]byte, short)
		rr, err := p.b.TagRecvNbx(buf, 7, MaxTag, nil)
		if err == nil {
			err = rr.Wait(ctx)
		}
		require.ErrorIs(t, err, ErrMessageTruncated, "a %d-byte receive", short)
		require.NoError(t, sr.Wait(ctx), "the send of a message received %d bytes short", n-short)
	}

	// Three sends of one tag; the middle one's receive is too short for its
	// descriptor. Each send completes, the good ones with their data.
	var sends [3]*Request
	for i := range sends {
		var err error
		sends[i], err = p.epA.TagSendNbx(sbuf, 9, devParam)
		require.NoError(t, err)
	}
	first, last := make([]byte, n), make([]byte, n)
	r1, err := p.b.TagRecvNbx(first, 9, MaxTag, nil)
	require.NoError(t, err)
	r2, err := p.b.TagRecvNbx(make([]byte, 16), 9, MaxTag, nil)
	if err == nil {
		err = r2.Wait(ctx)
	}
	require.ErrorIs(t, err, ErrMessageTruncated)
	r3, err := p.b.TagRecvNbx(last, 9, MaxTag, nil)
	require.NoError(t, err)
	require.NoError(t, r1.Wait(ctx))
	require.NoError(t, r3.Wait(ctx))
	for i, s := range sends {
		require.NoError(t, s.Wait(ctx), "send %d", i)
	}
	require.Equal(t, checksum(data), checksum(first))
	require.Equal(t, checksum(data), checksum(last))
	require.Zero(t, p.a.StagingStats().Bytes, "every send went by pull")
}

// A chain's receive that gets a pulled message pauses the run, pulls the data on the
// goroutine that waits for the chain, and goes on: the chain's next step sends back
// what was pulled.
func TestTagPullChain(t *testing.T) { tagPullChain(t, 256<<10, 3, 1) }

// Several goroutines waiting on one chain whose run pauses for pulls settle them
// together: each pull is reported to the chain once, the data is right, and nothing
// races (-race).
func TestTagPullChainManyWaiters(t *testing.T) { tagPullChain(t, 64<<10, 8, 4) }

// tagPullChain runs a chain that receives pulled messages of n bytes and echoes them,
// iters times, with waiters goroutines waiting on it.
func tagPullChain(t *testing.T, n, iters, waiters int) {
	p, ctx, src, _, data := pullSource(t, n, 13)
	ch, err := condition.NewChain(condition.ChainParam{Repeat: uint64(iters)})
	require.NoError(t, err)
	in := make([]byte, n)
	_, err = p.b.TagRecvNbx(in, 1, MaxTag, &RequestParam{Chain: ch})
	require.NoError(t, err)
	require.NoError(t, ch.Then())
	_, err = p.epB.TagSendNbx(in, 2, &RequestParam{Chain: ch})
	require.NoError(t, err)
	require.NoError(t, ch.Start())
	stop := make(chan error, waiters)
	for range waiters {
		go func() { stop <- ch.Wait(ctx) }()
	}
	for i := 0; i < iters; i++ {
		sr, err := p.epA.TagSendNbx(DeviceBuffer(src.Ptr(), n), 1, devParam)
		require.NoError(t, err)
		echo := make([]byte, n)
		got, _, err := p.a.TagRecv(ctx, echo, 2, MaxTag)
		require.NoError(t, err)
		require.Equal(t, n, got)
		require.Equal(t, checksum(data), checksum(echo), "iteration %d: the chain sent on what it pulled", i)
		require.NoError(t, sr.Wait(ctx))
	}
	for range waiters {
		require.NoError(t, <-stop)
	}
	require.Equal(t, uint64(iters), ch.Iterations())
	require.NoError(t, ch.Destroy())
	require.Zero(t, p.a.StagingStats().Bytes, "every send went by pull")
}

// A conditioned send is issued by the engine at its trigger, and goes by pull too;
// StageAlways stages instead, with the same data.
func TestTagPullConditionedAndStaged(t *testing.T) {
	const n = 64 << 10
	p, ctx, src, _, data := pullSource(t, n, 14)
	kc, trigger := kernelCondition(t)
	sr, err := p.epA.TagSendNbx(DeviceBuffer(src.Ptr(), n), 3, &RequestParam{Condition: kc, MemoryType: MemoryCUDA})
	require.NoError(t, err)
	host := make([]byte, n)
	rr, err := p.b.TagRecvNbx(host, 3, MaxTag, nil)
	require.NoError(t, err)
	time.Sleep(10 * time.Millisecond)
	require.False(t, rr.Done(), "sent before its trigger")
	trigger()
	require.NoError(t, rr.Wait(ctx))
	require.NoError(t, sr.Wait(ctx))
	require.Equal(t, checksum(data), checksum(host))
	require.Zero(t, p.a.StagingStats().Bytes, "pulled, not staged")

	clear(host)
	sr, err = p.epA.TagSendNbx(DeviceBuffer(src.Ptr(), n), 4, &RequestParam{MemoryType: MemoryCUDA, Staging: protocol.StageAlways})
	require.NoError(t, err)
	rr, err = p.b.TagRecvNbx(host, 4, MaxTag, nil)
	require.NoError(t, err)
	require.NoError(t, rr.Wait(ctx))
	require.NoError(t, sr.Wait(ctx))
	require.Equal(t, checksum(data), checksum(host))
	require.NotZero(t, p.a.StagingStats().Bytes, "StageAlways staged")
}

// A send whose peer fails before it pulled completes with the failure; one whose
// worker closes, with ErrCanceled.
func TestTagPullSenderCloses(t *testing.T) {
	p, _ := ipcPair(t)
	src := fakeipc.Malloc(8192)
	defer src.Free()
	stop := background(p.a)
	sr, err := p.epA.TagSendNbx(DeviceBuffer(src.Ptr(), 8192), 5, devParam)
	require.NoError(t, err)
	time.Sleep(10 * time.Millisecond)
	stop()
	require.False(t, sr.Done())
	require.NoError(t, p.a.Close())
	require.True(t, sr.Done())
	require.ErrorIs(t, sr.Err(), ErrCanceled)
}

// A message with the pull bit whose descriptor is not sealed by a peer (what a
// broken or hostile peer could send) fails its receive with ErrAuth; the next
// message of the tag is received normally.
func TestTagPullForged(t *testing.T) {
	p, ctx, _, _ := amPullPair(t, 4096)
	forged := make([]byte, 300)
	copy(forged, tagPullMagic)
	p.a.mu.Lock()
	_, err := p.a.postLocked("tag_send_nbx", p.a.raw.TagSend(p.epA.raw, bufPtr(forged), len(forged), 5|ucx.PullBit, 0, int(MemoryHost), nil, 0), &defaultParam, nil, bufPtr(forged))
	p.a.mu.Unlock()
	require.NoError(t, err)
	buf := make([]byte, 4096)
	rr, err := p.b.TagRecvNbx(buf, 5, MaxTag, nil)
	if err == nil {
		err = rr.Wait(ctx)
	}
	require.ErrorIs(t, err, ErrAuth)
	_, err = p.epA.TagSendNbx([]byte("plain"), 5, nil)
	require.NoError(t, err)
	n, _, err := p.b.TagRecv(ctx, buf, 5, MaxTag)
	require.NoError(t, err)
	require.Equal(t, "plain", string(buf[:n]))
}

// A receiver driven only by a loop that sleeps on the worker's events (as
// WorkerParams.ProgressThread and the engine do) still completes a pulled receive:
// the copy signals no event, so sleeps are bounded while it is pending.
func TestTagPullReceiverSleeps(t *testing.T) {
	dev := fakeipc.New(hostBackend(t), fakeUUID)
	p, l, err := listenPair(t, ContextParams{Device: dev}, ContextParams{Device: dev})
	require.NoError(t, err)
	require.NoError(t, l.Close())
	t.Cleanup(background(p.a))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			p.b.Progress()
			_ = p.b.WaitForEvents(ctx, time.Hour)
		}
	}()
	defer func() { cancel(); <-done }()
	const n = 64 << 10
	src := fakeipc.Malloc(n)
	defer src.Free()
	copy(src.Bytes(), pattern(n, 15))
	host := make([]byte, n)
	rr, err := p.b.TagRecvNbx(host, 8, MaxTag, nil)
	require.NoError(t, err)
	sr, err := p.epA.TagSendNbx(DeviceBuffer(src.Ptr(), n), 8, devParam)
	require.NoError(t, err)
	require.Eventually(t, rr.Done, 10*time.Second, time.Millisecond, "the pulled receive completes with nobody waiting on it")
	require.NoError(t, rr.Err())
	require.Equal(t, pattern(n, 15), host)
	require.NoError(t, sr.Wait(ctx))

	// The message there first: the receive completes in its call, from a goroutine
	// that drives no progress afterwards (as the engine's issue).
	clear(host)
	sr, err = p.epA.TagSendNbx(DeviceBuffer(src.Ptr(), n), 9, devParam)
	require.NoError(t, err)
	time.Sleep(50 * time.Millisecond) // the descriptor arrives, unexpected
	rr, err = p.b.TagRecvNbx(host, 9, MaxTag, nil)
	require.NoError(t, err)
	require.Eventually(t, rr.Done, 10*time.Second, time.Millisecond, "a pulled receive that completed in its call completes")
	require.NoError(t, rr.Err())
	require.Equal(t, pattern(n, 15), host)
	require.NoError(t, sr.Wait(ctx))
}

// A receiver with no endpoint to the sender (only the sender connected, by worker
// address) still answers, tag and active messages alike: the descriptor carries the
// sender's sealed address, and the receiver makes an endpoint from it once.
func TestTagPullOneWayEndpoint(t *testing.T) {
	for _, noPeerErr := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoPeerErrorHandling=%v", noPeerErr), func(t *testing.T) {
			const n = 64 << 10
			wa, wb, ep, ctx, src := oneWayPair(t, n, noPeerErr)
			copy(src.Bytes(), pattern(n, 16))
			for i := 0; i < 3; i++ {
				host := make([]byte, n)
				rr, err := wb.TagRecvNbx(host, 4, MaxTag, nil)
				require.NoError(t, err)
				sr, err := ep.TagSendNbx(DeviceBuffer(src.Ptr(), n), 4, devParam)
				require.NoError(t, err)
				require.NoError(t, rr.Wait(ctx))
				require.Equal(t, pattern(n, 16), host)
				require.NoError(t, sr.Wait(ctx), "send %d completes: the receiver answered", i)
			}
			require.Equal(t, pattern(n, 16), pullAMToHost(t, ctx, ep, wb, 3, src, n))
			wb.mu.Lock()
			eps := make([]*Endpoint, 0, len(wb.eps))
			for _, e := range wb.eps {
				eps = append(eps, e)
			}
			wb.mu.Unlock()
			require.Len(t, eps, 1, "one endpoint back, made once")
			// UCX refuses a pair whose ends differ in error handling: the endpoint back
			// takes the sender's.
			require.Equal(t, noPeerErr, eps[0].params.NoPeerErrorHandling)
			require.Zero(t, wa.StagingStats().Bytes, "pulled")
		})
	}
}

// The first pulled message of a one-way pair matched by a receive too short for its
// descriptor: the receiver cannot read the sender's address from it, but the hello
// the sender sent ahead gave it an endpoint, and the answer by tag completes the send.
func TestTagPullOneWayTruncated(t *testing.T) {
	const n = 64 << 10
	_, wb, ep, ctx, src := oneWayPair(t, n, false)
	sr, err := ep.TagSendNbx(DeviceBuffer(src.Ptr(), n), 4, devParam)
	require.NoError(t, err)
	rr, err := wb.TagRecvNbx(make([]byte, 16), 4, MaxTag, nil)
	if err == nil {
		err = rr.Wait(ctx)
	}
	require.ErrorIs(t, err, ErrMessageTruncated)
	require.NoError(t, sr.Wait(ctx), "the send completes")
}

// oneWayPair is two workers of contexts with the fake device where only a has an
// endpoint (to b, by b's worker address, with noPeerErr's error handling), both progressing in the background, a
// context that ends with the test, and n bytes of fake device memory.
func oneWayPair(t *testing.T, n int, noPeerErr bool) (wa, wb *Worker, ep *Endpoint, ctx context.Context, src *fakeipc.Alloc) {
	t.Helper()
	ca, cb := fakeDeviceContexts(t)
	wa, err := ca.NewWorker(WorkerParams{})
	require.NoError(t, err)
	wb, err = cb.NewWorker(WorkerParams{})
	require.NoError(t, err)
	addr, err := wb.Address()
	require.NoError(t, err)
	ep, err = wa.ConnectAddress(addr, &EndpointParams{NoPeerErrorHandling: noPeerErr})
	require.NoError(t, err)
	t.Cleanup(background(wa))
	t.Cleanup(background(wb))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	src = fakeipc.Malloc(n)
	t.Cleanup(src.Free)
	return wa, wb, ep, ctx, src
}

// fakeDeviceContexts is two contexts sharing one fake device, closed with the test.
func fakeDeviceContexts(t *testing.T) (ca, cb *Context) {
	t.Helper()
	dev := fakeipc.New(hostBackend(t), fakeUUID)
	ca, err := NewContext(ContextParams{Device: dev})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ca.Close() })
	cb, err = NewContext(ContextParams{Device: dev})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cb.Close() })
	return ca, cb
}

// A flush does not wait for a pulled send's receiver (UCX's flushes do not wait for
// message sends): a sender may flush before its peer posts the receive.
func TestTagPullFlushDoesNotWait(t *testing.T) {
	const n = 64 << 10
	p, ctx, src, _ := amPullPair(t, n)
	sr, err := p.epA.TagSendNbx(DeviceBuffer(src.Ptr(), n), 6, devParam)
	require.NoError(t, err)
	fr, err := p.epA.FlushNbx(nil)
	require.NoError(t, err)
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, fr.Wait(fctx), "the flush completes with the message unmatched")
	require.False(t, sr.Done())
	host := make([]byte, n)
	rr, err := p.b.TagRecvNbx(host, 6, MaxTag, nil)
	require.NoError(t, err)
	require.NoError(t, rr.Wait(ctx))
	require.NoError(t, sr.Wait(ctx))
}

// A receiver's worker that closes while a pulled message is being copied fails the
// receive with ErrCanceled instead of leaving it pending.
func TestTagPullReceiverCloses(t *testing.T) {
	dev := fakeipc.New(hostBackend(t), fakeUUID)
	p, l, err := listenPair(t, ContextParams{Device: dev}, ContextParams{Device: dev})
	require.NoError(t, err)
	require.NoError(t, l.Close())
	stopA := background(p.a)
	defer stopA()
	const n = 1 << 20
	src := fakeipc.Malloc(n)
	defer src.Free()
	host := make([]byte, n)
	rr, err := p.b.TagRecvNbx(host, 8, MaxTag, nil)
	require.NoError(t, err)
	_, err = p.epA.TagSendNbx(DeviceBuffer(src.Ptr(), n), 8, devParam)
	require.NoError(t, err)
	// Progress B until the descriptor matched; its pull is then under way (or done).
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.b.mu.Lock()
		matched := len(p.b.pullsIn) > 0 || rr.done.Load()
		p.b.mu.Unlock()
		if matched || time.Now().After(deadline) {
			break
		}
		p.b.mu.Lock()
		p.b.progressLocked(nil, 1) // completions only: the deferred pull does not start
		p.b.mu.Unlock()
	}
	require.NoError(t, p.b.Close())
	require.True(t, rr.Done(), "the receive completed")
	require.ErrorIs(t, rr.Err(), ErrCanceled)
}

// A pulled send waiting for a receiver that has not posted leaves its worker nothing
// to poll (its completion is a message, which the event fd shows), so sleepers on the
// fd are not woken every millisecond meanwhile; it completes once the receive comes.
func TestTagPullSendWaitsAsleep(t *testing.T) {
	p, _ := ipcPair(t)
	src := fakeipc.Malloc(8192)
	defer src.Free()
	sr, err := p.epA.TagSendNbx(DeviceBuffer(src.Ptr(), 8192), 5, devParam)
	require.NoError(t, err)
	p.a.Progress()
	p.a.mu.Lock()
	polls := p.a.ipcPollsLocked()
	p.a.mu.Unlock()
	require.False(t, polls, "nothing to poll")
	require.False(t, sr.Done())
	host := make([]byte, 8192)
	rr, err := p.b.TagRecvNbx(host, 5, MaxTag, nil)
	require.NoError(t, err)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	stop := background(p.a)
	defer stop()
	require.NoError(t, rr.Wait(ctx2))
	require.NoError(t, sr.Wait(ctx2))
}

// A pull is answered to the very worker that sent it: the receiver's endpoint to
// another worker of the sender's context would carry the answer to a worker that never
// sent anything, and the send would wait forever.
func TestPullAnsweredToItsWorker(t *testing.T) {
	const n = 64 << 10
	p, ctx, src, _, data := pullSource(t, n, 17)
	// a2: a second worker of A's context, connected to B by address only; B's one
	// endpoint to A's context is to p.a.
	a2, err := p.ctxA.NewWorker(WorkerParams{})
	require.NoError(t, err)
	addr, err := p.b.Address()
	require.NoError(t, err)
	ep2, err := a2.ConnectAddress(addr, nil)
	require.NoError(t, err)
	t.Cleanup(background(a2))
	require.Equal(t, data, pullAMToHost(t, ctx, ep2, p.b, 11, src, n))

	host := make([]byte, n)
	tr, err := p.b.TagRecvNbx(host, 12, MaxTag, nil)
	require.NoError(t, err)
	sr, err := ep2.TagSendNbx(DeviceBuffer(src.Ptr(), n), 12, devParam)
	require.NoError(t, err)
	require.NoError(t, tr.Wait(ctx))
	require.NoError(t, sr.Wait(ctx), "the tag send completes")
	require.Equal(t, data, host)
}

// pullAMToHost sends n bytes of src as a pulled active message id from ep to recv,
// receives it into host memory and waits for both sides; it returns what arrived.
func pullAMToHost(t *testing.T, ctx context.Context, ep *Endpoint, recv *Worker, id uint, src *fakeipc.Alloc, n int) []byte {
	t.Helper()
	msgs := amInbox(t, recv, id)
	sr, err := ep.AmSendNbx(id, nil, DeviceBuffer(src.Ptr(), n), devParam)
	require.NoError(t, err)
	return recvPulledAM(t, ctx, sr, nextMessage(t, msgs), n)
}

// recvPulledAM receives pulled message m, of n bytes, into host memory and waits for
// the receive and for sr, its send; it returns what arrived.
func recvPulledAM(t *testing.T, ctx context.Context, sr *Request, m *AmMessage, n int) []byte {
	t.Helper()
	host := make([]byte, n)
	rr, err := m.RecvData(host, nil)
	require.NoError(t, err)
	require.NoError(t, rr.Wait(ctx))
	require.NoError(t, sr.Wait(ctx), "the active message's send completes")
	return host
}

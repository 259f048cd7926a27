package ucp

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/ucpx/ucpx/condition"
)

// A worker's Close and its context's Close racing never tear the UCX context down
// under the worker being destroyed (this crashed: ucp_cleanup ran beside
// ucp_worker_destroy); both return, the second worker Close with ErrClosed.
func TestWorkerAndContextCloseConcurrently(t *testing.T) {
	for i := range 20 {
		p := newShmPair(t)
		wdone := make(chan error, 1)
		go func() { wdone <- p.a.Close() }()
		time.Sleep(time.Duration(i%5) * 100 * time.Microsecond)
		require.NoError(t, p.ctxA.Close())
		if err := <-wdone; err != nil {
			require.ErrorIs(t, err, ErrClosed)
		}
		p.ctxA = nil
	}
}

// A TagSendRecv whose send fails while its receive waits returns the send's error and
// leaves no receive posted: a later message with the receive's tag goes to a later
// receive, and the failed call's buffer is never written after it returned.
func TestTagSendRecvSendFailureTakesBackTheReceive(t *testing.T) {
	for range 10 {
		p := newPair(t, map[string]string{"TLS": "tcp"})
		require.NoError(t, p.ctxB.Close())
		p.ctxB = nil
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		rbuf := make([]byte, 64)
		_, _, err := p.epA.TagSendRecv(ctx, make([]byte, 4<<20), 1, rbuf, 77, ^uint64(0))
		cancel()
		require.Error(t, err)
		if errors.Is(err, context.DeadlineExceeded) {
			continue // the send did not fail in time: try again
		}
		self, err := p.a.ConnectAddress(mustAddress(t, p.a), &EndpointParams{NoPeerErrorHandling: true})
		require.NoError(t, err)
		sreq, err := self.TagSendNbx([]byte("hello"), 77, nil)
		require.NoError(t, err)
		fresh := make([]byte, 64)
		rreq, err := p.a.TagRecvNbx(fresh, 77, ^uint64(0), nil)
		require.NoError(t, err)
		wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer wcancel()
		require.NoError(t, rreq.Wait(wctx), "the later receive gets the message")
		require.NoError(t, sreq.Wait(wctx))
		require.Equal(t, "hello", string(fresh[:rreq.Length()]))
		require.Equal(t, make([]byte, 64), rbuf, "the failed call's buffer was written")
		return
	}
	t.Skip("the send never failed within the call's deadline")
}

// A ConnHandler that panics before deciding is recovered (RecoveredPanics) and the
// connection rejected: the process lives, and the peer's Connect fails instead of
// waiting.
func TestConnHandlerPanicRejects(t *testing.T) {
	c1, err := NewContext(ContextParams{})
	require.NoError(t, err)
	defer c1.Close()
	c2, err := NewContext(ContextParams{})
	require.NoError(t, err)
	defer c2.Close()
	w1, err := c1.NewWorker(WorkerParams{})
	require.NoError(t, err)
	w2, err := c2.NewWorker(WorkerParams{})
	require.NoError(t, err)
	before := len(RecoveredPanics())
	for _, h := range []func(*ConnRequest){
		func(*ConnRequest) { panic("boom in ConnHandler") },
		func(*ConnRequest) { runtime.Goexit() },
	} {
		l, err := w1.Listen("127.0.0.1:0", &ListenerParams{ConnHandler: h})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err = w2.Connect(ctx, l.Addr(), nil)
		cancel()
		require.Error(t, err)
		require.False(t, errors.Is(err, context.DeadlineExceeded), "Connect waited for a handler that never decided: %v", err)
		require.NoError(t, l.Close())
	}
	require.Eventually(t, func() bool { return len(RecoveredPanics()) > before }, 5*time.Second, time.Millisecond)
}

// A zero Request (RequestParam.Request may carry one) that was never issued answers
// Test and Wait with ErrInvalidParam and ignores Cancel, instead of panicking.
func TestZeroRequest(t *testing.T) {
	var r Request
	done, err := r.Test()
	require.False(t, done)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.ErrorIs(t, r.Wait(context.Background()), ErrInvalidParam)
	r.Cancel()
	require.False(t, r.Done())
}

// DeviceBuffer refuses a range that wraps around the address space (nil) instead of
// panicking.
func TestDeviceBufferWraps(t *testing.T) {
	require.Nil(t, DeviceBuffer(^uintptr(0)-4, 16))
	require.Len(t, DeviceBuffer(0x1000, 16), 16)
}

// Signals whose key's revocation timed out stay registered, and so do their words:
// Close says so and frees nothing, and a later Close, once the peer answered, does.
func TestSignalsCloseKeepsWordsWhileRegistered(t *testing.T) {
	old := revokeInProcess
	revokeInProcess = false // as between processes
	defer func() { revokeInProcess = old }()
	p := shmPairWith(t, WorkerParams{})
	p.ctxB.revokeTimeout = 100 * time.Millisecond
	sigs, err := p.b.NewSignals(hostBackend(t), 4)
	require.NoError(t, err)
	key, err := sigs.PackRkey()
	require.NoError(t, err)
	rk, err := p.epA.UnpackRkey(key)
	require.NoError(t, err)
	for range 1000 { // B learns of the import; then A stops progressing
		p.a.Progress()
		p.b.Progress()
	}
	err = sigs.Close()
	if err == nil {
		t.Skip("B did not learn of the import in time")
	}
	require.ErrorIs(t, err, ErrTimedOut)
	require.False(t, sigs.block.Closed(), "the words were freed while still registered")
	deadline := time.Now().Add(10 * time.Second)
	for err = sigs.Close(); err != nil && time.Now().Before(deadline); err = sigs.Close() {
		for range 100 {
			p.a.Progress()
			p.b.Progress()
		}
	}
	require.NoError(t, err)
	require.True(t, sigs.block.Closed())
	_ = rk.Close()
}

// Destroying a condition frees its completion word only once every stream given a
// wait on it (WaitOnStream) has passed it: another stream still behind other work when
// the operation completed and the condition was destroyed runs its wait, later work
// and all, instead of failing on a freed word. (KernelTriggered conditions the same.)
func TestDestroyWaitsForForeignStreams(t *testing.T) {
	p := newShmPair(t)
	b := hostBackend(t)
	for _, cat := range []condition.Category{condition.Stream, condition.KernelTriggered} {
		s1, err := b.NewStream()
		require.NoError(t, err)
		s2, err := b.NewStream()
		require.NoError(t, err)
		prm := condition.Param{Category: cat, Backend: b}
		if cat == condition.Stream {
			prm.Stream = s1
		}
		c, err := condition.Create(prm)
		require.NoError(t, err)
		buf := make([]byte, 8)
		req, err := p.b.TagRecvNbx(buf, 31, ^uint64(0), &RequestParam{Condition: c})
		require.NoError(t, err)
		gate := make(chan struct{})
		require.NoError(t, s2.LaunchHostFunc(func() { <-gate }))
		require.NoError(t, req.WaitOnStream(s2))
		ran := false
		require.NoError(t, s2.LaunchHostFunc(func() { ran = true }))
		if cat == condition.KernelTriggered {
			h, err := c.DeviceHandle()
			require.NoError(t, err)
			require.NoError(t, condition.Trigger(h))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		sr, err := p.epA.TagSendNbx([]byte("8 bytes!"), 31, nil)
		require.NoError(t, err)
		require.NoError(t, sr.Wait(ctx))
		require.NoError(t, req.Wait(ctx))
		cancel()
		require.NoError(t, c.Destroy(), "%v", cat)
		close(gate)
		require.NoError(t, s2.Synchronize(), "%v: the other stream's wait read a freed word", cat)
		require.True(t, ran, "%v", cat)
		require.NoError(t, s1.Close())
		require.NoError(t, s2.Close())
	}
}

// A nil or zero AmMessage (never delivered) answers every method without a panic:
// no data, RecvData refused with ErrInvalidParam.
func TestZeroAmMessage(t *testing.T) {
	for _, m := range []*AmMessage{nil, {}} {
		require.Nil(t, m.Data())
		require.Zero(t, m.Length())
		require.False(t, m.IsRendezvous())
		require.Nil(t, m.ReplyEndpoint())
		m.Retain()
		m.Release()
		_, err := m.RecvData(make([]byte, 8), nil)
		require.ErrorIs(t, err, ErrInvalidParam)
	}
}

// A worker made on a closed context fails with ErrClosed in an *OpError, as every ucp
// call's error is.
func TestNewWorkerOnClosedContext(t *testing.T) {
	c, err := NewContext(ContextParams{})
	require.NoError(t, err)
	require.NoError(t, c.Close())
	_, err = c.NewWorker(WorkerParams{})
	require.ErrorIs(t, err, ErrClosed)
	var oe *OpError
	require.ErrorAs(t, err, &oe)
}

// NewWorker racing its context's Close never touches a destroyed UCX worker: it either
// fails with ErrClosed or returns a worker the Close then closed.
func TestNewWorkerRacingContextClose(t *testing.T) {
	for i := range 50 {
		c, err := NewContext(ContextParams{})
		require.NoError(t, err)
		made := make(chan error, 1)
		go func() {
			w, err := c.NewWorker(WorkerParams{})
			if err == nil {
				err = w.Close() // nil, or ErrClosed if the context's Close got it first
				if errors.Is(err, ErrClosed) {
					err = nil
				}
			} else if errors.Is(err, ErrClosed) {
				err = nil
			}
			made <- err
		}()
		time.Sleep(time.Duration(i%5) * 50 * time.Microsecond)
		require.NoError(t, c.Close())
		require.NoError(t, <-made)
	}
}

// Closing an endpoint toward a peer that never progresses gives up after its timeout
// with ErrTimedOut (once, not twice the timeout), and the worker's Close afterwards
// releases UCX's close request: UCX asserted on it in ucp_worker_destroy (an abort).
func TestEndpointCloseTowardSilentPeer(t *testing.T) {
	cfg := map[string]string{"TLS": "tcp"}
	c1, err := NewContext(ContextParams{Config: cfg})
	require.NoError(t, err)
	defer c1.Close()
	c2, err := NewContext(ContextParams{Config: cfg})
	require.NoError(t, err)
	defer c2.Close()
	w1, err := c1.NewWorker(WorkerParams{})
	require.NoError(t, err)
	w2, err := c2.NewWorker(WorkerParams{}) // never progressed
	require.NoError(t, err)
	addr, err := w2.Address()
	require.NoError(t, err)
	ep, err := w1.ConnectAddress(addr, nil)
	require.NoError(t, err)
	for range 64 { // sends back up behind the silent peer
		if _, err := ep.TagSendNbx(make([]byte, 8), 1, nil); err != nil {
			break
		}
	}
	start := time.Now()
	err = ep.closeWith(false, 200*time.Millisecond)
	if err != nil {
		require.ErrorIs(t, err, ErrTimedOut)
		require.Less(t, time.Since(start), 2*time.Second)
	}
	require.NoError(t, w1.Close())
	require.NoError(t, w2.Close())
}

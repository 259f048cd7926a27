package ucp

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/stream"
)

// A request Callback that closes its worker, run on the worker's progress thread.
func TestCloseFromCallbackOnProgressThread(t *testing.T) {
	c, w, ep := selfLoop(t, WorkerParams{ProgressThread: true})
	res := make(chan error, 1)
	_, err := w.TagRecvNbx(make([]byte, 8), 1, ^uint64(0), &RequestParam{Callback: func(*Request) { res <- w.Close() }})
	require.NoError(t, err)
	_, err = ep.TagSendNbx([]byte("12345678"), 1, nil)
	require.NoError(t, err)
	select {
	case err := <-res:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Worker.Close from a callback on the progress thread hung") // (and c.Close would hang too)
	}
	require.NoError(t, c.Close())
}

// An active-message handler that closes its worker, run on the worker's progress
// thread.
func TestCloseFromAmHandlerOnProgressThread(t *testing.T) {
	c, w, ep := selfLoop(t, WorkerParams{ProgressThread: true})
	res := make(chan error, 1)
	require.NoError(t, w.SetAmHandler(7, func(*AmMessage) { res <- w.Close() }))
	_, err := ep.AmSendNbx(7, nil, []byte("12345678"), nil)
	require.NoError(t, err)
	select {
	case err := <-res:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Worker.Close from an active-message handler on the progress thread hung")
	}
	require.NoError(t, c.Close())
}

// A conditioned operation's Callback (run on the goroutine that ran the engine's
// round) closes the worker. While the stream waits for the operation its executor
// drives the rounds, and runs the callback most times; with NonBlockingEnqueue nothing
// waits, and the engine's goroutine runs it most times.
func TestCloseFromConditionedCallback(t *testing.T) {
	for i := range 40 {
		flags := NoImmediateCompletion
		if i%2 == 1 {
			flags |= NonBlockingEnqueue
		}
		c, w, ep := selfLoop(t, WorkerParams{})
		hb := stream.NewHostBackend()
		s, err := hb.NewStream()
		require.NoError(t, err)
		cond, err := condition.Create(condition.Param{Category: condition.Stream, Backend: hb, Stream: s})
		require.NoError(t, err)
		res := make(chan error, 1)
		rr, err := w.TagRecvNbx(make([]byte, 8), 1, ^uint64(0), nil)
		require.NoError(t, err)
		_, err = ep.TagSendNbx([]byte("12345678"), 1, &RequestParam{Condition: cond, Flags: flags,
			Callback: func(*Request) { res <- w.Close() }})
		require.NoError(t, err)
		go func() {
			for !rr.Done() {
				w.Progress()
			}
		}()
		select {
		case err := <-res:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("iteration %d: Worker.Close from a conditioned operation's callback hung", i)
		}
		require.NoError(t, cond.Destroy())
		require.NoError(t, s.Close())
		require.NoError(t, hb.Close())
		require.NoError(t, c.Close())
	}
}

// A callback that closes its worker leaves the callbacks due after it to run as they
// would have: each once, in retirement order, one at a time.
func TestCondCallbacksInOrderWhenClosedFromCallback(t *testing.T) {
	c, w, ep := selfLoop(t, WorkerParams{})
	t.Cleanup(func() { _ = c.Close() })
	hb := stream.NewHostBackend()
	s, err := hb.NewStream()
	require.NoError(t, err)
	cond, err := condition.Create(condition.Param{Category: condition.Stream, Backend: hb, Stream: s})
	require.NoError(t, err)
	// The stream holds the sends back until all are enqueued: the callback that closes
	// the worker must not run while the test still enqueues.
	gate := make(chan struct{})
	require.NoError(t, s.LaunchHostFunc(func() { <-gate }))
	const n, k = 64, 8
	var mu sync.Mutex
	counts := make([]int, n)
	var order []int
	closed := make(chan struct{})
	for i := range n {
		_, err := w.TagRecvNbx(make([]byte, 8), uint64(i), ^uint64(0), nil)
		require.NoError(t, err)
	}
	for i := range n {
		_, err := ep.TagSendNbx([]byte("12345678"), uint64(i), &RequestParam{Condition: cond,
			Flags: NoImmediateCompletion | NonBlockingEnqueue,
			Callback: func(*Request) {
				mu.Lock()
				counts[i]++
				order = append(order, i)
				mu.Unlock()
				if i == k {
					_ = w.Close()
					close(closed)
				}
			}})
		require.NoError(t, err)
	}
	close(gate)
	go func() {
		for {
			select {
			case <-closed:
				return
			default:
				w.Progress()
			}
		}
	}()
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Fatal("callback never ran")
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) == n
	}, 10*time.Second, time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for i, cnt := range counts {
		require.Equal(t, 1, cnt, "callback %d", i)
	}
	for j := 1; j < len(order); j++ {
		require.Greater(t, order[j], order[j-1], "callbacks out of retirement order: %v", order)
	}
	_ = cond.Destroy()
	_ = s.Close()
	_ = hb.Close()
	_ = c.Close()
}

// A callback run on the engine's goroutine may wait for another conditioned operation:
// it keeps driving the rounds that complete it rather than sleeping until they do. The
// operations are kernel-triggered, so the engine's goroutine runs their rounds (a
// callback run by a host stream's executor must not wait for work of that stream, as
// a CUDA host function must not).
func TestCondCallbackWaitsOnLaterOp(t *testing.T) {
	c, w, ep := selfLoop(t, WorkerParams{ProgressThread: true})
	defer c.Close()
	kc, trigger := kernelCondition(t)
	_, err := w.TagRecvNbx(make([]byte, 8), 1, ^uint64(0), nil)
	require.NoError(t, err)
	res, posted := make(chan error, 1), make(chan struct{})
	_, err = ep.TagSendNbx([]byte("12345678"), 1, &RequestParam{Condition: kc,
		Callback: func(*Request) {
			r2, err := w.TagRecvNbx(make([]byte, 8), 2, ^uint64(0), &RequestParam{Condition: kc})
			close(posted)
			if err != nil {
				res <- err
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			res <- r2.Wait(ctx)
		}})
	require.NoError(t, err)
	trigger()
	<-posted
	time.Sleep(300 * time.Millisecond) // the callback's Wait is past its spin
	trigger()
	_, err = ep.TagSendNbx([]byte("abcdefgh"), 2, nil)
	require.NoError(t, err)
	require.NoError(t, <-res, "the callback's Wait never saw its operation complete")
}

// A conditioned operation's Callback that panics is recovered (RecoveredPanics), as
// every user callback is, and the callbacks due after it still run.
func TestCondCallbackPanicRecovered(t *testing.T) {
	c, w, ep := selfLoop(t, WorkerParams{})
	defer c.Close()
	kc, trigger := kernelCondition(t)
	for tag := uint64(1); tag <= 2; tag++ {
		_, err := w.TagRecvNbx(make([]byte, 8), tag, ^uint64(0), nil)
		require.NoError(t, err)
	}
	_ = RecoveredPanics()
	ran := make(chan struct{})
	_, err := ep.TagSendNbx([]byte("12345678"), 1, &RequestParam{Condition: kc, Flags: NoImmediateCompletion,
		Callback: func(*Request) { panic("boom in a conditioned callback") }})
	require.NoError(t, err)
	r2, err := ep.TagSendNbx([]byte("12345678"), 2, &RequestParam{Condition: kc, Flags: NoImmediateCompletion,
		Callback: func(*Request) { close(ran) }})
	require.NoError(t, err)
	trigger()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, r2.Wait(ctx))
	select {
	case <-ran:
	case <-ctx.Done():
		t.Fatal("the callback after the panicking one did not run")
	}
	var found bool
	for _, e := range RecoveredPanics() {
		found = found || errors.Is(e, ErrPanic)
	}
	require.True(t, found, "the panic was recovered and kept")
}

// Worker.Close while a callback on the engine's goroutine waits for an operation whose
// trigger has not come: Close does not wait for that goroutine (it ends the operation
// itself, and the callback's Wait returns its error), so neither hangs.
func TestCloseWhileCallbackWaitsForUntriggeredOp(t *testing.T) {
	for i := range 10 {
		c, w, ep := selfLoop(t, WorkerParams{})
		hb := stream.NewHostBackend()
		s1, err := hb.NewStream()
		require.NoError(t, err)
		s2, err := hb.NewStream()
		require.NoError(t, err)
		gate := make(chan struct{})
		require.NoError(t, s2.LaunchHostFunc(func() { <-gate }))
		cond1, err := condition.Create(condition.Param{Category: condition.Stream, Backend: hb, Stream: s1})
		require.NoError(t, err)
		cond2, err := condition.Create(condition.Param{Category: condition.Stream, Backend: hb, Stream: s2})
		require.NoError(t, err)
		rB, err := w.TagRecvNbx(make([]byte, 8), 99, ^uint64(0), &RequestParam{Condition: cond2, Flags: NonBlockingEnqueue})
		require.NoError(t, err)
		rr, err := w.TagRecvNbx(make([]byte, 8), 1, ^uint64(0), nil)
		require.NoError(t, err)
		inCb := make(chan struct{})
		waited := make(chan error, 1)
		_, err = ep.TagSendNbx([]byte("12345678"), 1, &RequestParam{Condition: cond1,
			Flags:    NoImmediateCompletion | NonBlockingEnqueue,
			Callback: func(*Request) { close(inCb); waited <- rB.Wait(context.Background()) }})
		require.NoError(t, err)
		go func() {
			for !rr.Done() {
				w.Progress()
			}
		}()
		select {
		case <-inCb:
		case <-time.After(10 * time.Second):
			t.Fatalf("iteration %d: callback never ran", i)
		}
		time.Sleep(10 * time.Millisecond)
		closed := make(chan error, 1)
		go func() { closed <- w.Close() }()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatalf("iteration %d: Worker.Close hung while a callback waits for an operation Close ends", i)
		}
		select {
		case err := <-waited:
			require.Error(t, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("iteration %d: the callback's Wait never returned after Close", i)
		}
		close(gate)
		_ = cond1.Destroy()
		_ = cond2.Destroy()
		_ = s1.Close()
		_ = s2.Close()
		_ = hb.Close()
		_ = c.Close()
	}
}

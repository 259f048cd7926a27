package ucp

import (
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

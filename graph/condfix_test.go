package graph_test

// Regression tests of the condition package's side of graphs: Destroy of a graph
// condition whose operation a launch runs, a worker closed mid-launch, and a call
// refused under stream capture.

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/internal/testenv"
	"github.com/ucpx/ucpx/internal/testenv/streamenv"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// inFlightRecv builds [task] -> [recv] -> [dependent] on b, where the receive's node
// also sends a marker from b to a: its operations are issued together, the receive
// first, so once a has the marker the launch's receive is in flight. dependent records
// what the buffer held when it ran.
func inFlightRecv(t *testing.T, l *link, tag uint64) (g *graph.Host, recv *condition.Condition, in []byte, saw *atomic.Value) {
	t.Helper()
	g = graph.NewHost()
	task, err := g.AddTask(nil, func() error { return nil })
	require.NoError(t, err)
	in = []byte("--------")
	recv = recvNode(t, l, g, []condition.Node{task}, in, tag)
	_, err = l.ba.TagSendNbx([]byte("marker.."), tag+1, &ucp.RequestParam{Condition: recv})
	require.NoError(t, err)
	saw = new(atomic.Value)
	_, err = g.AddTask([]condition.Node{recv.WaitNode()}, func() error { saw.Store(string(in)); return nil })
	require.NoError(t, err)
	return g, recv, in, saw
}

// awaitMarker waits for the marker inFlightRecv's node sends when a launch issues it.
func awaitMarker(t *testing.T, ctx context.Context, l *link, tag uint64) {
	t.Helper()
	m := make([]byte, 8)
	r, err := l.a.TagRecvNbx(m, tag+1, ^uint64(0), nil)
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx), "the launch never issued its node's operations")
	require.Equal(t, "marker..", string(m))
}

// sendTag sends msg from a to b on tag and waits for the send to complete.
func sendTag(t *testing.T, ctx context.Context, l *link, tag uint64, msg string) {
	t.Helper()
	sr, err := l.ab.TagSendNbx([]byte(msg), tag, nil)
	require.NoError(t, err)
	require.NoError(t, sr.Wait(ctx))
}

// destroyOnceDone retries c.Destroy while it refuses with ErrBusy (an operation still
// in flight), and fails the test if it still refuses 20 s later.
func destroyOnceDone(t *testing.T, c *condition.Condition) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := c.Destroy()
		if err == nil {
			return
		}
		require.ErrorIs(t, err, condition.ErrBusy)
		require.True(t, time.Now().Before(deadline), "Destroy still refused 20 s after the message was sent: %v", err)
		time.Sleep(time.Millisecond)
	}
}

// Destroy of a graph condition while a launch node by node waits for its receive in
// flight refuses (ErrBusy) and changes nothing: the message that comes later completes
// that launch, and Destroy succeeds once the launch took the completion. Before,
// Destroy returned nil (the engine had taken the trigger and the completion word read
// 0), the launch stayed blocked, and the late message was written into the buffer after
// Destroy had succeeded.
func TestCondfixDestroyRefusedWhileLaunchWaits(t *testing.T) {
	l := newLink(t)
	const tag = 141
	g, recv, in, saw := inFlightRecv(t, l, tag)
	x, err := g.Instantiate()
	require.NoError(t, err)
	s, err := l.backend.NewStream()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	require.NoError(t, x.Launch(s))
	awaitMarker(t, ctx, l, tag)
	require.ErrorIs(t, recv.Destroy(), condition.ErrBusy, "Destroy with the launch's receive in flight")
	require.False(t, recv.Destroyed())
	require.Nil(t, saw.Load(), "the dependent task ran before the receive completed")

	sendTag(t, ctx, l, tag, "goodgood")
	require.NoError(t, syncErr(t, ctx, s), "the launch completes with the message")
	require.Equal(t, "goodgood", saw.Load())
	require.Equal(t, "goodgood", string(in))
	require.NoError(t, recv.Err())

	// The condition still works: a second launch, then Destroy once it is done.
	require.NoError(t, x.Launch(s))
	awaitMarker(t, ctx, l, tag)
	require.ErrorIs(t, recv.Destroy(), condition.ErrBusy)
	sendTag(t, ctx, l, tag, "again...")
	require.NoError(t, syncErr(t, ctx, s))
	require.Equal(t, "again...", saw.Load())
	endGraph(t, x, recv)
}

// A worker closed while a launch node by node waits for its receive fails the launch
// with ErrOperationFailed, and the receive's dependents do not run; later launches fail
// too instead of waiting. Before, Close canceled the receive, the engine completed the
// launch as one whose operation met an error (the completion word read 1), and the
// launch returned nil with its dependent task run on a buffer nothing had filled.
func TestCondfixWorkerCloseFailsNodeByNodeLaunch(t *testing.T) {
	l := newLink(t)
	const tag = 143
	g, recv, in, saw := inFlightRecv(t, l, tag)
	x, err := g.Instantiate()
	require.NoError(t, err)
	s, err := l.backend.NewStream()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	require.NoError(t, x.Launch(s))
	awaitMarker(t, ctx, l, tag)
	require.NoError(t, l.b.Close())
	err = syncErr(t, ctx, s)
	require.ErrorIs(t, err, graph.ErrOperationFailed, "a launch whose receive the worker's Close canceled")
	require.ErrorIs(t, err, graph.ErrClosed)
	require.Nil(t, saw.Load(), "the receive's dependent task ran")
	require.Equal(t, "--------", string(in))
	require.ErrorIs(t, recv.Err(), ucp.ErrCanceled)

	s2, err := l.backend.NewStream()
	require.NoError(t, err)
	require.NoError(t, x.Launch(s2))
	require.ErrorIs(t, syncErr(t, ctx, s2), graph.ErrOperationFailed, "a launch after the worker closed")
	require.Nil(t, saw.Load())
	require.NoError(t, x.Close())
	require.NoError(t, recv.Destroy())
}

// TestCondfixCaptureUnderFakeDriver runs the stream-capture test against the fake
// driver.
func TestCondfixCaptureUnderFakeDriver(t *testing.T) {
	testenv.RunUnderFakeDriver(t, []string{"TestCondfixFakeCaptureRefusedCall"})
}

// A tag receive refused under stream capture (a device buffer, with no
// ContextParams.Device to stage it through at every launch) leaves nothing in the
// captured graph, whose launch then completes. Before, the refused call left its
// graph condition's trigger store, completion wait and reset in the capture, and
// every launch of the graph waited for good.
func TestCondfixFakeCaptureRefusedCall(t *testing.T) {
	b := streamenv.CUDABackend(t)
	ctx, _, ok := stream.CUDAContext(b)
	require.True(t, ok)
	s, err := b.NewStream()
	require.NoError(t, err)
	cs, ok := stream.CUDAStream(s)
	require.True(t, ok)
	c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: s})
	require.NoError(t, err)
	uctx, err := ucp.NewContext(ucp.ContextParams{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, uctx.Close()) })
	w, err := uctx.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	dev, err := ctx.MemAlloc(4096)
	require.NoError(t, err)
	defer dev.Close()

	require.NoError(t, cs.BeginCapture(cuda.CaptureRelaxed))
	_, err = w.TagRecvNbx(ucp.DeviceBuffer(dev.Ptr(), 4096), 2, ^uint64(0), &ucp.RequestParam{Condition: c, MemoryType: ucp.MemoryCUDA})
	require.ErrorIs(t, err, ucp.ErrUnsupported, "a captured device receive with no device to stage through")
	g, err := cs.EndCapture()
	require.NoError(t, err)
	defer g.Close()
	nodes, err := g.Nodes()
	require.NoError(t, err)
	require.Empty(t, nodes, "the refused call left nodes in the captured graph")
	x, err := g.Instantiate(0)
	require.NoError(t, err)
	defer x.Close()
	require.NoError(t, x.Launch(cs))
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, syncErr(t, sctx, s)) // the captured graph's launch
	require.NoError(t, c.Destroy())
}

// A host-graph launch that fails while its receive is in flight (a task's error, or
// its stream's Close giving up on it) leaves the receive running: Destroy refuses
// (ErrBusy) until it completed, and succeeds then, without a relaunch; the message is
// in the buffer and the receive's dependent task did not run. Before, the completion
// word stayed stored with no launch to take it, and Destroy refused for good (only a
// relaunch, or closing the worker, let it go). A later launch fails with ErrClosed.
func TestCondfixDestroyAfterFailedLaunchCompleted(t *testing.T) {
	for _, cause := range []string{"task", "stream-close"} {
		t.Run(cause, func(t *testing.T) {
			l := newLink(t)
			const tag = 145
			g, recv, in, saw := inFlightRecv(t, l, tag)
			boom := errors.New("boom")
			release := make(chan struct{})
			var failed atomic.Bool // the task fails the first launch only
			if cause == "task" {
				_, err := g.AddTask(nil, func() error {
					<-release
					if failed.CompareAndSwap(false, true) {
						return boom
					}
					return nil
				})
				require.NoError(t, err)
			}
			x, err := g.Instantiate()
			require.NoError(t, err)
			backend := stream.NewHostBackend(stream.WithCloseGrace(50 * time.Millisecond))
			defer backend.Close()
			s, err := backend.NewStream()
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			require.NoError(t, x.Launch(s))
			awaitMarker(t, ctx, l, tag)
			if cause == "task" {
				close(release)
				require.ErrorIs(t, syncErr(t, ctx, s), boom)
			} else {
				require.ErrorIs(t, s.Close(), stream.ErrAbandoned)
			}
			require.Zero(t, x.InFlight())
			require.ErrorIs(t, recv.Destroy(), condition.ErrBusy, "Destroy with the failed launch's receive in flight")

			sendTag(t, ctx, l, tag, "late....")
			destroyOnceDone(t, recv)
			require.True(t, recv.Destroyed())
			require.Equal(t, "late....", string(in), "the receive's message")
			require.Nil(t, saw.Load(), "the dependent task of the failed launch ran")

			s2, err := l.backend.NewStream()
			require.NoError(t, err)
			defer s2.Close()
			require.NoError(t, x.Launch(s2))
			err = syncErr(t, ctx, s2)
			require.ErrorIs(t, err, graph.ErrClosed, "a launch after the condition was destroyed")
			require.NotErrorIs(t, err, graph.ErrInFlight)
			require.NoError(t, x.Close())
		})
	}
}

// A launch of a Split communication node that fails between its start node and its
// wait node (the compute between them fails) leaves the receive in flight with no
// wait node to take its completion: the completion is owed, as a waiting node's is.
// The next launch fails with ErrInFlight while the receive runs, and once it
// completed a launch takes it and then completes with its own message; or Destroy
// succeeds once it completed. Before, the next launch's wait node took the failed
// launch's completion for its own (its dependent read the old message, and its own
// receive stayed posted with no launch waiting), and Destroy refused for good.
func TestCondfixSplitLaunchFailedBeforeItsWaitOwesTheCompletion(t *testing.T) {
	for _, then := range []string{"relaunch", "destroy"} {
		t.Run(then, func(t *testing.T) {
			l := newLink(t)
			const tag = 147
			g := graph.NewHost()
			c := graphCondition(t, l, g, nil, true)
			in := []byte("--------")
			_, err := l.b.TagRecvNbx(in, tag, ^uint64(0), &ucp.RequestParam{Condition: c})
			require.NoError(t, err)
			_, err = l.ba.TagSendNbx([]byte("marker.."), tag+1, &ucp.RequestParam{Condition: c}) // issued after the receive
			require.NoError(t, err)
			boom := errors.New("boom")
			var fail atomic.Bool
			mid, err := g.AddTask([]condition.Node{c.Node()}, func() error {
				if fail.Load() {
					return boom
				}
				return nil
			})
			require.NoError(t, err)
			require.NoError(t, g.AddDependencies(mid, c.WaitNode()))
			saw := new(atomic.Value)
			_, err = g.AddTask([]condition.Node{c.WaitNode()}, func() error { saw.Store(string(in)); return nil })
			require.NoError(t, err)
			x, err := g.Instantiate()
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			send := func(msg string) { sendTag(t, ctx, l, tag, msg) }

			fail.Store(true)
			s, err := l.backend.NewStream()
			require.NoError(t, err)
			require.NoError(t, x.Launch(s))
			awaitMarker(t, ctx, l, tag)
			require.ErrorIs(t, syncErr(t, ctx, s), boom)
			fail.Store(false)
			require.ErrorIs(t, c.Destroy(), condition.ErrBusy, "Destroy with the failed launch's receive in flight")
			s, err = l.backend.NewStream()
			require.NoError(t, err)
			require.NoError(t, x.Launch(s))
			require.ErrorIs(t, syncErr(t, ctx, s), graph.ErrInFlight, "a launch with the failed launch's receive in flight")
			require.Nil(t, saw.Load())

			send("first...")
			if then == "destroy" {
				destroyOnceDone(t, c)
				require.Equal(t, "first...", string(in))
				require.Nil(t, saw.Load())
				require.NoError(t, x.Close())
				return
			}
			for {
				s, err := l.backend.NewStream()
				require.NoError(t, err)
				require.NoError(t, x.Launch(s))
				send("second..")
				err = syncErr(t, ctx, s)
				if !errors.Is(err, graph.ErrInFlight) {
					require.NoError(t, err)
					break
				}
				// The old receive's completion was not stored yet when the launch
				// began: it posted no receive, so take the message back.
				r, err := l.b.TagRecvNbx(make([]byte, 8), tag, ^uint64(0), nil)
				require.NoError(t, err)
				require.NoError(t, r.Wait(ctx))
				time.Sleep(time.Millisecond)
			}
			awaitMarker(t, ctx, l, tag)
			require.Equal(t, "second..", saw.Load(), "the launch's dependent read another launch's message")
			require.NoError(t, x.Close())
			require.NoError(t, c.Destroy())
		})
	}
}

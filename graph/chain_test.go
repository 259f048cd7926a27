package graph_test

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/trace"
	"github.com/ucpx/ucpx/ucp"
)

// relayGraph is B's relay: a graph receiving tag 1 into in (size bytes) and echoing it
// to A with tag 2.
func relayGraph(t *testing.T, l *link, size int) (in []byte, g *graph.Host, recv, echo *condition.Condition) {
	t.Helper()
	in = make([]byte, size)
	g = graph.NewHost()
	recv = recvNode(t, l, g, nil, in, 1)
	echo = sendNode(t, l, g, []condition.Node{recv.WaitNode()}, in, 2)
	return in, g, recv, echo
}

// launchable instantiates g and makes a host stream and a context (a minute) to launch
// it with.
func launchable(t *testing.T, l *link, g *graph.Host) (*graph.HostExec, stream.Stream, context.Context) {
	t.Helper()
	x, err := g.Instantiate()
	require.NoError(t, err)
	s, err := l.backend.NewStream()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return x, s, ctx
}

// launchOnce launches x once, with peer doing the other side, and checks the launch
// ran as a chain (the first of x): a later launch runs the chain at once.
func launchOnce(t *testing.T, ctx context.Context, x *graph.HostExec, s stream.Stream, peer func()) {
	t.Helper()
	require.NoError(t, x.Launch(s))
	peer()
	require.NoError(t, syncErr(t, ctx, s))
	require.Equal(t, uint64(1), graph.ChainedLaunches(x))
}

// receiverLaunched is B's graph of one receive (tag 1 into in, 8 bytes; req its
// Request), instantiated and launched once as a chain, so the next launch runs the
// chain at once.
func receiverLaunched(t *testing.T, l *link) (in []byte, recv *condition.Condition, req *ucp.Request, x *graph.HostExec, s stream.Stream, ctx context.Context) {
	t.Helper()
	in = make([]byte, 8)
	g := graph.NewHost()
	recv = graphCondition(t, l, g, nil, false)
	req, err := l.b.TagRecvNbx(in, 1, ^uint64(0), &ucp.RequestParam{Condition: recv})
	require.NoError(t, err)
	x, s, ctx = launchable(t, l, g)
	launchOnce(t, ctx, x, s, func() { pingB(t, ctx, l, 1) })
	return in, recv, req, x, s, ctx
}

// launchIntoReceive launches x and gives the launch the time to reach its receive,
// which waits for a message nobody sent yet.
func launchIntoReceive(t *testing.T, x *graph.HostExec, s stream.Stream) {
	t.Helper()
	require.NoError(t, x.Launch(s))
	time.Sleep(20 * time.Millisecond)
}

// echoFromA sends out from a with tag to b, receives the replies with replyTags at a
// and checks each is out; n times, out changing every time.
func echoFromA(t *testing.T, ctx context.Context, l *link, n int, tag uint64, replyTags ...uint64) {
	t.Helper()
	out := make([]byte, 64)
	got := make([]byte, 64)
	for k := range n {
		for i := range out {
			out[i] = byte(k*5 + i)
		}
		sr, err := l.ab.TagSendNbx(out, tag, nil)
		require.NoError(t, err)
		for _, rt := range replyTags {
			r, err := l.a.TagRecvNbx(got, rt, ^uint64(0), nil)
			require.NoError(t, err)
			require.NoError(t, r.Wait(ctx), "round %d tag %d", k, rt)
			require.Equal(t, out, got, "round %d tag %d", k, rt)
		}
		require.NoError(t, sr.Wait(ctx))
	}
}

// A graph of communication nodes only, in layers (B: recv -> two sends back), runs
// each launch as one completion chain: the sends leave from the receive's completion
// callback. 1000 launches, every reply checked; no node went through the engine.
func TestGraphLaunchesAsOneChain(t *testing.T) {
	l := newLink(t)
	const launches = 1000
	in, g, recv, echo := relayGraph(t, l, 64)
	again := sendNode(t, l, g, []condition.Node{recv.WaitNode()}, in, 3)
	x, s, ctx := launchable(t, l, g)
	for range launches {
		require.NoError(t, x.Launch(s))
	}
	echoFromA(t, ctx, l, launches, 1, 2, 3)
	require.NoError(t, syncErr(t, ctx, s))
	require.Equal(t, uint64(launches), graph.ChainedLaunches(x))
	require.Zero(t, graph.ChainedStarts(x))
	endGraph(t, x, recv, echo, again)
}

// All communication nodes, but not in layers: B's graph recv(1) -> send(2), and a root
// recv(3) that A satisfies only after it got send(2). As layers, send(2) would wait for
// recv(3), which waits for send(2): the graph must launch node by node, and does.
func TestGraphNotInLayersLaunchesNodeByNode(t *testing.T) {
	l := newLink(t)
	_, g, recv, echo := relayGraph(t, l, 64)
	late := recvNode(t, l, g, nil, make([]byte, 8), 3)
	x, s, ctx := launchable(t, l, g)
	for range 50 {
		require.NoError(t, x.Launch(s))
		echoFromA(t, ctx, l, 1, 1, 2)
		pingB(t, ctx, l, 3)
		require.NoError(t, syncErr(t, ctx, s))
	}
	require.Zero(t, graph.ChainedLaunches(x))
	endGraph(t, x, recv, echo, late)
}

// A chained launch whose receive fails (a message longer than its buffer) records
// the error in the receive's condition, runs the layer after it all the same and
// completes, as a launch node by node does; the next launch runs clean.
func TestGraphChainedLaunchOperationFails(t *testing.T) {
	l := newLink(t)
	_, g, recv, echo := relayGraph(t, l, 8)
	x, s, ctx := launchable(t, l, g)
	require.NoError(t, x.Launch(s))
	long, err := l.ab.TagSendNbx(make([]byte, 64), 1, nil)
	require.NoError(t, err)
	got := make([]byte, 8)
	r, err := l.a.TagRecvNbx(got, 2, ^uint64(0), nil)
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx), "the send after the failed receive ran")
	require.NoError(t, long.Wait(ctx))
	require.NoError(t, syncErr(t, ctx, s))
	require.ErrorIs(t, recv.Err(), ucp.ErrMessageTruncated)
	require.NoError(t, echo.Err())
	_ = recv.ClearErr()
	require.NoError(t, recv.Err())

	require.NoError(t, x.Launch(s))
	sr, err := l.ab.TagSendNbx([]byte("8 bytes!"), 1, nil)
	require.NoError(t, err)
	r, err = l.a.TagRecvNbx(got, 2, ^uint64(0), nil)
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
	require.NoError(t, sr.Wait(ctx))
	require.Equal(t, []byte("8 bytes!"), got)
	require.NoError(t, syncErr(t, ctx, s))
	require.Equal(t, uint64(2), graph.ChainedLaunches(x))
	endGraph(t, x, recv, echo)
}

// An operation enqueued on a condition after chained launches joins the next launch
// (the chain is made again), and a condition destroyed before a launch fails it with
// ErrClosed, as node by node.
func TestGraphChainFollowsItsConditions(t *testing.T) {
	l := newLink(t)
	_, g, recv, echo := relayGraph(t, l, 64)
	in2 := make([]byte, 64)
	x, s, ctx := launchable(t, l, g)
	launchOnce(t, ctx, x, s, func() { echoFromA(t, ctx, l, 1, 1, 2) })

	// recv gets a second receive, echo a second send.
	_, err := l.b.TagRecvNbx(in2, 11, ^uint64(0), &ucp.RequestParam{Condition: recv})
	require.NoError(t, err)
	_, err = l.ba.TagSendNbx(in2, 12, &ucp.RequestParam{Condition: echo})
	require.NoError(t, err)
	for k := range 3 {
		require.NoError(t, x.Launch(s))
		out2 := []byte{byte(k), 1, 2, 3, 4, 5, 6, 7}
		sr, err := l.ab.TagSendNbx(out2, 11, nil)
		require.NoError(t, err)
		echoFromA(t, ctx, l, 1, 1, 2)
		got := make([]byte, 64)
		r, err := l.a.TagRecvNbx(got, 12, ^uint64(0), nil)
		require.NoError(t, err)
		require.NoError(t, r.Wait(ctx))
		require.NoError(t, sr.Wait(ctx))
		require.Equal(t, out2, got[:8], "launch %d: the added operations ran", k)
		require.NoError(t, syncErr(t, ctx, s))
	}
	require.Equal(t, uint64(4), graph.ChainedLaunches(x), "the chain was made again at once")

	require.NoError(t, echo.Destroy())
	require.NoError(t, x.Launch(s))
	echoFromA(t, ctx, l, 0, 1) // nothing: the launch fails before or at echo
	sr, err := l.ab.TagSendNbx(make([]byte, 64), 1, nil)
	require.NoError(t, err)
	sr2, err := l.ab.TagSendNbx(make([]byte, 8), 11, nil)
	require.NoError(t, err)
	require.ErrorIs(t, syncErr(t, ctx, s), graph.ErrClosed)
	require.NoError(t, sr.Wait(ctx))
	require.NoError(t, sr2.Wait(ctx))
	require.Equal(t, uint64(4), graph.ChainedLaunches(x))
	endGraph(t, x, recv)
}

// Launches of one chained graph on two streams at once take turns: every launch runs
// whole, the replies all arrive, and nothing races (go test -race).
func TestGraphChainedLaunchesOnTwoStreams(t *testing.T) {
	l := newLink(t)
	const launches = 200
	_, g, recv, echo := relayGraph(t, l, 64)
	x, err := g.Instantiate()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var streams []stream.Stream
	for range 2 {
		s, err := l.backend.NewStream()
		require.NoError(t, err)
		streams = append(streams, s)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range launches / 2 {
				if err := x.Launch(s); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	// Both streams' launches receive into one buffer: only the count is checked.
	got := make([]byte, 64)
	for k := range launches {
		sr, err := l.ab.TagSendNbx(make([]byte, 64), 1, nil)
		require.NoError(t, err)
		r, err := l.a.TagRecvNbx(got, 2, ^uint64(0), nil)
		require.NoError(t, err)
		require.NoError(t, r.Wait(ctx), "reply %d", k)
		require.NoError(t, sr.Wait(ctx))
	}
	for _, s := range streams {
		require.NoError(t, syncErr(t, ctx, s))
	}
	// Each launch ran as the chain, or node by node (its echo started by the engine).
	require.Equal(t, uint64(launches), graph.ChainedLaunches(x)+graph.ChainedStarts(x))
	endGraph(t, x, recv, echo)
}

// Closing the worker after chained launches: the next launch fails (ErrOperationFailed,
// matching ErrClosed) instead of waiting forever.
func TestGraphChainedLaunchAfterWorkerClose(t *testing.T) {
	l := newLink(t)
	_, g, recv, echo := relayGraph(t, l, 64)
	x, s, ctx := launchable(t, l, g)
	launchOnce(t, ctx, x, s, func() { echoFromA(t, ctx, l, 1, 1, 2) })
	require.NoError(t, l.b.Close())
	require.NoError(t, x.Launch(s))
	require.ErrorIs(t, syncErr(t, ctx, s), graph.ErrOperationFailed)
	require.NoError(t, x.Close())
	_ = recv.Destroy()
	_ = echo.Destroy()
}

// An executable graph dropped without Close releases its launch chain (whose C side
// would otherwise live as long as the worker), and the graph's conditions still run
// in another executable graph of the same graph.
func TestGraphDroppedExecReleasesItsChain(t *testing.T) {
	l := newLink(t)
	_, g, recv, echo := relayGraph(t, l, 64)
	held, s, ctx := func() (func() bool, stream.Stream, context.Context) {
		x, s, ctx := launchable(t, l, g)
		launchOnce(t, ctx, x, s, func() { echoFromA(t, ctx, l, 1, 1, 2) })
		return graph.ChainHeld(x), s, ctx
	}()
	require.True(t, held(), "the launch made its chain")
	deadline := time.Now().Add(10 * time.Second)
	for held() && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	require.False(t, held(), "the dropped executable graph's chain was not released")

	x, err := g.Instantiate()
	require.NoError(t, err)
	launchOnce(t, ctx, x, s, func() { echoFromA(t, ctx, l, 1, 1, 2) })
	endGraph(t, x, recv, echo)
}

// Destroying a condition while a chained launch runs its operation is refused
// (ErrBusy), as while a launch runs it node by node; once the launch is done it
// succeeds. (Should the Destroy come before the launch started, the launch fails with
// ErrClosed and nothing is received: checked too.)
func TestGraphChainedLaunchRefusesDestroy(t *testing.T) {
	l := newLink(t)
	in, recv, _, x, s, ctx := receiverLaunched(t, l)

	launchIntoReceive(t, x, s)
	err := recv.Destroy()
	if err == nil {
		t.Log("Destroy came before the launch started")
		require.ErrorIs(t, syncErr(t, ctx, s), graph.ErrClosed)
		require.NoError(t, x.Close())
		return
	}
	require.ErrorIs(t, err, condition.ErrBusy)
	copy(in, "--------")
	sr, err := l.ab.TagSendNbx([]byte("8 bytes!"), 1, nil)
	require.NoError(t, err)
	require.NoError(t, sr.Wait(ctx))
	require.NoError(t, syncErr(t, ctx, s))
	require.Equal(t, []byte("8 bytes!"), in)
	endGraph(t, x, recv)
}

// Graphs in layers that cannot run as a chain launch node by node, and correctly: the
// engine of a traced worker (a chain records no timelines), and a node whose operation
// a chain cannot hold (a flush).
func TestGraphUnchainableLaunchesNodeByNode(t *testing.T) {
	for _, tc := range []string{"traced", "flush"} {
		t.Run(tc, func(t *testing.T) {
			l := newLink(t)
			if tc == "traced" {
				require.NoError(t, l.b.Trace(trace.NewRecorder()))
			}
			in := make([]byte, 64)
			g := graph.NewHost()
			recv := recvNode(t, l, g, nil, in, 1)
			echo := sendNode(t, l, g, []condition.Node{recv.WaitNode()}, in, 2)
			conds := []*condition.Condition{recv, echo}
			if tc == "flush" {
				c := graphCondition(t, l, g, []condition.Node{recv.WaitNode()}, false)
				_, err := l.ba.FlushNbx(&ucp.RequestParam{Condition: c})
				require.NoError(t, err)
				conds = append(conds, c)
			}
			x, s, ctx := launchable(t, l, g)
			for range 20 {
				require.NoError(t, x.Launch(s))
				echoFromA(t, ctx, l, 1, 1, 2)
				require.NoError(t, syncErr(t, ctx, s))
			}
			require.Zero(t, graph.ChainedLaunches(x))
			require.Equal(t, uint64(20*(len(conds)-1)), graph.ChainedStarts(x))
			endGraph(t, x, conds...)
			if tc == "traced" {
				require.NoError(t, l.b.Trace(nil))
			}
		})
	}
}

// A launch node by node of one graph while another graph launches as a chain on the
// same worker: making the chain again (an operation of the other graph was added)
// must not take the other graph's operations from the engine's queue outside a round
// (before, the other graph's launch hung for good at its second iteration).
func TestGraphChainBesideNodeByNodeGraph(t *testing.T) {
	l := newLink(t)
	const launches = 200
	// G1 (chained): B receives tag 1 and echoes tag 2.
	_, g1, recv, echo := relayGraph(t, l, 64)
	x1, s1, ctx := launchable(t, l, g1)
	done := make(chan error, 1)
	go func() {
		for range launches {
			if err := x1.Launch(s1); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	// G2 (node by node: a task first) made and launched meanwhile, from B to A.
	var conds []*condition.Condition
	for k := range 20 {
		g2 := graph.NewHost()
		task, err := g2.AddTask(nil, func() error { return nil })
		require.NoError(t, err)
		c := graphCondition(t, l, g2, []condition.Node{task}, false)
		_, err = l.ba.TagSendNbx([]byte{byte(k), 0, 0, 0, 0, 0, 0, 0}, 9, &ucp.RequestParam{Condition: c})
		require.NoError(t, err)
		conds = append(conds, c)
		x2, err := g2.Instantiate()
		require.NoError(t, err)
		s2, err := l.backend.NewStream()
		require.NoError(t, err)
		got := make([]byte, 8)
		r, err := l.a.TagRecvNbx(got, 9, ^uint64(0), nil)
		require.NoError(t, err)
		require.NoError(t, x2.Launch(s2))
		require.NoError(t, r.Wait(ctx), "graph %d", k)
		require.Equal(t, byte(k), got[0])
		require.NoError(t, syncErr(t, ctx, s2))
		require.NoError(t, x2.Close())
		require.NoError(t, s2.Close())
	}
	echoFromA(t, ctx, l, launches, 1, 2)
	require.NoError(t, <-done)
	require.NoError(t, syncErr(t, ctx, s1))
	require.NotZero(t, graph.ChainedLaunches(x1))
	endGraph(t, x1, recv, echo)
	for _, c := range conds {
		require.NoError(t, c.Err())
		require.NoError(t, c.Destroy())
	}
}

// Closing the endpoint of a chained launch's send while the launch waits in its
// receive: as node by node, the receive gets its message, the send fails with
// ErrClosed (recorded in its condition, never posted on the closed endpoint), and the
// launch completes.
func TestGraphChainedLaunchEndpointClosed(t *testing.T) {
	l := newLink(t)
	in, g, recv, echo := relayGraph(t, l, 64)
	x, s, ctx := launchable(t, l, g)
	launchOnce(t, ctx, x, s, func() { echoFromA(t, ctx, l, 1, 1, 2) })

	launchIntoReceive(t, x, s)
	require.NoError(t, l.ba.Close())
	sr, err := l.ab.TagSendNbx([]byte("8 bytes!"), 1, nil)
	require.NoError(t, err)
	require.NoError(t, sr.Wait(ctx))
	require.NoError(t, syncErr(t, ctx, s))
	require.Equal(t, []byte("8 bytes!"), in[:8], "the receive got its message")
	require.NoError(t, recv.Err())
	require.ErrorIs(t, echo.Err(), ucp.ErrClosed)
	require.NoError(t, x.Close())
	require.NoError(t, recv.Destroy())
	require.NoError(t, echo.Destroy())
}

// Canceling a chained launch's pending receive (its Request) ends it as node by node:
// the receive completes with ErrCanceled, recorded in its condition, and the launch
// completes.
func TestGraphChainedLaunchCancel(t *testing.T) {
	l := newLink(t)
	_, c, req, x, s, ctx := receiverLaunched(t, l)

	launchIntoReceive(t, x, s)
	// Canceled until it takes: a Cancel before the launch posted its receive (a slow
	// machine) finds nothing to cancel, as node by node.
	stop := make(chan struct{})
	go func() {
		for {
			req.Cancel()
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	err := syncErr(t, ctx, s)
	close(stop)
	require.NoError(t, err)
	require.ErrorIs(t, c.Err(), ucp.ErrCanceled)
	require.NoError(t, x.Close())
	require.NoError(t, c.Destroy())
}

// The worker closing while a chained launch waits in its receive fails the launch
// (ErrOperationFailed, matching ErrClosed) instead of leaving it waiting.
func TestGraphChainedLaunchWorkerClosedMidRun(t *testing.T) {
	l := newLink(t)
	_, recv, _, x, s, ctx := receiverLaunched(t, l)

	launchIntoReceive(t, x, s)
	require.NoError(t, l.b.Close())
	err := syncErr(t, ctx, s)
	require.ErrorIs(t, err, graph.ErrOperationFailed)
	require.ErrorIs(t, err, graph.ErrClosed)
	if graph.ChainedLaunches(x) != 2 {
		t.Log("the worker closed before the launch reached its receive (node by node)")
	}
	require.NoError(t, x.Close())
	_ = recv.Destroy()
}

package graph_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

type link struct {
	a, b     *ucp.Worker
	ab, ba   *ucp.Endpoint
	backend  stream.Backend
	contexts []*ucp.Context
}

func newLink(t testing.TB) *link { return newLinkWith(t, ucp.ContextParams{}) }

// newLinkWith is newLink with both contexts made with params.
func newLinkWith(t testing.TB, params ucp.ContextParams) *link {
	t.Helper()
	l := &link{backend: stream.NewHostBackend()}
	ws := make([]*ucp.Worker, 2)
	for i := range ws {
		c, err := ucp.NewContext(params)
		require.NoError(t, err)
		l.contexts = append(l.contexts, c)
		ws[i], err = c.NewWorker(ucp.WorkerParams{})
		require.NoError(t, err)
	}
	l.a, l.b = ws[0], ws[1]
	aa, _ := l.a.Address()
	ba, _ := l.b.Address()
	var err error
	l.ab, err = l.a.ConnectAddress(ba, &ucp.EndpointParams{NoPeerErrorHandling: true})
	require.NoError(t, err)
	l.ba, err = l.b.ConnectAddress(aa, &ucp.EndpointParams{NoPeerErrorHandling: true})
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, c := range l.contexts {
			require.NoError(t, c.Close())
		}
		_ = l.backend.Close()
	})
	return l
}

// graphCondition adds a communication node for one operation to g.
func graphCondition(t *testing.T, l *link, g *graph.Host, deps []condition.Node, split bool) *condition.Condition {
	t.Helper()
	c, err := condition.Create(condition.Param{Category: condition.Graph, Backend: l.backend, Graph: g, Deps: deps, Split: split})
	require.NoError(t, err)
	return c
}

// recvNode adds a communication node receiving tag into buf at b, after deps.
func recvNode(t *testing.T, l *link, g *graph.Host, deps []condition.Node, buf []byte, tag uint64) *condition.Condition {
	t.Helper()
	c := graphCondition(t, l, g, deps, false)
	_, err := l.b.TagRecvNbx(buf, tag, ^uint64(0), &ucp.RequestParam{Condition: c})
	require.NoError(t, err)
	return c
}

// sendNode adds a communication node sending buf with tag from b to a, after deps.
func sendNode(t *testing.T, l *link, g *graph.Host, deps []condition.Node, buf []byte, tag uint64) *condition.Condition {
	t.Helper()
	c := graphCondition(t, l, g, deps, false)
	_, err := l.ba.TagSendNbx(buf, tag, &ucp.RequestParam{Condition: c})
	require.NoError(t, err)
	return c
}

// endGraph checks that no condition met an error, closes x and destroys the conditions.
func endGraph(t *testing.T, x *graph.HostExec, conds ...*condition.Condition) {
	t.Helper()
	for _, c := range conds {
		require.NoError(t, c.Err())
	}
	require.NoError(t, x.Close())
	for _, c := range conds {
		require.NoError(t, c.Destroy())
	}
}

// pingB sends 8 bytes with tag from a to b and waits for the send.
func pingB(t *testing.T, ctx context.Context, l *link, tag uint64) {
	t.Helper()
	sr, err := l.ab.TagSendNbx(make([]byte, 8), tag, nil)
	require.NoError(t, err)
	require.NoError(t, sr.Wait(ctx))
}

// syncErr is s.Synchronize's error; the test fails if ctx ends first (a hung launch).
func syncErr(t *testing.T, ctx context.Context, s stream.Stream) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- s.Synchronize() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		require.FailNow(t, "the launch hung")
		return nil
	}
}

// A sender graph [fill -> send] and a receiver graph [recv -> check], each instantiated
// once and launched 1000 times, with the data verified at every launch.
func TestGraphConditionRelaunch(t *testing.T) {
	l := newLink(t)
	const launches = 1000
	out := make([]byte, 4096)
	in := make([]byte, 4096)
	var launch uint64

	sg := graph.NewHost()
	fill, _ := sg.AddTask(nil, func() error {
		launch++
		for i := range out {
			out[i] = byte(launch + uint64(i))
		}
		return nil
	})
	send := graphCondition(t, l, sg, []condition.Node{fill}, false)
	_, err := l.ab.TagSendNbx(out, 9, &ucp.RequestParam{Condition: send})
	require.NoError(t, err)

	rg := graph.NewHost()
	recv := graphCondition(t, l, rg, nil, false)
	_, err = l.b.TagRecvNbx(in, 9, ^uint64(0), &ucp.RequestParam{Condition: recv})
	require.NoError(t, err)
	var checked atomic.Int64
	_, err = rg.AddTask([]condition.Node{recv.Node()}, func() error {
		n := uint64(checked.Add(1))
		for i := range in {
			if in[i] != byte(n+uint64(i)) {
				return fmt.Errorf("launch %d: byte %d is %d, want %d", n, i, in[i], byte(n+uint64(i)))
			}
		}
		return nil
	})
	require.NoError(t, err)

	launchPair(t, l, sg, rg, send, recv, launches, &checked)
}

// launchPair instantiates a sender and a receiver graph, launches both launches times
// (the receiver first; each sender launch finished before the next, which refills its
// buffer), checks that the receiver's check task ran every time (checked) and that
// neither condition met an error, and ends both graphs and conditions.
func launchPair(t *testing.T, l *link, sg, rg *graph.Host, send, recv *condition.Condition, launches int, checked *atomic.Int64) {
	t.Helper()
	sx, err := sg.Instantiate()
	require.NoError(t, err)
	rx, err := rg.Instantiate()
	require.NoError(t, err)
	ss, err := l.backend.NewStream()
	require.NoError(t, err)
	rs, err := l.backend.NewStream()
	require.NoError(t, err)
	start := time.Now()
	for i := 0; i < launches; i++ {
		require.NoError(t, rx.Launch(rs))
		require.NoError(t, sx.Launch(ss))
		require.NoError(t, ss.Synchronize())
	}
	require.NoError(t, rs.Synchronize())
	t.Logf("%d launches in %v", launches, time.Since(start))
	require.Equal(t, int64(launches), checked.Load())
	require.NoError(t, send.Err())
	require.NoError(t, recv.Err())
	require.NoError(t, sx.Close())
	require.NoError(t, rx.Close())
	require.NoError(t, send.Destroy())
	require.NoError(t, recv.Destroy())
}

// Split start/wait nodes with a compute task between them: the compute runs while the
// receive is posted, and the node after the wait sees the data.
func TestGraphConditionSplitWithCompute(t *testing.T) {
	l := newLink(t)
	in := make([]byte, 64)
	g := graph.NewHost()
	recv := graphCondition(t, l, g, nil, true)
	_, err := l.b.TagRecvNbx(in, 3, ^uint64(0), &ucp.RequestParam{Condition: recv})
	require.NoError(t, err)
	var computed atomic.Bool
	compute, err := g.AddTask([]condition.Node{recv.Node()}, func() error {
		computed.Store(true)
		return nil
	})
	require.NoError(t, err)
	var seen []byte
	_, err = g.AddTask([]condition.Node{compute, recv.WaitNode()}, func() error {
		seen = append([]byte(nil), in...)
		return nil
	})
	require.NoError(t, err)
	require.NotSame(t, recv.Node(), recv.WaitNode())
	x, err := g.Instantiate()
	require.NoError(t, err)
	s, err := l.backend.NewStream()
	require.NoError(t, err)
	require.NoError(t, x.Launch(s))
	// The compute node runs although the message has not been sent yet.
	require.Eventually(t, computed.Load, 5*time.Second, time.Millisecond)
	msg := make([]byte, 64)
	binary.LittleEndian.PutUint64(msg, 0xfeed)
	sr, err := l.ab.TagSendNbx(msg, 3, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, sr.Wait(ctx))
	require.NoError(t, s.Synchronize())
	require.Equal(t, msg, seen)
	require.NoError(t, x.Close())
	require.NoError(t, recv.Destroy())
}

// A graph holding 256 communication nodes (128 sends, 128 receives), launched 20 times.
func TestGraphWith256CommunicationNodes(t *testing.T) {
	l := newLink(t)
	const pairs = 128
	g := graph.NewHost()
	root, _ := g.AddEmpty(nil)
	var launch atomic.Uint64
	outs := make([][]byte, pairs)
	ins := make([][]byte, pairs)
	fill, _ := g.AddTask([]condition.Node{root}, func() error {
		n := launch.Add(1)
		for i := range outs {
			binary.LittleEndian.PutUint64(outs[i], n<<16|uint64(i))
		}
		return nil
	})
	var conds []*condition.Condition
	var waits []condition.Node
	for i := 0; i < pairs; i++ {
		outs[i], ins[i] = make([]byte, 8), make([]byte, 8)
		rc := graphCondition(t, l, g, []condition.Node{root}, false)
		_, err := l.b.TagRecvNbx(ins[i], uint64(i), ^uint64(0), &ucp.RequestParam{Condition: rc})
		require.NoError(t, err)
		sc := graphCondition(t, l, g, []condition.Node{fill}, false)
		_, err = l.ab.TagSendNbx(outs[i], uint64(i), &ucp.RequestParam{Condition: sc})
		require.NoError(t, err)
		conds = append(conds, rc, sc)
		waits = append(waits, rc.Node(), sc.Node())
	}
	_, err := g.AddTask(waits, func() error {
		n := launch.Load()
		for i := range ins {
			if got := binary.LittleEndian.Uint64(ins[i]); got != n<<16|uint64(i) {
				return fmt.Errorf("launch %d pair %d: got %#x", n, i, got)
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 2+2*pairs+1, g.Len())
	x, err := g.Instantiate()
	require.NoError(t, err)
	s, err := l.backend.NewStream()
	require.NoError(t, err)
	for i := 0; i < 20; i++ {
		require.NoError(t, x.Launch(s))
	}
	require.NoError(t, s.Synchronize())
	require.NoError(t, x.Close())
	for _, c := range conds {
		require.NoError(t, c.Err())
		require.NoError(t, c.Destroy())
	}
}

// Closing the worker makes later launches fail instead of waiting forever.
func TestGraphLaunchAfterWorkerClose(t *testing.T) {
	l := newLink(t)
	g := graph.NewHost()
	c := graphCondition(t, l, g, nil, false)
	_, err := l.b.TagRecvNbx(make([]byte, 8), 1, ^uint64(0), &ucp.RequestParam{Condition: c})
	require.NoError(t, err)
	x, err := g.Instantiate()
	require.NoError(t, err)
	require.NoError(t, l.b.Close())
	s, err := l.backend.NewStream()
	require.NoError(t, err)
	require.NoError(t, x.Launch(s))
	done := make(chan error, 1)
	go func() { done <- s.Synchronize() }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, graph.ErrOperationFailed)
	case <-time.After(10 * time.Second):
		require.FailNow(t, "launch after worker close hung")
	}
	require.ErrorIs(t, c.Err(), ucp.ErrCanceled)
	require.NoError(t, c.Destroy())
}

// One communication node carrying several operations: a sender node with 8 sends and
// a receiver node with the 8 receives, relaunched 200 times, every message verified at
// every launch; the node completes only after all its operations did.
func TestGraphConditionSeveralOperations(t *testing.T) {
	l := newLink(t)
	const ops, launches, size = 8, 200, 512
	var launch uint64
	outs, ins := make([][]byte, ops), make([][]byte, ops)
	for i := range outs {
		outs[i], ins[i] = make([]byte, size), make([]byte, size)
	}
	sg := graph.NewHost()
	fill, _ := sg.AddTask(nil, func() error {
		launch++
		for k, out := range outs {
			for i := range out {
				out[i] = byte(launch*7 + uint64(k*31+i))
			}
		}
		return nil
	})
	send := graphCondition(t, l, sg, []condition.Node{fill}, false)
	rg := graph.NewHost()
	recv := graphCondition(t, l, rg, nil, false)
	sendReqs := make([]*ucp.Request, ops)
	for k := 0; k < ops; k++ {
		var err error
		sendReqs[k], err = l.ab.TagSendNbx(outs[k], uint64(100+k), &ucp.RequestParam{Condition: send})
		require.NoError(t, err)
		_, err = l.b.TagRecvNbx(ins[k], uint64(100+k), ^uint64(0), &ucp.RequestParam{Condition: recv})
		require.NoError(t, err)
	}
	var checked atomic.Int64
	_, err := rg.AddTask([]condition.Node{recv.Node()}, func() error {
		n := uint64(checked.Add(1))
		for k, in := range ins {
			for i := range in {
				if want := byte(n*7 + uint64(k*31+i)); in[i] != want {
					return fmt.Errorf("launch %d, message %d: byte %d is %d, want %d", n, k, i, in[i], want)
				}
			}
		}
		return nil
	})
	require.NoError(t, err)
	launchPair(t, l, sg, rg, send, recv, launches, &checked)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, r := range sendReqs { // every operation's request ends with the condition
		require.NoError(t, r.Wait(ctx))
	}
}

// Nodes whose only dependency is a communication node start in the engine's round that
// completes it (stream.Follower), chains of them too, and a node with a second
// dependency still waits for it. B's graph: recv -> echo -> tail (both chained), and
// recv + fill -> late, where fill writes late's buffer from what recv got: a late send
// started at recv's completion would carry the previous launch's bytes.
func TestGraphChainedNodesStartInTheEngine(t *testing.T) {
	l := newLink(t)
	const launches = 1000
	in, late := make([]byte, 64), make([]byte, 64)
	g := graph.NewHost()
	recv := recvNode(t, l, g, nil, in, 1)
	echo := sendNode(t, l, g, []condition.Node{recv.WaitNode()}, in, 2)
	tail := sendNode(t, l, g, []condition.Node{echo.WaitNode()}, in, 3)
	fill, err := g.AddTask([]condition.Node{recv.WaitNode()}, func() error {
		for i := range late {
			late[i] = ^in[i]
		}
		return nil
	})
	require.NoError(t, err)
	lateC := sendNode(t, l, g, []condition.Node{recv.WaitNode(), fill}, late, 4)
	x, err := g.Instantiate()
	require.NoError(t, err)
	s, err := l.backend.NewStream()
	require.NoError(t, err)
	for range launches {
		require.NoError(t, x.Launch(s))
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := make([]byte, 64)
	got := make([][]byte, 3)
	for i := range got {
		got[i] = make([]byte, 64)
	}
	for n := range launches {
		for i := range out {
			out[i] = byte(n*7 + i)
		}
		sr, err := l.ab.TagSendNbx(out, 1, nil)
		require.NoError(t, err)
		for k, tag := range []uint64{2, 3, 4} {
			r, err := l.a.TagRecvNbx(got[k], tag, ^uint64(0), nil)
			require.NoError(t, err)
			require.NoError(t, r.Wait(ctx), "launch %d tag %d", n, tag)
		}
		require.NoError(t, sr.Wait(ctx))
		require.Equal(t, out, got[0], "launch %d: echo", n)
		require.Equal(t, out, got[1], "launch %d: tail", n)
		for i := range out {
			require.Equal(t, ^out[i], got[2][i], "launch %d: late byte %d", n, i)
		}
	}
	require.NoError(t, s.Synchronize())
	// echo and tail, every launch; late has two dependencies and runs from the launch.
	require.Equal(t, uint64(2*launches), graph.ChainedStarts(x))
	endGraph(t, x, recv, echo, tail, lateC)
}

// A node that would start in the engine but whose condition was destroyed fails the
// launch (ErrClosed), as its own trigger task would, instead of leaving it waiting.
func TestGraphChainedNodeDestroyedFailsTheLaunch(t *testing.T) {
	l := newLink(t)
	in := make([]byte, 8)
	g := graph.NewHost()
	recv := recvNode(t, l, g, nil, in, 1)
	echo := sendNode(t, l, g, []condition.Node{recv.WaitNode()}, in, 2)
	x, err := g.Instantiate()
	require.NoError(t, err)
	require.NoError(t, echo.Destroy())
	s, err := l.backend.NewStream()
	require.NoError(t, err)
	require.NoError(t, x.Launch(s))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pingB(t, ctx, l, 1)
	require.ErrorIs(t, syncErr(t, ctx, s), graph.ErrClosed)
	require.Equal(t, uint64(1), graph.ChainedStarts(x))
	require.NoError(t, recv.Err())
	require.NoError(t, x.Close())
	require.NoError(t, recv.Destroy())
}

// A launch that reaches a communication node whose condition carries no operation
// fails with ErrNoOperation (ErrInvalidParam) instead of waiting forever, split or
// not, chained or not; the graph launches fine once the operations are enqueued.
func TestGraphNodeWithoutOperationFailsTheLaunch(t *testing.T) {
	l := newLink(t)
	for _, tc := range []struct {
		name           string
		split, chained bool
	}{{"node", false, false}, {"split", true, false}, {"chained", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			g := graph.NewHost()
			var deps []condition.Node
			var first *condition.Condition
			in := make([]byte, 8)
			if tc.chained {
				first = recvNode(t, l, g, nil, in, 5)
				deps = []condition.Node{first.WaitNode()}
			}
			empty := graphCondition(t, l, g, deps, tc.split)
			x, err := g.Instantiate()
			require.NoError(t, err)
			s, err := l.backend.NewStream()
			require.NoError(t, err)
			require.NoError(t, x.Launch(s))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if tc.chained {
				pingB(t, ctx, l, 5)
			}
			err = syncErr(t, ctx, s)
			require.ErrorIs(t, err, graph.ErrNoOperation)
			require.ErrorIs(t, err, graph.ErrInvalidParam)
			_ = s.Close() // returns the launch's error again (the stream's sticky error)
			// With its operation enqueued the same graph launches.
			out := []byte("8 bytes!")
			_, err = l.ab.TagSendNbx(out, 6, &ucp.RequestParam{Condition: empty})
			require.NoError(t, err)
			got := make([]byte, 8)
			r, err := l.b.TagRecvNbx(got, 6, ^uint64(0), nil)
			require.NoError(t, err)
			s2, err := l.backend.NewStream()
			require.NoError(t, err)
			require.NoError(t, x.Launch(s2))
			if tc.chained {
				pingB(t, ctx, l, 5)
			}
			require.NoError(t, syncErr(t, ctx, s2))
			require.NoError(t, r.Wait(ctx))
			require.Equal(t, out, got)
			require.NoError(t, s2.Close())
			require.NoError(t, x.Close())
			require.NoError(t, empty.Destroy())
			if first != nil {
				require.NoError(t, first.Destroy())
			}
		})
	}
}

// A follower whose operation is on another worker (another engine) is started too: the
// engine that completes the first node stores its trigger and kicks its engine after
// the round (or the launch's own rounds of that engine do). The graph: recv at b -> a
// send from a (to b); 200 launches, every forwarded message checked, the forward
// chained at every launch.
func TestGraphChainedNodeOnAnotherEngine(t *testing.T) {
	l := newLink(t)
	const launches = 200
	in, fwd := make([]byte, 8), make([]byte, 8)
	g := graph.NewHost()
	recv := recvNode(t, l, g, nil, in, 1)
	fwdC := graphCondition(t, l, g, []condition.Node{recv.WaitNode()}, false)
	_, err := l.ab.TagSendNbx(fwd, 3, &ucp.RequestParam{Condition: fwdC})
	require.NoError(t, err)
	x, err := g.Instantiate()
	require.NoError(t, err)
	s, err := l.backend.NewStream()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got := make([]byte, 8)
	for n := range launches {
		for i := range fwd {
			fwd[i] = byte(n + 3*i)
		}
		require.NoError(t, x.Launch(s))
		r, err := l.b.TagRecvNbx(got, 3, ^uint64(0), nil)
		require.NoError(t, err)
		pingB(t, ctx, l, 1)
		require.NoError(t, r.Wait(ctx), "launch %d", n)
		require.Equal(t, fwd, got, "launch %d", n)
		require.NoError(t, syncErr(t, ctx, s))
	}
	require.Equal(t, uint64(launches), graph.ChainedStarts(x))
	endGraph(t, x, recv, fwdC)
}

// A launch that fails while a communication node waits leaves its operation in flight;
// the operation's completion must not be taken by a later launch for its own. Later
// launches fail with ErrInFlight until it completed, then run and see their own data
// (before, the next launch completed at once with the old message and every launch
// after it was one completion off).
func TestGraphLaunchAfterFailedLaunchWithNodeInFlight(t *testing.T) {
	l := newLink(t)
	in, echo := make([]byte, 8), make([]byte, 8)
	g := graph.NewHost()
	recv := recvNode(t, l, g, nil, in, 7)
	fwd := sendNode(t, l, g, []condition.Node{recv.WaitNode()}, in, 8) // chained
	boom := errors.New("boom")
	var fail atomic.Bool
	_, err := g.AddTask(nil, func() error {
		if fail.Load() {
			return boom
		}
		return nil
	})
	require.NoError(t, err)
	x, err := g.Instantiate()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	send := func(v byte) {
		sr, err := l.ab.TagSendNbx(bytes.Repeat([]byte{v}, 8), 7, nil)
		require.NoError(t, err)
		require.NoError(t, sr.Wait(ctx))
	}
	echoed := func() byte {
		r, err := l.a.TagRecvNbx(echo, 8, ^uint64(0), nil)
		require.NoError(t, err)
		require.NoError(t, r.Wait(ctx))
		return echo[0]
	}

	fail.Store(true)
	s1, err := l.backend.NewStream()
	require.NoError(t, err)
	require.NoError(t, x.Launch(s1))
	require.ErrorIs(t, syncErr(t, ctx, s1), boom)
	fail.Store(false)

	s2, err := l.backend.NewStream()
	require.NoError(t, err)
	require.NoError(t, x.Launch(s2))
	require.ErrorIs(t, syncErr(t, ctx, s2), graph.ErrInFlight, "a launch took the failed launch's receive")

	// The failed launch's receive gets its message (and its chained forward runs).
	send(1)
	require.Equal(t, byte(1), echoed())
	for v := byte(2); v < 6; v++ {
		s, err := l.backend.NewStream()
		require.NoError(t, err)
		for {
			require.NoError(t, x.Launch(s))
			send(v)
			err = syncErr(t, ctx, s)
			if !errors.Is(err, graph.ErrInFlight) {
				break
			}
			// The old receive's completion was not stored yet when the launch began:
			// it posted no receive, so take the message back and launch again.
			r, err := l.b.TagRecvNbx(make([]byte, 8), 7, ^uint64(0), nil)
			require.NoError(t, err)
			require.NoError(t, r.Wait(ctx))
			_ = s.Close()
			s, err = l.backend.NewStream()
			require.NoError(t, err)
		}
		require.NoError(t, err, "launch %d", v)
		require.Equal(t, bytes.Repeat([]byte{v}, 8), in, "launch %d received", v)
		require.Equal(t, v, echoed(), "launch %d forwarded", v)
		require.NoError(t, s.Close())
	}
	endGraph(t, x, recv, fwd)
}

// A failed launch owes no completion of a follower whose trigger no engine can store:
// one armed on a node whose condition was destroyed (the root of the relay) or armed
// after a destroyed follower (the middle of it). Every launch fails with the real
// cause, ErrClosed, and so does a fresh executable graph of the Host; before, the first
// launch failed with ErrClosed and every later one, of any executable graph of the
// Host, with ErrInFlight for good.
func TestGraphDestroyedNodeOwesNoFollower(t *testing.T) {
	for _, destroyed := range []string{"root", "middle"} {
		t.Run(destroyed, func(t *testing.T) {
			l := newLink(t)
			in := make([]byte, 8)
			g := graph.NewHost()
			task, err := g.AddTask(nil, func() error { return nil })
			require.NoError(t, err)
			// task -> recv -> fwd -> tail, the last two chained to the node before.
			recv := recvNode(t, l, g, []condition.Node{task}, in, 48)
			fwd := sendNode(t, l, g, []condition.Node{recv.WaitNode()}, in, 49)
			tail := sendNode(t, l, g, []condition.Node{fwd.WaitNode()}, in, 50)
			x, err := g.Instantiate()
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			got := make([]byte, 8)
			relayed := func(tag uint64) {
				r, err := l.a.TagRecvNbx(got, tag, ^uint64(0), nil)
				require.NoError(t, err)
				require.NoError(t, r.Wait(ctx))
			}
			// One good launch: the nodes' engine is attached to their words.
			s, err := l.backend.NewStream()
			require.NoError(t, err)
			require.NoError(t, x.Launch(s))
			pingB(t, ctx, l, 48)
			relayed(49)
			relayed(50)
			require.NoError(t, syncErr(t, ctx, s))

			gone, kept := recv, []*condition.Condition{fwd, tail}
			if destroyed == "middle" {
				gone, kept = fwd, []*condition.Condition{recv, tail}
			}
			require.NoError(t, gone.Destroy())
			launch := func(x *graph.HostExec, k int) {
				t.Helper()
				s, err := l.backend.NewStream()
				require.NoError(t, err)
				require.NoError(t, x.Launch(s))
				if destroyed == "middle" {
					pingB(t, ctx, l, 48) // the receive runs; the forward fails
				}
				err = syncErr(t, ctx, s)
				require.ErrorIs(t, err, graph.ErrClosed, "launch %d", k)
				require.NotErrorIs(t, err, graph.ErrInFlight, "launch %d", k)
			}
			for k := range 3 {
				launch(x, k)
			}
			require.NoError(t, x.Close())
			x2, err := g.Instantiate()
			require.NoError(t, err)
			launch(x2, 3)
			require.NoError(t, x2.Close())
			for _, c := range kept {
				require.NoError(t, c.Err())
				require.NoError(t, c.Destroy())
			}
		})
	}
}

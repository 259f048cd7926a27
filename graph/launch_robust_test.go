package graph_test

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/stream"
)

// A task that calls runtime.Goexit (t.FailNow in a test's task) fails its launch with
// ErrTaskPanicked, as a panic does, instead of leaving the launch waiting for good.
func TestHostGraphTaskGoexit(t *testing.T) {
	g := graph.NewHost()
	_, err := g.AddTask(nil, func() error { runtime.Goexit(); return nil })
	require.NoError(t, err)
	x, err := g.Instantiate()
	require.NoError(t, err)
	s := hostStream(t)
	require.NoError(t, x.Launch(s))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.ErrorIs(t, syncErr(t, ctx, s), graph.ErrTaskPanicked)
	require.NoError(t, x.Close())
}

// Launches of a graph with a communication node, overlapping on two streams, all
// complete: they share the node's words, and run one at a time, also when they are
// launches of two executable graphs of the graph. (Two runs storing the trigger
// together got one operation, and one waited for good.)
func TestHostGraphOverlappingLaunchesOnTwoStreams(t *testing.T) {
	l := newLink(t)
	g := graph.NewHost()
	task, err := g.AddTask(nil, func() error { return nil })
	require.NoError(t, err)
	recv := recvNode(t, l, g, []condition.Node{task}, make([]byte, 64), 5)
	x, err := g.Instantiate()
	require.NoError(t, err)
	x2, err := g.Instantiate()
	require.NoError(t, err)
	const perStream = 50
	var ss [2]stream.Stream
	for i := range ss {
		ss[i], err = l.backend.NewStream()
		require.NoError(t, err)
		defer ss[i].Close()
	}
	for range perStream {
		require.NoError(t, x.Launch(ss[0]))
		require.NoError(t, x.Launch(ss[1]))
		require.NoError(t, x2.Launch(ss[1]))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for range 3 * perStream {
		pingB(t, ctx, l, 5)
	}
	for _, s := range ss {
		require.NoError(t, syncErr(t, ctx, s))
	}
	require.Zero(t, x.InFlight())
	require.NoError(t, x2.Close())
	endGraph(t, x, recv)
}

// A launch that begins after its stream's Close was called, behind other work, and
// then waits (here: not at all, its message is there) gets a grace of its own: Close
// drains it like any queued work instead of failing it at random.
func TestHostGraphLaunchAfterCloseDrains(t *testing.T) {
	l := newLink(t)
	g := graph.NewHost()
	recv := recvNode(t, l, g, nil, make([]byte, 8), 12)
	x, err := g.Instantiate()
	require.NoError(t, err)
	quick := stream.NewHostBackend(stream.WithCloseGrace(5 * time.Millisecond))
	defer quick.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for range 20 {
		s, err := quick.NewStream()
		require.NoError(t, err)
		pingB(t, ctx, l, 12)
		require.NoError(t, s.LaunchHostFunc(func() { time.Sleep(30 * time.Millisecond) }))
		require.NoError(t, x.Launch(s))
		require.NoError(t, s.Close())
	}
	require.Zero(t, x.InFlight())
	endGraph(t, x, recv)
}

// A launch its stream dropped (the stream stopped on an earlier launch's failure, or
// its Close abandoned it) is not in flight: the executable graph closes.
func TestHostGraphDroppedLaunchesAreNotInFlight(t *testing.T) {
	g := graph.NewHost()
	_, err := g.AddTask(nil, func() error { time.Sleep(10 * time.Millisecond); return errors.New("boom") })
	require.NoError(t, err)
	x, err := g.Instantiate()
	require.NoError(t, err)
	s := hostStream(t)
	require.NoError(t, x.Launch(s))
	require.NoError(t, x.Launch(s)) // queued behind the one that fails: dropped
	require.Error(t, s.Synchronize())
	require.Zero(t, x.InFlight())
	require.NoError(t, x.Close())

	// Abandoned by Close: behind a wait nobody answers.
	b := stream.NewHostBackend(stream.WithCloseGrace(10 * time.Millisecond))
	defer b.Close()
	s2, err := b.NewStream()
	require.NoError(t, err)
	words, err := b.AllocWords(1)
	require.NoError(t, err)
	defer words.Close()
	require.NoError(t, s2.WaitValue(words.Word(0), 1, stream.GEQ))
	x2, err := g.Instantiate()
	require.NoError(t, err)
	require.NoError(t, x2.Launch(s2))
	require.ErrorIs(t, s2.Close(), stream.ErrAbandoned)
	require.Zero(t, x2.InFlight())
	require.NoError(t, x2.Close())
}

// Closing a host stream whose graph launch waits for a message nobody sends returns
// after the stream's close grace (ErrAbandoned), as for a blocked stream wait; the
// operation stays in flight for the next launch to settle, and the message, once
// sent, lets the graph launch again.
func TestHostGraphLaunchAbandonedByClose(t *testing.T) {
	for _, chained := range []bool{false, true} {
		l := newLink(t)
		g := graph.NewHost()
		deps := []condition.Node(nil)
		if !chained { // a task first: the graph launches node by node
			task, err := g.AddTask(nil, func() error { return nil })
			require.NoError(t, err)
			deps = []condition.Node{task}
		}
		recv := recvNode(t, l, g, deps, make([]byte, 8), 11)
		x, err := g.Instantiate()
		require.NoError(t, err)
		quick := stream.NewHostBackend(stream.WithCloseGrace(50 * time.Millisecond))
		defer quick.Close()
		s, err := quick.NewStream()
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if chained { // the first launch makes the chain
			launchOnce(t, ctx, x, s, func() { pingB(t, ctx, l, 11) })
		}
		require.NoError(t, x.Launch(s))
		time.Sleep(20 * time.Millisecond)
		closed := make(chan error, 1)
		go func() { closed <- s.Close() }()
		select {
		case err := <-closed:
			require.ErrorIs(t, err, stream.ErrAbandoned, "chained %v", chained)
		case <-time.After(20 * time.Second):
			t.Fatalf("Close hung on a launch waiting for a message (chained %v)", chained)
		}
		require.Zero(t, x.InFlight())

		s2, err := l.backend.NewStream()
		require.NoError(t, err)
		defer s2.Close()
		pingB(t, ctx, l, 11) // for the receive in flight (node by node) or a new one
		pingB(t, ctx, l, 11)
		var last error
		for range 10 { // the receive left in flight settles, then a launch completes
			require.NoError(t, x.Launch(s2))
			if last = syncErr(t, ctx, s2); last == nil {
				break
			}
			require.ErrorIs(t, last, graph.ErrInFlight, "chained %v", chained)
			s2, err = l.backend.NewStream()
			require.NoError(t, err)
			defer s2.Close()
			time.Sleep(10 * time.Millisecond)
		}
		require.NoError(t, last, "chained %v", chained)
		require.NoError(t, x.Close())
		_ = recv.Destroy()
	}
}

package graph_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/testenv"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/stream"
)

func hostStream(t *testing.T) stream.Stream {
	t.Helper()
	b := stream.NewHostBackend()
	t.Cleanup(func() { _ = b.Close() })
	s, err := b.NewStream()
	require.NoError(t, err)
	return s
}

// A diamond runs in dependency order at every launch.
func TestHostGraphOrderAndRelaunch(t *testing.T) {
	g := graph.NewHost()
	var mu sync.Mutex
	var order []string
	task := func(name string) func() error {
		return func() error {
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			return nil
		}
	}
	a, err := g.AddTask(nil, task("a"))
	require.NoError(t, err)
	b, err := g.AddTask([]condition.Node{a}, task("b"))
	require.NoError(t, err)
	c, err := g.AddTask([]condition.Node{a}, task("c"))
	require.NoError(t, err)
	d, err := g.AddTask([]condition.Node{b}, task("d"))
	require.NoError(t, err)
	require.NoError(t, g.AddDependencies(c, d))
	x, err := g.Instantiate()
	require.NoError(t, err)
	s := hostStream(t)
	const launches = 100
	for i := 0; i < launches; i++ {
		require.NoError(t, x.Launch(s))
	}
	require.NoError(t, s.Synchronize())
	require.Len(t, order, 4*launches)
	for i := 0; i < launches; i++ {
		run := order[4*i : 4*i+4]
		require.Equal(t, "a", run[0], "launch %d", i)
		require.Equal(t, "d", run[3], "launch %d", i)
		require.ElementsMatch(t, []string{"b", "c"}, run[1:3])
	}
	require.NoError(t, x.Close())
	require.ErrorIs(t, x.Close(), graph.ErrClosed)
	require.ErrorIs(t, x.Launch(s), graph.ErrClosed)
}

func TestHostGraphFailureStopsDependents(t *testing.T) {
	g := graph.NewHost()
	boom := errors.New("boom")
	a, _ := g.AddTask(nil, func() error { return boom })
	var ran atomic.Bool
	_, _ = g.AddTask([]condition.Node{a}, func() error { ran.Store(true); return nil })
	x, err := g.Instantiate()
	require.NoError(t, err)
	s := hostStream(t)
	require.NoError(t, x.Launch(s))
	err = s.Synchronize()
	require.ErrorIs(t, err, boom)
	require.False(t, ran.Load())
}

func TestHostGraphCycleAndBadInput(t *testing.T) {
	g := graph.NewHost()
	a, _ := g.AddEmpty(nil)
	b, _ := g.AddEmpty([]condition.Node{a})
	require.NoError(t, g.AddDependencies(b, a))
	_, err := g.Instantiate()
	require.ErrorIs(t, err, graph.ErrCycle)
	_, err = g.AddTask(nil, nil)
	require.ErrorIs(t, err, graph.ErrInvalidParam)
	other := graph.NewHost()
	c, _ := other.AddEmpty(nil)
	_, err = g.AddTask([]condition.Node{c}, func() error { return nil })
	require.ErrorIs(t, err, graph.ErrInvalidParam)
	require.ErrorIs(t, g.AddDependencies(a, a), graph.ErrInvalidParam)
	require.NoError(t, g.Close())
	_, err = g.AddEmpty(nil)
	require.ErrorIs(t, err, graph.ErrClosed)
}

// Closing an executable graph with a launch in flight is refused, without hanging.
func TestHostGraphCloseWithLaunchInFlight(t *testing.T) {
	g := graph.NewHost()
	release := make(chan struct{})
	_, _ = g.AddTask(nil, func() error { <-release; return nil })
	x, err := g.Instantiate()
	require.NoError(t, err)
	s := hostStream(t)
	require.NoError(t, x.Launch(s))
	time.Sleep(10 * time.Millisecond)
	done := make(chan error, 1)
	go func() { done <- x.Close() }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, graph.ErrInFlight)
	case <-time.After(5 * time.Second):
		require.FailNow(t, "Close hung on a launch in flight")
	}
	close(release)
	require.NoError(t, s.Synchronize())
	require.NoError(t, x.Close())
}

// Launches of one executable graph on several streams at once each run the whole DAG
// in dependency order with state of their own (launches reuse their scratch): in a
// diamond a -> {b, c} -> d, no d runs before the b and c of as many launches, and every
// node runs once per launch.
func TestHostGraphConcurrentLaunches(t *testing.T) {
	g := graph.NewHost()
	var na, nb, nc, nd atomic.Int64
	var bad atomic.Int64
	pause := func(n int64) {
		if n%3 == 0 {
			time.Sleep(time.Duration(n%7) * time.Microsecond)
		}
	}
	a, err := g.AddTask(nil, func() error { pause(na.Add(1)); return nil })
	require.NoError(t, err)
	b, err := g.AddTask([]condition.Node{a}, func() error {
		if nb.Add(1) > na.Load() {
			bad.Add(1)
		}
		return nil
	})
	require.NoError(t, err)
	c, err := g.AddTask([]condition.Node{a}, func() error {
		n := nc.Add(1)
		pause(n)
		if n > na.Load() {
			bad.Add(1)
		}
		return nil
	})
	require.NoError(t, err)
	_, err = g.AddTask([]condition.Node{b, c}, func() error {
		if n := nd.Add(1); n > nb.Load() || n > nc.Load() {
			bad.Add(1)
		}
		return nil
	})
	require.NoError(t, err)
	x, err := g.Instantiate()
	require.NoError(t, err)
	const streams, launches = 4, 250
	ss := make([]stream.Stream, streams)
	for i := range ss {
		ss[i] = hostStream(t)
	}
	for i := 0; i < launches; i++ {
		for _, s := range ss {
			require.NoError(t, x.Launch(s))
		}
	}
	synced := make(chan error, streams)
	for _, s := range ss {
		go func() { synced <- s.Synchronize() }()
	}
	for range ss {
		select {
		case err := <-synced:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			require.FailNow(t, "launches hung", "d ran %d of %d times", nd.Load(), streams*launches)
		}
	}
	const total = streams * launches
	require.Zero(t, bad.Load(), "a node ran ahead of its dependencies")
	require.EqualValues(t, total, na.Load())
	require.EqualValues(t, total, nb.Load())
	require.EqualValues(t, total, nc.Load())
	require.EqualValues(t, total, nd.Load())
	require.NoError(t, x.Close())
}

// A failed launch leaves nothing behind for later launches of the same executable
// graph (they reuse its scratch): after a launch whose root failed, a launch on another
// stream runs every node once, in order.
func TestHostGraphLaunchAfterFailedLaunch(t *testing.T) {
	g := graph.NewHost()
	boom := errors.New("boom")
	var fail atomic.Bool
	var ranA, ranB, ranC atomic.Int64
	a, err := g.AddTask(nil, func() error {
		ranA.Add(1)
		if fail.Load() {
			return boom
		}
		return nil
	})
	require.NoError(t, err)
	slow, err := g.AddTask(nil, func() error { time.Sleep(time.Millisecond); ranC.Add(1); return nil })
	require.NoError(t, err)
	_, err = g.AddTask([]condition.Node{a, slow}, func() error {
		if ranA.Load() != ranC.Load() {
			return errors.New("ran before its dependencies")
		}
		ranB.Add(1)
		return nil
	})
	require.NoError(t, err)
	x, err := g.Instantiate()
	require.NoError(t, err)

	fail.Store(true)
	s1 := hostStream(t)
	require.NoError(t, x.Launch(s1))
	require.ErrorIs(t, s1.Synchronize(), boom)
	require.EqualValues(t, 0, ranB.Load(), "a dependent of the failed node ran")
	require.EqualValues(t, 1, ranC.Load(), "the launch ended before its running task")

	fail.Store(false)
	s2 := hostStream(t)
	for range 50 {
		require.NoError(t, x.Launch(s2))
	}
	require.NoError(t, s2.Synchronize())
	require.EqualValues(t, 51, ranA.Load())
	require.EqualValues(t, 51, ranC.Load())
	require.EqualValues(t, 50, ranB.Load())
	require.NoError(t, x.Close())
}

// The HostExec of a failed Instantiate is nil: its methods report that.
func TestNilHostExec(t *testing.T) {
	var x *graph.HostExec
	require.ErrorIs(t, x.Launch(hostStream(t)), graph.ErrInvalidParam)
	require.Zero(t, x.InFlight())
	require.ErrorIs(t, x.Close(), graph.ErrInvalidParam)
	testenv.NilMethods(t, (*graph.Host)(nil), (*graph.HostExec)(nil))
}

// A zero HostExec (declared, not made by Instantiate) answers Launch with
// ErrInvalidParam and enqueues nothing (its Launch dereferenced a nil function);
// its Close succeeds once, then returns ErrClosed.
func TestZeroHostExec(t *testing.T) {
	var x graph.HostExec
	s := hostStream(t)
	require.ErrorIs(t, x.Launch(s), graph.ErrInvalidParam)
	require.NoError(t, s.Synchronize(), "the refused launch enqueued something")
	require.Zero(t, x.InFlight())
	require.NoError(t, x.Close())
	require.ErrorIs(t, x.Close(), graph.ErrClosed)
	require.ErrorIs(t, x.Launch(s), graph.ErrInvalidParam)
	// A zero node is of no graph.
	g := graph.NewHost()
	var n graph.HostNode
	_, err := g.AddTask([]condition.Node{&n}, func() error { return nil })
	require.ErrorIs(t, err, graph.ErrInvalidParam)
}

// liveAndFreedWords allocates two word blocks of two words on b: live, for the
// caller to close, and freed, already closed.
func liveAndFreedWords(t *testing.T, b stream.Backend) (live, freed *stream.WordBlock) {
	t.Helper()
	live, err := b.AllocWords(2)
	require.NoError(t, err)
	freed, err = b.AllocWords(2)
	require.NoError(t, err)
	require.NoError(t, freed.Close())
	return live, freed
}

// AddSignalNodes (condition.GraphBuilder, exported) refuses words no launch could use
// at the call: nil words and one word as both (ErrInvalidParam), words of a freed
// block (ErrClosed). They were accepted, and every launch then failed at the node.
func TestHostAddSignalNodesRefusesBadWords(t *testing.T) {
	b := stream.NewHostBackend()
	defer b.Close()
	live, freed := liveAndFreedWords(t, b)
	defer live.Close()
	g := graph.NewHost()
	for _, split := range []bool{false, true} {
		for _, tc := range []struct {
			name          string
			trigger, done *stream.Word
			want          error
		}{
			{"nil words", nil, nil, graph.ErrInvalidParam},
			{"nil trigger", nil, live.Word(1), graph.ErrInvalidParam},
			{"nil completion", live.Word(0), nil, graph.ErrInvalidParam},
			{"out-of-range word", live.Word(0), live.Word(2), graph.ErrInvalidParam},
			{"one word as both", live.Word(0), live.Word(0), graph.ErrInvalidParam},
			{"freed words", freed.Word(0), freed.Word(1), graph.ErrClosed},
			{"freed completion", live.Word(0), freed.Word(1), graph.ErrClosed},
		} {
			start, wait, err := g.AddSignalNodes(nil, tc.trigger, tc.done, split)
			require.ErrorIs(t, err, tc.want, "%s (split %v)", tc.name, split)
			require.Nil(t, start)
			require.Nil(t, wait)
		}
	}
	require.Zero(t, g.Len(), "a refused call added nodes")
	start, wait, err := g.AddSignalNodes(nil, live.Word(0), live.Word(1), true)
	require.NoError(t, err)
	require.NotNil(t, start)
	require.NotNil(t, wait)
}

// A nil *Host (a typed nil behind condition.GraphBuilder too) answers ErrInvalidParam.
func TestNilHost(t *testing.T) {
	var g *graph.Host
	_, err := g.AddTask(nil, func() error { return nil })
	require.ErrorIs(t, err, graph.ErrInvalidParam)
	_, err = g.AddEmpty(nil)
	require.ErrorIs(t, err, graph.ErrInvalidParam)
	require.Zero(t, g.Len())
	require.ErrorIs(t, g.Close(), graph.ErrInvalidParam)
	_, err = g.Instantiate()
	require.ErrorIs(t, err, graph.ErrInvalidParam)
	b := stream.NewHostBackend()
	defer b.Close()
	_, err = condition.Create(condition.Param{Category: condition.Graph, Backend: b, Graph: g})
	require.ErrorIs(t, err, graph.ErrInvalidParam)
}

// A host graph, its executable, a node and a Graph condition answer zero arguments
// with errors, open and closed; so do a zero HostExec and a zero Host.
func TestHandlesTakeZeroArguments(t *testing.T) {
	for _, closed := range []bool{false, true} {
		b := stream.NewHostBackend()
		g := graph.NewHost()
		n, err := g.AddEmpty(nil)
		require.NoError(t, err)
		_, err = g.AddTask([]condition.Node{n}, func() error { return nil })
		require.NoError(t, err)
		c, err := condition.Create(condition.Param{Category: condition.Graph, Backend: b, Graph: g})
		require.NoError(t, err)
		x, err := g.Instantiate()
		require.NoError(t, err)
		handles := []any{g, x, n, c, &graph.HostExec{}, &graph.Host{}}
		if !closed {
			testenv.ZeroArgs(t, map[string]bool{"Close": true, "Destroy": true}, handles...)
			testenv.ExtremeArgs(t, map[string]bool{"Close": true, "Destroy": true}, handles...)
		}
		require.NoError(t, x.Close())
		require.NoError(t, c.Destroy())
		require.NoError(t, g.Close())
		require.NoError(t, b.Close())
		require.NoError(t, handles[4].(*graph.HostExec).Close())
		require.NoError(t, handles[5].(*graph.Host).Close())
		if closed {
			testenv.ZeroArgs(t, nil, handles...)
		}
	}
}

// Enqueuing a launch allocates nothing (no closure per launch): a loop of launches
// makes no garbage for the collector to chase beside the communication.
func TestHostLaunchAllocatesNothing(t *testing.T) {
	b := stream.NewHostBackend()
	defer b.Close()
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	g := graph.NewHost()
	n, err := g.AddEmpty(nil)
	require.NoError(t, err)
	_, err = g.AddEmpty([]condition.Node{n})
	require.NoError(t, err)
	x, err := g.Instantiate()
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(1000, func() {
		if err := x.Launch(s); err != nil {
			t.Fatal(err)
		}
	})
	require.NoError(t, s.Synchronize())
	require.Zero(t, allocs, "allocations per launch")
	require.NoError(t, x.Close())
}

package graph_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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

package graph_test

import (
	"context"
	"os"
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

// TestCUDAFakeDriver runs the CUDA graph tests against the CPU emulation of the
// driver (cgo/cuda/testdata/fakecuda) where there is no GPU.
func TestCUDAFakeDriver(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a child process against the fake driver")
	}
	testenv.RunUnderFakeDriver(t, []string{"TestCUDAAdoptedTwiceSharesTheChain", "TestCUDASignalNodesRefuseBadWords",
		"TestCUDAFailedConditionDestroyedAfterLaunch", "TestCUDASignalNodesRefusedWaitLeavesTheGraph"})
}

// newCUDAGraph opens a CUDA backend and makes a graph on its context, both closed
// once the test and its defers are done (the graph first). It skips or fails as
// testenv.RequireGPU does.
func newCUDAGraph(t *testing.T) (stream.Backend, *cuda.Context, *cuda.Graph) {
	t.Helper()
	b := streamenv.CUDABackend(t)
	ctx, _, ok := stream.CUDAContext(b)
	require.True(t, ok)
	cg, err := ctx.NewGraph()
	require.NoError(t, err)
	t.Cleanup(func() { _ = cg.Close() })
	return b, ctx, cg
}

// The completion nodes of one CUgraph form one chain whichever wrapper adds them: two
// AdoptCUDA of a graph used in turn, a wrapper closed meanwhile, the graph adopted
// again once every wrapper closed. Before, the chain was kept per wrapper, so each
// adoption started a chain of its own (independent memop waits, each holding a
// hardware queue while it waits: with enough of them, a graph hung on a GPU). A closed
// wrapper answers ErrClosed (its second Close too); a graph of its own has its own
// chain.
func TestCUDAAdoptedTwiceSharesTheChain(t *testing.T) {
	b, ctx, owner := newCUDAGraph(t)
	a1, err := graph.AdoptCUDA(owner.Handle(), b)
	require.NoError(t, err)
	a2, err := graph.AdoptCUDA(owner.Handle(), b)
	require.NoError(t, err)
	var conds []*condition.Condition
	defer func() {
		for _, c := range conds {
			require.NoError(t, c.Destroy())
		}
	}()
	// add makes a condition through a and checks that its completion node followed
	// the tail of the chain (want) and became the tail, seen through every wrapper.
	add := func(a graph.CUDA, want uintptr, through ...graph.CUDA) uintptr {
		t.Helper()
		require.Equal(t, want, graph.CompletionTail(a), "the tail the new node will wait after")
		c, err := condition.Create(condition.Param{Category: condition.Graph, Backend: b, Graph: a})
		require.NoError(t, err)
		conds = append(conds, c)
		w := c.WaitNode().Handle()
		require.NotZero(t, w)
		for _, o := range append(through, a) {
			require.Equal(t, w, graph.CompletionTail(o), "the chain's tail seen through another wrapper")
		}
		return w
	}
	w := add(a1, 0, a2)
	w = add(a2, w, a1)
	w = add(a1, w, a2)
	nodes, err := owner.Nodes()
	require.NoError(t, err)
	require.Len(t, nodes, 6, "a start and a completion node per condition")

	require.NoError(t, a1.Graph.Close())
	require.ErrorIs(t, a1.Graph.Close(), graph.ErrClosed)
	_, err = condition.Create(condition.Param{Category: condition.Graph, Backend: b, Graph: a1})
	require.ErrorIs(t, err, graph.ErrClosed)
	w = add(a2, w)
	require.NoError(t, a2.Graph.Close())

	// Every wrapper closed, the graph alive: a new adoption continues its chain.
	a3, err := graph.AdoptCUDA(owner.Handle(), b)
	require.NoError(t, err)
	defer a3.Graph.Close()
	w = add(a3, w)

	// Another graph has a chain of its own.
	other, err := ctx.NewGraph()
	require.NoError(t, err)
	defer other.Close()
	o := graph.CUDA{Graph: other}
	add(o, 0)
	require.Equal(t, w, graph.CompletionTail(a3))
}

// CUDA.AddSignalNodes refuses words no graph could use at the call: nil words and
// host words (ErrInvalidParam), words of a freed block (ErrClosed; before, they were
// accepted and the graph's memops would write freed memory).
func TestCUDASignalNodesRefuseBadWords(t *testing.T) {
	b, _, cg := newCUDAGraph(t)
	g := graph.CUDA{Graph: cg}
	hb := stream.NewHostBackend()
	defer hb.Close()
	host, err := hb.AllocWords(2)
	require.NoError(t, err)
	defer host.Close()
	live, freed := liveAndFreedWords(t, b)
	defer live.Close()
	for _, tc := range []struct {
		name          string
		trigger, done *stream.Word
		want          error
	}{
		{"nil words", nil, nil, graph.ErrInvalidParam},
		{"host words", host.Word(0), host.Word(1), graph.ErrInvalidParam},
		{"one word as both", live.Word(0), live.Word(0), graph.ErrInvalidParam},
		{"freed words", freed.Word(0), freed.Word(1), graph.ErrClosed},
		{"freed trigger", freed.Word(0), live.Word(1), graph.ErrClosed},
	} {
		_, _, err := g.AddSignalNodes(nil, tc.trigger, tc.done, false)
		require.ErrorIs(t, err, tc.want, tc.name)
	}
	nodes, err := cg.Nodes()
	require.NoError(t, err)
	require.Empty(t, nodes, "a refused call added nodes")
	_, _, err = g.AddSignalNodes(nil, live.Word(0), live.Word(1), false)
	require.NoError(t, err)
}

// A CUDA.AddSignalNodes whose completion node the driver refuses leaves the graph as it
// was: no node added, the chain's tail where it was (the fake driver refuses adds past
// FAKECUDA_GRAPH_NODES_MAX nodes). Before, the start node stayed in the user's graph: each
// launch stored its trigger, which no condition would ever take.
func TestCUDASignalNodesRefusedWaitLeavesTheGraph(t *testing.T) {
	testenv.RequireFakeDriver(t)
	b, _, cg := newCUDAGraph(t)
	g := graph.CUDA{Graph: cg}
	words, err := b.AllocWords(4)
	require.NoError(t, err)
	defer words.Close()
	count := func() int {
		t.Helper()
		nodes, err := cg.Nodes()
		require.NoError(t, err)
		return len(nodes)
	}

	t.Setenv("FAKECUDA_GRAPH_NODES_MAX", "1") // the start node fits, its completion node does not
	_, _, err = g.AddSignalNodes(nil, words.Word(0), words.Word(1), false)
	require.ErrorIs(t, err, cuda.ErrOutOfMemory)
	require.Zero(t, count(), "nodes left by a refused call")
	require.Zero(t, graph.CompletionTail(g), "the chain's tail after a refused call")

	require.NoError(t, os.Unsetenv("FAKECUDA_GRAPH_NODES_MAX"))
	_, w, err := g.AddSignalNodes(nil, words.Word(0), words.Word(1), true)
	require.NoError(t, err)
	tail := w.(cuda.Node).Handle()
	require.Equal(t, 2, count())

	// With a chain to follow: refused again, the tail stays the node before.
	t.Setenv("FAKECUDA_GRAPH_NODES_MAX", "3")
	_, _, err = g.AddSignalNodes([]condition.Node{w}, words.Word(2), words.Word(3), false)
	require.ErrorIs(t, err, cuda.ErrOutOfMemory)
	require.Equal(t, 2, count(), "nodes after a second refused call")
	require.Equal(t, tail, graph.CompletionTail(g), "the chain's tail after a second refused call")
	require.NoError(t, os.Unsetenv("FAKECUDA_GRAPH_NODES_MAX"))
	_, _, err = g.AddSignalNodes([]condition.Node{w}, words.Word(2), words.Word(3), false)
	require.NoError(t, err)
	require.Equal(t, 4, count())
}

// A CUDA graph launched after its condition's worker closed is released at once
// (GraphFailed), and its completion node resets the word to 0 behind it: Destroy of
// the condition then succeeds, as it does for a condition failed for good. Before, it
// read the words, found the trigger the launch stored, and refused (ErrBusy) for good.
func TestCUDAFailedConditionDestroyedAfterLaunch(t *testing.T) {
	b, _, cg := newCUDAGraph(t)
	c, err := condition.Create(condition.Param{Category: condition.Graph, Backend: b, Graph: graph.CUDA{Graph: cg}})
	require.NoError(t, err)
	uctx, err := ucp.NewContext(ucp.ContextParams{})
	require.NoError(t, err)
	defer uctx.Close()
	w, err := uctx.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	r, err := w.TagRecvNbx(make([]byte, 8), 5, ^uint64(0), &ucp.RequestParam{Condition: c})
	require.NoError(t, err)
	x, err := cg.Instantiate(0)
	require.NoError(t, err)
	defer x.Close()
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	cs, ok := stream.CUDAStream(s)
	require.True(t, ok)

	require.NoError(t, w.Close())
	wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.ErrorIs(t, r.Wait(wctx), ucp.ErrClosed, "the graph operation ends with its worker")
	require.NoError(t, x.Launch(cs))
	done := make(chan error, 1)
	go func() { done <- s.Synchronize() }()
	select {
	case err := <-done:
		require.NoError(t, err, "a launch after the worker closed is released")
	case <-wctx.Done():
		require.FailNow(t, "the graph's launch after the worker closed hung")
	}
	require.NoError(t, c.Destroy(), "Destroy of a condition failed for good, after a launch reset its word")
	require.ErrorIs(t, c.Destroy(), condition.ErrDestroyed)
}

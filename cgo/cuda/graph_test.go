package cuda_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/internal/errs"
)

// roundTripOps is DESIGN.md §4's relaunchable graph operation: trigger, wait for
// the proxy's completion, re-arm the completion word.
func roundTripOps(w words, T, D int) []cuda.MemOp {
	return []cuda.MemOp{
		cuda.WriteValue64Op(w.dev(T), 1, cuda.WriteDefault),
		cuda.WaitValue64Op(w.dev(D), 1, cuda.WaitEQ),
		cuda.WriteValue64Op(w.dev(D), 0, cuda.WriteDefault),
	}
}

// TestGraphMemops1000: one batch-memop node instantiated once and launched 1000
// times against a host proxy, the words checked after every launch.
func TestGraphMemops1000(t *testing.T) {
	ctx := newContext(t)
	s := newStream(t, ctx)
	const T, D = 0, 1
	w := newWords(t, ctx, 2)
	g, err := ctx.NewGraph()
	require.NoError(t, err)
	defer g.Close()
	node, err := g.AddBatchMemOpNode(nil, roundTripOps(w, T, D))
	require.NoError(t, err)
	typ, err := g.NodeType(node)
	require.NoError(t, err)
	assert.Equal(t, cuda.NodeBatchMemOp, typ, "node type")
	x, err := g.Instantiate(0)
	require.NoError(t, err)
	defer x.Close()

	var count atomic.Int64
	p := startProxy(w, T, D, &count)
	defer p.Stop()
	for i := 1; i <= 1000; i++ {
		require.NoError(t, x.Launch(s))
		syncWithin(t, s, 5*time.Second)
		require.Equal(t, [3]int64{0, 0, int64(i)}, [3]int64{int64(w.load(T)), int64(w.load(D)), count.Load()},
			"launch %d: T, D, triggers the proxy saw", i)
	}
	// Launches may also be queued back to back.
	for i := 0; i < 100; i++ {
		require.NoError(t, x.Launch(s))
	}
	syncWithin(t, s, 10*time.Second)
	require.Equal(t, int64(1100), count.Load(), "triggers after 1100 launches")
}

func TestGraphNodeKinds(t *testing.T) {
	ctx := newContext(t)
	s := newStream(t, ctx)
	w := newWords(t, ctx, 4)
	const n = 4096
	dm := devMem(t, ctx, n)
	hm := hostMem(t, ctx, n, cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
	ev, err := ctx.NewEvent(cuda.EventDisableTiming)
	require.NoError(t, err)
	defer ev.Close()

	g, err := ctx.NewGraph()
	require.NoError(t, err)
	defer g.Close()
	var hostRuns, hostSawMemset atomic.Int64
	memset, err := g.AddMemsetNode(nil, dm.Ptr(), 0x5a, 1, n)
	require.NoError(t, err)
	memcpy, err := g.AddMemcpyNode([]cuda.Node{memset}, hm.Addr(), dm.Ptr(), n)
	require.NoError(t, err)
	host, err := g.AddHostNode([]cuda.Node{memcpy}, func() {
		hostRuns.Add(1)
		if b := hm.Bytes(); b[0] == 0x5a && b[n-1] == 0x5a {
			hostSawMemset.Add(1)
		}
	})
	require.NoError(t, err)
	memop, err := g.AddBatchMemOpNode([]cuda.Node{host}, []cuda.MemOp{cuda.WriteValue64Op(w.dev(0), 42, cuda.WriteDefault)})
	require.NoError(t, err)
	record, err := g.AddEventRecordNode([]cuda.Node{memop}, ev)
	require.NoError(t, err)
	empty, err := g.AddEmptyNode([]cuda.Node{record})
	require.NoError(t, err)

	child, err := ctx.NewGraph()
	require.NoError(t, err)
	var childRuns atomic.Int64
	c1, err := child.AddBatchMemOpNode(nil, []cuda.MemOp{cuda.WriteValue64Op(w.dev(1), 7, cuda.WriteDefault)})
	require.NoError(t, err)
	_, err = child.AddHostNode([]cuda.Node{c1}, func() { childRuns.Add(1) })
	require.NoError(t, err)
	sub, err := g.AddChildGraphNode([]cuda.Node{empty}, child)
	require.NoError(t, err)
	require.NoError(t, child.Close()) // the parent holds a copy, and the child's Go callback
	_, err = g.AddChildGraphNode(nil, g)
	require.ErrorIs(t, err, cuda.ErrInvalidValue)

	// Two unconnected nodes joined by AddDependencies after the fact.
	a, err := g.AddEmptyNode([]cuda.Node{sub})
	require.NoError(t, err)
	b, err := g.AddBatchMemOpNode(nil, []cuda.MemOp{cuda.WriteValue64Op(w.dev(2), 9, cuda.WriteDefault)})
	require.NoError(t, err)
	require.NoError(t, g.AddDependencies([]cuda.Node{a}, []cuda.Node{b}))

	nodes, err := g.Nodes()
	require.NoError(t, err)
	want := map[cuda.NodeType]int{cuda.NodeMemset: 1, cuda.NodeMemcpy: 1, cuda.NodeHost: 1, cuda.NodeBatchMemOp: 2,
		cuda.NodeEventRecord: 1, cuda.NodeEmpty: 2, cuda.NodeGraph: 1}
	got := map[cuda.NodeType]int{}
	for _, nd := range nodes {
		typ, err := g.NodeType(nd)
		require.NoError(t, err)
		got[typ]++
	}
	require.Len(t, nodes, 9)
	require.Equal(t, want, got, "graph nodes by type")

	x, err := g.Instantiate(0)
	require.NoError(t, err)
	defer x.Close()
	require.NoError(t, g.Close()) // the exec keeps running with its callbacks
	require.ErrorIs(t, g.Close(), cuda.ErrInvalidHandle)
	require.ErrorIs(t, g.Close(), errs.Closed)
	for i := 1; i <= 3; i++ {
		require.NoError(t, x.Launch(s))
		syncWithin(t, s, 5*time.Second)
		require.Equal(t, [3]int64{int64(i), int64(i), int64(i)}, [3]int64{hostRuns.Load(), hostSawMemset.Load(), childRuns.Load()},
			"launch %d: host node runs, of them seeing the memset, child host node runs", i)
		require.Equal(t, [3]uint64{42, 7, 9}, [3]uint64{w.load(0), w.load(1), w.load(2)}, "launch %d: words", i)
		done, err := ev.Query()
		require.NoError(t, err, "event record node")
		require.True(t, done, "event record node")
		w.store(0, 0)
		w.store(1, 0)
		w.store(2, 0)
	}

	// An event wait node holds its graph until the event's work is done.
	gate := newStream(t, ctx)
	ev2, err := ctx.NewEvent(cuda.EventDisableTiming)
	require.NoError(t, err)
	defer ev2.Close()
	require.NoError(t, gate.WaitValue64(w.dev(3), 1, cuda.WaitGEQ))
	defer w.store(3, 1)
	require.NoError(t, ev2.Record(gate))
	g2, err := ctx.NewGraph()
	require.NoError(t, err)
	defer g2.Close()
	wait, err := g2.AddEventWaitNode(nil, ev2)
	require.NoError(t, err)
	_, err = g2.AddBatchMemOpNode([]cuda.Node{wait}, []cuda.MemOp{cuda.WriteValue64Op(w.dev(2), 11, cuda.WriteDefault)})
	require.NoError(t, err)
	x2, err := g2.Instantiate(0)
	require.NoError(t, err)
	defer x2.Close()
	require.NoError(t, x2.Launch(s))
	time.Sleep(blockedFor)
	require.Zero(t, w.load(2), "the event wait node did not wait")
	w.store(3, 1)
	syncWithin(t, s, 5*time.Second)
	require.Equal(t, uint64(11), w.load(2), "graph did not run after the event")
}

func TestGraphExecUpdate(t *testing.T) {
	ctx := newContext(t)
	s := newStream(t, ctx)
	w := newWords(t, ctx, 2)
	g, err := ctx.NewGraph()
	require.NoError(t, err)
	node, err := g.AddBatchMemOpNode(nil, []cuda.MemOp{cuda.WriteValue64Op(w.dev(0), 1, cuda.WriteDefault)})
	require.NoError(t, err)
	x, err := g.Instantiate(0)
	require.NoError(t, err)
	defer x.Close()
	// The graph stays alive: an exec update names the node of the original graph
	// (cuda.h: "hNode must not have been removed from the original graph").
	defer g.Close()

	require.NoError(t, x.Launch(s))
	syncWithin(t, s, 5*time.Second)
	require.Equal(t, uint64(1), w.load(0), "first launch")
	require.NoError(t, x.SetBatchMemOpNodeParams(node, []cuda.MemOp{cuda.WriteValue64Op(w.dev(0), 2, cuda.WriteDefault)}))
	require.NoError(t, x.Launch(s))
	syncWithin(t, s, 5*time.Second)
	require.Equal(t, uint64(2), w.load(0), "updated value")
	require.NoError(t, x.SetBatchMemOpNodeParams(node, []cuda.MemOp{cuda.WriteValue64Op(w.dev(1), 3, cuda.WriteDefault)}))
	require.NoError(t, x.Launch(s))
	syncWithin(t, s, 5*time.Second)
	require.Equal(t, [2]uint64{2, 3}, [2]uint64{w.load(0), w.load(1)}, "updated address: words 0 and 1")
	two := []cuda.MemOp{cuda.WriteValue64Op(w.dev(0), 4, 0), cuda.WriteValue64Op(w.dev(1), 4, 0)}
	assert.Error(t, x.SetBatchMemOpNodeParams(node, two), "changing the number of operations was accepted")
	require.NoError(t, x.Launch(s)) // still launchable after the refused update
	syncWithin(t, s, 5*time.Second)

	require.NoError(t, x.Close())
	require.ErrorIs(t, x.Close(), cuda.ErrInvalidHandle)
	require.ErrorIs(t, x.Close(), errs.Closed)
	require.ErrorIs(t, x.Launch(s), cuda.ErrInvalidHandle)
	require.ErrorIs(t, x.Launch(s), errs.Closed)
	require.ErrorIs(t, x.SetBatchMemOpNodeParams(node, two[:1]), cuda.ErrInvalidHandle)
}

// TestGraphDestroyNode: a node taken out of a graph no longer runs in executables made
// after, and the graph's other nodes still do; an executable made before keeps it. A
// nil node is refused (ErrInvalidValue) and a closed graph answers ErrClosed.
func TestGraphDestroyNode(t *testing.T) {
	ctx := newContext(t)
	s := newStream(t, ctx)
	w := newWords(t, ctx, 3)
	g, err := ctx.NewGraph()
	require.NoError(t, err)
	write := func(deps []cuda.Node, i int, v uint64) cuda.Node {
		t.Helper()
		n, err := g.AddBatchMemOpNode(deps, []cuda.MemOp{cuda.WriteValue64Op(w.dev(i), v, cuda.WriteDefault)})
		require.NoError(t, err)
		return n
	}
	a := write(nil, 0, 1)
	b := write([]cuda.Node{a}, 1, 2)
	write([]cuda.Node{b}, 2, 3)
	before, err := g.Instantiate(0)
	require.NoError(t, err)
	defer before.Close()

	require.NoError(t, g.DestroyNode(b))
	nodes, err := g.Nodes()
	require.NoError(t, err)
	require.Len(t, nodes, 2, "nodes after one was destroyed")
	for _, n := range nodes {
		require.NotEqual(t, b.Handle(), n.Handle(), "the destroyed node is still listed")
	}
	require.ErrorIs(t, g.DestroyNode(cuda.Node{}), cuda.ErrInvalidValue)
	require.ErrorIs(t, g.DestroyNode(cuda.Node{}), errs.InvalidParam)

	after, err := g.Instantiate(0)
	require.NoError(t, err)
	defer after.Close()
	require.NoError(t, after.Launch(s))
	syncWithin(t, s, 5*time.Second)
	require.Equal(t, [3]uint64{1, 0, 3}, [3]uint64{w.load(0), w.load(1), w.load(2)}, "words after a launch without the node")
	require.NoError(t, before.Launch(s))
	syncWithin(t, s, 5*time.Second)
	require.Equal(t, [3]uint64{1, 2, 3}, [3]uint64{w.load(0), w.load(1), w.load(2)}, "words after a launch made before")

	require.NoError(t, g.Close())
	require.ErrorIs(t, g.DestroyNode(a), errs.Closed)
	require.ErrorIs(t, g.DestroyNode(a), cuda.ErrInvalidHandle)
	require.ErrorIs(t, (*cuda.Graph)(nil).DestroyNode(a), errs.Closed)
}

// TestStreamCapture: memops, a host function and a spliced node captured from a
// stream into a graph, which then runs repeatedly against the proxy.
func TestStreamCapture(t *testing.T) {
	ctx := newContext(t)
	s := newStream(t, ctx)
	run := newStream(t, ctx)
	const T, D, X, Y = 0, 1, 2, 3
	w := newWords(t, ctx, 4)

	st, err := s.CaptureStatus()
	require.NoError(t, err)
	require.Equal(t, cuda.CaptureNone, st, "status before capture")
	info, err := s.CaptureInfo()
	require.NoError(t, err)
	require.Equal(t, cuda.CaptureNone, info.Status, "info before capture: %+v", info)
	require.Nil(t, info.Graph, "info before capture: %+v", info)
	_, err = s.EndCapture()
	require.Error(t, err, "EndCapture without BeginCapture succeeded")

	require.NoError(t, s.BeginCapture(cuda.CaptureRelaxed))
	for _, op := range roundTripOps(w, T, D) {
		switch op.Kind {
		case cuda.MemOpWriteValue64:
			require.NoError(t, s.WriteValue64(op.Addr, op.Value, cuda.WriteDefault))
		case cuda.MemOpWaitValue64:
			require.NoError(t, s.WaitValue64(op.Addr, op.Value, cuda.WaitFlags(op.Flags)))
		}
	}
	var hostRuns atomic.Int64
	require.NoError(t, s.LaunchHostFunc(func() { hostRuns.Add(1) }))
	time.Sleep(5 * time.Millisecond)
	require.Zero(t, w.load(T), "captured work ran")
	require.Zero(t, hostRuns.Load(), "captured work ran")

	info, err = s.CaptureInfo()
	require.NoError(t, err)
	require.Equal(t, cuda.CaptureActive, info.Status, "capture info %+v", info)
	require.NotNil(t, info.Graph, "capture info %+v", info)
	require.NotEmpty(t, info.Dependencies, "capture info %+v", info)
	require.NotZero(t, info.ID, "capture info %+v", info)
	// Splice a node in as the next step of the captured sequence.
	spliced, err := info.Graph.AddBatchMemOpNode(info.Dependencies, []cuda.MemOp{cuda.WriteValue64Op(w.dev(X), 5, cuda.WriteDefault)})
	require.NoError(t, err)
	require.NoError(t, s.UpdateCaptureDependencies([]cuda.Node{spliced}, true))
	after, err := s.CaptureInfo()
	require.NoError(t, err)
	require.Len(t, after.Dependencies, 1, "dependencies after the splice")
	require.True(t, after.Dependencies[0] == spliced, "dependencies after the splice") // the same CUgraphNode: Equal would compare the opaque pointees
	require.NoError(t, after.Graph.Close())
	require.NoError(t, s.BatchMemOp([]cuda.MemOp{cuda.WaitValue64Op(w.dev(X), 5, cuda.WaitEQ), cuda.WriteValue64Op(w.dev(Y), 6, cuda.WriteDefault)}))

	g, err := s.EndCapture()
	require.NoError(t, err)
	defer g.Close()
	require.NoError(t, info.Graph.Close()) // borrowed: the wrapper only
	st, err = s.CaptureStatus()
	require.NoError(t, err)
	require.Equal(t, cuda.CaptureNone, st, "status after EndCapture")
	nodes, err := g.Nodes()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, len(nodes), 3, "captured graph's nodes") // the driver may merge consecutive memops into one node
	x, err := g.Instantiate(0)
	require.NoError(t, err)
	defer x.Close()

	var count atomic.Int64
	p := startProxy(w, T, D, &count)
	defer p.Stop()
	for i := 1; i <= 3; i++ {
		w.store(X, 0)
		w.store(Y, 0)
		require.NoError(t, x.Launch(run))
		syncWithin(t, run, 5*time.Second)
		require.Equal(t, [5]int64{int64(i), int64(i), 5, 6, 0},
			[5]int64{count.Load(), hostRuns.Load(), int64(w.load(X)), int64(w.load(Y)), int64(w.load(D))},
			"launch %d: proxy triggers, host func runs, X, Y, D", i)
	}
	// The stream itself is back to normal execution.
	require.NoError(t, s.WriteValue64(w.dev(Y), 99, cuda.WriteDefault))
	syncWithin(t, s, 5*time.Second)
	require.Equal(t, uint64(99), w.load(Y), "stream after capture")
}

package cuda_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/ucpx/ucpx/cgo/cuda"
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
	must(t, err)
	defer g.Close()
	node, err := g.AddBatchMemOpNode(nil, roundTripOps(w, T, D))
	must(t, err)
	typ, err := g.NodeType(node)
	must(t, err)
	if typ != cuda.NodeBatchMemOp {
		t.Errorf("node type %d", typ)
	}
	x, err := g.Instantiate(0)
	must(t, err)
	defer x.Close()

	var count atomic.Int64
	p := startProxy(w, T, D, &count)
	defer p.Stop()
	for i := 1; i <= 1000; i++ {
		must(t, x.Launch(s))
		syncWithin(t, s, 5*time.Second)
		if w.load(T) != 0 || w.load(D) != 0 || count.Load() != int64(i) {
			t.Fatalf("launch %d: T=%d D=%d proxy saw %d triggers", i, w.load(T), w.load(D), count.Load())
		}
	}
	// Launches may also be queued back to back.
	for i := 0; i < 100; i++ {
		must(t, x.Launch(s))
	}
	syncWithin(t, s, 10*time.Second)
	if count.Load() != 1100 {
		t.Fatalf("%d triggers after 1100 launches", count.Load())
	}
}

func TestGraphNodeKinds(t *testing.T) {
	ctx := newContext(t)
	s := newStream(t, ctx)
	w := newWords(t, ctx, 4)
	const n = 4096
	dm := devMem(t, ctx, n)
	hm := hostMem(t, ctx, n, cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
	ev, err := ctx.NewEvent(cuda.EventDisableTiming)
	must(t, err)
	defer ev.Close()

	g, err := ctx.NewGraph()
	must(t, err)
	defer g.Close()
	var hostRuns, hostSawMemset atomic.Int64
	memset, err := g.AddMemsetNode(nil, dm.Ptr(), 0x5a, 1, n)
	must(t, err)
	memcpy, err := g.AddMemcpyNode([]cuda.Node{memset}, hm.Addr(), dm.Ptr(), n)
	must(t, err)
	host, err := g.AddHostNode([]cuda.Node{memcpy}, func() {
		hostRuns.Add(1)
		if b := hm.Bytes(); b[0] == 0x5a && b[n-1] == 0x5a {
			hostSawMemset.Add(1)
		}
	})
	must(t, err)
	memop, err := g.AddBatchMemOpNode([]cuda.Node{host}, []cuda.MemOp{cuda.WriteValue64Op(w.dev(0), 42, cuda.WriteDefault)})
	must(t, err)
	record, err := g.AddEventRecordNode([]cuda.Node{memop}, ev)
	must(t, err)
	empty, err := g.AddEmptyNode([]cuda.Node{record})
	must(t, err)

	child, err := ctx.NewGraph()
	must(t, err)
	var childRuns atomic.Int64
	c1, err := child.AddBatchMemOpNode(nil, []cuda.MemOp{cuda.WriteValue64Op(w.dev(1), 7, cuda.WriteDefault)})
	must(t, err)
	_, err = child.AddHostNode([]cuda.Node{c1}, func() { childRuns.Add(1) })
	must(t, err)
	sub, err := g.AddChildGraphNode([]cuda.Node{empty}, child)
	must(t, err)
	must(t, child.Close()) // the parent holds a copy, and the child's Go callback
	_, err = g.AddChildGraphNode(nil, g)
	mustIs(t, err, cuda.ErrInvalidValue)

	// Two unconnected nodes joined by AddDependencies after the fact.
	a, err := g.AddEmptyNode([]cuda.Node{sub})
	must(t, err)
	b, err := g.AddBatchMemOpNode(nil, []cuda.MemOp{cuda.WriteValue64Op(w.dev(2), 9, cuda.WriteDefault)})
	must(t, err)
	must(t, g.AddDependencies([]cuda.Node{a}, []cuda.Node{b}))

	nodes, err := g.Nodes()
	must(t, err)
	want := map[cuda.NodeType]int{cuda.NodeMemset: 1, cuda.NodeMemcpy: 1, cuda.NodeHost: 1, cuda.NodeBatchMemOp: 2,
		cuda.NodeEventRecord: 1, cuda.NodeEmpty: 2, cuda.NodeGraph: 1}
	got := map[cuda.NodeType]int{}
	for _, nd := range nodes {
		typ, err := g.NodeType(nd)
		must(t, err)
		got[typ]++
	}
	if len(nodes) != 9 || len(got) != len(want) {
		t.Fatalf("graph nodes by type %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("graph nodes by type %v, want %v", got, want)
		}
	}

	x, err := g.Instantiate(0)
	must(t, err)
	defer x.Close()
	must(t, g.Close()) // the exec keeps running with its callbacks
	mustIs(t, g.Close(), cuda.ErrInvalidHandle)
	for i := 1; i <= 3; i++ {
		must(t, x.Launch(s))
		syncWithin(t, s, 5*time.Second)
		if hostRuns.Load() != int64(i) || hostSawMemset.Load() != int64(i) || childRuns.Load() != int64(i) {
			t.Fatalf("launch %d: host node ran %d (saw memset %d), child host node %d",
				i, hostRuns.Load(), hostSawMemset.Load(), childRuns.Load())
		}
		if w.load(0) != 42 || w.load(1) != 7 || w.load(2) != 9 {
			t.Fatalf("launch %d: words %d %d %d", i, w.load(0), w.load(1), w.load(2))
		}
		if done, err := ev.Query(); err != nil || !done {
			t.Fatalf("event record node: %v %v", done, err)
		}
		w.store(0, 0)
		w.store(1, 0)
		w.store(2, 0)
	}

	// An event wait node holds its graph until the event's work is done.
	gate := newStream(t, ctx)
	ev2, err := ctx.NewEvent(cuda.EventDisableTiming)
	must(t, err)
	defer ev2.Close()
	must(t, gate.WaitValue64(w.dev(3), 1, cuda.WaitGEQ))
	defer w.store(3, 1)
	must(t, ev2.Record(gate))
	g2, err := ctx.NewGraph()
	must(t, err)
	defer g2.Close()
	wait, err := g2.AddEventWaitNode(nil, ev2)
	must(t, err)
	_, err = g2.AddBatchMemOpNode([]cuda.Node{wait}, []cuda.MemOp{cuda.WriteValue64Op(w.dev(2), 11, cuda.WriteDefault)})
	must(t, err)
	x2, err := g2.Instantiate(0)
	must(t, err)
	defer x2.Close()
	must(t, x2.Launch(s))
	time.Sleep(blockedFor)
	if w.load(2) != 0 {
		t.Fatal("the event wait node did not wait")
	}
	w.store(3, 1)
	syncWithin(t, s, 5*time.Second)
	if w.load(2) != 11 {
		t.Fatal("graph did not run after the event")
	}
}

func TestGraphExecUpdate(t *testing.T) {
	ctx := newContext(t)
	s := newStream(t, ctx)
	w := newWords(t, ctx, 2)
	g, err := ctx.NewGraph()
	must(t, err)
	node, err := g.AddBatchMemOpNode(nil, []cuda.MemOp{cuda.WriteValue64Op(w.dev(0), 1, cuda.WriteDefault)})
	must(t, err)
	x, err := g.Instantiate(0)
	must(t, err)
	defer x.Close()
	// The graph stays alive: an exec update names the node of the original graph
	// (cuda.h: "hNode must not have been removed from the original graph").
	defer g.Close()

	must(t, x.Launch(s))
	syncWithin(t, s, 5*time.Second)
	if w.load(0) != 1 {
		t.Fatal("first launch")
	}
	must(t, x.SetBatchMemOpNodeParams(node, []cuda.MemOp{cuda.WriteValue64Op(w.dev(0), 2, cuda.WriteDefault)}))
	must(t, x.Launch(s))
	syncWithin(t, s, 5*time.Second)
	if w.load(0) != 2 {
		t.Fatalf("updated value: %d", w.load(0))
	}
	must(t, x.SetBatchMemOpNodeParams(node, []cuda.MemOp{cuda.WriteValue64Op(w.dev(1), 3, cuda.WriteDefault)}))
	must(t, x.Launch(s))
	syncWithin(t, s, 5*time.Second)
	if w.load(1) != 3 || w.load(0) != 2 {
		t.Fatalf("updated address: %d %d", w.load(0), w.load(1))
	}
	two := []cuda.MemOp{cuda.WriteValue64Op(w.dev(0), 4, 0), cuda.WriteValue64Op(w.dev(1), 4, 0)}
	if err := x.SetBatchMemOpNodeParams(node, two); err == nil {
		t.Error("changing the number of operations was accepted")
	}
	must(t, x.Launch(s)) // still launchable after the refused update
	syncWithin(t, s, 5*time.Second)

	must(t, x.Close())
	mustIs(t, x.Close(), cuda.ErrInvalidHandle)
	mustIs(t, x.Launch(s), cuda.ErrInvalidHandle)
	mustIs(t, x.SetBatchMemOpNodeParams(node, two[:1]), cuda.ErrInvalidHandle)
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
	must(t, err)
	if st != cuda.CaptureNone {
		t.Fatalf("status %v before capture", st)
	}
	info, err := s.CaptureInfo()
	must(t, err)
	if info.Status != cuda.CaptureNone || info.Graph != nil {
		t.Fatalf("info before capture %+v", info)
	}
	_, err = s.EndCapture()
	if err == nil {
		t.Fatal("EndCapture without BeginCapture succeeded")
	}

	must(t, s.BeginCapture(cuda.CaptureRelaxed))
	for _, op := range roundTripOps(w, T, D) {
		switch op.Kind {
		case cuda.MemOpWriteValue64:
			must(t, s.WriteValue64(op.Addr, op.Value, cuda.WriteDefault))
		case cuda.MemOpWaitValue64:
			must(t, s.WaitValue64(op.Addr, op.Value, cuda.WaitFlags(op.Flags)))
		}
	}
	var hostRuns atomic.Int64
	must(t, s.LaunchHostFunc(func() { hostRuns.Add(1) }))
	time.Sleep(5 * time.Millisecond)
	if w.load(T) != 0 || hostRuns.Load() != 0 {
		t.Fatal("captured work ran")
	}

	info, err = s.CaptureInfo()
	must(t, err)
	if info.Status != cuda.CaptureActive || info.Graph == nil || len(info.Dependencies) == 0 || info.ID == 0 {
		t.Fatalf("capture info %+v", info)
	}
	// Splice a node in as the next step of the captured sequence.
	spliced, err := info.Graph.AddBatchMemOpNode(info.Dependencies, []cuda.MemOp{cuda.WriteValue64Op(w.dev(X), 5, cuda.WriteDefault)})
	must(t, err)
	must(t, s.UpdateCaptureDependencies([]cuda.Node{spliced}, true))
	after, err := s.CaptureInfo()
	must(t, err)
	if len(after.Dependencies) != 1 || after.Dependencies[0] != spliced {
		t.Fatalf("dependencies after the splice: %v", after.Dependencies)
	}
	must(t, after.Graph.Close())
	must(t, s.BatchMemOp([]cuda.MemOp{cuda.WaitValue64Op(w.dev(X), 5, cuda.WaitEQ), cuda.WriteValue64Op(w.dev(Y), 6, cuda.WriteDefault)}))

	g, err := s.EndCapture()
	must(t, err)
	defer g.Close()
	must(t, info.Graph.Close()) // borrowed: the wrapper only
	st, err = s.CaptureStatus()
	must(t, err)
	if st != cuda.CaptureNone {
		t.Fatalf("status %v after EndCapture", st)
	}
	nodes, err := g.Nodes()
	must(t, err)
	if len(nodes) < 3 { // the driver may merge consecutive memops into one node
		t.Errorf("captured graph has %d nodes", len(nodes))
	}
	x, err := g.Instantiate(0)
	must(t, err)
	defer x.Close()

	var count atomic.Int64
	p := startProxy(w, T, D, &count)
	defer p.Stop()
	for i := 1; i <= 3; i++ {
		w.store(X, 0)
		w.store(Y, 0)
		must(t, x.Launch(run))
		syncWithin(t, run, 5*time.Second)
		if count.Load() != int64(i) || hostRuns.Load() != int64(i) || w.load(X) != 5 || w.load(Y) != 6 || w.load(D) != 0 {
			t.Fatalf("launch %d: proxy %d host %d X %d Y %d D %d", i, count.Load(), hostRuns.Load(), w.load(X), w.load(Y), w.load(D))
		}
	}
	// The stream itself is back to normal execution.
	must(t, s.WriteValue64(w.dev(Y), 99, cuda.WriteDefault))
	syncWithin(t, s, 5*time.Second)
	if w.load(Y) != 99 {
		t.Fatal("stream after capture")
	}
}

package graph

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"weak"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/stream"
)

// CUDA lets graph conditions add their nodes to a CUDA graph. Each operation has a
// start node [write T=1] after its dependencies and a completion node [wait D&1, write
// D=0] after the start node; the engine resets T when it takes the trigger and sets D
// once the operation completed, so every launch performs the operation again with no
// host call. Without Split the completion node is the one node the condition shows
// (Node and WaitNode): give input dependencies in Param.Deps, and depend on the node
// for completion. With Split, Node is the start node and WaitNode the completion node.
//
// Completion nodes of one graph wait one after another (each depends on the one
// created before it, whichever wrapper of the CUgraph added it: two AdoptCUDA of one
// graph share the chain): a memop wait occupies one of the GPU's hardware work queues
// (CUDA_DEVICE_MAX_CONNECTIONS: CUDA's default 8, 32 once ucpx initialized CUDA) while
// it waits, and with many independent waits blocked at once, the trigger writes of
// other work on the same context (another graph, the peer half of a loopback exchange)
// could get no queue and never run. Start nodes stay independent, so every operation is
// issued as soon as its dependencies allow; only the observation of completions is
// ordered.
//
// Order across graphs of one CUDA context: CUDA may run independent branches of a
// graph on any of the context's hardware queues, in any order, and the ordering a memop
// wait creates is invisible to its scheduler (the driver API documentation of
// cuGraphAddBatchMemOpNode warns of this). So when two graphs of one process talk to
// each other (two workers in one process), launch the sending graph before the
// receiving one: a receive's wait launched first can sit in a queue ahead of the send
// trigger it waits for, and both wait forever (seen on an H200 with 16 receives).
// Graphs in different processes use different contexts and are not affected. Without
// the chaining above, 256 independent one-node operations hung even sender first.
//
// Close CUDA graphs that hold a worker's conditions before closing the worker: a launch
// after that waits for an engine that is gone (the launch in flight when the worker closes
// is released, with the error in the condition). Likewise enqueue each condition's
// operations before the first launch: the GPU cannot tell that no engine will ever
// complete a node whose condition carries none, and its wait holds the stream (a host
// graph's launch fails with ErrNoOperation instead).
type CUDA struct {
	Graph *cuda.Graph
}

// waitChains holds, per CUgraph (the raw handle: every wrapper of one graph, such as
// two AdoptCUDA of it, shares its chain), the completion node created last in it.
var waitChains = struct {
	sync.Mutex
	m map[uintptr]*waitChain
}{m: map[uintptr]*waitChain{}}

// waitChain is the chain of completion nodes of one CUgraph.
type waitChain struct {
	last cuda.Node
	// users are the wrappers that added to the chain. While one is open the graph is
	// alive and last is its node; once none is (closed wrappers), the graph may have
	// been destroyed and its handle reused, so last is checked against the graph's
	// nodes before a new wrapper chains to it. The entry goes once every user is
	// collected.
	users []weak.Pointer[cuda.Graph]
}

// tailLocked returns the completion node the next one added through g, whose handle
// is h, must depend on, if any. Caller holds waitChains.
func tailLocked(g *cuda.Graph, h uintptr) (cuda.Node, bool) {
	ch := waitChains.m[h]
	if ch == nil || ch.last.Handle() == 0 {
		return cuda.Node{}, false
	}
	for _, u := range ch.users {
		if w := u.Value(); w != nil && w.Handle() == h {
			return ch.last, true // a wrapper that added to it is open: the graph is alive
		}
	}
	// Every wrapper that added to the chain was closed: the graph may be another one
	// at the same address now.
	nodes, err := g.Nodes()
	if err == nil && slices.Contains(nodes, ch.last) {
		return ch.last, true
	}
	ch.last = cuda.Node{}
	return cuda.Node{}, false
}

// joinLocked records w, g's new completion node, as the tail of the chain of h.
// Caller holds waitChains.
func joinLocked(g *cuda.Graph, h uintptr, w cuda.Node) {
	ch := waitChains.m[h]
	if ch == nil {
		ch = &waitChain{}
		waitChains.m[h] = ch
	}
	ch.last = w
	me := weak.Make(g)
	if slices.Contains(ch.users, me) {
		return
	}
	ch.users = slices.DeleteFunc(ch.users, func(u weak.Pointer[cuda.Graph]) bool { return u.Value() == nil })
	ch.users = append(ch.users, me)
	runtime.AddCleanup(g, func(h uintptr) {
		waitChains.Lock()
		defer waitChains.Unlock()
		ch := waitChains.m[h]
		if ch == nil {
			return
		}
		ch.users = slices.DeleteFunc(ch.users, func(u weak.Pointer[cuda.Graph]) bool { return u.Value() == nil })
		if len(ch.users) == 0 {
			delete(waitChains.m, h)
		}
	}, h)
}

// Kind is stream.KindCUDA.
func (c CUDA) Kind() stream.Kind { return stream.KindCUDA }

// CUDANodes converts condition nodes of a CUDA graph (what Condition.Node and WaitNode
// return for a graph.CUDA, and cuda.Node values) into the cuda.Node values the raw
// graph calls of cgo/cuda take.
func CUDANodes(deps ...condition.Node) ([]cuda.Node, error) {
	nodes := make([]cuda.Node, 0, len(deps))
	for _, d := range deps {
		n, ok := d.(cuda.Node)
		if !ok || n.Handle() == 0 {
			return nil, fmt.Errorf("dependency %T is not a CUDA graph node: %w", d, ErrInvalidParam)
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

// AddSignalNodes implements condition.GraphBuilder. deps are cuda.Node values.
func (c CUDA) AddSignalNodes(deps []condition.Node, trigger, done *stream.Word, split bool) (start, wait condition.Node, err error) {
	if c.Graph == nil {
		return nil, nil, fmt.Errorf("nil CUDA graph: %w", ErrInvalidParam)
	}
	const op = "add signal nodes"
	if err := checkSignalWords(op, trigger, done); err != nil {
		return nil, nil, err
	}
	nodes, err := CUDANodes(deps...)
	if err != nil {
		return nil, nil, err
	}
	t, d := trigger.DevicePtr(), done.DevicePtr()
	if t == 0 || d == 0 {
		return nil, nil, fmt.Errorf("%s: signal words without device addresses (a host backend?): %w", op, ErrInvalidParam)
	}
	// Under the chains' lock: the nodes of one CUgraph are added one call at a time,
	// also through several wrappers of it.
	waitChains.Lock()
	defer waitChains.Unlock()
	s, err := c.Graph.AddBatchMemOpNode(nodes, []cuda.MemOp{cuda.WriteValue64Op(t, 1, cuda.WriteDefault)})
	if err != nil {
		return nil, nil, err
	}
	h := c.Graph.Handle()
	if h == 0 {
		return nil, nil, fmt.Errorf("%s: CUDA graph closed: %w", op, ErrClosed)
	}
	waitDeps := []cuda.Node{s}
	if prev, chained := tailLocked(c.Graph, h); chained {
		waitDeps = append(waitDeps, prev)
	}
	// AND 1: released by 1 (done) and by condition.GraphFailed (all ones).
	w, err := c.Graph.AddBatchMemOpNode(waitDeps, []cuda.MemOp{cuda.WaitValue64Op(d, 1, cuda.WaitAND), cuda.WriteValue64Op(d, 0, cuda.WriteDefault)})
	if err != nil {
		// Leave the graph as it was: a start node without its condition would store
		// the trigger at every launch, and nothing would ever take it.
		if derr := c.Graph.DestroyNode(s); derr != nil {
			return nil, nil, fmt.Errorf("%w (and the start node stays in the graph: %v)", err, derr)
		}
		return nil, nil, err
	}
	joinLocked(c.Graph, h, w)
	if !split {
		return w, w, nil
	}
	return s, w, nil
}

var _ condition.GraphBuilder = CUDA{}

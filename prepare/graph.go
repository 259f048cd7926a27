package prepare

import (
	"fmt"
	"reflect"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/internal/backoff"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// PreadyNode adds to graph g, after deps, the nodes that make partition p ready each
// time the graph runs: a gate that takes the receiver's ready flag of p (waiting for
// it), then the partition's put-with-signal as a persistent operation of a graph
// condition. Every launch is an iteration of p, with no host call per launch; the
// receiver starts each iteration as usual. It returns the node that completes when
// the partition has moved. g is a *graph.Host (host backends) or a graph.CUDA (CUDA
// backends). In a CUDA graph nothing of the host runs per launch, so the sender's
// worker must be progressed by someone else while the graph runs: give it
// ucp.WorkerParams.ProgressThread. There the gates (the memop waits for the receiver's
// readiness) of one request wait one after another, in the order PreadyNode added
// them, and do not wait for deps: what moves p waits for its gate and for deps.
//
// On the direct path (a receiver's device buffer that CUDA IPC maps here, direct.go)
// the nodes are the transfer itself, with no engine and no CPU per launch: a memop
// wait for the ready flag, a memcpy node into the receiver's mapped buffer, a
// one-thread kernel node copying the flag (the iteration the receiver started) into
// its mapped arrival counter (both are host memory), a memop write taking the flag.
// Launch the graph only for iterations the receiver starts, and Free the request only
// after its launches completed: the nodes hold the receiver's mapped addresses, which
// Free (and the receiver's Free) unmap. A sender with a PreadyNode iterates by its
// graphs' launches only: its Start is refused (ErrInvalidParam), as a host iteration
// after launches this side does not count would tell the receiver an older iteration.
func (r *Request) PreadyNode(g condition.GraphBuilder, deps []condition.Node, p int) (condition.Node, error) {
	if r == nil {
		return nil, fmt.Errorf("pready node: nil request: %w", ErrInvalidParam)
	}
	// Bad input fails before the prepare phase, which may wait for the peer.
	switch {
	case r.role != sender:
		return nil, fmt.Errorf("pready node on a receive request: %w", ErrInvalidParam)
	case p < 0 || p >= r.parts:
		return nil, fmt.Errorf("pready node: partition %d of %d: %w", p, r.parts, ErrInvalidParam)
	case g == nil || g.Kind() != r.backend.Kind():
		return nil, fmt.Errorf("pready node: the graph is not of the request's backend: %w", ErrInvalidParam)
	}
	if err := r.ensurePrepared(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nodeOfLocked(g, p) {
		// Each node takes one ready flag a launch: a second node of p would take the
		// next iteration's, and the last launch's would wait for good.
		return nil, fmt.Errorf("pready node: partition %d has a node in this graph already: %w", p, ErrInvalidParam)
	}
	switch {
	case r.remote.bufKey.Device():
		if !r.direct {
			return nil, fmt.Errorf("pready node: a host buffer to the receiver's device buffer: use Pready or PreadyOnStream: %w", ErrUnsupported)
		}
		if err := r.errLocked(); err != nil {
			return nil, err
		}
		gate, n, err := r.directNodeLocked(g, deps, p)
		if err != nil {
			return nil, fmt.Errorf("pready node: %w", err)
		}
		r.stats.Puts++
		r.addNodeLocked(g, p)
		r.addGateLocked(g, gate)
		return n, nil
	case r.st != nil:
		// A staged partition's copy would need a copy node per launch ahead of the
		// put; the CUDA-IPC path will give device buffers graph nodes.
		return nil, fmt.Errorf("pready node: a staged (device) buffer: use PreadyOnStream on a stream the graph waits for: %w", ErrUnsupported)
	}
	if err := r.errLocked(); err != nil {
		return nil, err
	}
	gate, after, err := r.gateNodeLocked(g, deps, p)
	if err != nil {
		return nil, fmt.Errorf("pready node: %w", err)
	}
	cond, err := condition.Create(condition.Param{Category: condition.Graph, Backend: r.backend, Graph: g, Deps: after})
	if err != nil {
		// A gate left behind would take p's flag at every launch, and a later
		// PreadyNode of p would add a second gate waiting for the flag for good.
		return nil, fmt.Errorf("pready node: %w", dropNodes(g, err, gate))
	}
	if _, err := r.putLocked(p, &ucp.RequestParam{Condition: cond}, true); err != nil {
		_ = cond.Destroy()
		return nil, fmt.Errorf("pready node: %w", err)
	}
	r.graphConds = append(r.graphConds, cond)
	r.addNodeLocked(g, p)
	r.addGateLocked(g, gate)
	return cond.Node(), nil
}

// graphPart names a partition's PreadyNode in one graph.
type graphPart struct {
	g any
	p int
}

// nodeOfLocked reports whether partition p has a PreadyNode in g. A graph of a type Go
// cannot compare (a caller's own GraphBuilder) is not told apart, and not checked.
func (r *Request) nodeOfLocked(g condition.GraphBuilder, p int) bool {
	return reflect.TypeOf(g).Comparable() && r.nodes[graphPart{g, p}]
}

// addNodeLocked records partition p's PreadyNode in g.
func (r *Request) addNodeLocked(g condition.GraphBuilder, p int) {
	if !reflect.TypeOf(g).Comparable() {
		return
	}
	if r.nodes == nil {
		r.nodes = map[graphPart]bool{}
	}
	r.nodes[graphPart{g, p}] = true
}

// dropNodes takes the nodes a refused PreadyNode added back out of a CUDA graph, so
// that it leaves the graph as it was; it returns err, noting nodes it could not remove.
func dropNodes(g condition.GraphBuilder, err error, nodes ...condition.Node) error {
	cg, ok := g.(graph.CUDA)
	if !ok {
		return err
	}
	for i := len(nodes) - 1; i >= 0; i-- {
		if n, ok := nodes[i].(cuda.Node); ok && n.Handle() != 0 {
			if derr := cg.Graph.DestroyNode(n); derr != nil {
				return fmt.Errorf("%w (and a node it added stays in the graph: %v)", err, derr)
			}
		}
	}
	return err
}

// addGateLocked records gate, the gate node of a PreadyNode added to g, as the one the
// next gate added to g waits after (CUDA graphs only; see cudaGateLocked).
func (r *Request) addGateLocked(g condition.GraphBuilder, gate condition.Node) {
	if _, ok := g.(graph.CUDA); !ok || gate == nil {
		return
	}
	if r.gates == nil {
		r.gates = map[any]condition.Node{}
	}
	r.gates[g] = gate
}

// cudaGateLocked adds to g a batch-memop node running ops, which begin with a wait for
// the receiver's ready flag of a partition. The gates of one request in one CUDA graph
// wait one after another, each after the previous gate and after nothing else: a memop
// wait holds one of the GPU's hardware work queues while it waits (graph.CUDA says why
// that matters), and a gate waits from its dependencies until the receiver starts the
// iteration, so gates after the user's dependencies (one per partition, up to 1024)
// could hold every queue of the context at once, and other work of the context (the
// receiver's side of a loopback exchange, which the receiver's Start may wait for) get
// none. The receiver sets every ready flag of an iteration with one write, so a chain
// of gates is released at once; the user's dependencies go on the node after the
// gate, so no partition waits for another's. Caller holds r.mu.
func (r *Request) cudaGateLocked(g graph.CUDA, ops []cuda.MemOp) (cuda.Node, error) {
	var prev []cuda.Node
	if tail, ok := r.gates[g]; ok {
		prev = []cuda.Node{tail.(cuda.Node)}
	}
	return g.Graph.AddBatchMemOpNode(prev, ops)
}

// gateNodeLocked adds the node that waits for the receiver's ready flag of p and
// takes it (stores 0), so each launch moves p once per iteration the receiver started.
// It returns the gate and the dependencies of the node that moves p: the gate, and in
// a CUDA graph deps too (there the gate does not wait for them, see cudaGateLocked).
func (r *Request) gateNodeLocked(g condition.GraphBuilder, deps []condition.Node, p int) (gate condition.Node, after []condition.Node, err error) {
	flag := r.words.Word(p)
	switch g := g.(type) {
	case *graph.Host:
		gate, err := g.AddTask(deps, func() error {
			_, err := r.awaitReady(flag, p)
			return err
		})
		if err != nil {
			return nil, nil, err
		}
		return gate, []condition.Node{gate}, nil
	case graph.CUDA:
		if _, err := graph.CUDANodes(deps...); err != nil {
			return nil, nil, err
		}
		// GEQ 1: released by the ready flag (the iteration) and by the failure value,
		// which the write of 0 takes too: a failed request puts it back (holdFailed).
		r.clearingNodes = true
		gate, err := r.cudaGateLocked(g, []cuda.MemOp{
			cuda.WaitValue64Op(flag.DevicePtr(), 1, cuda.WaitGEQ),
			cuda.WriteValue64Op(flag.DevicePtr(), 0, cuda.WriteDefault),
		})
		if err != nil {
			return nil, nil, err
		}
		return gate, append([]condition.Node{gate}, deps...), nil
	}
	return nil, nil, fmt.Errorf("graph %T: want *graph.Host or graph.CUDA: %w", g, ErrInvalidParam)
}

// awaitReady waits for ready flag p of a host graph's launch and takes it, returning
// the iteration it held.
func (r *Request) awaitReady(flag *stream.Word, p int) (uint64, error) {
	start := time.Now()
	for {
		v := flag.Load()
		if v == failedWord {
			// The peer's failure, or a peer that wrote the failure value itself.
			r.mu.Lock()
			err := r.peerFailedLocked("pready node", p)
			r.mu.Unlock()
			return 0, err
		}
		if readyValue(v) && flag.CompareAndSwap(v, 0) {
			return v, nil
		}
		// The receiver's write may need this worker's progress (tcp).
		if r.w.Progress() == 0 {
			backoff.Pause(start)
		}
	}
}

// copyWordKernelLocked is ucpx_signal_copy_word (src, dst), from the backend's signal
// kernels (loaded with the backend: a module loaded now would wait for the context's
// streams, which may be held back). Caller holds r.mu.
func (r *Request) copyWordKernelLocked() (*cuda.Function, error) {
	if _, _, ok := stream.CUDAContext(r.backend); !ok {
		return nil, fmt.Errorf("a CUDA graph needs the request's Backend to be CUDA: %w", ErrInvalidParam)
	}
	return stream.CUDACopyWordKernel(r.backend)
}

// directNodeLocked adds the direct path's nodes of partition p (see PreadyNode),
// returning the gate of a CUDA graph (nil for a host graph) and the last node.
// Caller holds r.mu.
func (r *Request) directNodeLocked(g condition.GraphBuilder, deps []condition.Node, p int) (gate, last condition.Node, err error) {
	off, size := partRange(len(r.buf), r.parts, p)
	dst, err := r.remote.bufKey.DeviceAddress(r.remote.bufBase+uint64(off), size)
	if err != nil {
		return nil, nil, err
	}
	arrival, err := r.remote.wordKey.DeviceAddress(r.remote.wordBase+8*uint64(p), 8)
	if err != nil {
		return nil, nil, err
	}
	src, flag := ptrOf(r.buf)+uintptr(off), r.words.Word(p)
	r.clearingNodes = true
	switch g := g.(type) {
	case graph.CUDA:
		nodes, err := graph.CUDANodes(deps...)
		if err != nil {
			return nil, nil, err
		}
		// The copy-word kernel is looked up before any node is added.
		copyWord, err := r.copyWordKernelLocked()
		if err != nil {
			return nil, nil, err
		}
		// GEQ 1: the iteration, or the failure value (which the request keeps
		// storing after a failure: the take below clears it at each launch). The gate
		// waits after the request's previous gate in g only (cudaGateLocked); the
		// copy waits for it and for deps.
		gate, err := r.cudaGateLocked(g, []cuda.MemOp{cuda.WaitValue64Op(flag.DevicePtr(), 1, cuda.WaitGEQ)})
		if err != nil {
			return nil, nil, err
		}
		data, err := g.Graph.AddMemcpyNode(append([]cuda.Node{gate}, nodes...), dst, src, size)
		if err != nil {
			return nil, nil, dropNodes(g, err, gate)
		}
		// The flag and the counter are host memory: a memcpy node between them would
		// be a host-to-host copy; the copy-word kernel stores it from the GPU.
		signal, err := g.Graph.AddKernelNode([]cuda.Node{data}, copyWord, cuda.Linear(1, 1), flag.DevicePtr(), arrival)
		if err != nil {
			return nil, nil, dropNodes(g, err, gate, data)
		}
		take, err := g.Graph.AddBatchMemOpNode([]cuda.Node{signal}, []cuda.MemOp{cuda.WriteValue64Op(flag.DevicePtr(), 0, cuda.WriteDefault)})
		if err != nil {
			return nil, nil, dropNodes(g, err, gate, data, signal)
		}
		return gate, take, nil
	case *graph.Host:
		if dev := r.w.Context().Device(); dev == nil || dev.Kind() != stream.KindHost {
			return nil, nil, fmt.Errorf("a host graph cannot copy device memory: use a graph.CUDA: %w", ErrUnsupported)
		}
		// A host device (package fakeipc): its memory is host memory.
		n, err := g.AddTask(deps, func() error {
			v, err := r.awaitReady(flag, p)
			if err != nil {
				return err
			}
			copy(ucp.DeviceBuffer(dst, size), r.buf[off:off+size])
			atomic.StoreUint64((*uint64)(unsafe.Pointer(&ucp.DeviceBuffer(arrival, 8)[0])), v)
			return nil
		})
		return nil, n, err
	}
	return nil, nil, fmt.Errorf("graph %T: want *graph.Host or graph.CUDA: %w", g, ErrInvalidParam)
}

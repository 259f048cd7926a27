package prepare

import (
	"fmt"
	"runtime"
	"time"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
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
// ucp.WorkerParams.ProgressThread.
func (r *Request) PreadyNode(g condition.GraphBuilder, deps []condition.Node, p int) (condition.Node, error) {
	if err := r.ensurePrepared(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.role != sender:
		return nil, fmt.Errorf("pready node on a receive request: %w", ErrInvalidParam)
	case p < 0 || p >= r.parts:
		return nil, fmt.Errorf("pready node: partition %d of %d: %w", p, r.parts, ErrInvalidParam)
	case g == nil || g.Kind() != r.backend.Kind():
		return nil, fmt.Errorf("pready node: the graph is not of the request's backend: %w", ErrInvalidParam)
	case r.st != nil:
		// A staged partition's copy would need a copy node per launch ahead of the
		// put; the CUDA-IPC path will give device buffers graph nodes.
		return nil, fmt.Errorf("pready node: a staged (device) buffer: use PreadyOnStream on a stream the graph waits for: %w", ErrUnsupported)
	}
	if err := r.errLocked(); err != nil {
		return nil, err
	}
	gate, err := r.gateNodeLocked(g, deps, p)
	if err != nil {
		return nil, fmt.Errorf("pready node: %w", err)
	}
	cond, err := condition.Create(condition.Param{Category: condition.Graph, Backend: r.backend, Graph: g, Deps: []condition.Node{gate}})
	if err != nil {
		return nil, fmt.Errorf("pready node: %w", err)
	}
	if _, err := r.putLocked(p, &ucp.RequestParam{Condition: cond}, true); err != nil {
		_ = cond.Destroy()
		return nil, fmt.Errorf("pready node: %w", err)
	}
	r.graphConds = append(r.graphConds, cond)
	return cond.Node(), nil
}

// gateNodeLocked adds the node that waits for the receiver's ready flag of p and
// takes it (stores 0), so each launch moves p once per iteration the receiver started.
func (r *Request) gateNodeLocked(g condition.GraphBuilder, deps []condition.Node, p int) (condition.Node, error) {
	flag := r.words.Word(p)
	switch g := g.(type) {
	case *graph.Host:
		return g.AddTask(deps, func() error {
			for i := 0; ; i++ {
				v := flag.Load()
				if v == failedWord {
					r.mu.Lock()
					err := r.err
					r.mu.Unlock()
					return fmt.Errorf("pready node: partition %d: %w", p, err)
				}
				if v == 1 && flag.CompareAndSwap(1, 0) {
					return nil
				}
				// The receiver's write may need this worker's progress (tcp).
				if r.w.Progress() == 0 {
					if i < 256 {
						runtime.Gosched()
					} else {
						time.Sleep(10 * time.Microsecond)
					}
				}
			}
		})
	case graph.CUDA:
		nodes, err := graph.CUDANodes(deps...)
		if err != nil {
			return nil, err
		}
		// AND 1: released by the ready flag and by the failure value.
		return g.Graph.AddBatchMemOpNode(nodes, []cuda.MemOp{
			cuda.WaitValue64Op(flag.DevicePtr(), 1, cuda.WaitAND),
			cuda.WriteValue64Op(flag.DevicePtr(), 0, cuda.WriteDefault),
		})
	}
	return nil, fmt.Errorf("graph %T: want *graph.Host or graph.CUDA: %w", g, ErrInvalidParam)
}

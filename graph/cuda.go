package graph

import (
	"fmt"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/stream"
)

// CUDA lets graph conditions add their nodes to a CUDA graph. Each operation becomes one
// batch-memop node [write T=1, wait D&1, write D=0] (a one-node batch measured faster
// than two chained nodes, DESIGN §6), or with Split a start node [write T=1] and a wait
// node [wait D&1, write D=0] after it. Instantiate and launch the graph with cgo/cuda:
// every launch performs the operation again with no host call; the proxy resets T when
// it takes the trigger and sets D once the operation completed.
//
// Close CUDA graphs that hold a worker's conditions before closing the worker: a launch
// after that waits for a proxy that is gone (the launch in flight when the worker closes
// is released, with the error in the condition).
type CUDA struct {
	Graph *cuda.Graph
}

// Kind is stream.KindCUDA.
func (c CUDA) Kind() stream.Kind { return stream.KindCUDA }

// AddSignalNodes implements condition.GraphBuilder. deps are cuda.Node values.
func (c CUDA) AddSignalNodes(deps []any, trigger, done *stream.Word, split bool) (start, wait any, err error) {
	if c.Graph == nil {
		return nil, nil, fmt.Errorf("nil CUDA graph: %w", ErrInvalidParam)
	}
	nodes := make([]cuda.Node, 0, len(deps))
	for _, d := range deps {
		n, ok := d.(cuda.Node)
		if !ok {
			return nil, nil, fmt.Errorf("dependency %T is not a cuda.Node: %w", d, ErrInvalidParam)
		}
		nodes = append(nodes, n)
	}
	t, d := trigger.DevicePtr(), done.DevicePtr()
	if t == 0 || d == 0 {
		return nil, nil, fmt.Errorf("signal words without device addresses (a host backend?): %w", ErrInvalidParam)
	}
	fire := cuda.WriteValue64Op(t, 1, cuda.WriteDefault)
	// AND 1: released by 1 (done) and by condition.GraphFailed (all ones).
	complete := []cuda.MemOp{cuda.WaitValue64Op(d, 1, cuda.WaitAND), cuda.WriteValue64Op(d, 0, cuda.WriteDefault)}
	if !split {
		n, err := c.Graph.AddBatchMemOpNode(nodes, append([]cuda.MemOp{fire}, complete...))
		if err != nil {
			return nil, nil, err
		}
		return n, n, nil
	}
	s, err := c.Graph.AddBatchMemOpNode(nodes, []cuda.MemOp{fire})
	if err != nil {
		return nil, nil, err
	}
	w, err := c.Graph.AddBatchMemOpNode([]cuda.Node{s}, complete)
	if err != nil {
		return nil, nil, err
	}
	return s, w, nil
}

var _ condition.GraphBuilder = CUDA{}

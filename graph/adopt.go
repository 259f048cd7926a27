package graph

import (
	"fmt"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/stream"
)

// AdoptCUDA lets graph conditions and prepared partitions (prepare.Request.PreadyNode)
// add their nodes to a CUDA graph built by someone else: a framework's graph captured
// from its stream (torch.cuda.graph, cudaStreamBeginCapture), or a C++ library's
// cudaGraph_t. handle is the raw CUgraph; b is the CUDA backend whose context the graph
// belongs to and whose signal words the conditions will use (a raw CUgraph does not
// name its context). The graph stays its owner's: closing the returned CUDA's Graph
// only releases the wrapper, and the owner instantiates and launches it as usual once
// the nodes are in. Dependencies on the owner's nodes are cuda.NodeFromHandle values.
// Adopting one graph more than once is fine: the completion nodes added through every
// wrapper of it form one chain (see CUDA).
func AdoptCUDA(handle uintptr, b stream.Backend) (CUDA, error) {
	if handle == 0 {
		return CUDA{}, fmt.Errorf("adopt CUDA graph: nil CUgraph: %w", ErrInvalidParam)
	}
	if b == nil {
		return CUDA{}, fmt.Errorf("adopt CUDA graph: nil backend: %w", ErrInvalidParam)
	}
	ctx, _, ok := stream.CUDAContext(b)
	if !ok {
		return CUDA{}, fmt.Errorf("adopt CUDA graph: a %s backend: %w", b.Kind(), ErrInvalidParam)
	}
	g, err := cuda.GraphFromHandle(ctx, handle)
	if err != nil {
		return CUDA{}, fmt.Errorf("adopt CUDA graph: %w", err)
	}
	return CUDA{Graph: g}, nil
}

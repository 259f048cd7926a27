package graph_test

import (
	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// A send added to a CUDA graph a framework captured (torch.cuda.graph,
// cudaStreamBeginCapture): ucpx gets the raw CUgraph and the raw node to follow, adds
// the graph condition's node, and the framework instantiates and launches its graph as
// before; every launch sends buf again. buf is host-mapped pinned memory. (Not run: it
// needs a GPU; tests/gpu_interop_test.go runs it.)
func ExampleAdoptCUDA() {
	var (
		ep            *ucp.Endpoint  // connected to the receiver
		b             stream.Backend // stream.Open(stream.CUDA)
		rawGraph      uintptr        // the framework's CUgraph
		rawLastNode   uintptr        // the captured node the send follows
		buf           []byte         // pinned, mapped
		framework     func() error   // instantiates and launches rawGraph
		sendCondition *condition.Condition
	)
	g, err := graph.AdoptCUDA(rawGraph, b)
	if err != nil {
		return
	}
	defer g.Graph.Close() // the wrapper only: the graph stays the framework's
	sendCondition, err = condition.Create(condition.Param{Category: condition.Graph, Backend: b, Graph: g,
		Deps: []condition.Node{cuda.NodeFromHandle(rawLastNode)}})
	if err != nil {
		return
	}
	if _, err := ep.TagSendNbx(buf, 9, &ucp.RequestParam{Condition: sendCondition}); err != nil {
		return
	}
	_ = framework()
}

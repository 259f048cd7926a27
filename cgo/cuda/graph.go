package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"runtime/cgo"
	"sync"
	"unsafe"
)

// Graph is a CUgraph under construction. Add nodes, then Instantiate it into a
// GraphExec and Launch that as often as needed.
type Graph struct {
	ctx   *Context
	owned bool
	fns   *hostFnSet // Go callbacks of host nodes in this graph

	mu sync.RWMutex
	h  C.CUgraph // nil once closed
}

// Node is a node of a Graph. Nodes are owned by their graph and die with it.
type Node struct{ h C.CUgraphNode }

// NodeFromHandle wraps a raw CUgraphNode.
func NodeFromHandle(h uintptr) Node {
	return Node{h: C.ucpx_node_from(C.uintptr_t(h))}
}

// Handle is the raw CUgraphNode.
func (n Node) Handle() uintptr { return uintptr(unsafe.Pointer(n.h)) }

// NodeType is a CUgraphNodeType.
type NodeType int

const (
	NodeKernel      NodeType = 0
	NodeMemcpy      NodeType = 1
	NodeMemset      NodeType = 2
	NodeHost        NodeType = 3
	NodeGraph       NodeType = 4
	NodeEmpty       NodeType = 5
	NodeWaitEvent   NodeType = 6
	NodeEventRecord NodeType = 7
	NodeBatchMemOp  NodeType = 12
)

// NewGraph creates an empty graph.
func (c *Context) NewGraph() (*Graph, error) {
	h, err := c.raw("cuGraphCreate")
	if err != nil {
		return nil, err
	}
	var g C.CUgraph
	if err := check("cuGraphCreate", C.ucpx_graph_create(h, &g, 0)); err != nil {
		return nil, err
	}
	return &Graph{ctx: c, owned: true, fns: newHostFnSet(), h: g}, nil
}

// GraphFromHandle wraps a raw CUgraph of ctx made elsewhere. The Graph borrows it:
// Close does not destroy it. Host nodes added through the wrapper keep their Go
// callbacks until the wrapper and every GraphExec made from it are closed.
func GraphFromHandle(ctx *Context, h uintptr) (*Graph, error) {
	if _, err := ctx.raw("GraphFromHandle"); err != nil {
		return nil, err
	}
	if h == 0 {
		return nil, invalid("GraphFromHandle", "nil CUgraph")
	}
	return &Graph{ctx: ctx, fns: newHostFnSet(), h: C.ucpx_graph_from(C.uintptr_t(h))}, nil
}

// Handle is the raw CUgraph, 0 after Close.
func (g *Graph) Handle() uintptr {
	if g == nil {
		return 0
	}
	g.mu.RLock()
	defer g.mu.RUnlock()
	return uintptr(unsafe.Pointer(g.h))
}

func (g *Graph) rlock(op string) error {
	if g == nil {
		return closedErr(op, "graph")
	}
	g.mu.RLock()
	if g.h == nil {
		g.mu.RUnlock()
		return closedErr(op, "graph")
	}
	return nil
}

// depsPtr returns the C view of a dependency list (Node is a single C pointer,
// so []Node has the layout of CUgraphNode[]; Go memory without Go pointers).
func depsPtr(deps []Node) (*C.CUgraphNode, C.size_t) {
	if len(deps) == 0 {
		return nil, 0
	}
	return (*C.CUgraphNode)(unsafe.Pointer(&deps[0])), C.size_t(len(deps))
}

func checkDeps(op string, deps []Node) error {
	for i, d := range deps {
		if d.h == nil {
			return invalid(op, "dependency %d is a nil node", i)
		}
	}
	return nil
}

// AddEmptyNode adds a node that does nothing: a join point for dependencies.
func (g *Graph) AddEmptyNode(deps []Node) (Node, error) {
	const op = "cuGraphAddEmptyNode"
	if err := checkDeps(op, deps); err != nil {
		return Node{}, err
	}
	if err := g.rlock(op); err != nil {
		return Node{}, err
	}
	defer g.mu.RUnlock()
	d, n := depsPtr(deps)
	var node C.CUgraphNode
	err := check(op, C.ucpx_graph_add_empty_node(g.ctx.h, &node, g.h, d, n))
	return Node{node}, err
}

// AddBatchMemOpNode adds a node running ops in order, like BatchMemOp on a
// stream. The values are fixed at instantiation (see GraphExec.SetBatchMemOpNodeParams).
func (g *Graph) AddBatchMemOpNode(deps []Node, ops []MemOp) (Node, error) {
	const op = "cuGraphAddBatchMemOpNode"
	if err := checkDeps(op, deps); err != nil {
		return Node{}, err
	}
	arr, err := memopArray(op, ops)
	if err != nil {
		return Node{}, err
	}
	if err := g.rlock(op); err != nil {
		return Node{}, err
	}
	defer g.mu.RUnlock()
	d, n := depsPtr(deps)
	var node C.CUgraphNode
	err = check(op, C.ucpx_graph_add_batch_memop_node(g.ctx.h, &node, g.h, d, n, &arr[0], C.uint(len(arr))))
	return Node{node}, err
}

// AddHostNode adds a node that runs fn on a driver thread on every launch. fn
// must not call CUDA.
func (g *Graph) AddHostNode(deps []Node, fn func()) (Node, error) {
	const op = "cuGraphAddHostNode"
	if fn == nil {
		return Node{}, invalid(op, "nil function")
	}
	if err := checkDeps(op, deps); err != nil {
		return Node{}, err
	}
	if err := g.rlock(op); err != nil {
		return Node{}, err
	}
	defer g.mu.RUnlock()
	h := cgo.NewHandle(&hostCall{fn: fn})
	d, n := depsPtr(deps)
	var node C.CUgraphNode
	if err := check(op, C.ucpx_graph_add_host_node(g.ctx.h, &node, g.h, d, n, C.uintptr_t(h))); err != nil {
		h.Delete()
		return Node{}, err
	}
	g.fns.add(h)
	return Node{node}, nil
}

// AddMemcpyNode adds a 1-D copy of n bytes between unified addresses (device,
// pinned or registered host memory).
func (g *Graph) AddMemcpyNode(deps []Node, dst, src uintptr, size int) (Node, error) {
	const op = "cuGraphAddMemcpyNode"
	if err := checkCopy(op, dst, src, size); err != nil {
		return Node{}, err
	}
	if err := checkDeps(op, deps); err != nil {
		return Node{}, err
	}
	if err := g.rlock(op); err != nil {
		return Node{}, err
	}
	defer g.mu.RUnlock()
	d, n := depsPtr(deps)
	var node C.CUgraphNode
	err := check(op, C.ucpx_graph_add_memcpy_node(g.ctx.h, &node, g.h, d, n, C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(size)))
	return Node{node}, err
}

// AddMemsetNode adds a node setting count elements of elemSize bytes (1, 2 or
// 4) at device address dst to value.
func (g *Graph) AddMemsetNode(deps []Node, dst uintptr, value uint32, elemSize, count int) (Node, error) {
	const op = "cuGraphAddMemsetNode"
	if dst == 0 || count <= 0 {
		return Node{}, invalid(op, "memset of %d elements at %#x", count, dst)
	}
	switch elemSize {
	case 1, 2, 4:
	default:
		return Node{}, invalid(op, "element size %d, want 1, 2 or 4", elemSize)
	}
	if dst%uintptr(elemSize) != 0 {
		return Node{}, invalid(op, "address %#x is not %d-byte aligned", dst, elemSize)
	}
	if elemSize < 4 && value >= 1<<(8*elemSize) {
		return Node{}, invalid(op, "value %#x does not fit %d bytes", value, elemSize)
	}
	if err := checkDeps(op, deps); err != nil {
		return Node{}, err
	}
	if err := g.rlock(op); err != nil {
		return Node{}, err
	}
	defer g.mu.RUnlock()
	d, n := depsPtr(deps)
	var node C.CUgraphNode
	err := check(op, C.ucpx_graph_add_memset_node(g.ctx.h, &node, g.h, d, n, C.CUdeviceptr(dst), C.uint(value), C.uint(elemSize), C.size_t(count)))
	return Node{node}, err
}

// AddKernelNode adds a kernel launch; args are packed as for Stream.LaunchKernel
// and copied into the node.
func (g *Graph) AddKernelNode(deps []Node, f *Function, cfg LaunchConfig, args ...any) (Node, error) {
	const op = "cuGraphAddKernelNode"
	if err := checkDeps(op, deps); err != nil {
		return Node{}, err
	}
	if err := cfg.validate(op); err != nil {
		return Node{}, err
	}
	params, err := packArgs(op, args)
	if err != nil {
		return Node{}, err
	}
	defer params.free()
	fh, err := f.raw(op)
	if err != nil {
		return Node{}, err
	}
	defer f.mod.mu.RUnlock()
	if err := g.rlock(op); err != nil {
		return Node{}, err
	}
	defer g.mu.RUnlock()
	d, n := depsPtr(deps)
	flat, offs, nargs := params.c()
	var node C.CUgraphNode
	err = check(op, C.ucpx_graph_add_kernel_node(g.ctx.h, &node, g.h, d, n, fh,
		C.uint(cfg.Grid.X), C.uint(cfg.Grid.Y), C.uint(cfg.Grid.Z),
		C.uint(cfg.Block.X), C.uint(cfg.Block.Y), C.uint(cfg.Block.Z),
		C.uint(cfg.SharedMemBytes), flat, offs, nargs))
	return Node{node}, err
}

// AddEventRecordNode adds a node recording e.
func (g *Graph) AddEventRecordNode(deps []Node, e *Event) (Node, error) {
	return g.addEventNode("cuGraphAddEventRecordNode", deps, e, true)
}

// AddEventWaitNode adds a node waiting for e (recorded elsewhere).
func (g *Graph) AddEventWaitNode(deps []Node, e *Event) (Node, error) {
	return g.addEventNode("cuGraphAddEventWaitNode", deps, e, false)
}

func (g *Graph) addEventNode(op string, deps []Node, e *Event, record bool) (Node, error) {
	if err := checkDeps(op, deps); err != nil {
		return Node{}, err
	}
	if err := e.rlock(op); err != nil {
		return Node{}, err
	}
	defer e.mu.RUnlock()
	if err := g.rlock(op); err != nil {
		return Node{}, err
	}
	defer g.mu.RUnlock()
	d, n := depsPtr(deps)
	var node C.CUgraphNode
	var r C.CUresult
	if record {
		r = C.ucpx_graph_add_event_record_node(g.ctx.h, &node, g.h, d, n, e.h)
	} else {
		r = C.ucpx_graph_add_event_wait_node(g.ctx.h, &node, g.h, d, n, e.h)
	}
	return Node{node}, check(op, r)
}

// AddChildGraphNode embeds a copy of child. child may be closed afterwards; its
// Go host callbacks stay alive as long as g needs them.
func (g *Graph) AddChildGraphNode(deps []Node, child *Graph) (Node, error) {
	const op = "cuGraphAddChildGraphNode"
	if err := checkDeps(op, deps); err != nil {
		return Node{}, err
	}
	if child == g {
		return Node{}, invalid(op, "a graph cannot contain itself")
	}
	if err := child.rlock(op); err != nil {
		return Node{}, err
	}
	defer child.mu.RUnlock()
	if err := g.rlock(op); err != nil {
		return Node{}, err
	}
	defer g.mu.RUnlock()
	d, n := depsPtr(deps)
	var node C.CUgraphNode
	if err := check(op, C.ucpx_graph_add_child_graph_node(g.ctx.h, &node, g.h, d, n, child.h)); err != nil {
		return Node{}, err
	}
	g.fns.addChild(child.fns)
	return Node{node}, nil
}

// AddDependencies adds the edges from[i] -> to[i].
func (g *Graph) AddDependencies(from, to []Node) error {
	const op = "cuGraphAddDependencies"
	if len(from) != len(to) || len(from) == 0 {
		return invalid(op, "%d sources and %d destinations", len(from), len(to))
	}
	if err := checkDeps(op, from); err != nil {
		return err
	}
	if err := checkDeps(op, to); err != nil {
		return err
	}
	if err := g.rlock(op); err != nil {
		return err
	}
	defer g.mu.RUnlock()
	f, n := depsPtr(from)
	t, _ := depsPtr(to)
	return check(op, C.ucpx_graph_add_dependencies(g.ctx.h, g.h, f, t, n))
}

// Nodes lists the graph's nodes.
func (g *Graph) Nodes() ([]Node, error) {
	const op = "cuGraphGetNodes"
	if err := g.rlock(op); err != nil {
		return nil, err
	}
	defer g.mu.RUnlock()
	var n C.size_t
	if err := check(op, C.ucpx_graph_get_nodes(g.ctx.h, g.h, nil, &n)); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil
	}
	nodes := make([]Node, n)
	if err := check(op, C.ucpx_graph_get_nodes(g.ctx.h, g.h, (*C.CUgraphNode)(unsafe.Pointer(&nodes[0])), &n)); err != nil {
		return nil, err
	}
	return nodes[:n], nil
}

// NodeType returns the kind of node n of g.
func (g *Graph) NodeType(n Node) (NodeType, error) {
	const op = "cuGraphNodeGetType"
	if n.h == nil {
		return 0, invalid(op, "nil node")
	}
	if err := g.rlock(op); err != nil {
		return 0, err
	}
	defer g.mu.RUnlock()
	var t C.CUgraphNodeType
	if err := check(op, C.ucpx_graph_node_get_type(g.ctx.h, n.h, &t)); err != nil {
		return 0, err
	}
	return NodeType(t), nil
}

// DestroyNode removes node n of g and its edges (cuGraphDestroyNode). GraphExecs made
// from g keep it. A host node's Go callback stays alive until g is closed.
func (g *Graph) DestroyNode(n Node) error {
	const op = "cuGraphDestroyNode"
	if n.h == nil {
		return invalid(op, "nil node")
	}
	if err := g.rlock(op); err != nil {
		return err
	}
	defer g.mu.RUnlock()
	return check(op, C.ucpx_graph_destroy_node(g.ctx.h, n.h))
}

// InstantiateFlags are cuGraphInstantiateWithFlags flags.
type InstantiateFlags uint64

// (CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD is missing on purpose: only
// cuGraphInstantiateWithParams accepts it.)
const (
	InstantiateAutoFreeOnLaunch InstantiateFlags = 1
	InstantiateDeviceLaunch     InstantiateFlags = 4
	InstantiateUseNodePriority  InstantiateFlags = 8
)

// GraphExec is an instantiated graph (CUgraphExec).
type GraphExec struct {
	ctx *Context
	fns *hostFnSet

	mu sync.RWMutex
	h  C.CUgraphExec // nil once closed
}

// Instantiate turns the graph into an executable graph. The graph may be
// changed or closed afterwards without affecting the GraphExec.
func (g *Graph) Instantiate(flags InstantiateFlags) (*GraphExec, error) {
	const op = "cuGraphInstantiateWithFlags"
	if flags&^(InstantiateAutoFreeOnLaunch|InstantiateDeviceLaunch|InstantiateUseNodePriority) != 0 {
		return nil, invalid(op, "unknown instantiate flags %#x", uint64(flags))
	}
	if err := g.rlock(op); err != nil {
		return nil, err
	}
	defer g.mu.RUnlock()
	var x C.CUgraphExec
	if err := check(op, C.ucpx_graph_instantiate(g.ctx.h, &x, g.h, C.ulonglong(flags))); err != nil {
		return nil, err
	}
	return &GraphExec{ctx: g.ctx, fns: g.fns.retain(), h: x}, nil
}

// Close destroys the graph (cuGraphDestroy); a borrowed graph is only marked
// closed. GraphExecs made from it stay valid. A second Close returns an error
// matching ErrInvalidHandle.
func (g *Graph) Close() error {
	if g == nil {
		return closedErr("cuGraphDestroy", "graph")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.h == nil {
		return closedErr("cuGraphDestroy", "graph")
	}
	h := g.h
	g.h = nil
	var err error
	if g.owned {
		err = check("cuGraphDestroy", C.ucpx_graph_destroy(g.ctx.h, h))
	}
	g.fns.release()
	return err
}

// Handle is the raw CUgraphExec, 0 after Close.
func (x *GraphExec) Handle() uintptr {
	if x == nil {
		return 0
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	return uintptr(unsafe.Pointer(x.h))
}

func (x *GraphExec) rlock(op string) error {
	if x == nil {
		return closedErr(op, "graph exec")
	}
	x.mu.RLock()
	if x.h == nil {
		x.mu.RUnlock()
		return closedErr(op, "graph exec")
	}
	return nil
}

// Launch enqueues one run of the graph on s.
func (x *GraphExec) Launch(s *Stream) error {
	const op = "cuGraphLaunch"
	if err := s.rlock(op); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	if err := x.rlock(op); err != nil {
		return err
	}
	defer x.mu.RUnlock()
	return check(op, C.ucpx_graph_launch(x.ctx.h, x.h, s.h))
}

// SetBatchMemOpNodeParams replaces the operations of batch-memop node n for
// later launches (cuGraphExecBatchMemOpNodeSetParams). The driver allows
// changing addresses and values but not the number or kinds of operations.
func (x *GraphExec) SetBatchMemOpNodeParams(n Node, ops []MemOp) error {
	const op = "cuGraphExecBatchMemOpNodeSetParams"
	if n.h == nil {
		return invalid(op, "nil node")
	}
	arr, err := memopArray(op, ops)
	if err != nil {
		return err
	}
	if err := x.rlock(op); err != nil {
		return err
	}
	defer x.mu.RUnlock()
	return check(op, C.ucpx_graph_exec_batch_memop_node_set_params(x.ctx.h, x.h, n.h, &arr[0], C.uint(len(arr))))
}

// Close destroys the executable graph (cuGraphExecDestroy). A second Close
// returns an error matching ErrInvalidHandle.
func (x *GraphExec) Close() error {
	if x == nil {
		return closedErr("cuGraphExecDestroy", "graph exec")
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.h == nil {
		return closedErr("cuGraphExecDestroy", "graph exec")
	}
	h := x.h
	x.h = nil
	err := check("cuGraphExecDestroy", C.ucpx_graph_exec_destroy(x.ctx.h, h))
	x.fns.release()
	return err
}

// Package graph holds communication nodes in graphs: the host graph (a DAG of host
// tasks, the CPU twin of a CUDA graph, used where there is no GPU) and the graph nodes
// of graph conditions, which perform an operation each time the graph runs.
package graph

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ucpx/ucpx/stream"
)

// Errors, wrapped with detail; test with errors.Is.
var (
	ErrInvalidParam = errors.New("graph: invalid parameter")
	ErrClosed       = errors.New("graph: closed")
	// ErrInFlight: the executable graph still has launches running; nothing was closed.
	ErrInFlight = errors.New("graph: launch in flight")
	// ErrCycle: the dependencies form a cycle; the graph cannot be instantiated.
	ErrCycle = errors.New("graph: dependency cycle")
)

// Host is a graph of host tasks: nodes run on goroutines once all their dependencies
// have run. Build it, Instantiate it once, and Launch the executable graph as often as
// needed; each launch runs every node again. Safe for concurrent use.
type Host struct {
	mu     sync.Mutex
	nodes  []*HostNode
	closed bool
}

// HostNode is a node of a Host graph.
type HostNode struct {
	g    *Host
	id   int
	deps []*HostNode
	task func() error
}

// NewHost creates an empty host graph.
func NewHost() *Host { return &Host{} }

// Kind is stream.KindHost: host graphs launch on host streams.
func (g *Host) Kind() stream.Kind { return stream.KindHost }

// AddTask adds a node running task after deps. A task's error fails the launch; nodes
// that depend on it do not run.
func (g *Host) AddTask(deps []*HostNode, task func() error) (*HostNode, error) {
	if task == nil {
		return nil, fmt.Errorf("add task: nil task: %w", ErrInvalidParam)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, fmt.Errorf("add task: %w", ErrClosed)
	}
	for _, d := range deps {
		if d == nil || d.g != g {
			return nil, fmt.Errorf("add task: dependency from another graph: %w", ErrInvalidParam)
		}
	}
	n := &HostNode{g: g, id: len(g.nodes), deps: append([]*HostNode(nil), deps...), task: task}
	g.nodes = append(g.nodes, n)
	return n, nil
}

// AddEmpty adds a node that only joins its dependencies.
func (g *Host) AddEmpty(deps []*HostNode) (*HostNode, error) {
	return g.AddTask(deps, func() error { return nil })
}

// AddDependencies makes to depend on from (both of this graph).
func (g *Host) AddDependencies(from, to *HostNode) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return fmt.Errorf("add dependencies: %w", ErrClosed)
	}
	if from == nil || to == nil || from.g != g || to.g != g || from == to {
		return fmt.Errorf("add dependencies: %w", ErrInvalidParam)
	}
	to.deps = append(to.deps, from)
	return nil
}

// Len is the number of nodes.
func (g *Host) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.nodes)
}

// Close releases the graph. Executable graphs made from it stay usable.
func (g *Host) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return fmt.Errorf("close: %w", ErrClosed)
	}
	g.closed = true
	return nil
}

// HostExec is an instantiated host graph: a fixed topology, launched on host streams.
type HostExec struct {
	tasks    []func() error
	deps     [][]int // node -> its dependencies
	children [][]int // node -> nodes depending on it
	roots    []int
	mu       sync.Mutex // orders Launch against Close
	inFlight atomic.Int64
	closed   bool
}

// Instantiate freezes the graph's topology (ErrCycle if it has one).
func (g *Host) Instantiate() (*HostExec, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, fmt.Errorf("instantiate: %w", ErrClosed)
	}
	n := len(g.nodes)
	x := &HostExec{tasks: make([]func() error, n), deps: make([][]int, n), children: make([][]int, n)}
	indegree := make([]int, n)
	for _, node := range g.nodes {
		x.tasks[node.id] = node.task
		seen := map[int]bool{}
		for _, d := range node.deps {
			if !seen[d.id] {
				seen[d.id] = true
				x.deps[node.id] = append(x.deps[node.id], d.id)
				x.children[d.id] = append(x.children[d.id], node.id)
				indegree[node.id]++
			}
		}
	}
	// Kahn's algorithm: every node must become ready.
	ready := []int{}
	for i := range indegree {
		if indegree[i] == 0 {
			ready = append(ready, i)
		}
	}
	x.roots = append([]int(nil), ready...)
	left := append([]int(nil), indegree...)
	visited := 0
	for len(ready) > 0 {
		i := ready[len(ready)-1]
		ready = ready[:len(ready)-1]
		visited++
		for _, c := range x.children[i] {
			if left[c]--; left[c] == 0 {
				ready = append(ready, c)
			}
		}
	}
	if visited != n {
		return nil, fmt.Errorf("instantiate: %d of %d nodes are on a cycle: %w", n-visited, n, ErrCycle)
	}
	return x, nil
}

// Launch enqueues one run of the graph on s: it starts when s gets there, and later
// work on s runs after every node has finished. A failed node fails the launch (the
// stream's sticky error, returned by Synchronize), and its dependents do not run.
func (x *HostExec) Launch(s stream.Stream) error {
	if s == nil || s.Kind() != stream.KindHost {
		return fmt.Errorf("launch: a host graph needs a host stream: %w", ErrInvalidParam)
	}
	x.mu.Lock()
	if x.closed {
		x.mu.Unlock()
		return fmt.Errorf("launch: %w", ErrClosed)
	}
	x.inFlight.Add(1)
	x.mu.Unlock()
	var runErr error
	if err := s.LaunchHostFunc(func() {
		defer x.inFlight.Add(-1)
		runErr = x.run()
		if runErr != nil {
			panic(runErr) // becomes the stream's sticky error (stream.PanicError)
		}
	}); err != nil {
		x.inFlight.Add(-1)
		return fmt.Errorf("launch: %w", err)
	}
	return nil
}

// run executes the DAG once: each node on its own goroutine once its dependencies are
// done; it returns the first node error.
func (x *HostExec) run() error {
	n := len(x.tasks)
	if n == 0 {
		return nil
	}
	left := make([]atomic.Int32, n)
	for i := range x.deps {
		left[i].Store(int32(len(x.deps[i])))
	}
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
		failed   atomic.Bool
	)
	var start func(i int)
	start = func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if failed.Load() {
				return
			}
			if err := x.tasks[i](); err != nil {
				failed.Store(true)
				errOnce.Do(func() { firstErr = fmt.Errorf("node %d: %w", i, err) })
				return
			}
			for _, c := range x.children[i] {
				if left[c].Add(-1) == 0 {
					start(c)
				}
			}
		}()
	}
	for _, r := range x.roots {
		start(r)
	}
	wg.Wait()
	return firstErr
}

// InFlight is the number of launches enqueued and not finished.
func (x *HostExec) InFlight() int { return int(x.inFlight.Load()) }

// Close releases the executable graph. With launches in flight it returns an error
// matching ErrInFlight and closes nothing (wait for the stream first).
func (x *HostExec) Close() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return fmt.Errorf("close: %w", ErrClosed)
	}
	if n := x.inFlight.Load(); n > 0 {
		return fmt.Errorf("close: %d launch(es) not finished: %w", n, ErrInFlight)
	}
	x.closed = true
	return nil
}

package graph

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/internal/errs"
	"github.com/ucpx/ucpx/stream"
)

// Errors, wrapped with detail; test with errors.Is.
var (
	ErrInvalidParam = errs.InvalidParam
	ErrClosed       = errs.Closed
	// ErrInFlight: the executable graph still has launches running (Close: nothing
	// was closed), or a failed launch's communication operations are still in flight
	// (a launch: it ran nothing; launch again once they completed).
	ErrInFlight = errs.New("graph: launch in flight", errs.Busy)
	// ErrCycle: the dependencies form a cycle; the graph cannot be instantiated.
	ErrCycle = errs.New("graph: dependency cycle", errs.InvalidParam)
)

// Host is a graph of host tasks: nodes run on goroutines once all their dependencies
// have run. Build it, Instantiate it once, and Launch the executable graph as often as
// needed; each launch runs every node again. Safe for concurrent use.
type Host struct {
	mu     sync.Mutex
	nodes  []*HostNode
	closed bool
	words  *nodeWords // made at the first Instantiate of a graph with communication nodes
}

// HostNode is a node of a Host graph. It is a condition.Node, so the nodes of graph
// conditions and the graph's own mix in every call without type assertions.
type HostNode struct {
	g    *Host
	id   int
	deps []*HostNode
	task func() error
	// Signal nodes (communication operations): inline tasks only store a word, so the
	// launching goroutine runs them itself; a node with waitFor completes once the
	// engine fires that word, watched by the launch's event loop, not by a goroutine.
	inline  bool
	waitFor *stream.Word
	trigger *stream.Word // the word the node's inline task stores (its block is kicked)
	// op: the words of the node's operation (a signal node's; split nodes share them):
	// a wait node takes the trigger back when no engine will take it (ErrNoOperation),
	// a failed launch owes the completion of a trigger node it did not reach (owed).
	op opWords
}

// opWords are a communication operation's trigger and completion words.
type opWords struct{ trigger, done *stream.Word }

// Handle is 0: a host graph node has no CUDA handle (condition.Node).
func (n *HostNode) Handle() uintptr { return 0 }

// hostNodes takes the host graph nodes out of deps.
func hostNodes(op string, deps []condition.Node) ([]*HostNode, error) {
	hd := make([]*HostNode, 0, len(deps))
	for _, d := range deps {
		n, ok := d.(*HostNode)
		if !ok || n == nil {
			return nil, fmt.Errorf("%s: dependency %T is not a host graph node: %w", op, d, ErrInvalidParam)
		}
		hd = append(hd, n)
	}
	return hd, nil
}

// NewHost creates an empty host graph.
func NewHost() *Host { return &Host{} }

// Kind is stream.KindHost: host graphs launch on host streams.
func (g *Host) Kind() stream.Kind { return stream.KindHost }

// AddTask adds a node running task after deps. A task's error fails the launch; nodes
// that depend on it do not run.
func (g *Host) AddTask(deps []condition.Node, task func() error) (*HostNode, error) {
	if task == nil {
		return nil, fmt.Errorf("add task: nil task: %w", ErrInvalidParam)
	}
	hd, err := hostNodes("add task", deps)
	if err != nil {
		return nil, err
	}
	return g.add("add task", hd, HostNode{task: task})
}

// add appends node n (its task and kind set) after deps, the one place nodes are made.
func (g *Host) add(op string, deps []*HostNode, n HostNode) (*HostNode, error) {
	if g == nil {
		return nil, fmt.Errorf("%s: nil graph: %w", op, ErrInvalidParam)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, fmt.Errorf("%s: %w", op, ErrClosed)
	}
	for _, d := range deps {
		if d == nil || d.g != g {
			return nil, fmt.Errorf("%s: dependency from another graph: %w", op, ErrInvalidParam)
		}
	}
	n.g, n.id, n.deps = g, len(g.nodes), append([]*HostNode(nil), deps...)
	g.nodes = append(g.nodes, &n)
	return &n, nil
}

// AddEmpty adds a node that only joins its dependencies.
func (g *Host) AddEmpty(deps []condition.Node) (*HostNode, error) {
	return g.AddTask(deps, func() error { return nil })
}

// AddDependencies makes to depend on from (both of this graph).
func (g *Host) AddDependencies(from, to condition.Node) error {
	nodes, err := hostNodes("add dependencies", []condition.Node{from, to})
	if err != nil {
		return err
	}
	return g.addDependency(nodes[0], nodes[1])
}

func (g *Host) addDependency(from, to *HostNode) error {
	if g == nil {
		return fmt.Errorf("add dependencies: nil graph: %w", ErrInvalidParam)
	}
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
	if g == nil {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.nodes)
}

// Close releases the graph. Executable graphs made from it stay usable.
func (g *Host) Close() error {
	if g == nil {
		return fmt.Errorf("close: nil graph: %w", ErrInvalidParam)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return fmt.Errorf("close: %w", ErrClosed)
	}
	g.closed = true
	return nil
}

// HostExec is an instantiated host graph: a fixed topology, launched on host streams.
// Only Host.Instantiate makes one: a zero HostExec's Launch fails with ErrInvalidParam
// (it has no graph to run), and its Close, having nothing to release, succeeds once.
type HostExec struct {
	tasks   []func() error
	inline  []bool
	waitFor []*stream.Word
	trigger []*stream.Word
	op      []opWords
	// follow: for a communication node (one node: its trigger and its wait), the
	// signal nodes whose only dependency it is. A launch asks the node's engine
	// (stream.Follower) to store their triggers itself when the node's operation
	// completes, in the round that completes it, and then skips their tasks.
	follow [][]int
	// splitStart: for the wait node of a Split communication operation, its start
	// node (-1 for other nodes). A launch that fails after a start node stored its
	// trigger and before the wait node took the completion owes that completion.
	splitStart []int
	// waitBlocks: the blocks of the communication nodes' completion words, each once.
	waitBlocks []*stream.WordBlock
	deps       [][]int   // node -> its dependencies
	children   [][]int   // node -> nodes depending on it
	states     sync.Pool // *launchState
	roots      []int
	mu         sync.Mutex // orders Launch against Close
	// inFlight counts launches enqueued and not finished; leave (made once) takes one
	// off, when a launch ends or its stream drops it (stream.HostFuncDropper).
	inFlight atomic.Int64
	leave    func()
	// onStream: the launches of each stream (under mu), see streamLaunches.
	onStream map[stream.Stream]*streamLaunches
	closed   bool
	// chainedStarts counts the nodes whose trigger an engine stored (tests).
	chainedStarts atomic.Uint64
	// layers: the trigger words of a graph of communication nodes only, whose every
	// node depends on all nodes of the layers before its own and on nothing else (nil
	// otherwise). Such a launch runs as one completion chain of the nodes' engine
	// (stream.Chainer), each layer posted from the completion of the one before, with
	// no Go between the hops; chain holds the prepared run.
	layers [][]*stream.Word
	chain  *launchChain
	// chainedLaunches counts the launches run as a chain (tests).
	chainedLaunches atomic.Uint64
	// words: the communication nodes' words' state, shared by every executable graph
	// of the graph (they all use the same words).
	words *nodeWords
}

// nodeWords is what the executable graphs of one Host share about its communication
// nodes' words.
type nodeWords struct {
	// runSem lets one run at a time use the words (two overlapping runs could both
	// store a trigger the engine takes once, and one would wait for good).
	runSem chan struct{}
	// owed: completion words of communication nodes a failed launch left in flight.
	// Their operations still complete and store 1, which a later launch would take
	// for its own; settleOwed consumes them first (owing: owed is not empty). Their
	// engines know (completionOwer): no launch waits for them, so Condition.Destroy
	// need not wait for a relaunch.
	owedMu sync.Mutex
	owed   map[*stream.Word]bool
	owing  atomic.Bool
}

// Instantiate freezes the graph's topology (ErrCycle if it has one).
func (g *Host) Instantiate() (*HostExec, error) {
	if g == nil {
		return nil, fmt.Errorf("instantiate: nil graph: %w", ErrInvalidParam)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, fmt.Errorf("instantiate: %w", ErrClosed)
	}
	n := len(g.nodes)
	x := &HostExec{tasks: make([]func() error, n), inline: make([]bool, n), waitFor: make([]*stream.Word, n),
		trigger: make([]*stream.Word, n), op: make([]opWords, n), follow: make([][]int, n), splitStart: make([]int, n),
		deps: make([][]int, n), children: make([][]int, n)}
	x.leave = func() { x.inFlight.Add(-1) }
	indegree := make([]int, n)
	for _, node := range g.nodes {
		x.tasks[node.id] = node.task
		x.inline[node.id] = node.inline
		x.waitFor[node.id] = node.waitFor
		x.trigger[node.id] = node.trigger
		x.op[node.id] = node.op
		if w := node.waitFor; w != nil && !slices.Contains(x.waitBlocks, w.Block()) {
			x.waitBlocks = append(x.waitBlocks, w.Block())
		}
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
	for i := range n {
		if d := x.deps[i]; len(d) == 1 && x.trigger[i] != nil && x.trigger[d[0]] != nil && x.waitFor[d[0]] != nil {
			x.follow[d[0]] = append(x.follow[d[0]], i)
		}
	}
	starts := map[*stream.Word]int{} // split start nodes by trigger word
	for i := range n {
		x.splitStart[i] = -1
		if x.trigger[i] != nil && x.waitFor[i] == nil {
			starts[x.trigger[i]] = i
		}
	}
	for i := range n {
		if s, ok := starts[x.op[i].trigger]; ok && x.waitFor[i] != nil && x.trigger[i] == nil {
			x.splitStart[i] = s
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
	if len(x.waitBlocks) > 0 {
		if g.words == nil {
			g.words = &nodeWords{runSem: make(chan struct{}, 1)}
		}
		x.words = g.words
	}
	if x.layers = x.chainLayers(g.nodes); x.layers != nil {
		x.chain = &launchChain{}
		runtime.AddCleanup(x, func(c *launchChain) { _ = c.release() }, x.chain)
	}
	return x, nil
}

// chainLayers returns the trigger words of x's nodes by layer if every node is a
// communication node (its trigger and its wait in one node) and the dependencies are
// exactly layers: a node of layer L depends, directly or not, on every node of layers
// 0..L-1 and on nothing else. Run as a chain, each layer starts once every operation
// of the one before completed, which then adds no wait the graph does not have.
//
// That holds when each node of layer L > 0 depends directly on every node of layer
// L-1: an ancestor at L-1 reached through another node would put the node at L+1, and
// by induction the layers below come with them.
func (x *HostExec) chainLayers(nodes []*HostNode) [][]*stream.Word {
	n := len(nodes)
	if n == 0 {
		return nil
	}
	for _, node := range nodes {
		if !node.inline || node.trigger == nil || node.waitFor == nil {
			return nil
		}
	}
	// Nodes are added after their dependencies, so ids are a topological order.
	level := make([]int, n)
	var count []int // nodes per level
	for i := range n {
		for _, d := range x.deps[i] {
			if d >= i {
				return nil
			}
			level[i] = max(level[i], level[d]+1)
		}
		if level[i] == len(count) {
			count = append(count, 0)
		}
		count[level[i]]++
	}
	layers := make([][]*stream.Word, len(count))
	for i := range n {
		l := level[i]
		if l > 0 {
			prev := 0 // its dependencies at l-1 (x.deps holds each once)
			for _, d := range x.deps[i] {
				if level[d] == l-1 {
					prev++
				}
			}
			if prev != count[l-1] {
				return nil
			}
		}
		layers[l] = append(layers[l], x.trigger[i])
	}
	return layers
}

// launchChain is the prepared chain of an executable graph's launches, kept apart from
// the HostExec so that a HostExec dropped without Close still releases it (a cleanup):
// the chain's C side lives with the worker until then.
type launchChain struct {
	// mu guards run against release (Close, the cleanup); launches already take
	// turns on the words' runSem (a chained graph has only communication nodes).
	mu  sync.Mutex
	run stream.ChainedLaunch
	// skip: launches to go node by node before the engine is asked again for a chain
	// it could not make (backoff: the last such pause, doubling).
	skip, backoff int
	// closing: run's Close refused (ErrBusy: UCX still holds an operation it canceled,
	// a pull still copies into a buffer); closed again before the next launch, which
	// fails while it cannot be: node by node, it would post the same buffers again.
	closing bool
}

// closeRunLocked closes the prepared run; one that something still holds (ErrBusy) is
// kept, closing. Caller holds c.mu.
func (c *launchChain) closeRunLocked() error {
	if err := c.run.Close(); errors.Is(err, errs.Busy) {
		c.closing = true
		return err
	}
	c.run, c.closing = nil, false
	return nil
}

// release closes the prepared run, if any.
func (c *launchChain) release() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.run == nil {
		return nil
	}
	err := c.run.Close()
	c.run = nil
	return err
}

// maxChainBackoff bounds the launches between two requests for a chain.
const maxChainBackoff = 4096

// runChained runs the launch as the nodes' engine's chain (see HostExec.layers); it
// reports false, having done nothing, where the launch must go node by node. The
// caller holds x.words.runSem.
func (x *HostExec) runChained(abandon context.Context) (bool, error) {
	c := x.chain
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		if err := c.closeRunLocked(); err != nil {
			return true, fmt.Errorf("launch: the chain of an abandoned launch still holds the nodes' buffers: %w", err)
		}
	}
	for range 2 { // a chain that declines is made again once, for this launch
		if c.run == nil {
			if c.skip > 0 {
				c.skip--
				return false, nil
			}
			ch, ok := x.trigger[0].Block().Driver().(stream.Chainer)
			if !ok {
				return false, nil // no engine yet (no operation enqueued), or not one that chains
			}
			run, err := ch.ChainLaunch(x.layers)
			if err != nil {
				// Not now (a node without its operation yet, one in flight from a
				// launch node by node) or not at all: asked again later, less often
				// each time.
				c.backoff = min(max(2*c.backoff, 16), maxChainBackoff)
				c.skip = c.backoff
				return false, nil
			}
			c.run, c.backoff = run, 0
		}
		ran, err := c.run.Run(abandon)
		if ran {
			x.chainedLaunches.Add(1)
			switch {
			case err != nil && abandon.Err() != nil:
				// Stopped for good: made again at the next launch, once closed.
				_ = c.closeRunLocked()
				return true, errAbandoned
			case err != nil:
				return true, fmt.Errorf("%w: %w", ErrOperationFailed, err)
			}
			return true, nil
		}
		// The nodes changed since it was made (or it cannot start now).
		if err := c.closeRunLocked(); err != nil {
			return true, fmt.Errorf("launch: the chain of an earlier launch still holds the nodes' buffers: %w", err)
		}
	}
	return false, nil
}

// Launch enqueues one run of the graph on s: it starts when s gets there, and later
// work on s runs after every node has finished. A failed node fails the launch (the
// stream's sticky error, returned by Synchronize), and its dependents do not run.
// Launches of a graph with communication nodes run one at a time, also on several
// streams (they share the nodes' words), as a CUDA graph's do. A launch waiting for an
// operation when s is closed gives up after the stream's close grace (ErrAbandoned),
// as a blocked stream wait does.
func (x *HostExec) Launch(s stream.Stream) error {
	if x == nil {
		return fmt.Errorf("launch: nil executable graph: %w", ErrInvalidParam)
	}
	if x.leave == nil {
		// A zero HostExec (declared, not returned by Instantiate) has no graph to run.
		return fmt.Errorf("launch: an executable graph not made by Host.Instantiate: %w", ErrInvalidParam)
	}
	if s == nil || s.Kind() != stream.KindHost {
		return fmt.Errorf("launch: a host graph needs a host stream: %w", ErrInvalidParam)
	}
	x.mu.Lock()
	if x.closed {
		x.mu.Unlock()
		return fmt.Errorf("launch: %w", ErrClosed)
	}
	sl := x.launchesOnLocked(s)
	x.inFlight.Add(1)
	x.mu.Unlock()
	var err error
	if d, ok := s.(stream.HostFuncDropper); ok {
		err = d.LaunchHostFuncOrDrop(sl.run, x.leave) // a launch the stream drops leaves too
	} else {
		err = s.LaunchHostFunc(sl.run)
	}
	if err != nil {
		x.leave()
		return fmt.Errorf("launch: %w", err)
	}
	return nil
}

// streamLaunches is what an executable graph keeps for each stream it is launched on:
// the function the stream runs for a launch (made once per stream: a launch allocates
// no closure), and how the stream tells a waiting launch that it is closing.
type streamLaunches struct {
	run func()
	// abandon is done when the stream's Close has waited its grace (stream.Closing;
	// never for other streams); grace is that grace.
	abandon context.Context
	grace   time.Duration
}

// maxStreamRecords: past this many streams' records, Launch forgets them (a launch
// queued keeps its own; a stream launched on again gets a new one).
const maxStreamRecords = 16

// launchesOnLocked returns s's record, made on first use. Caller holds x.mu.
func (x *HostExec) launchesOnLocked(s stream.Stream) *streamLaunches {
	keep := reflect.TypeOf(s).Comparable() // a map key must compare: others get a record per launch
	if keep {
		if sl := x.onStream[s]; sl != nil {
			return sl
		}
	}
	if x.onStream == nil {
		x.onStream = map[stream.Stream]*streamLaunches{}
	}
	if len(x.onStream) >= maxStreamRecords {
		clear(x.onStream)
	}
	sl := &streamLaunches{abandon: context.Background()}
	if c, ok := s.(stream.Closing); ok {
		sl.abandon, sl.grace = c.Abandon(), c.CloseGrace()
	}
	sl.run = func() { x.runLaunch(sl) }
	if keep {
		x.onStream[s] = sl
	}
	return sl
}

// runLaunch is one launch as the stream runs it. A failed node fails it.
func (x *HostExec) runLaunch(sl *streamLaunches) {
	defer x.leave()
	if err := x.run(sl); err != nil {
		panic(err) // becomes the stream's sticky error (stream.PanicError)
	}
}

// errAbandoned: the launch's stream was closed while the launch waited, and the close
// grace passed.
var errAbandoned = fmt.Errorf("graph: launch still waiting after its stream's Close grace: %w", stream.ErrAbandoned)

// acquire takes runSem for a run, giving up once abandon is done.
func (w *nodeWords) acquire(abandon context.Context) error {
	select {
	case w.runSem <- struct{}{}: // first: with both ready, select would pick at random
		return nil
	default:
	}
	select {
	case w.runSem <- struct{}{}:
		return nil
	case <-abandon.Done(): // Background's is nil: never
		return errAbandoned
	}
}

func (w *nodeWords) release() { <-w.runSem }

// run executes the DAG once, as an event loop on the launching goroutine: user tasks
// run on their own goroutines (they may block), signal tasks run inline, and
// communication nodes wait in the loop, which drives the engine and parks on the words'
// notification, so N communication nodes cost no goroutine each. It returns the first
// node error; dependents of a failed node do not run.
func (x *HostExec) run(sl *streamLaunches) error {
	n := len(x.tasks)
	if n == 0 {
		return nil
	}
	abandon := sl.abandon
	if abandon.Err() != nil {
		// Close's grace had passed when this launch began: it gets a grace of its own,
		// as a stream wait that begins then does.
		ctx, cancel := context.WithTimeout(context.Background(), sl.grace)
		defer cancel()
		abandon = ctx
	}
	if x.words != nil {
		if err := x.words.acquire(abandon); err != nil {
			return err
		}
		defer x.words.release()
		if x.words.owing.Load() {
			if err := x.settleOwed(); err != nil {
				return err
			}
		}
	}
	if x.layers != nil {
		if ran, err := x.runChained(abandon); ran {
			return err
		}
	}
	st, _ := x.states.Get().(*launchState)
	if st == nil {
		st = &launchState{left: make([]int, n), chained: make([]bool, n), started: make([]bool, n), results: make(chan finished, n)}
	}
	defer x.states.Put(st)
	left, chained, started, results, scratch := st.left, st.chained, st.started, st.results, &st.scratch
	clear(chained)
	clear(started)
	for i := range x.deps {
		left[i] = len(x.deps[i])
	}
	ready := append(st.ready[:0], x.roots...)
	waits := st.waits[:0]
	running, done := 0, 0
	var firstErr error
	var spinStart time.Time
	var lastYield time.Duration // into the spin, at its last Gosched
	drove := false              // the launch drove its words' engines: it releases them at the end
	complete := func(i int) {
		done++
		for _, c := range x.children[i] {
			if left[c]--; left[c] == 0 {
				ready = append(ready, c)
			}
		}
	}
	afterTask := func(i int, err error) {
		if s := x.splitStart[i]; s >= 0 {
			// A split wait node: it waits for its completion now (waits), or the
			// completion will not come.
			started[s] = false
		}
		switch {
		case err != nil:
			if firstErr == nil {
				firstErr = fmt.Errorf("node %d: %w", i, err)
			}
			if len(x.follow[i]) > 0 {
				// Its operation will not complete (never started, or can run no more):
				// no engine starts the followers armed on it, so none is owed.
				x.disarmFollowers(i, chained)
			}
		case x.waitFor[i] != nil && x.waitFor[i].Block().Driver() == nil:
			// No engine will ever complete it: its condition carries no operation. The
			// trigger goes back to 0, or an operation enqueued later would run at once,
			// outside a launch, and leave its completion for the next launch to find.
			x.op[i].trigger.Store(0) // a nil or freed word ignores it
			if firstErr == nil {
				firstErr = fmt.Errorf("node %d: %w", i, ErrNoOperation)
			}
		case x.waitFor[i] != nil:
			waits = append(waits, i)
		default:
			if x.trigger[i] != nil {
				started[i] = true // a split start node: its wait node takes the completion
			}
			complete(i)
		}
	}
	collect := func(r finished) {
		running--
		afterTask(r.node, r.err)
	}
	kicks := st.kicks[:0] // blocks whose triggers this pass stored
	for spins := 0; ; spins++ {
		for len(ready) > 0 && firstErr == nil {
			i := ready[len(ready)-1]
			ready = ready[:len(ready)-1]
			if x.inline[i] {
				if chained[i] {
					// Its trigger was stored, and its operation issued, by the engine
					// in the round that completed its dependency.
					chained[i] = false // taken: its completion is awaited below
					x.chainedStarts.Add(1)
					var err error
					if x.trigger[i].Block().Closed() {
						err = fmt.Errorf("trigger word freed (condition destroyed): %w", ErrClosed)
					}
					afterTask(i, err)
					continue
				}
				if len(x.follow[i]) > 0 {
					x.armFollowers(i, chained)
				}
				err := x.tasks[i]()
				if err == nil && x.trigger[i] != nil {
					kicks = append(kicks, x.trigger[i].Block())
				}
				afterTask(i, err)
				continue
			}
			running++
			go func(i int) {
				// Sent however the task ends: one that calls runtime.Goexit (t.FailNow)
				// unwinds past runTask's recover, and the launch would wait for good.
				r, returned := finished{node: i}, false
				defer func() {
					if !returned {
						r.err = fmt.Errorf("graph: task of node %d called runtime.Goexit: %w", i, ErrTaskPanicked)
					}
					results <- r
				}()
				r.err = runTask(i, x.tasks[i])
				returned = true
			}(i)
		}
		// Kicked after every trigger that became ready together was stored, once per
		// driver: its round issues them all.
		if len(kicks) > 0 {
			scratch.eachDriver(kicks, stream.Driver.Kick)
			clear(kicks)
			kicks = kicks[:0]
		}
		if firstErr != nil || (done == n) {
			for ; running > 0; running-- { // let started tasks finish
				<-results
			}
			if drove {
				// The launch ends: the engines it drove take their rounds back.
				scratch.eachDriver(x.waitBlocks, stream.Driver.Release)
			}
			if firstErr != nil {
				x.oweInFlight(waits, chained, started)
			}
			clear(waits)
			st.ready, st.waits, st.kicks = ready[:0], waits[:0], kicks[:0]
			return firstErr
		}
		progressed := false
		for k := 0; k < len(waits); k++ {
			w := x.waitFor[waits[k]]
			switch w.Load() {
			case 1:
				w.Store(0)
			case condition.GraphFailed:
				afterTask(waits[k], ErrOperationFailed)
				continue
			default:
				continue
			}
			complete(waits[k])
			waits[k] = waits[len(waits)-1]
			waits = waits[:len(waits)-1]
			k--
			progressed = true
		}
		select {
		case r := <-results:
			collect(r)
			progressed = true
		default:
		}
		if progressed || len(ready) > 0 {
			spins = 0
			continue
		}
		if len(waits) > 0 {
			block := x.waitFor[waits[0]].Block()
			if block.Closed() {
				afterTask(waits[0], fmt.Errorf("completion word freed: %w", ErrClosed))
				continue
			}
			drove = true
			if block.Drive() {
				spins = 0
				continue
			}
			// Spin: 64 rounds with no clock read (most waits end there), then the clock
			// every launchClockEvery rounds, a yield every launchYieldEvery, and a park
			// after launchSpinFor.
			switch {
			case spins < 64:
				continue
			case spins == 64:
				spinStart, lastYield = time.Now(), 0
				continue
			case spins%launchClockEvery != 0:
				continue
			}
			spent := time.Since(spinStart)
			if spent < launchSpinFor {
				if spent-lastYield >= launchYieldEvery {
					lastYield = spent
					runtime.Gosched()
				}
				continue
			}
			if abandon.Err() != nil {
				// Its stream's Close waited the grace: it gives up, as the stream's own
				// waits do; its operations still in flight are owed.
				firstErr = errAbandoned
				continue
			}
			x.park(waits, results, collect, scratch, abandon.Done())
			continue
		}
		collect(<-results) // only user tasks left
	}
}

// oweInFlight records the completion words a failed launch leaves behind: those of
// the communication nodes it was waiting for, of the followers an engine will start
// (chained, not reached), and of the Split operations it started whose wait node it
// did not reach (started).
func (x *HostExec) oweInFlight(waits []int, chained, started []bool) {
	if x.words == nil {
		return // no communication node
	}
	x.words.owedMu.Lock()
	defer x.words.owedMu.Unlock()
	if x.words.owed == nil {
		x.words.owed = map[*stream.Word]bool{}
	}
	for _, i := range waits {
		x.owe(x.waitFor[i])
	}
	for c, armed := range chained {
		if armed {
			x.owe(x.op[c].done)
		}
	}
	for i, run := range started {
		if run {
			x.owe(x.op[i].done)
		}
	}
	x.words.owing.Store(len(x.words.owed) > 0)
}

// owe records completion word w as owed, and tells its engine that no launch waits for
// it (completionOwer). Caller holds owedMu.
func (x *HostExec) owe(w *stream.Word) {
	x.words.owed[w] = true
	oweCompletion(w, true)
}

// completionOwer is the engine of a communication node's words (condition.Engine): a
// launch that fails and leaves an operation in flight tells it that no launch waits for
// the completion, and the launch that takes the completion later tells it that this is
// over. Condition.Destroy then succeeds once such an operation completed; before, it
// refused (ErrBusy) until a relaunch took the completion.
type completionOwer interface {
	OweCompletion(done *stream.Word, owed bool) bool
}

// oweCompletion tells the engine of w whether w's completion is owed.
func oweCompletion(w *stream.Word, owed bool) {
	if o, ok := w.Block().Driver().(completionOwer); ok {
		o.OweCompletion(w, owed)
	}
}

// settleOwed takes the completions a failed launch left in flight (see owed) before
// a launch uses the words again; while one is still in flight the launch fails with
// ErrInFlight rather than take that completion for its own.
func (x *HostExec) settleOwed() error {
	x.words.owedMu.Lock()
	defer x.words.owedMu.Unlock()
	for w := range x.words.owed {
		switch v, ok := w.TryLoad(); {
		case !ok, v == condition.GraphFailed:
			// Gone, or failed for good: the launch fails at the node itself.
		case v == 1:
			w.Store(0)
			oweCompletion(w, false) // taken: the launches wait for it again
		default:
			continue
		}
		delete(x.words.owed, w)
	}
	x.words.owing.Store(len(x.words.owed) > 0)
	if n := len(x.words.owed); n > 0 {
		return fmt.Errorf("%d communication node(s) of a failed launch still in flight (launch again once they complete): %w", n, ErrInFlight)
	}
	return nil
}

// armFollowers asks the engine of communication node i (stream.Follower) to store the
// triggers of the nodes that follow it when its operation completes; chained records
// which it took: the launch skips their tasks. Called before i's trigger is stored,
// and for the followers' own followers too, before anything can complete them. The
// newest node is armed (and issued) first, the order in which a round issues triggers
// that a launch stored together. Nothing is armed on a node whose condition was
// destroyed (its operation never completes, and its engine already dropped what was
// armed on it; the engine refuses such a node's completion word, also where the
// condition goes as it is armed, and forgets what it took then): a destroyed follower
// is armed, the engine skips it, and the launch fails there (ErrClosed), but its own
// followers are not.
func (x *HostExec) armFollowers(i int, chained []bool) {
	if x.trigger[i].Block().Closed() || x.waitFor[i].Block().Closed() {
		return
	}
	f, _ := x.waitFor[i].Block().Driver().(stream.Follower)
	for k := len(x.follow[i]) - 1; k >= 0; k-- {
		c := x.follow[i][k]
		chained[c] = f != nil && f.Follow(x.waitFor[i], x.trigger[c])
		if chained[c] && len(x.follow[c]) > 0 {
			x.armFollowers(c, chained)
		}
	}
}

// disarmFollowers forgets the followers armed on node i, and theirs, once i failed:
// its operation was not started, or can run no more, so no engine stores their
// triggers, and a failed launch must not owe their completions (a completion owed that
// never comes failed every later launch of the graph with ErrInFlight).
func (x *HostExec) disarmFollowers(i int, chained []bool) {
	for _, c := range x.follow[i] {
		if chained[c] {
			chained[c] = false
			x.disarmFollowers(c, chained)
		}
	}
}

// eachDriver calls f once for each driver of blocks: a kick or release of an engine
// concerns all its conditions, so a launch of N communication nodes of one engine makes
// one call, not N. Drivers of a type that cannot be compared get a call per block
// (ucpx's own are comparable since a condition has one engine; the check guards
// another stream.Driver).
func (p *parking) eachDriver(blocks []*stream.WordBlock, f func(stream.Driver)) {
	seen := p.drivers[:0]
next:
	for _, b := range blocks {
		d := b.Driver()
		if d == nil {
			continue
		}
		if reflect.TypeOf(d).Comparable() {
			for _, s := range seen {
				if s == d {
					continue next
				}
			}
			seen = append(seen, d)
		}
		f(d)
	}
	clear(seen)
	p.drivers = seen[:0]
}

// launchState is a launch's scratch, reused by later launches of the same executable
// graph (launches on several streams may overlap: each takes one of its own). Every
// started task is collected before a launch ends, so results is empty when reused.
type launchState struct {
	left         []int
	chained      []bool // nodes whose trigger an engine stores (armFollowers)
	started      []bool // split start nodes whose wait node has not run (afterTask)
	results      chan finished
	ready, waits []int
	kicks        []*stream.WordBlock
	scratch      parking
}

// finished is a user task's end, as its goroutine reports it to the launch.
type finished struct {
	node int
	err  error
}

// parking is a launch's reusable scratch: its sleeps' select cases and timer, the
// blocks a park releases, and eachDriver's list.
type parking struct {
	cases   []reflect.SelectCase
	timer   *time.Timer
	blocks  []*stream.WordBlock // the waited words' blocks of a park
	drivers []stream.Driver     // eachDriver's scratch
}

// launchYieldEvery: while it spins, a launch lets other goroutines have its processor
// this often, not at every round: a Gosched with idle processors wakes a thread of the
// runtime (a futex call) to look for work, which took a third of a broadcast's CPU
// (performance.md, "Host graphs and host streams"); a message a few microseconds away
// is then seen without one.
const launchYieldEvery = 20 * time.Microsecond

// launchClockEvery: a spinning launch reads the clock once per so many rounds (a
// clock read per round was a tenth of its CPU).
const launchClockEvery = 16

// launchSpinFor is how long a launch drives its communication nodes' rounds itself
// before it parks (as ucp's waits spin DefaultSpinTime): a park costs two wake-ups in a
// row, the engine's from the event fd and then the launch's from the word's block.
const launchSpinFor = 100 * time.Microsecond

// parkSafety bounds a sleep, in case a word's writer does not notify (the engine fires
// every graph completion word with a notification, so this is only a safety net, not
// the wait: a launch is woken by the fire itself, not by a timer's tick).
const parkSafety = 5 * time.Millisecond

// park sleeps until a waited word's block is notified (the engine fired it), a task
// finishes, abandon is closed (the stream's Close waited its grace), or the safety
// bound passes. Before
// sleeping it releases the engines of the waited words: the launch stops driving their
// rounds, so they drive on their own (they sleep on their transport's event, not on a
// timer).
func (x *HostExec) park(waits []int, results chan finished, collect func(finished), p *parking, abandon <-chan struct{}) {
	if p.timer == nil {
		p.timer = time.NewTimer(parkSafety)
	} else {
		p.timer.Reset(parkSafety)
	}
	defer p.timer.Stop()
	if len(waits) == 1 {
		block := x.waitFor[waits[0]].Block()
		changed := block.Changed()
		if x.waitFor[waits[0]].Load() != 0 {
			return // fired between the last look and Changed
		}
		block.Release()
		select {
		case <-changed:
		case r := <-results:
			collect(r)
		case <-p.timer.C:
		case <-abandon:
		}
		return
	}
	// Several words, usually of several blocks: select on all of them.
	p.cases = append(p.cases[:0],
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(results)},
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(p.timer.C)})
	if abandon != nil {
		p.cases = append(p.cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(abandon)})
	}
	for _, i := range waits {
		block := x.waitFor[i].Block()
		p.cases = append(p.cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(block.Changed())})
	}
	for _, i := range waits {
		if x.waitFor[i].Load() != 0 {
			return
		}
	}
	p.blocks = p.blocks[:0]
	for _, i := range waits {
		p.blocks = append(p.blocks, x.waitFor[i].Block())
	}
	p.eachDriver(p.blocks, stream.Driver.Release)
	clear(p.blocks)
	if chosen, v, ok := reflect.Select(p.cases); chosen == 0 && ok {
		collect(v.Interface().(finished))
	}
}

// InFlight is the number of launches enqueued and not finished, but for those their
// stream dropped (it stopped on an error, or its Close abandoned them): they never run.
func (x *HostExec) InFlight() int {
	if x == nil {
		return 0
	}
	return int(x.inFlight.Load())
}

// Close releases the executable graph. With launches in flight it returns an error
// matching ErrInFlight and closes nothing (wait for the stream first).
func (x *HostExec) Close() error {
	if x == nil {
		return fmt.Errorf("close: nil executable graph: %w", ErrInvalidParam)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return fmt.Errorf("close: %w", ErrClosed)
	}
	if n := x.inFlight.Load(); n > 0 {
		return fmt.Errorf("close: %d launch(es) not finished: %w", n, ErrInFlight)
	}
	x.closed = true
	if x.chain != nil {
		return x.chain.release()
	}
	return nil
}

// runTask runs a user task; a panic fails the launch with an error carrying the panic
// value instead of killing the process.
func runTask(i int, task func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("graph: task of node %d panicked: %v: %w", i, v, ErrTaskPanicked)
		}
	}()
	return task()
}

// ErrTaskPanicked is matched by a launch's error when a task panicked.
var ErrTaskPanicked = errs.New("task panicked")

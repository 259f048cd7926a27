package condition

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ucpx/ucpx/device"
	"github.com/ucpx/ucpx/internal/errs"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream/streamcore"
	"github.com/ucpx/ucpx/trace"
)

// Category says what starts a conditioned operation.
type Category int

const (
	// Stream: the operation starts when a stream reaches the point where the operation
	// was enqueued (input: the stream).
	Stream Category = iota + 1
	// Graph: the operation is a node of a CUDA (or host) graph (output: the node).
	Graph
	// KernelTriggered: a kernel, or a host goroutine on host backends, calls the trigger
	// function with the condition's DeviceHandle (output: the handle).
	KernelTriggered
)

// conditionName names a condition of the category in messages, without allocating.
func (c Category) conditionName() string {
	switch c {
	case Stream:
		return "stream condition"
	case Graph:
		return "graph condition"
	case KernelTriggered:
		return "kernel-triggered condition"
	}
	return "condition"
}

func (c Category) String() string {
	switch c {
	case Stream:
		return "stream"
	case Graph:
		return "graph"
	case KernelTriggered:
		return "kernel-triggered"
	}
	return fmt.Sprintf("Category(%d)", int(c))
}

// Errors; wrapped with detail, test with errors.Is.
var (
	ErrInvalidParam = errs.InvalidParam
	// ErrClosed: the engine closed (its worker closed).
	ErrClosed = errs.Closed
	// ErrDestroyed: the condition was destroyed; it matches ErrClosed of every package.
	ErrDestroyed = errs.New("condition: destroyed", errs.Closed)
	// ErrBusy: Destroy was called while operations were still pending; nothing was lost
	// and the condition is still usable.
	ErrBusy = errs.New("condition: operations pending", errs.Busy)
	// ErrStreamFull: the Stream conditions on a CUDA stream have MaxPendingCUDA operations
	// that have not completed; the operation was not enqueued (wait for earlier ones,
	// or release what holds the stream back). It matches ErrBusy (and every package's
	// ErrBusy).
	ErrStreamFull = errs.New("condition: too many operations pending on the CUDA stream", ErrBusy)
)

// Param configures Create.
type Param struct {
	Category Category
	// Backend allocates the condition's signal words; it must be the backend of Stream
	// (or of Graph's kind).
	Backend streamcore.Backend
	// Stream is the stream operations are enqueued on (Stream category).
	Stream streamcore.Stream
	// Graph receives the condition's nodes (Graph category), after Deps.
	Graph GraphBuilder
	// Deps are nodes of Graph the operation's node depends on.
	Deps []Node
	// Split asks for two nodes: Node starts the operation, WaitNode completes it, so
	// other nodes (compute) can run between them.
	Split bool
	// Timeout, if positive, fails an operation that has not completed this long after
	// it was issued (its trigger came) with an error matching ErrTimedOut: it is
	// canceled (a send UCX cannot cancel is abandoned), its Request fails, and the
	// completion word advances, releasing the streams and kernels waiting on it (the
	// status word tells them it failed). Graph conditions ignore it.
	Timeout time.Duration
}

// ErrTimedOut is matched by the error of an operation that Param.Timeout failed.
var ErrTimedOut = errs.New("condition: operation timed out", errs.TimedOut)

// Node is a node of a graph that Graph conditions add their nodes to: *graph.HostNode
// in a graph.Host, cuda.Node in a graph.CUDA. Conditions' nodes and the graph's own mix
// in every call of the graph without type assertions.
type Node interface {
	// Handle is the raw CUgraphNode of a CUDA graph node, 0 for a host graph node.
	Handle() uintptr
}

// GraphBuilder is what a graph offers graph conditions (graph.Host, graph.CUDA).
type GraphBuilder interface {
	Kind() streamcore.Kind
	// AddSignalNodes adds the nodes of one communication operation after deps: with
	// split false one node [store 1 into trigger, wait until done == 1, store 0 into
	// done]; with split true a start node (the store) and a wait node (the rest)
	// depending on it. The graph relaunches safely: the engine resets trigger to 0 when
	// it takes the trigger, the node resets done.
	AddSignalNodes(deps []Node, trigger, done *streamcore.Word, split bool) (start, wait Node, err error)
}

// Condition links operations to a point of execution. Each operation enqueued with the
// condition gets the next sequence number k: the stream (or kernel, or Trigger) stores
// k into the trigger word when it gets there, the engine issues every operation up to the
// trigger in order, and stores into the completion word the highest k up to which all
// operations have completed. Streams wait on the completion word for stream-ordered
// completion. A condition serves the operations of one worker (its engine): another
// worker's are refused with ErrInvalidParam.
type Condition struct {
	id       uint64                         // its track in traces
	named    atomic.Pointer[trace.Recorder] // the recorder its track was named in
	category Category
	backend  streamcore.Backend
	stream   streamcore.Stream
	failer   streamcore.Failer // stream, when it can tell it stopped (host streams)
	words    *streamcore.WordBlock
	trigger  *streamcore.Word
	done     *streamcore.Word
	// status is the word beside done (done's address + 8): the sequence number of the
	// latest operation that failed, stored before done advances past it (StatusAt,
	// ucpx_status).
	status  *streamcore.Word
	timeout time.Duration
	// depth: a Stream condition on a CUDA stream counts its pending operations there
	// (MaxPendingCUDA); nil otherwise.
	depth *streamDepth
	_     [64]byte // the engine reads the fields above every round; enqueuers write the ones below

	// mu orders sequence assignment with the stream enqueues, so stream order is
	// sequence order even with concurrent callers. It is held while a stream enqueue
	// blocks (a CUDA stream stuck in a wait stops accepting work), so the engine must
	// never need it: Retire uses only retired and errMu.
	mu        sync.Mutex
	armed     uint64      // last sequence number handed out
	destroyed atomic.Bool // written under mu; read without it by the engine
	// chainRun is the host graph's chain running the condition's operations, nil if
	// none (graphChain.Run; set and cleared under mu): Destroy refuses meanwhile, as
	// while a launch runs them node by node, the engine leaves a trigger stored
	// meanwhile for after it, and a Cancel of an operation reaches the chain.
	chainRun atomic.Pointer[graphChain]
	// owed: no launch waits for a Graph condition's completion word: a host graph's
	// launch failed with the operation in flight and left (Engine.OweCompletion), and
	// no launch took the completion since. A completion stored meanwhile does not
	// hold Destroy back (launchRunningLocked): only a later launch would read it.
	owed atomic.Bool
	// engine is the engine (the worker) whose operations the condition carries: the
	// first Submit binds it, and another engine's Submit is refused (bindEngine). One
	// engine retires the condition's operations, in sequence order, and alone stores
	// its completion word; two engines each retired their own, out of order. Written
	// under mu.
	engine atomic.Pointer[Engine]
	// driver is the bound engine once an operation is armed (attachDriver): the one
	// driver of the words, read without mu (set and cleared under mu).
	driver   atomic.Pointer[streamcore.Driver]
	node     Node                 // Graph category: the start node
	waitNode Node                 // Graph category: the completion node
	captured []*Condition         // Stream category: operations enqueued under stream capture
	group    *group               // Stream category: the open BeginGroup, if any
	foreign  streamcore.StreamSet // other streams given a wait on done (waitOnStream)
	stamps   *deviceStamps        // Stream category, traced: device stamps of polls
	groupBuf group                // what group points to: one group at a time, reused
	// held: give-backs of staging buffers that must wait until the stream has passed
	// work enqueued on them (copies) and that the stream refused as a host function:
	// retried behind the next operation armed, run by Destroy once the stream passed.
	held []func()

	// Enqueuers write the fields above on every Arm; the engine writes retired on every
	// Retire, from another core: the padding keeps them on different cache lines.
	_        [64]byte
	retired  atomic.Uint64 // last sequence number retired (mirrors the completion word)
	errMu    sync.Mutex
	firstErr error
	// failed keeps the errors of failed operations among the latest maxFailedKept
	// sequence numbers, at seq % maxFailedKept (under errMu), for StatusAt. Made at the
	// first failure.
	failed *[maxFailedKept]failedOp
	// failedForGood: a Graph condition's operation can run no more (fail: its engine
	// closed, or a launch failed as the transport closed). Destroy frees the words
	// then, whatever they read: a CUDA graph's completion node, released by
	// GraphFailed, stores 0 into the completion word behind it (and its start node 1
	// into the trigger).
	failedForGood atomic.Bool
}

// failedOp is one entry of Condition.failed.
type failedOp struct {
	seq uint64
	err error
}

// nextID numbers conditions (their trace tracks).
var nextID atomic.Uint64

// Create makes a condition.
func Create(p Param) (*Condition, error) {
	switch p.Category {
	case Stream:
		if p.Stream == nil {
			return nil, fmt.Errorf("stream condition without a stream: %w", ErrInvalidParam)
		}
	case KernelTriggered:
	case Graph:
		if p.Graph == nil {
			return nil, fmt.Errorf("graph condition without a graph: %w", ErrInvalidParam)
		}
		if p.Backend != nil && p.Graph.Kind() != p.Backend.Kind() {
			return nil, fmt.Errorf("%s graph with a %s backend: %w", p.Graph.Kind(), p.Backend.Kind(), ErrInvalidParam)
		}
	default:
		return nil, fmt.Errorf("category %v: %w", p.Category, ErrInvalidParam)
	}
	if p.Backend == nil {
		return nil, fmt.Errorf("%v condition without a backend: %w", p.Category, ErrInvalidParam)
	}
	if p.Stream != nil && p.Stream.Kind() != p.Backend.Kind() {
		return nil, fmt.Errorf("%s stream with a %s backend: %w", p.Stream.Kind(), p.Backend.Kind(), ErrInvalidParam)
	}
	if p.Timeout < 0 {
		return nil, fmt.Errorf("timeout %v: %w", p.Timeout, ErrInvalidParam)
	}
	words, err := p.Backend.AllocWords(3)
	if err != nil {
		return nil, fmt.Errorf("condition words: %w", err)
	}
	failer, _ := p.Stream.(streamcore.Failer)
	var depth *streamDepth
	if p.Category == Stream && p.Stream.Kind() == streamcore.KindCUDA {
		depth = acquireDepth(p.Stream.Handle())
	}
	c := &Condition{
		id:       nextID.Add(1),
		category: p.Category,
		backend:  p.Backend,
		stream:   p.Stream,
		failer:   failer,
		words:    words,
		trigger:  words.Word(0),
		done:     words.Word(1),
		status:   words.Word(2),
		timeout:  p.Timeout,
		depth:    depth,
	}
	if p.Category == Graph {
		c.node, c.waitNode, err = p.Graph.AddSignalNodes(p.Deps, c.trigger, c.done, p.Split)
		if err != nil {
			_ = words.Close()
			return nil, fmt.Errorf("graph nodes: %w", err)
		}
	}
	return c, nil
}

// Node is the graph node of a Graph condition (with Split, the node that starts the
// operation). Add further dependencies with the graph's own calls.
func (c *Condition) Node() Node {
	if c == nil {
		return nil
	}
	return c.node
}

// WaitNode is the node that completes the operation (the same as Node without Split).
func (c *Condition) WaitNode() Node {
	if c == nil {
		return nil
	}
	return c.waitNode
}

// fire reports one run of a Graph condition's operations finished (err nil on
// success): it stores 1 into the completion word, releasing the graph's wait node.
func (c *Condition) fire(err error) {
	c.recordErr(err, "graph operation")
	c.done.Store(1)
	c.words.Notify() // host graph wait nodes park on it
}

// MaxPendingCUDA bounds the operations of the Stream conditions on one CUDA stream that
// are enqueued and not completed, all conditions on the stream together (each is a
// trigger store and a completion wait on the stream): past a few thousand memops
// waiting behind a wait nobody answers, the driver's enqueue call blocks, and with it
// the caller (DESIGN "Proxy engine"). The operations of a BeginGroup/EndGroup group
// count at their enqueue, one by one; an operation moved in parts counts each part.
const MaxPendingCUDA = 512

// GraphFailed is the completion-word value of a Graph condition whose operation can run
// no more (its worker closed): graph wait nodes fail instead of waiting forever.
const GraphFailed = ^uint64(0)

// fail marks a Graph condition's operation as unable to run again (see GraphFailed).
func (c *Condition) fail(err error) {
	c.recordErr(err, "graph operation")
	c.failedForGood.Store(true)
	c.done.Store(GraphFailed)
	c.words.Notify()
}

// Destroyed reports whether Destroy succeeded.
func (c *Condition) Destroyed() bool { return c != nil && c.destroyed.Load() }

// releaseWords frees a destroyed Graph condition's words once the engine no longer
// reads them.
func (c *Condition) releaseWords() {
	if !c.words.Closed() {
		_ = c.words.Close()
	}
}

// Backend is the backend of the condition's words (and stream).
func (c *Condition) Backend() streamcore.Backend {
	if c == nil {
		return nil
	}
	return c.backend
}

// Category reports the condition's category.
func (c *Condition) Category() Category {
	if c == nil {
		return 0
	}
	return c.category
}

// Stream is the stream of a Stream condition.
func (c *Condition) Stream() streamcore.Stream {
	if c == nil {
		return nil
	}
	return c.stream
}

// streamWork is work a Stream condition's operation enqueues around its trigger, in
// the same critical section so no other operation's work interleaves: before runs
// before the trigger store (a device-to-host staging copy), after after the
// completion wait (a host-to-device copy of received data).
type streamWork struct {
	before, after func(s streamcore.Stream) error
	// poll: the completion is expected to take long (a large transfer), so the stream
	// waits for it with Stream.PollValue, which notices it sooner than a memop wait at
	// the cost of a kernel launch.
	poll bool
	// trace: the engine's recorder when it traces: a stamping stream stamps the poll.
	trace *trace.Recorder
	// part is the engine's part of the work (nil for none): where the stream refuses
	// some of the work, the condition gives the part's staging back itself, in stream
	// order.
	part *part
}

// giveBackLocked runs give (a staging buffer's give-back, which makes no driver call)
// once the stream has passed the work enqueued on it so far: from a host function, or,
// where the stream refuses one, later (held). Caller holds mu.
func (c *Condition) giveBackLocked(give func()) {
	if give != nil && streamcore.LaunchOrDrop(c.stream, give) != nil {
		c.held = append(c.held, give)
	}
}

// retryHeldLocked enqueues the held give-backs again, behind the work enqueued since
// (a refusal may pass). Caller holds mu.
func (c *Condition) retryHeldLocked() {
	for len(c.held) > 0 && streamcore.LaunchOrDrop(c.stream, c.held[0]) == nil {
		c.held[0] = nil
		c.held = c.held[1:]
	}
}

// afterLocked enqueues the work after an armed part's completion (the copy in from its
// staging buffer, then the host function giving the buffer back) and lets go of the
// part's staging: that host function gives it back; where the stream refused only the
// host function, the condition holds the give-back until the stream passed the copy;
// where the copy is not enqueued either, the buffer goes back once the part retired.
// Caller holds mu.
func (c *Condition) afterLocked(p *part, after func(streamcore.Stream) error) error {
	err := after(c.stream)
	var refused *protocol.GiveBackRefused
	switch {
	case err == nil:
		p.settle(nil)
	case errors.As(err, &refused):
		c.held = append(c.held, refused.Give)
		p.settle(nil)
	default:
		p.settleUnused()
	}
	return err
}

// arm reserves the next sequence number for one operation. record runs first, with the
// number, so the engine knows the operation before the trigger can reach it. For a
// Stream condition arm then enqueues work.before, the trigger store, and with
// streamOrdered the wait for completion and work.after, on the stream.
func (c *Condition) arm(streamOrdered bool, work streamWork, record func(seq uint64)) (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.destroyed.Load() {
		return 0, fmt.Errorf("arm: %w", ErrDestroyed)
	}
	seq := c.armed + 1
	if c.category != Stream {
		record(seq)
		c.armed = seq
		return seq, nil
	}
	if err := c.reserveLocked(1); err != nil {
		return 0, err
	}
	// Work before the trigger precedes a group's trigger too: enqueued now either way.
	if work.before != nil {
		if err := work.before(c.stream); err != nil {
			c.unreserve(1)
			return 0, fmt.Errorf("arm: enqueue work before the trigger: %w", err)
		}
	}
	if c.group != nil {
		return c.armGroupLocked(streamOrdered, work, record)
	}
	// The trigger and the completion wait go in one enqueue (one driver call on
	// CUDA). If the stream refuses it (closed, sticky error), nothing is armed.
	polled := streamOrdered && work.poll
	var err error
	if streamOrdered && !polled {
		err = c.stream.WriteThenWait(c.trigger, seq, c.done, seq, streamcore.GEQ)
	} else {
		err = c.stream.WriteValue(c.trigger, seq)
	}
	if err != nil {
		c.unreserve(1)
		if work.before != nil {
			// The copy into the part's staging buffer is enqueued: the buffer goes
			// back once the stream has passed it, not before.
			c.giveBackLocked(work.part.takeUnused())
		}
		return 0, fmt.Errorf("arm: enqueue trigger: %w", err)
	}
	// An incoming staged part's buffer goes back after the copy in, or, where that is
	// not enqueued, once the part retired (afterLocked).
	if streamOrdered && work.after != nil {
		work.part.holdStaging()
	}
	record(seq)
	c.armed = seq
	c.retryHeldLocked()
	if polled {
		if err := c.pollLocked(seq, work.trace); err != nil {
			work.part.settleUnused()
			return seq, fmt.Errorf("arm: enqueue completion wait: %w", err)
		}
	}
	if streamOrdered && work.after != nil {
		if err := c.afterLocked(work.part, work.after); err != nil {
			return seq, fmt.Errorf("arm: enqueue work after completion: %w", err)
		}
	}
	return seq, nil
}

// retire marks operation seq completed (with err, nil on success). Operations retire
// in sequence order: the engine retires seq only after seq-1. It advances the
// completion word, which releases streams waiting on it.
func (c *Condition) retire(seq uint64, err error) {
	if err != nil {
		c.errMu.Lock()
		if c.firstErr == nil { // checked here: only the first failure pays for the message
			c.firstErr = fmt.Errorf("operation %d: %w", seq, err)
		}
		if c.failed == nil {
			c.failed = new([maxFailedKept]failedOp)
		}
		// O(1) however many fail: a dead peer fails every queued operation at once.
		c.failed[seq%maxFailedKept] = failedOp{seq: seq, err: err}
		c.errMu.Unlock()
		c.status.Store(seq) // before done: a waiter that sees done sees the status
	}
	c.retired.Store(seq) // retirements come in sequence order, from one goroutine at a time
	c.unreserve(1)
	c.done.Store(seq)
}

// recordErr keeps the first error (nil is ignored).
func (c *Condition) recordErr(err error, what string) {
	if err == nil {
		return
	}
	c.errMu.Lock()
	if c.firstErr == nil {
		c.firstErr = fmt.Errorf("%s: %w", what, err)
	}
	c.errMu.Unlock()
}

// Err is the first error an operation of the condition met since the condition was
// created or ClearErr was last called, nil if none. The failed operation's Request
// reports its own error too; the completion word still advances, so no stream stays
// blocked on a failed operation. For a Graph condition it is the first error any
// launch met.
func (c *Condition) Err() error {
	if c == nil {
		return fmt.Errorf("condition: nil condition: %w", ErrInvalidParam)
	}
	c.errMu.Lock()
	defer c.errMu.Unlock()
	return c.firstErr
}

// ClearErr returns Err and clears it, so the condition serves as a health check again
// (operations that fail later are reported by the next Err).
func (c *Condition) ClearErr() error {
	if c == nil {
		return fmt.Errorf("condition: nil condition: %w", ErrInvalidParam)
	}
	c.errMu.Lock()
	defer c.errMu.Unlock()
	err := c.firstErr
	c.firstErr = nil
	return err
}

// maxFailedKept bounds how far back StatusAt remembers failures.
const maxFailedKept = 1024

// StatusAt reports the outcome of operation seq (a DeviceHandle's CompletionValue, or
// the count of operations armed): done once the completion word reached it, and then
// the operation's error (nil on success; failures older than the latest 1024 sequence
// numbers are forgotten). A kernel reads the same with ucpx_status.
func (c *Condition) StatusAt(seq uint64) (done bool, err error) {
	if c == nil {
		return false, fmt.Errorf("status: nil condition: %w", ErrInvalidParam)
	}
	if int64(c.done.Load()-seq) < 0 {
		return false, nil
	}
	c.errMu.Lock()
	defer c.errMu.Unlock()
	if c.failed == nil {
		return true, nil
	}
	if f := c.failed[seq%maxFailedKept]; f.seq == seq {
		return true, f.err
	}
	return true, nil
}

// Pending is the number of operations armed but not retired.
func (c *Condition) Pending() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return int(c.armed - c.retired.Load())
}

// waitOnStream enqueues on s a wait until operation seq has completed: the
// cross-stream form of stream-ordered completion.
func (c *Condition) waitOnStream(s streamcore.Stream, seq uint64) error {
	if s == nil {
		return fmt.Errorf("wait on stream: nil stream: %w", ErrInvalidParam)
	}
	if s.Kind() != c.backend.Kind() {
		return fmt.Errorf("wait on a %s stream for a %s condition: %w", s.Kind(), c.backend.Kind(), ErrInvalidParam)
	}
	if c.category == Graph {
		return fmt.Errorf("wait on stream for a graph operation (it completes inside its graph): %w", ErrInvalidParam)
	}
	// Under c.mu, against Destroy: the wait reads the completion word, which Destroy
	// frees only once every stream given such a wait has passed it (foreign).
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.destroyed.Load() {
		return fmt.Errorf("wait on stream: %w", ErrDestroyed)
	}
	own := streamcore.SameStream(s, c.stream)
	if own && c.group != nil && seq > c.group.last {
		// The wait would sit ahead of the group's trigger on the same stream.
		return fmt.Errorf("wait on the condition's own stream for an operation of an open group: %w", ErrInvalidParam)
	}
	if err := s.WaitValue(c.done, seq, streamcore.GEQ); err != nil {
		return err
	}
	if !own {
		c.foreign.Add(s)
	}
	return nil
}

// streamStopped reports whether s stopped for good: its query fails (closed, failed,
// or on CUDA a sticky error of its context), where a running stream's says only
// whether its work is done.
func streamStopped(s streamcore.Stream) bool {
	_, err := s.Query()
	return err != nil
}

// DeviceHandle is what a kernel (or a host goroutine) triggers a KernelTriggered
// condition with: the layout of struct ucpx_device_handle in device/ucpx_signal.cuh.
type DeviceHandle struct {
	// Trigger and Completion are device addresses on CUDA and host addresses on host backends.
	Trigger         uintptr
	Value           uint64
	Completion      uintptr
	CompletionValue uint64

	hostTrigger, hostDone *streamcore.Word
}

// DeviceHandle returns the handle for the most recently armed operation: triggering it
// starts every operation armed so far, and its completion value is reached when they
// all completed. Arming another operation and fetching the handle again re-arms the
// condition for the next launch.
func (c *Condition) DeviceHandle() (DeviceHandle, error) {
	if c == nil {
		return DeviceHandle{}, fmt.Errorf("device handle: nil condition: %w", ErrInvalidParam)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.destroyed.Load() {
		return DeviceHandle{}, fmt.Errorf("device handle: %w", ErrDestroyed)
	}
	if c.category != KernelTriggered {
		return DeviceHandle{}, fmt.Errorf("device handle of a %v condition: %w", c.category, ErrInvalidParam)
	}
	h := DeviceHandle{Value: c.armed, CompletionValue: c.armed, hostTrigger: c.trigger, hostDone: c.done}
	if c.backend.Kind() == streamcore.KindCUDA {
		h.Trigger, h.Completion = c.trigger.DevicePtr(), c.done.DevicePtr()
	} else {
		h.Trigger, h.Completion = c.trigger.HostPtr(), c.done.HostPtr()
	}
	return h, nil
}

// Kernel is the handle as the kernel argument struct ucpx_device_handle (32 bytes).
func (h DeviceHandle) Kernel() device.Handle {
	return device.Handle{Trigger: uint64(h.Trigger), Value: h.Value, Completion: uint64(h.Completion), CompletionValue: h.CompletionValue}
}

// Trigger is the host-side trigger function: what a kernel does with ucpx_trigger. The
// trigger word only moves forward: a handle older than one triggered already (two
// kernels finishing in either order) changes nothing, its operations were started by
// the newer one. A handle whose condition was destroyed gives ErrDestroyed.
func Trigger(h DeviceHandle) error {
	if h.hostTrigger == nil {
		return fmt.Errorf("trigger: zero handle: %w", ErrInvalidParam)
	}
	if h.hostTrigger.Kind() == streamcore.KindHost && h.hostTrigger.HostPtr() != h.Trigger {
		return fmt.Errorf("trigger: handle was altered: %w", ErrInvalidParam)
	}
	if !advanceTrigger(h.hostTrigger, h.Value) {
		// Its memory went back with the condition.
		return fmt.Errorf("trigger: the handle's condition was destroyed: %w", ErrDestroyed)
	}
	return nil
}

// advanceTrigger moves a KernelTriggered condition's trigger word forward to v, never
// back (wrap-aware, as the engine compares it with sequence numbers): a plain store of
// an older handle's value after a newer one's took the trigger back, and the newer
// handle's operations never started. ucpx_trigger does the same on the device. It
// reports false when the word was freed.
func advanceTrigger(w *streamcore.Word, v uint64) bool {
	for {
		cur, ok := w.TryLoad()
		if !ok {
			return false
		}
		if int64(cur-v) >= 0 || w.CompareAndSwap(cur, v) {
			return true
		}
	}
}

// Test reports whether the operations of the handle have completed (ucpx_test). On the
// host it also drives the operations one round, as MPI_Test does. A handle whose
// condition was destroyed reports true (Destroy succeeds only once all completed).
func Test(h DeviceHandle) bool {
	if h.hostDone == nil {
		return false
	}
	// A freed word means destroyed, which takes every operation completed.
	if v, ok := h.hostDone.TryLoad(); !ok || int64(v-h.CompletionValue) >= 0 {
		return true
	}
	h.hostDone.Block().Drive()
	v, ok := h.hostDone.TryLoad()
	return !ok || int64(v-h.CompletionValue) >= 0
}

// bindEngine binds c to e, the engine of the worker whose operation is about to be
// armed on it: a condition serves the operations of one worker. Its completion word
// says that every operation up to a sequence number completed, which only the one
// engine retiring them in order can tell; with a second engine each retired its own
// (an event recorded after a receive was ready before the receive had its data,
// StatusAt and Pending were wrong, and Destroy freed the words under an operation in
// flight or refused for good). So the Submit of another engine is refused
// (ErrInvalidParam), as a Chain refuses operations of another worker. A condition
// whose engine closed (its worker closed) with every operation retired is bound to
// the next engine that submits, unless it is a Graph condition (failed for good
// then: it can run no more).
func (c *Condition) bindEngine(e *Engine) error {
	if c.engine.Load() == e {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch old := c.engine.Load(); {
	case old == e:
		return nil
	case old == nil:
	case old.closed() && c.category != Graph && c.armed == c.retired.Load():
		// Its engine let go of it: the new one drives its words from now on.
		c.driver.Store(nil)
	default:
		return fmt.Errorf("submit: the %s carries operations of another worker (a condition serves one worker's operations: use a condition per worker): %w",
			c.category.conditionName(), ErrInvalidParam)
	}
	c.engine.Store(e)
	return nil
}

// attachDriver makes e, the engine c is bound to (bindEngine), the driver of the
// condition's words: host executors waiting on the completion word run it, and
// trigger stores kick it.
func (c *Condition) attachDriver(e *Engine) {
	d := streamcore.Driver(e)
	// The common case, once per operation: the driver is attached already.
	if c.drivenByEngine(e) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.engine.Load() != e || c.driver.Load() != nil {
		// Bound to another engine since (this one closed), or attached already.
		return
	}
	first := d // a copy, so that d itself does not escape on every call
	c.driver.Store(&first)
	c.words.SetDriver(d)
}

// drivenByEngine reports whether e is attached as the driver of c's words.
func (c *Condition) drivenByEngine(e *Engine) bool {
	p := c.driver.Load()
	return p != nil && *p == streamcore.Driver(e)
}

// drivenBy reports whether c's trigger is stored by a host executor that kicks e and
// drives e's rounds while it waits on c's completion word: an operation whose
// completion the stream waits for then needs nothing of the engine's goroutine.
func (c *Condition) drivenBy(e *Engine) bool {
	if c.category != Stream || c.polledTrigger() {
		return false
	}
	return c.drivenByEngine(e)
}

// Destroy releases the condition. With operations still pending it returns an error
// matching ErrBusy and changes nothing: for a Graph condition, while a launch runs its
// operations, until that launch took their completion. A completion no launch waits for
// (a host graph's launch failed and left the operations in flight) does not hold
// Destroy back once the operations completed. A second Destroy returns ErrDestroyed. Its
// words are freed once every stream that waits on them (its own, and those given a
// wait by WaitOnStream) has passed its waits: on host streams in stream order, without
// blocking; on CUDA streams Destroy synchronizes them, as cudaFree does. A Stream
// condition's Destroy also destroys the Graph conditions of the operations enqueued
// under stream capture, which live until then (nothing tells ucpx when a captured
// graph is destroyed): ErrBusy while a launch of one runs.
func (c *Condition) Destroy() error {
	if c == nil {
		return fmt.Errorf("destroy: nil condition: %w", ErrInvalidParam)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.destroyed.Load() {
		return fmt.Errorf("destroy: %w", ErrDestroyed)
	}
	if err := c.destroyCapturedLocked(); err != nil {
		return fmt.Errorf("destroy: %w", err)
	}
	if c.category == Graph {
		if c.failedForGood.Load() {
			// The engine is gone and read its last word. Told by the flag, not by
			// the completion word: a CUDA graph's launch since may have reset its
			// GraphFailed to 0 (and left the trigger stored), which read as a launch
			// still running, and the words were never freed.
			c.destroyed.Store(true)
			return c.words.Close()
		}
		if c.chainRun.Load() != nil || c.launchRunningLocked() {
			return fmt.Errorf("destroy: a launch is running the operation: %w", ErrBusy)
		}
		c.destroyed.Store(true)
		if c.armed == 0 {
			return c.words.Close()
		}
		return nil // the engine drops the operation, then releases the words
	}
	if n := c.armed - c.retired.Load(); n > 0 {
		return fmt.Errorf("destroy: %d operation(s) not completed: %w", n, ErrBusy)
	}
	c.destroyed.Store(true)
	if c.group != nil {
		// An open group whose operations all ended (its engine closed, its stream
		// stopped): their staging goes back as after a refused trigger.
		c.settleGroupLocked(c.group)
	}
	stamps := c.takeStampsLocked()
	// Streams may not yet have run their last (already satisfied) waits on the
	// completion word: the condition's own, and those given one by WaitOnStream.
	waiting := c.foreign.Streams()
	if c.stream != nil {
		waiting = append(slices.Clip(waiting), c.stream)
	}
	if c.backend.Kind() == streamcore.KindHost {
		// Freed in stream order, by the last of them to get there: never blocking on
		// a stream. So are the staging buffers held for the condition's stream.
		words, held := c.words, c.held
		c.held = nil
		streamcore.AfterPassed(waiting, func(bool) {
			_ = words.Close()
			stamps.close()
			giveBackAll(held)
		})
		return nil
	}
	// CUDA host functions may not call CUDA (cuMemFreeHost): synchronize instead, as
	// cudaFree does. Every armed operation has retired, so the waits on the completion
	// word are satisfied. A foreign stream that failed runs nothing more.
	for _, s := range waiting {
		// A stream that stopped (closed, or its context dead) runs nothing more.
		if err := s.Synchronize(); err != nil && !errors.Is(err, streamcore.ErrClosed) && streamcore.SameStream(s, c.stream) && !streamStopped(s) {
			c.destroyed.Store(false)
			c.stamps = stamps
			return fmt.Errorf("destroy: synchronize stream: %w", err)
		}
	}
	if c.depth != nil {
		c.depth.release()
	}
	c.foreign.Take()
	stamps.close()
	// The stream has passed the copies on the held staging buffers, or runs nothing
	// more.
	giveBackAll(c.held)
	c.held = nil
	return c.words.Close()
}

// launchRunningLocked reports whether a launch runs a Graph condition's operations: it
// stored the trigger and no engine took it yet, an engine runs them (it took the
// trigger, which then reads 0, and the completion word reads 0 too), or the completion
// is stored and the launch has not taken it. The condition's engine answers under its
// lock, in which its round takes the trigger, issues the operations and, once they
// completed, stores the completion word, so no state between those is seen. Caller
// holds mu.
func (c *Condition) launchRunningLocked() bool {
	if p := c.driver.Load(); p != nil {
		if e, ok := (*p).(*Engine); ok && e.launchRunning(c) {
			return true
		}
	}
	return c.wordsShowLaunch()
}

// wordsShowLaunch reports whether a Graph condition's words show a launch: a trigger
// stored and not taken, or a completion stored that the launch waiting for it has not
// taken. A completion no launch waits for (owed) shows none: the launch that stored the
// trigger failed and left, and a later one takes that completion before it stores a
// trigger of its own.
func (c *Condition) wordsShowLaunch() bool {
	if c.trigger.Load() != 0 {
		return true
	}
	d := c.done.Load()
	return d != 0 && (d != 1 || !c.owed.Load())
}

func giveBackAll(gives []func()) {
	for _, give := range gives {
		give()
	}
}

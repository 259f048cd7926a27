package condition

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ucpx/ucpx/internal/errs"
	"github.com/ucpx/ucpx/internal/goid"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream/streamcore"
	"github.com/ucpx/ucpx/trace"
)

// Submission describes one operation handed to an engine.
type Submission struct {
	// What names the operation in errors ("tag_send_nbx").
	What string
	// Transfer is what the operation moves, for the transfer protocol's plan.
	Transfer protocol.Transfer
	// NonBlocking, with a Stream condition, enqueues only the trigger: the stream does
	// not wait for completion (Op.WaitOnStream orders a stream after it later).
	NonBlocking bool
	// Callback runs once the operation completed: on the goroutine that retired it,
	// after the engine's round let go of the engine's locks (or on a goroutine running
	// earlier rounds' callbacks then), in retirement order. It may close the engine.
	Callback func()
}

// Op is an operation submitted to an engine: the caller's handle on its completion.
// The zero value is ready for Submit.
type Op struct {
	eng       *Engine
	cond      *Condition
	operation Operation
	what      string
	cb        func()
	plan      protocol.Plan
	single    part
	parts     []*part // every part, for an operation moved in several
	seq       uint64  // the last part's sequence number: the operation's completion

	mu   sync.Mutex // left, err of a multi-part operation; the blocked waiter's channel
	left int

	done   atomic.Bool
	err    error
	doneCh chan struct{} // made only for a waiter that has to block
	// finished: done and retired, so the condition's words show it too. Set under mu
	// (doneChan checks it there), read by Wait without.
	finished atomic.Bool
	// nextDue links the Ops whose callback is due (dueList).
	nextDue *Op
}

// dueList is a queue of completed Ops whose callback has yet to run, linked through
// Op.nextDue: a round collects them, so that callbacks run outside its locks.
type dueList struct{ head, tail *Op }

func (l *dueList) push(o *Op) {
	if l.tail == nil {
		l.head = o
	} else {
		l.tail.nextDue = o
	}
	l.tail = o
}

// pop takes the oldest Op, nil if none.
func (l *dueList) pop() *Op {
	o := l.head
	if o != nil {
		l.head, o.nextDue = o.nextDue, nil
		if l.head == nil {
			l.tail = nil
		}
	}
	return o
}

// append moves m's Ops to the end of l.
func (l *dueList) append(m *dueList) {
	if m.head == nil {
		return
	}
	if l.tail == nil {
		l.head = m.head
	} else {
		l.tail.nextDue = m.head
	}
	l.tail = m.tail
	*m = dueList{}
}

// part is the engine's unit: one sequence number of a condition.
type part struct {
	// nextIn and cond first: the round that takes the part from Engine.incoming reads
	// them, written on the enqueuer's core, in one cache line.
	nextIn *part // the next older part while it waits in Engine.incoming
	cond   *Condition
	op     *Op
	plan   *protocol.Part
	seq    uint64

	inner  Issued
	err    error // issue error
	issued bool
	// awaited: the stream waits for the part's completion on a host executor that
	// kicks its trigger and drives the engine's rounds while it waits (drivenBy), so
	// the part needs nothing of the engine's goroutine.
	awaited  bool
	canceled bool // canceled before its trigger: retired without being issued
	running  bool // Graph category: issued for the current launch, not yet fired
	// ring: a CUDA stream waits for this part with a memop wait, which the GPU looks at
	// again late unless rung; issuedAt tells whether it completed late enough for that.
	ring     bool
	issuedAt time.Time
	tl       *trace.Op // its timeline while the engine traces
	// held: the part's staging goes back through hold, not plan.Release: set by arm
	// (before the engine knows the part) for the staged parts of a group, and for an
	// incoming staged part, whose stream work around the trigger decides when its
	// buffer is free. settled: the condition let go of hold (under the condition's mu).
	held, settled bool
	hold          stagingHold
}

// stagingHold gives a staged part's buffer back once both sides let go, whichever is
// last: the engine (the part retired: the transport is done with the buffer) and the
// condition (the stream has passed the work enqueued on the buffer, or that work
// gives the buffer back itself).
type stagingHold struct {
	left atomic.Int32
	// give is what the last let runs (nil: nothing, stream work gives the buffer back).
	// The condition writes it before its let, and only the last let reads it.
	give func()
}

// holdStaging makes p's staging go back through its hold. Before the engine knows p.
func (p *part) holdStaging() {
	if p == nil || !p.plan.Staged {
		return
	}
	p.held = true
	p.hold.left.Store(2)
}

func (h *stagingHold) let() {
	if h.left.Add(-1) == 0 && h.give != nil {
		h.give()
	}
}

// settle is the condition's let of p's hold: give (nil: none) runs once p retired too.
// Caller holds the condition's mu.
func (p *part) settle(give func()) {
	if p == nil || !p.held || p.settled {
		return
	}
	p.settled = true
	p.hold.give = give
	p.hold.let()
}

// settleUnused is settle for a part whose buffer nothing enqueued on the stream
// touches: it goes back once the part retired.
func (p *part) settleUnused() {
	if p != nil && p.held && !p.settled {
		p.settle(p.plan.TakeUnused())
	}
}

// takeUnused takes the give-back of p's staging (protocol.Part.TakeUnused); nil for no
// part.
func (p *part) takeUnused() func() {
	if p == nil {
		return nil
	}
	return p.plan.TakeUnused()
}

// timelines recycles timelines: tracing allocates nothing per operation.
var timelines = sync.Pool{New: func() any { return new(trace.Op) }}

// timeline starts the trace of one of o's parts, enqueued at now. recordTimeline ends
// it.
func (o *Op) timeline(tr *trace.Recorder, now int64) *trace.Op {
	c := o.cond
	if c.named.Load() != tr {
		tr.Name(c.id, fmt.Sprintf("condition %d (%s)", c.id, c.category))
		c.named.Store(tr)
	}
	plan := "as is"
	switch {
	case len(o.plan.Parts) > 1:
		plan = "staged in parts"
	case o.plan.Staged():
		plan = "staged"
	}
	tl := timelines.Get().(*trace.Op)
	*tl = trace.Op{Track: c.id, What: o.what, Bytes: len(o.plan.Parts[0].Buf) * len(o.plan.Parts), Plan: plan, Enqueue: now}
	return tl
}

// recordTimeline hands p's timeline to tr and recycles it.
func (p *part) recordTimeline(tr *trace.Recorder) {
	tr.Record(*p.tl)
	timelines.Put(p.tl)
	p.tl = nil
}

// Submit arms c for op: it plans how the operation's buffer travels (staging device
// memory through pinned host memory on c's stream where the transport cannot move it),
// reserves the operation's sequence number(s) and, for a Stream condition, enqueues the
// trigger (and, unless NonBlocking, the completion wait) on the stream. The engine
// calls op.Issue once the trigger has come. o must be a zero Op; it completes when the
// operation did, with its error. A condition serves one engine: the first Submit binds
// it, and another engine's Submit is refused (ErrInvalidParam) until that engine
// closed with every operation retired (bindEngine).
func (e *Engine) Submit(o *Op, c *Condition, op Operation, s Submission) error {
	if c == nil || op == nil || o == nil {
		return fmt.Errorf("submit: nil condition, operation or Op: %w", ErrInvalidParam)
	}
	if o.eng != nil {
		return fmt.Errorf("submit: the Op was submitted already: %w", ErrInvalidParam)
	}
	// Under stream capture the operation becomes a persistent graph operation of a
	// condition of its own (same backend), planned as one.
	capturing, err := c.capturing(!s.NonBlocking)
	if err != nil {
		return err
	}
	category := c.category
	if capturing {
		category = Graph
	} else if err := c.bindEngine(e); err != nil {
		// Before the plan, which may lend staging: nothing to give back.
		return err
	}
	streamOrdered := category == Stream && !s.NonBlocking
	route := protocol.Route{
		Backend:       c.backend,
		OnStream:      category == Stream,
		StreamOrdered: streamOrdered,
		// Only a split transfer cares, and only a Stream condition has groups: the
		// condition's lock is not taken on every operation.
		Grouped: s.Transfer.Splittable && category == Stream && c.inGroup(),
		What:    category.conditionName(),
	}
	if err := e.planner.Plan(s.Transfer, route, &o.plan); err != nil {
		return err
	}
	if capturing {
		// Only once the plan accepted the operation: the graph condition's signal
		// nodes go into the capture as it is made, and a captured graph keeps them
		// (nodes with no operation would hold every launch of the graph for good).
		captured, err := c.capture()
		if err != nil {
			o.plan.Unused(0)
			return err
		}
		c = captured
		_ = c.bindEngine(e) // a condition of its own: never bound to another
	}
	o.eng, o.cond, o.operation, o.what, o.cb = e, c, op, s.What, s.Callback
	if len(o.plan.Parts) > 1 {
		return e.submitParts(o, streamOrdered)
	}
	p := &o.single
	*p = part{cond: c, op: o, plan: &o.plan.Parts[0], ring: o.plan.Ring}
	work := streamWork{before: p.plan.Before, after: p.plan.After, poll: o.plan.Poll, part: p}
	if tr := e.trace.Load(); tr != nil && c.category != Graph {
		p.tl = o.timeline(tr, tr.Now())
		work.trace = tr
	}
	var addErr error
	p.awaited = streamOrdered && !work.poll && c.drivenBy(e)
	_, err = c.arm(streamOrdered, work, func(seq uint64) {
		p.seq, o.seq = seq, seq
		if p.tl != nil {
			p.tl.Seq = seq
		}
		addErr = e.add(p)
	})
	if addErr == nil && err == nil {
		c.attachDriver(e) // after arm, which holds the lock attachDriver takes
	}
	if addErr != nil {
		// Armed but the engine closed: fail it so streams move on.
		p.retire(errClosedWhile(s.What, "before the condition triggered"), nil)
		return nil
	}
	if err != nil {
		if p.seq == 0 {
			o.plan.Unused(0)
			return err
		}
		// The trigger is enqueued (the operation will run) but what follows it on the
		// stream (the completion wait, or the work after completion) is not: the
		// caller reports it with the operation.
		return fmt.Errorf("operation armed, its stream-ordered follow-up not enqueued: %w", err)
	}
	return nil
}

// submitParts arms an operation moved in parts (a large staged RMA): one sequence
// number per part, so that staging copies pipeline with the transfers (armChunks). The
// operation completes with its last part, with the first error any part met.
func (e *Engine) submitParts(o *Op, streamOrdered bool) error {
	c := o.cond
	n := len(o.plan.Parts)
	o.parts = make([]*part, n)
	o.left = n
	work := make([]streamWork, n)
	for i := range o.plan.Parts {
		pp := &o.plan.Parts[i]
		o.parts[i] = &part{cond: c, op: o, plan: pp}
		work[i] = streamWork{before: pp.Before, after: pp.After, part: o.parts[i]}
	}
	var addErr error
	added := 0
	armed, err := c.armChunks(streamOrdered, work, func(i int, seq uint64) {
		p := o.parts[i]
		p.seq, o.seq = seq, seq
		if addErr == nil {
			if addErr = e.add(p); addErr == nil {
				added++
			}
		}
	})
	if armed > 0 && addErr == nil {
		c.attachDriver(e)
	}
	// Parts never armed give their staging back and count as ended now.
	o.plan.Unused(armed)
	if addErr != nil {
		closed := errClosedWhile(o.what, "before the condition triggered")
		for _, p := range o.parts[added:armed] {
			p.retire(closed, nil)
		}
		if armed < n {
			o.finishParts(n-armed, closed)
		}
		return nil
	}
	if armed < n {
		o.finishParts(n-armed, err)
	}
	if err != nil {
		if armed == 0 {
			return err
		}
		return fmt.Errorf("the operation runs in %d of %d parts: %w", armed, n, err)
	}
	return nil
}

// finishParts counts k parts as ended (err from one of them); the last ends the Op
// with the first error any part met.
func (o *Op) finishParts(k int, err error) {
	o.mu.Lock()
	if o.err == nil {
		o.err = err
	}
	o.left -= k
	last, first := o.left == 0, o.err
	o.mu.Unlock()
	if last {
		o.complete(first, nil, nil)
	}
}

// retire ends part p (err: a failure found by the engine itself, nil to take the
// operation's own result) and advances its condition's completion word. The Op's
// callback joins due if due is not nil, else it runs now.
func (p *part) retire(err error, due *dueList) {
	o := p.op
	c := o.cond
	if c.category == Graph {
		// A persistent operation ends with its condition (destroyed, or the engine
		// closed); each launch's result went to the condition already.
		if err != nil {
			c.fail(err)
		} else {
			c.releaseWords()
			err = c.Err() // the first error any launch met
		}
		o.complete(err, nil, due)
		return
	}
	switch {
	case err != nil:
	case p.err != nil:
		err = p.err
	default:
		err = p.inner.Err()
	}
	if p.held {
		p.hold.let()
	} else if rel := p.plan.Release; rel != nil {
		rel()
	}
	if o.parts != nil {
		c.retire(p.seq, err)
		o.mu.Lock()
		if o.err == nil {
			o.err = err
		}
		o.left--
		last, first := o.left == 0, o.err
		o.mu.Unlock()
		if last {
			o.complete(first, nil, due)
		}
		return
	}
	o.complete(err, func() { c.retire(p.seq, err) }, due)
}

// complete ends the Op with err. It is done before retire runs (a stream the
// completion word releases sees it done); a blocked waiter is woken and the callback
// runs after (a woken waiter may destroy the condition), or joins due if not nil.
func (o *Op) complete(err error, retire func(), due *dueList) {
	o.err = err
	o.done.Store(true)
	if retire != nil {
		retire()
	}
	o.mu.Lock()
	o.finished.Store(true)
	if o.doneCh != nil {
		close(o.doneCh)
	}
	o.mu.Unlock()
	switch {
	case o.cb == nil:
	case due != nil:
		due.push(o)
	default:
		o.cb()
	}
}

// Submitted reports whether Submit armed the operation, so that it will complete
// (even when Submit returned an error about work after its trigger).
func (o *Op) Submitted() bool { return o.seq != 0 }

// Done reports whether the operation completed.
func (o *Op) Done() bool { return o.done.Load() }

// Err is the operation's result once Done; nil while pending.
func (o *Op) Err() error {
	if !o.done.Load() {
		return nil
	}
	return o.err
}

// Issued is the started operation of a one-part operation once Done (to read its
// results: received length, tag), nil for an operation moved in parts or never issued.
func (o *Op) Issued() Issued {
	if !o.done.Load() || o.parts != nil {
		return nil
	}
	return o.single.inner
}

// Condition is the condition the operation was armed on (for an operation enqueued
// under stream capture, the graph condition made for it).
func (o *Op) Condition() *Condition { return o.cond }

// Test drives one engine round if the operation is pending and reports whether it is
// done, with its error.
func (o *Op) Test() (bool, error) {
	if o.done.Load() {
		return true, o.err
	}
	o.eng.Drive()
	return o.done.Load(), o.Err()
}

// Wait waits until the operation completed or ctx ended (then it returns ctx.Err()
// and the operation stays pending). It drives the engine itself while that makes
// progress (no thread hop on the latency path), then blocks until the engine's
// goroutine completes the operation.
func (o *Op) Wait(ctx context.Context) error {
	if o == nil || ctx == nil {
		return fmt.Errorf("wait: nil Op or context: %w", ErrInvalidParam)
	}
	idle, drove := 0, false
	for idle < 4096 {
		// finished, not done: a waiter that returns must see the condition's
		// completion word stored as well (condition.Test on its handle).
		if o.finished.Load() {
			if drove {
				o.eng.Release()
			}
			return o.err
		}
		drove = true
		if o.eng.Drive() {
			idle = 0
		} else {
			idle++
			if idle > 256 {
				runtime.Gosched()
			}
		}
	}
	if goid.Is(o.eng.id.Load()) {
		// A callback on the engine's own goroutine waits: it is the goroutine that
		// would complete the operation, so it keeps driving the rounds instead of
		// sleeping until they are done.
		return o.driveUntilFinished(ctx)
	}
	o.eng.Release()
	select {
	case <-o.doneChan():
		return o.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// driveUntilFinished drives the engine's rounds until o finished or ctx ends, pausing
// briefly between rounds that found nothing to do.
func (o *Op) driveUntilFinished(ctx context.Context) error {
	defer o.eng.Release()
	for idle := 0; ; {
		if o.finished.Load() {
			return o.err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if o.eng.Drive() {
			idle = 0
			continue
		}
		if idle++; idle < 4096 {
			runtime.Gosched()
		} else {
			time.Sleep(50 * time.Microsecond)
		}
	}
}

func (o *Op) doneChan() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.doneCh == nil {
		o.doneCh = make(chan struct{})
		if o.finished.Load() {
			close(o.doneCh)
		}
	}
	return o.doneCh
}

// WaitOnStream orders s after the operation: work enqueued on s afterwards runs only
// once it has completed (MPIX Wait_enqueue). s must be of the condition's backend.
func (o *Op) WaitOnStream(s streamcore.Stream) error {
	if err := o.cond.waitOnStream(s, o.seq); err != nil {
		return err
	}
	if s.Kind() == streamcore.KindCUDA && !o.done.Load() {
		// Nothing tells the engine when s reaches its wait: ring on completion,
		// however soon.
		o.ringOnCompletion()
	}
	return nil
}

// ringOnCompletion makes the engine ring the completion word's block when the
// operation's last part retires, so a CUDA stream waiting on the word notices sooner.
func (o *Op) ringOnCompletion() {
	last := &o.single
	if o.parts != nil {
		last = o.parts[len(o.parts)-1]
	}
	o.eng.mu.Lock()
	last.ring = true
	o.eng.mu.Unlock()
}

// Cancel cancels the operation: before its trigger it will complete with an error
// matching ErrCanceled without being issued (on a KernelTriggered condition at once,
// in sequence order, after the operations armed before it: its trigger may never
// come; on a Stream condition when the stream reaches its trigger); once issued, the
// transport cancels it.
func (o *Op) Cancel() {
	if o.done.Load() {
		return
	}
	if o.parts != nil {
		for _, p := range o.parts {
			p.cancel()
		}
		return
	}
	o.single.cancel()
}

func (p *part) cancel() {
	e := p.op.eng
	e.mu.Lock()
	var inner Issued
	early := false
	if p.issued {
		inner = p.inner
	} else {
		p.canceled = true
		// A KernelTriggered part retires without its trigger (roundLocked): the
		// next full round does it, wherever it runs.
		early = p.cond.category == KernelTriggered
	}
	e.mu.Unlock()
	if early {
		e.canceled.Store(true)
		e.wakeUp()
	}
	if inner != nil {
		inner.Cancel()
	}
	if g := p.cond.chainRun.Load(); g != nil {
		g.cancel(p) // a host graph's chain runs it (graphChain)
	}
}

// ErrCanceled matches operations canceled by Cancel or by their engine closing.
var ErrCanceled = errs.Canceled

// errEngineClosed: the operation ended because its engine closed (its worker closed).
var errEngineClosed = errs.New("engine closed", errs.Canceled, errs.Closed)

func errCanceledBeforeTrigger(what string) error {
	return fmt.Errorf("%s: canceled before the condition triggered: %w", what, ErrCanceled)
}

func errStreamStopped(what string, stopped error) error {
	return fmt.Errorf("%s: not issued, its stream stopped before the trigger (%w): %w", what, ErrCanceled, stopped)
}

func errClosedWhile(what, when string) error {
	return fmt.Errorf("%s: %w %s", what, errEngineClosed, when)
}

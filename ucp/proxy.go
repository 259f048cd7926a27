package ucp

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream"
)

// The proxy engine executes conditioned operations: one per worker, on a goroutine
// locked to its OS thread, started by the first conditioned operation. It watches the
// trigger words of conditions with pending operations only, issues each operation
// (in sequence order) once its condition's trigger has reached it, and retires
// operations in order, storing into the completion word the highest sequence number up
// to which every operation completed. With nothing pending it blocks on a channel, so
// an idle process costs no CPU. It never needs the application's goroutines to run.

// NonBlockingEnqueue, on an operation with a Stream condition, enqueues only the trigger:
// the stream does not wait for completion. Wait on the Request, or order a stream after
// it with Request.WaitOnStream (the MPIX Isend_enqueue / Wait_enqueue pattern).
const NonBlockingEnqueue OpFlags = 1 << 31

// ucpxOnlyFlags are OpFlags bits UCX never sees.
const ucpxOnlyFlags = NonBlockingEnqueue

type condOp struct {
	seq uint64
	// issueAt performs the operation on buf; off is its offset in the user's buffer
	// (the part of an operation moved in parts).
	issueAt  func(off int, buf []byte, p *RequestParam) (*Request, error)
	off      int
	buf      []byte
	param    RequestParam // what issue gets: no condition, no callback
	user     *Request
	inner    *Request
	err      error // issue error
	issued   bool
	canceled bool      // canceled before its trigger: retired without being issued
	running  bool      // Graph category: issued for the current launch, not yet fired
	release  func()    // returns a staging buffer once the operation is done with it
	whole    *partedOp // the operation this one is a part of (enqueueParts), or nil
	// ring: a CUDA stream waits for this operation with a memop wait (its own stream,
	// or another through Request.WaitOnStream), which the GPU looks at again late
	// unless rung (stream.WordBlock.Ring); issuedAt tells whether it completed late
	// enough for the wait to be pending. Under px.mu once added.
	ring     bool
	issuedAt time.Time
	nextIn   *condOp // the next older operation while o waits in proxy.incoming
}

// closedIncoming marks proxy.incoming of a proxy that shut down.
var closedIncoming = &condOp{}

type channel struct {
	cond *condition.Condition
	ops  []*condOp // armed, not retired, in sequence order
	pos  int       // index in proxy.order
	// seenTrigger is the trigger word as the last full round read it (under drive).
	seenTrigger uint64
	// running counts a Graph condition's operations issued for the current launch
	// and not yet completed.
	running int
}

type proxy struct {
	w *Worker
	// drive makes one goroutine at a time run a round: the proxy's own, a host stream
	// executor waiting on a completion word, or a goroutine in Request.Wait or Test.
	drive  sync.Mutex
	mu     sync.Mutex // guards active and the operations' issue state
	active map[*condition.Condition]*channel
	order  []*channel // the channels of active, for rounds (iterating a map costs more)
	// incoming holds the operations added and not yet in their channels (see add): a
	// lock-free stack linked through condOp.nextIn, newest first; closedIncoming once
	// the proxy shut down. Enqueuers write it on every operation, from other cores:
	// the padding keeps it off the lines of mu and the round state, which the driving
	// thread uses every round (sharing one, each write would take the line from it).
	_        [64]byte
	incoming atomic.Pointer[condOp]
	_        [64]byte
	wake     chan struct{}
	stop     chan struct{}
	exited   chan struct{}
	// retired is the drive round's scratch list (under drive).
	retired []retirement
	// parked: the proxy goroutine waits for work on wake. Kicks wake it only then:
	// while it backs off, a goroutine waiting on a completion word drives the round
	// itself, and an extra spinning thread would only take a core from it.
	parked atomic.Bool

	// What the last full round saw, so that rounds in between can tell that nothing
	// changed without taking mu (which enqueuers need: a spinning proxy taking it
	// every round made them wait).
	last   roundState // under drive
	scan   []*channel // the active channels as of the last full round (under drive)
	waitOn *Request   // the oldest operation in flight then (under drive)
}

// roundState is what a full round started from.
type roundState struct {
	completions uint64
	changed     bool // the round progressed: the next one must be full too
	inflight    bool
}

// proxy returns the worker's proxy, starting it on first use.
func (w *Worker) proxy() (*proxy, error) {
	if px := w.proxyReady.Load(); px != nil {
		return px, nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed.Load() {
		return nil, ErrClosed
	}
	if w.px == nil {
		w.px = &proxy{
			w:      w,
			active: map[*condition.Condition]*channel{},
			wake:   make(chan struct{}, 1),
			stop:   make(chan struct{}),
			exited: make(chan struct{}),
		}
		go w.px.run()
		w.proxyReady.Store(w.px)
	}
	return w.px, nil
}

// PollCompletionBytes: a stream-ordered operation moving at least this many bytes has
// its stream wait for completion with Stream.PollValue, not a memop wait. A memop wait
// not satisfied at once is looked at again only about every 13 µs on the H200 (run 29 of
// docs/gpu-runs.md), while a transfer of 16 KiB or more takes several microseconds
// over shared memory; below, the wait usually ends within a microsecond or two, where
// the memop is cheaper (one driver call for trigger and wait, no kernel launch). At 4 KiB
// polling sped the bare ping-pong up (5.9 → 5.3 µs) but slowed it with a producer kernel
// on the stream (6.2 → 8.5 µs: the extra launch made the enqueuing thread the
// bottleneck), runs 35 and 36.
const PollCompletionBytes = 16 << 10

// ringAfter: the proxy rings the GPU's doorbell (stream.WordBlock.Ring) when a
// stream-ordered operation on a CUDA stream completes at least this long after it was
// issued. The stream reaches its memop wait right after the trigger; the GPU keeps
// looking at a pending wait for a short while, then only about every 13 µs, so a
// completion later than that window is noticed late unless the GPU is given new work.
// A ring costs the proxy one driver call (~1.3 µs) and, when the wait was still being
// looked at anyway, slows the stream. Sweeps on the H200 (runs 43 and 45, never / 0 /
// 1 / 2 / 3 / 4 µs): completions within ~1.5 µs of their issue (8 B) were noticed
// without a ring and rings only slowed them ((c)+work 8 B: 4.0 µs unrung, 5.1 at
// 1 µs, 4.8 at 2 µs); 4 KiB ones (~2–2.5 µs) were not (unrung (c)+work 6.6 µs, 5.5–5.8
// rung at 1–2 µs; 3 µs and more rang too late to help).
const ringAfter = 2 * time.Microsecond

// direction says which way an operation's buffer moves, for staging.
type direction int

const (
	dirNone direction = iota // flush, atomics: no user buffer
	dirOut                   // sends, puts: the buffer is read
	dirIn                    // receives, gets: the buffer is written
)

// enqueueConditioned arms cond for one operation that issueAt performs, on buf, once
// triggered. Device memory UCX cannot use is staged through pinned host memory, on the
// condition's stream: copied out before the trigger, copied in after the completion.
// partable operations (RMA: the part at offset off goes to the remote address plus off)
// stage a device buffer larger than StagingPart in parts that pipeline with the staging
// copies (see enqueueParts).
func (w *Worker) enqueueConditioned(op string, p *RequestParam, buf []byte, dir direction, issueAt func(off int, buf []byte, p *RequestParam) (*Request, error), partable bool) (*Request, error) {
	cond := p.Condition
	if w.closed.Load() {
		return nil, opErr(op, ErrClosed, "")
	}
	// Not under w.mu, which the proxy holds while it progresses. A Close racing with
	// this is caught by px.add (the proxy is shut down) or by the stager.
	px, err := w.proxy()
	if err != nil {
		return nil, opErr(op, err, "")
	}
	stager, err := w.stager(cond.Backend())
	if err != nil {
		return nil, opErr(op, err, "")
	}
	// Under stream capture the operation becomes a persistent graph operation of a
	// condition of its own (same backend, so the same stager).
	captured, err := cond.Captured(p.Flags&NonBlockingEnqueue == 0)
	if err != nil {
		return nil, opErr(op, err, "condition")
	}
	if captured != nil {
		cond = captured
	}

	o := newCondOp(p, issueAt)
	o.user = &Request{w: w, op: op, cb: p.Callback, cond: cond, condOp: o}
	streamOrdered := cond.Category() == condition.Stream && p.Flags&NonBlockingEnqueue == 0

	// A large transfer's completion comes long after its trigger: the stream polls for
	// it (condition.StreamWork.PollCompletion).
	work := condition.StreamWork{PollCompletion: len(buf) >= PollCompletionBytes}
	o.buf = buf
	o.ring = streamOrdered && !work.PollCompletion && cond.Backend().Kind() == stream.KindCUDA
	registeredHost := p.MemH != nil && p.MemH.MemoryType() == MemoryHost
	if stager != nil && dir != dirNone && len(buf) > 0 && !registeredHost {
		addr := uintptr(unsafe.Pointer(&buf[0]))
		kind, err := stager.Classify(addr)
		if err != nil {
			return nil, opErr(op, err, "buffer %#x", addr)
		}
		if kind == protocol.KindDevice {
			switch {
			case cond.Category() != condition.Stream:
				return nil, opErr(op, ErrUnsupported, "device buffer with a %v condition: UCX here has no CUDA transport, and staging needs a stream", cond.Category())
			case dir == dirIn && !streamOrdered:
				return nil, opErr(op, ErrUnsupported, "device receive buffer with NonBlockingEnqueue: staged data is copied in on the stream after completion")
			}
			if partable && len(buf) > StagingPart && !cond.InGroup() {
				return w.enqueueParts(op, p, cond, px, stager, addr, len(buf), dir, streamOrdered, issueAt)
			}
			if _, err := o.stage(stager, &work, addr, len(buf), dir); err != nil {
				return nil, opErr(op, err, "staging %d bytes", len(buf))
			}
		}
	}

	var addErr error
	_, err = cond.Arm(streamOrdered, work, func(seq uint64) {
		o.seq, o.user.seq = seq, seq
		addErr = px.add(o)
	})
	if addErr == nil && err == nil {
		// After Arm: Arm holds the condition's lock, which AttachDriver takes. Cheap
		// once attached.
		cond.AttachDriver(px)
	}
	if addErr != nil {
		// Armed but the proxy is gone (worker closing): fail it so streams move on.
		px.retire(cond, o, opErr(op, ErrClosed, "worker closed"))
		return o.user, nil
	}
	if err != nil {
		if o.seq == 0 {
			if o.release != nil {
				o.release()
			}
			return nil, opErr(op, err, "condition")
		}
		// The trigger is enqueued (the operation will run) but the completion wait is
		// not: report it with the request.
		return o.user, opErr(op, err, "condition: stream-ordered completion not enqueued")
	}
	return o.user, nil
}

// newCondOp is the proxy's copy of an operation that issueAt performs: its parameters
// without what ucpx alone handles (the condition, the callback, ucpx-only flags).
func newCondOp(p *RequestParam, issueAt func(off int, buf []byte, p *RequestParam) (*Request, error)) *condOp {
	o := &condOp{param: *p, issueAt: issueAt}
	o.param.Condition, o.param.Callback = nil, nil
	o.param.Flags &^= ucpxOnlyFlags
	return o
}

// stage makes o move n bytes of device memory at dev through a pinned buffer from
// stager, on the condition's stream: work gets the copy out before the trigger (dir
// out) or the copy in after the completion (dir in), and the buffer goes back once the
// operation (out) or the copy in (in) is done with it. It returns the buffer.
func (o *condOp) stage(stager *protocol.Stager, work *condition.StreamWork, dev uintptr, n int, dir direction) (*cuda.HostMemory, error) {
	buf, err := stager.Get(n)
	if err != nil {
		return nil, err
	}
	o.buf = buf.Bytes()[:n]
	o.param.MemoryType, o.param.MemH = MemoryHost, nil
	if dir == dirOut {
		work.Before = func(s stream.Stream) error { return s.Copy(buf.Addr(), dev, n) }
		o.release = func() { stager.Put(buf) }
		return buf, nil
	}
	work.After = func(s stream.Stream) error {
		if err := s.Copy(dev, buf.Addr(), n); err != nil {
			return err
		}
		return s.LaunchHostFunc(func() { stager.Put(buf) })
	}
	return buf, nil
}

// stager returns the worker's stager for backend b (nil for host backends: every
// buffer there is host memory).
func (w *Worker) stager(b stream.Backend) (*protocol.Stager, error) {
	if b.Kind() != stream.KindCUDA || w.ctx.SupportsMemoryType(MemoryCUDA) {
		return nil, nil
	}
	w.stagerMu.Lock()
	defer w.stagerMu.Unlock()
	if w.stagersClosed {
		return nil, ErrClosed
	}
	if w.stagers == nil {
		w.stagers = map[stream.Backend]*protocol.Stager{}
	}
	st := w.stagers[b]
	if st == nil {
		st = protocol.NewStager(b)
		w.stagers[b] = st
	}
	return st, nil
}

// add hands o (of the condition o.user.cond) to the proxy: it is pushed onto a lock-free stack, which the next full
// round empties into the channels. An enqueuer never waits for a round (which holds
// px.mu while it issues operations), and a round never waits for an enqueuer (the
// lock this replaced was the most contended of a host-stream run: run 47). One
// condition's operations arrive in sequence order: Arm holds the condition's lock while
// it calls add, and the round takes them in push order.
func (px *proxy) add(o *condOp) error {
	for {
		head := px.incoming.Load()
		if head == closedIncoming {
			return ErrClosed
		}
		o.nextIn = head
		if px.incoming.CompareAndSwap(head, o) {
			break
		}
	}
	px.Kick()
	return nil
}

// added reports whether operations wait in px.incoming.
func (px *proxy) added() bool {
	head := px.incoming.Load()
	return head != nil && head != closedIncoming
}

// takeIncomingLocked moves the added operations into their channels. Caller holds
// px.mu.
func (px *proxy) takeIncomingLocked() {
	for {
		head := px.incoming.Load()
		if head == nil || head == closedIncoming {
			return
		}
		if px.incoming.CompareAndSwap(head, nil) {
			px.channelLocked(head)
			return
		}
	}
}

// channelLocked appends the stack of added operations from head to their channels,
// oldest first. Caller holds px.mu.
func (px *proxy) channelLocked(head *condOp) {
	var oldest *condOp
	for o := head; o != nil; {
		next := o.nextIn
		o.nextIn = oldest
		oldest, o = o, next
	}
	for o := oldest; o != nil; {
		next := o.nextIn
		o.nextIn = nil
		cond := o.user.cond
		ch := px.active[cond]
		if ch == nil {
			ch = &channel{cond: cond, pos: len(px.order)}
			px.active[cond] = ch
			px.order = append(px.order, ch)
		}
		ch.ops = append(ch.ops, o)
		o = next
	}
}

// removeLocked drops ch from the active channels. Caller holds px.mu.
func (px *proxy) removeLocked(ch *channel) {
	delete(px.active, ch.cond)
	last := px.order[len(px.order)-1]
	px.order[ch.pos], last.pos = last, ch.pos
	px.order[len(px.order)-1] = nil
	px.order = px.order[:len(px.order)-1]
}

// Kick wakes the proxy goroutine if it is parked (a new operation, or a host executor
// stored a trigger).
func (px *proxy) Kick() {
	if !px.parked.Load() {
		return
	}
	select {
	case px.wake <- struct{}{}:
	default:
	}
}

// Drive runs one round if no other goroutine is running one: issue the operations whose
// trigger has come, retire completed ones in order, progress UCX if anything is in
// flight. It reports whether anything progressed.
func (px *proxy) Drive() bool {
	progressed, _, _ := px.round()
	return progressed
}

type retirement struct {
	cond *condition.Condition
	op   *condOp
}

// The proxy goroutine is not locked to its OS thread: its backoff yields with
// runtime.Gosched, which on a locked goroutine costs a thread handoff (measured here:
// 25-30 us per call locked, 0.1-0.2 us unlocked), and nothing it calls needs thread
// affinity (the worker is SERIALIZED, cgo/cuda binds its context in every call).
func (px *proxy) run() {
	defer close(px.exited)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	idle := 0
	for {
		select {
		case <-px.stop:
			return
		default:
		}
		progressed, active, busy := px.round()
		if !active {
			px.parked.Store(true)
			// Re-check after announcing: an add between the round and the flag would
			// otherwise go unseen until the next kick.
			if _, active, _ = px.round(); !active {
				select {
				case <-px.wake:
				case <-px.stop:
					px.parked.Store(false)
					return
				}
			}
			px.parked.Store(false)
			idle = 0
			continue
		}
		if progressed {
			idle = 0
			continue
		}
		if busy && idle < 4096 {
			idle = 4096 // another goroutine drives the round: back off at once
		}
		idle++
		switch {
		case idle < 256:
		case idle < 4096:
			// Yielding keeps the latency of a trigger that comes soon in the
			// microseconds; Go's timers cannot sleep for less than ~1 ms here.
			runtime.Gosched()
		default:
			// Waiting long for a trigger or a peer, or another goroutine drives:
			// sleep until kicked, or briefly (GPU-written triggers are not kicked).
			timer.Reset(50 * time.Microsecond)
			select {
			case <-px.wake:
				idle = 0
			case <-timer.C:
			case <-px.stop:
				timer.Stop()
				return
			}
			timer.Stop()
		}
	}
}

// round is one pass of the proxy engine, unless another goroutine is running one
// (busy). active reports whether operations are pending.
func (px *proxy) round() (progressed, active, busy bool) {
	if !px.drive.TryLock() {
		return false, true, true
	}
	progressed, active = px.roundLocked()
	return progressed, active, false
}

func (px *proxy) roundLocked() (progressed, active bool) {
	defer px.drive.Unlock()
	if px.quiet() {
		// Nothing to issue or retire: only progress what is in flight.
		if px.last.inflight && px.w.progressFor(px.waitOn, 16) > 0 {
			return true, true
		}
		return false, true
	}
	defer func() { px.last.changed = progressed }()
	px.last.completions = px.w.completions.Load()
	inflight := false
	var bell *stream.WordBlock // rung once this round's completions are stored
	var waitOn *Request        // the oldest operation in flight
	px.mu.Lock()
	px.takeIncomingLocked()
	if len(px.active) == 0 {
		px.scan = px.scan[:0]
		px.mu.Unlock()
		return false, false
	}
	// Backwards, so removeLocked's swap only moves channels already visited.
	for i := len(px.order) - 1; i >= 0; i-- {
		ch := px.order[i]
		cond := ch.cond
		if cond.Category() == condition.Graph {
			if px.graphRoundLocked(cond, ch) {
				progressed = true
			}
			if ch.running > 0 {
				inflight = true
			}
			continue
		}
		trigger := cond.TriggerWord().Load()
		ch.seenTrigger = trigger
		for _, o := range ch.ops {
			if o.issued {
				continue
			}
			if int64(trigger-o.seq) < 0 {
				break // later operations wait for a later trigger
			}
			if o.canceled {
				o.err = opErr(o.user.op, ErrCanceled, "canceled before the condition triggered")
			} else {
				if o.ring {
					o.issuedAt = time.Now()
				}
				o.inner, o.err = o.issueAt(o.off, o.buf, &o.param)
			}
			o.issued = true
			progressed = true
		}
		for len(ch.ops) > 0 {
			o := ch.ops[0]
			if !o.issued || (o.err == nil && !o.inner.Done()) {
				break
			}
			ch.ops[0] = nil
			ch.ops = ch.ops[1:]
			if o.ring && time.Since(o.issuedAt) >= ringAfter {
				bell = cond.CompletionWord().Block()
			}
			px.retired = append(px.retired, retirement{cond, o})
		}
		if len(ch.ops) > 0 && ch.ops[0].issued {
			inflight = true
			if front := ch.ops[0]; waitOn == nil && front.err == nil && front.inner != nil {
				waitOn = front.inner
			}
		}
		if len(ch.ops) == 0 {
			px.removeLocked(ch)
		}
	}
	px.scan = append(px.scan[:0], px.order...)
	px.mu.Unlock()
	px.last.inflight, px.waitOn = inflight, waitOn
	if len(px.retired) > 0 {
		// Outside px.mu: Retire takes the condition's lock, which Arm holds while it
		// calls add.
		for i, r := range px.retired {
			px.retire(r.cond, r.op, nil)
			px.retired[i] = retirement{}
		}
		px.retired = px.retired[:0]
		if bell != nil {
			// Best effort: unrung, the wait is still noticed, only later.
			_ = bell.Ring()
		}
		progressed = true
	}
	// Spin in C on the oldest operation in flight (as Request.Wait does) rather than
	// paying a whole round per ucp_worker_progress call.
	if inflight && px.w.progressFor(waitOn, 16) > 0 {
		progressed = true
	}
	return progressed, true
}

// quiet reports that no full round is needed: the last one changed nothing, no
// operation was added, no request completed and no trigger word moved since. Caller
// holds px.drive.
func (px *proxy) quiet() bool {
	if px.last.changed || len(px.scan) == 0 || px.added() || px.w.completions.Load() != px.last.completions {
		return false
	}
	for _, ch := range px.scan {
		cond := ch.cond
		if cond.Category() == condition.Graph {
			if cond.TriggerWord().Load() == 1 || cond.Destroyed() {
				return false
			}
		} else if cond.TriggerWord().Load() != ch.seenTrigger {
			return false
		}
	}
	return true
}

// graphRoundLocked runs the persistent operations of a Graph condition: each time a
// launch's node stores 1 into the trigger, the proxy takes it (resets the trigger to 0,
// so the graph relaunches with no host update), issues every operation the condition
// carries (one node, N operations: a launch costs the CPU nothing per operation) and,
// once all completed, stores 1 into the completion word. An operation added while a
// launch runs joins from the next launch. A destroyed condition's operations end and
// their requests complete. Caller holds px.mu and px.drive.
func (px *proxy) graphRoundLocked(cond *condition.Condition, ch *channel) bool {
	if ch.running > 0 {
		var err error
		for _, o := range ch.ops {
			if !o.running {
				continue
			}
			if o.err == nil && !o.inner.Done() {
				return false
			}
			if err == nil {
				err = o.err
				if err == nil {
					err = o.inner.err
				}
			}
		}
		for _, o := range ch.ops {
			o.running = false
		}
		ch.running = 0
		cond.Fire(err)
		return true
	}
	if cond.Destroyed() {
		px.removeLocked(ch)
		for _, o := range ch.ops {
			px.retired = append(px.retired, retirement{cond, o})
		}
		return true
	}
	if cond.TriggerWord().Load() != 1 {
		return false
	}
	cond.TriggerWord().Store(0)
	for _, o := range ch.ops {
		o.inner, o.err = o.issueAt(o.off, o.buf, &o.param)
		o.issued, o.running = true, true
	}
	ch.running = len(ch.ops)
	return true
}

// ringOnCompletion makes the proxy ring the GPU's doorbell when o completes (a CUDA
// stream now waits for it with a memop wait), however soon. An operation moved in
// parts completes with its last part.
func (px *proxy) ringOnCompletion(o *condOp) {
	if o.whole != nil {
		o = o.whole.ops[len(o.whole.ops)-1]
	}
	px.mu.Lock()
	o.ring = true
	px.mu.Unlock()
}

// cancel cancels a conditioned operation: before its trigger it will retire with
// ErrCanceled without being issued; once issued, its UCX operation is canceled. An
// operation moved in parts cancels every part.
func (px *proxy) cancel(o *condOp) {
	if o.whole != nil {
		for _, part := range o.whole.ops {
			px.cancelOne(part)
		}
		return
	}
	px.cancelOne(o)
}

func (px *proxy) cancelOne(o *condOp) {
	px.mu.Lock()
	var inner *Request
	if o.issued {
		inner = o.inner
	} else {
		o.canceled = true
	}
	px.mu.Unlock()
	if inner != nil {
		inner.Cancel()
	}
}

// retire completes o's user request and advances the condition's completion word.
func (px *proxy) retire(cond *condition.Condition, o *condOp, err error) {
	u := o.user
	if cond.Category() == condition.Graph {
		// A persistent operation ends with its condition (destroyed, or the worker
		// closed); each launch's result went to the condition already.
		if err != nil {
			cond.Fail(err)
		} else {
			cond.ReleaseWords()
			err = cond.Err() // the first error any launch met
		}
		u.finishProxied(err, nil)
		return
	}
	switch {
	case err != nil:
	case o.err != nil:
		err = o.err
	default:
		err = o.inner.err
		if o.whole == nil {
			u.length, u.tag, u.fetched = o.inner.length, o.inner.tag, o.inner.fetched
		}
	}
	if o.release != nil {
		o.release()
	}
	if o.whole != nil {
		// One part: the user's Request ends with the last (parts retire in order).
		last, userErr := o.whole.finish(1, err)
		if !last {
			cond.Retire(o.seq, err)
			return
		}
		u.finishProxied(userErr, func() { cond.Retire(o.seq, err) })
		return
	}
	u.finishProxied(err, func() { cond.Retire(o.seq, err) })
}

// shutdown stops the proxy and fails every operation it still holds, so no stream
// stays blocked on a completion word. Called by Worker.Close without w.mu held, after
// UCX finished every request the proxy had issued.
func (px *proxy) shutdown() {
	pending := px.incoming.Swap(closedIncoming)
	close(px.stop)
	<-px.exited
	px.mu.Lock()
	if pending != closedIncoming {
		px.channelLocked(pending)
	}
	var left []retirement
	for len(px.order) > 0 {
		ch := px.order[len(px.order)-1]
		for _, o := range ch.ops {
			left = append(left, retirement{ch.cond, o})
		}
		px.removeLocked(ch)
	}
	px.mu.Unlock()
	for _, r := range left {
		var err error
		if r.cond.Category() == condition.Graph {
			px.retire(r.cond, r.op, opErr(r.op.user.op, ErrCanceled, "worker closed: the graph operation can run no more"))
			continue
		}
		if !r.op.issued {
			err = opErr(r.op.user.op, ErrCanceled, "worker closed before the condition triggered")
		} else if r.op.err == nil && !r.op.inner.Done() {
			err = opErr(r.op.user.op, ErrCanceled, "worker closed")
		}
		px.retire(r.cond, r.op, err)
	}
}

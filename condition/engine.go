package condition

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ucpx/ucpx/internal/goid"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream/streamcore"
	"github.com/ucpx/ucpx/trace"
)

// The engine (the proxy) executes conditioned operations: one per communication
// worker. It watches the trigger words of conditions with pending operations only,
// issues each operation (in sequence order) once its condition's trigger has reached
// it, and retires operations in order, storing into the completion word the highest
// sequence number up to which every operation completed. A round may run on any
// goroutine (the engine's own, a host-stream executor waiting on a completion word, a
// goroutine waiting on an operation), one at a time. With nothing pending the engine's
// goroutine blocks on a channel, so an idle process costs no CPU. It never needs the
// application's goroutines to run, and it makes no driver call that can wait for the
// application's stream work (docs/ARCHITECTURE.md lists the calls it makes).

// Operation is a communication operation the engine issues when its condition's
// trigger reaches it. Package ucp implements it for every nbx call.
type Operation interface {
	// Issue starts the operation on one part of its plan: p.Buf at p.Offset of the
	// caller's buffer (p.Staged: host staging memory standing for device memory). It
	// is called once per trigger (once per launch for graph operations) on whichever
	// goroutine runs the engine's round, and must not block.
	Issue(p *protocol.Part) (Issued, error)
}

// Issued is an operation the transport has started.
type Issued interface {
	// Done reports completion without driving progress.
	Done() bool
	// Err is the result once Done.
	Err() error
	// Cancel asks the transport to cancel the operation.
	Cancel()
}

// Transport is what an engine drives.
type Transport interface {
	// Progress advances the transport, spinning a bounded number of times while
	// oldest (the oldest operation in flight, nil if none) is pending; it reports
	// whether anything progressed. It must not block.
	Progress(oldest Issued) bool
	// Completions counts the operations the transport completed asynchronously so
	// far: the engine rescans its operations only when this or a trigger word moved.
	Completions() uint64
}

// TransportWaiter is a Transport that can sleep until it may have work (package ucp:
// the worker's event fd in Go's netpoller). The engine's goroutine sleeps there, rather
// than on a timer the runtime rounds up to a millisecond, when its rounds find nothing
// to do and every pending condition's trigger comes with a kick (not GPU-written, not
// KernelTriggered).
type TransportWaiter interface {
	// WaitProgress returns when the transport may have progressed (an event), Wake was
	// called since the last WaitProgress returned, done closes, or max passes (0: no
	// bound). It returns false at once when the transport cannot sleep (no event fd):
	// the engine then polls.
	WaitProgress(done <-chan struct{}, max time.Duration) bool
	// Wake ends a WaitProgress, or makes the next one return at once.
	Wake()
}

// TransportClosing is a Transport that tells it is closing (package ucp: the worker's
// Close began, which cancels the operations in flight). A Graph condition's launch
// that fails then is not completed as a launch that met an error: its operations can
// run no more, so the engine marks them failed (GraphFailed) and a host graph's wait
// node fails the launch, rather than letting it go on as if the canceled operation had
// done its work.
type TransportClosing interface {
	Closing() bool
}

// Engine executes the conditioned operations of one transport (a ucp.Worker).
type Engine struct {
	transport Transport
	closing   TransportClosing // transport, if it tells it is closing
	planner   *protocol.Planner
	// drive makes one goroutine at a time run a round.
	drive  sync.Mutex
	mu     sync.Mutex // guards active and the parts' issue state
	active map[*Condition]*channel
	order  []*channel // the channels of active, for rounds (cheaper than a map)
	// polled counts the channels of order whose trigger is stored without a kick
	// (pollPending). Written under mu.
	polled atomic.Int32
	// incoming holds the parts added and not yet in their channels: a lock-free stack
	// linked through part.nextIn, newest first; closedIncoming once the engine closed.
	// Enqueuers write it from other cores: the padding keeps it off the lines the
	// driving thread uses every round.
	_        [64]byte
	incoming atomic.Pointer[part]
	_        [64]byte
	wake     chan struct{}
	stop     chan struct{}
	exited   chan struct{}
	retired  []*part // the round's scratch list (under drive)
	inbox    []*part // channelLocked's scratch list (under mu)
	// id is the engine's goroutine (goid): a callback it runs may close the engine,
	// and Close does not wait for that goroutine's exit then.
	id atomic.Uint64
	// due: the callbacks of the Ops the round retired (under drive). Handed to
	// callbacks when the round lets go of drive (unlockDrive).
	due dueList
	// callbacks: the Ops whose callback is due, in retirement order; cbRunning: a
	// goroutine runs them (runCallbacks). Under cbMu.
	cbMu      sync.Mutex
	callbacks dueList
	cbRunning bool
	// ownInCallback: the engine's goroutine runs user callbacks (Close does not wait
	// for it then).
	ownInCallback atomic.Bool
	// fired: the Graph conditions whose launch the round completed, fired once the
	// round stored inflight (under drive).
	fired []firedLaunch
	// parked: the engine's goroutine waits on wake. Kicks wake it only then: while it
	// backs off, a goroutine waiting on a completion word drives rounds itself.
	parked atomic.Bool
	// inTransport: the engine's goroutine sleeps in TransportWaiter.WaitProgress; Kick
	// wakes it there.
	inTransport atomic.Bool
	// driven: another goroutine called Drive since the engine's goroutine last looked
	// (Release clears it): a goroutine waiting on the engine's words drives the rounds,
	// and the engine's goroutine keeps out of its way (see run).
	driven atomic.Bool
	// inflight: the last full round left operations in flight (Release reads it).
	inflight atomic.Bool
	// canceled: a part of a KernelTriggered condition was canceled before its
	// trigger since the last full round (part.cancel), which retires it.
	canceled atomic.Bool
	// sharing: the engine's goroutine sleeps because another goroutine drives (run).
	sharing atomic.Bool
	// unawaited: the last full round left in flight an operation that no host
	// executor's completion wait drives (part.awaited); awaitedOnly: the engine's
	// goroutine sleeps because nothing pending needs it (run).
	unawaited   atomic.Bool
	awaitedOnly atomic.Bool

	// What the last full round saw, so rounds in between can tell that nothing changed
	// without taking mu (which enqueuers need). Under drive.
	last   roundState
	scan   []*channel
	waitOn Issued // the oldest operation in flight then

	// trace, when set, receives every operation's timeline (SetTrace).
	trace atomic.Pointer[trace.Recorder]

	// follows: per completion word of a Graph condition, the triggers its next
	// completion stores (Follow); nfollow counts them, so that rounds skip followMu
	// when there are none. A launch arms them, the round that fires the word takes them;
	// those of a condition the engine let go of are dropped (forgetFollows).
	followMu sync.Mutex
	follows  map[*streamcore.Word][]*streamcore.Word
	nfollow  atomic.Int32
	// byTrigger: the Graph conditions' channels by trigger word (under mu).
	byTrigger map[*streamcore.Word]*channel
	// chainRuns counts the host graphs' chains running (graphChain.Run): their waits
	// progress the transport, and the engine's goroutine keeps out of their way as
	// it does for a goroutine that drives its rounds (othersDrive).
	chainRuns atomic.Int32
	// Under drive: the triggers a round takes (copied out, as issuing one may remove a
	// destroyed condition's channel, which takes followMu), and the blocks of those it
	// could not issue itself (another engine's), kicked once the round let go of mu.
	following []*streamcore.Word
	kickAfter []*streamcore.WordBlock
}

// SetTrace makes the engine record the timeline of every operation it retires from
// now on into r (nil stops).
func (e *Engine) SetTrace(r *trace.Recorder) { e.trace.Store(r) }

// closedIncoming marks Engine.incoming of an engine that closed.
var closedIncoming = &part{}

// channel is one condition's pending parts, in sequence order.
type channel struct {
	cond *Condition
	ops  []*part
	pos  int // index in Engine.order
	// seenTrigger is the trigger word as the last full round read it (under drive).
	seenTrigger uint64
	// running counts a Graph condition's parts issued for the current launch and not
	// yet completed.
	running int
	// untriggered: the last full round left parts waiting for a trigger (under drive);
	// quiet then also asks whether the condition's stream stopped.
	untriggered bool
}

type roundState struct {
	completions uint64
	changed     bool // the round progressed: the next one must be full too
	inflight    bool
}

// NewEngine starts an engine driving t, with the transfer protocol configured by cfg;
// cudaTransport says t moves device memory itself (no staging).
func NewEngine(t Transport, cfg protocol.Config, cudaTransport bool) (*Engine, error) {
	if t == nil {
		return nil, fmt.Errorf("engine: nil transport: %w", ErrInvalidParam)
	}
	pl, err := protocol.NewPlanner(cfg, cudaTransport)
	if err != nil {
		return nil, err
	}
	closing, _ := t.(TransportClosing)
	e := &Engine{
		transport: t,
		closing:   closing,
		planner:   pl,
		active:    map[*Condition]*channel{},
		wake:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
		exited:    make(chan struct{}),
	}
	go e.run()
	return e, nil
}

// add hands p to the engine through the lock-free stack, which the next full round
// empties into the channels: an enqueuer never waits for a round, a round never waits
// for an enqueuer. One condition's parts arrive in sequence order: arming holds the
// condition's lock while it calls add, and the round takes them in push order.
func (e *Engine) add(p *part) error {
	for {
		head := e.incoming.Load()
		if head == closedIncoming {
			return ErrClosed
		}
		p.nextIn = head
		if e.incoming.CompareAndSwap(head, p) {
			break
		}
	}
	// A goroutine that drives the rounds takes the part too (or releases them to the
	// engine, seeing it added): waking the engine's goroutine for it would only have it
	// compete with the driver. An awaited part's executor kicks its trigger and drives
	// its completion itself.
	if !p.awaited && (!e.sharing.Load() || !e.driven.Load()) {
		e.wakeUp()
	}
	return nil
}

// closed reports whether Close began: the engine takes no operation any more.
func (e *Engine) closed() bool { return e.incoming.Load() == closedIncoming }

func (e *Engine) added() bool {
	head := e.incoming.Load()
	return head != nil && head != closedIncoming
}

// takeIncomingLocked moves the added parts into their channels. Caller holds e.mu.
func (e *Engine) takeIncomingLocked() {
	for {
		head := e.incoming.Load()
		if head == nil || head == closedIncoming {
			return
		}
		if e.incoming.CompareAndSwap(head, nil) {
			e.channelLocked(head)
			return
		}
	}
}

// channelLocked appends the stack from head to the channels, oldest first. It only
// reads the parts' links (a scratch list reverses them): the enqueuer wrote them on
// another core, and a write here would take each line away from it.
func (e *Engine) channelLocked(head *part) {
	in := e.inbox[:0]
	for p := head; p != nil; p = p.nextIn {
		in = append(in, p)
	}
	for i := len(in) - 1; i >= 0; i-- {
		p := in[i]
		in[i] = nil
		cond := p.cond
		ch := e.active[cond]
		if ch == nil {
			ch = &channel{cond: cond, pos: len(e.order)}
			e.active[cond] = ch
			e.order = append(e.order, ch)
			if cond.polledTrigger() {
				e.polled.Add(1)
			}
			if cond.category == Graph {
				if e.byTrigger == nil {
					e.byTrigger = map[*streamcore.Word]*channel{}
				}
				e.byTrigger[cond.trigger] = ch
			}
		}
		ch.ops = append(ch.ops, p)
	}
	e.inbox = in[:0]
}

func (e *Engine) removeLocked(ch *channel) {
	delete(e.active, ch.cond)
	if ch.cond.polledTrigger() {
		e.polled.Add(-1)
	}
	if ch.cond.category == Graph {
		delete(e.byTrigger, ch.cond.trigger)
		e.forgetFollows(ch.cond)
	}
	last := e.order[len(e.order)-1]
	e.order[ch.pos], last.pos = last, ch.pos
	e.order[len(e.order)-1] = nil
	e.order = e.order[:len(e.order)-1]
}

// Kick handles a trigger a host executor stored (streamcore.Driver): it runs the round
// on the calling goroutine unless another goroutine runs one, and wakes the engine's
// goroutine only then. Waking it costs microseconds of another thread, which then
// competes with the executor for the worker; the executor usually drives the rounds
// that follow itself, waiting on the completion word.
func (e *Engine) Kick() {
	if _, _, busy := e.round(); busy || e.needsOwn() {
		e.wakeUp()
	}
}

// needsOwn reports whether the engine's goroutine, asleep because only awaited parts
// were pending (awaitedOnly), is needed again: the round just run by another goroutine
// left in flight an operation no executor's wait drives, or a trigger to poll.
func (e *Engine) needsOwn() bool {
	return e.awaitedOnly.Load() && (e.unawaited.Load() || e.pollPending())
}

// Release hands the rounds back to the engine's goroutine (streamcore.Driver): the
// goroutine that drove them stops, to sleep or because its word came. Only an engine
// asleep for the driver (sharing) needs waking, and only for work that no kick or
// enqueue will announce: operations in flight (as the round that stored the word saw
// them), triggers to poll, parts enqueued meanwhile. Asleep on its transport it wakes
// on the transport's events anyway. Clearing driven first keeps it from starting a
// sleep on a driver that has gone (park's second look).
func (e *Engine) Release() {
	e.driven.Store(false)
	if (e.sharing.Load() || e.awaitedOnly.Load()) && (e.inflight.Load() || e.pollPending() || e.added()) {
		e.wakeUp()
	}
}

// wakeUp wakes the engine's goroutine if it sleeps: in its transport, or parked with
// nothing pending.
func (e *Engine) wakeUp() {
	if e.inTransport.Load() {
		e.transport.(TransportWaiter).Wake()
		return
	}
	if !e.parked.Load() {
		return
	}
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Drive runs one round unless another goroutine runs one (streamcore.Driver): issue the
// operations whose trigger came, retire completed ones in order, progress the
// transport if anything is in flight. It reports whether anything progressed.
func (e *Engine) Drive() bool {
	if !e.driven.Load() {
		e.driven.Store(true)
	}
	progressed, _, busy := e.round()
	if !busy && e.needsOwn() {
		e.wakeUp()
	}
	return progressed
}

// othersDrive reports (and clears) that another goroutine drove rounds since the last
// call, or that a host graph's chain runs (it progresses the transport itself). Only
// the engine's goroutine calls it.
func (e *Engine) othersDrive() bool {
	if e.chainRuns.Load() > 0 && !e.inflight.Load() {
		return true // with operations of its own in flight, it drives them on
	}
	if !e.driven.Load() {
		return false
	}
	e.driven.Store(false)
	return true
}

// run is the engine's goroutine. It is not locked to its OS thread: its backoff
// yields with runtime.Gosched, which on a locked goroutine costs a thread handoff,
// and nothing it calls needs thread affinity.
func (e *Engine) run() {
	defer close(e.exited)
	e.id.Store(goid.Current())
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	idle := 0
	tw, canSleep := e.transport.(TransportWaiter)
	var yieldingSince time.Time
	spinning, shared := false, false
	for {
		select {
		case <-e.stop:
			return
		default:
		}
		progressed, active, busy := e.roundOn(true)
		if !active {
			// Nothing pending: sleep until an operation is added.
			if !e.park(timer, 0, parkIdle, func(active, _ bool) bool { return !active }) {
				return
			}
			idle, shared = 0, false
			continue
		}
		// A goroutine that drives rounds while it waits for a word yields between its
		// rounds: spinning here without yielding could keep it queued behind this
		// goroutine (measured: a host-graph launch waited 55 µs per hop for it), so
		// once one drove, yield every round until the engine sleeps: a queued
		// goroutine cannot say it is still there.
		if !progressed && !busy && e.awaitedOnlyPending() {
			// Every pending operation is awaited by a host executor, which kicks its
			// trigger and drives its completion: rounds here would only compete with
			// it for the worker. Release, Kick and Drive wake this goroutine when that
			// changes; the bound lets it notice a stream that stopped.
			if !e.park(timer, engineSleepBound, parkAwaited, func(active, busy bool) bool { return active && !busy && e.awaitedOnlyPending() }) {
				return
			}
			idle, shared = 0, false
			continue
		}
		shared = shared || e.othersDrive()
		if progressed {
			idle = 0
			if shared {
				runtime.Gosched()
			}
			continue
		}
		if (busy || shared) && !e.pollPending() {
			// Another goroutine drives the rounds, waiting on a word: stay out of its
			// way until it releases them, a kick finds it busy, an operation is
			// enqueued, or the bound passes (a driver that does not release: Test
			// loops). Sleeping on the transport instead, every arrival would wake
			// this goroutine to compete with the driver for the worker. A trigger
			// nobody kicks (a GPU's, KernelTriggered) keeps the engine polling: a
			// driver may drive only now and then.
			if !e.park(timer, engineShareBound, parkSharing, func(_, busy bool) bool { return busy || e.othersDrive() }) {
				return
			}
			idle, shared = 0, false
			continue
		}
		if busy && idle < 4096 {
			idle = 4096 // polling, and another goroutine drives the rounds: back off at once
		}
		idle++
		switch {
		case idle < 256:
			if shared {
				runtime.Gosched()
			}
		case idle < 4096:
			// First spin without yielding for engineSpinFor: a trigger that comes
			// soon is seen within a round, and a yield costs the scheduler's global
			// lock, which polling goroutines contend for. Then yield: timers cannot
			// sleep briefly. A transport that can sleep wakes the engine on a kick or
			// an event within microseconds too: then yield for engineYieldFor only
			// (4096 rounds are milliseconds of a core, which an oversubscribed
			// machine's peers need), unless a trigger must be polled.
			if idle&63 == 0 {
				if idle == 256 {
					yieldingSince = time.Now()
				}
				since := time.Since(yieldingSince)
				spinning = since < engineSpinFor && !shared
				if canSleep && since >= engineYieldFor && !e.pollPending() {
					idle = 4095
				}
			}
			if !spinning {
				runtime.Gosched()
			}
		default:
			if canSleep {
				// When every trigger comes with a kick, sleep until kicked or the
				// transport has an event, not on a timer. A goroutine that drives
				// rounds releases them to the engine before it sleeps itself. The
				// round after announcing catches a kick (and takes parts) that came
				// before.
				e.inTransport.Store(true)
				slept, progressed := true, false
				if progressed, _, _ = e.roundOn(true); !progressed {
					// The sleep is bounded: UCX signals arrivals, not everything an
					// operation may wait for (a send queued until the peer frees
					// resources completes only by progress).
					slept = !e.pollPending() && tw.WaitProgress(e.stop, engineSleepBound)
				}
				e.inTransport.Store(false)
				if progressed {
					idle = 0
					continue
				}
				if slept {
					// One round after the wake-up; it spins again only if that
					// round progresses (a bound that expired costs one round).
					idle, shared = 4095, false
					continue
				}
			}
			// Waiting long for a trigger or a peer, or another goroutine drives: sleep
			// until kicked, or briefly (GPU-written triggers are not kicked).
			timer.Reset(50 * time.Microsecond)
			select {
			case <-e.wake:
				idle = 0
			case <-timer.C:
			case <-e.stop:
				timer.Stop()
				return
			}
			timer.Stop()
		}
	}
}

// Why the engine's goroutine parks (park).
type parkReason int

const (
	parkIdle    parkReason = iota // nothing pending
	parkSharing                   // another goroutine drives the rounds
	parkAwaited                   // only parts that host executors drive are pending
)

// awaitedOnlyPending reports whether every pending operation is awaited (see
// part.awaited): none in flight that no executor's wait drives, no trigger to poll,
// and those in flight driven by a goroutine now.
func (e *Engine) awaitedOnlyPending() bool {
	return !e.pollPending() && !e.unawaited.Load() && (!e.inflight.Load() || e.driven.Load())
}

// park sleeps the engine's goroutine on its wake channel, for at most bound (0: no
// bound), announced as parked (and as sharing or awaitedOnly, for why) so that
// wake-ups reach it. One round runs after the announcement, and the goroutine sleeps
// only if stay, given that round's active and busy, still says so: an add or a kick
// between the caller's round and the announcement would otherwise go unseen. It
// reports false when the engine stops.
func (e *Engine) park(timer *time.Timer, bound time.Duration, why parkReason, stay func(active, busy bool) bool) bool {
	e.parked.Store(true)
	switch why {
	case parkSharing:
		e.sharing.Store(true)
	case parkAwaited:
		e.awaitedOnly.Store(true)
	}
	defer func() {
		e.sharing.Store(false)
		e.awaitedOnly.Store(false)
		e.parked.Store(false)
	}()
	if _, active, busy := e.roundOn(true); !stay(active, busy) {
		return true
	}
	var expired <-chan time.Time
	if bound > 0 {
		timer.Reset(bound)
		defer timer.Stop()
		expired = timer.C
	}
	select {
	case <-e.wake:
	case <-expired:
	case <-e.stop:
		return false
	}
	return true
}

// pollPending reports whether a condition with pending operations has a trigger that
// is stored without a kick, so the engine must poll it: words on a device backend (a
// GPU writes them), and KernelTriggered conditions (a kernel, or Trigger on the host,
// stores the trigger and tells nobody).
func (e *Engine) pollPending() bool { return e.polled.Load() > 0 }

// polledTrigger reports whether c's trigger is stored without a kick (see pollPending).
func (c *Condition) polledTrigger() bool {
	return c.category == KernelTriggered || c.backend.Kind() != streamcore.KindHost
}

// engineSleepBound bounds the engine's sleep on its transport (see run): events and
// kicks end it sooner. A wake-up costs a round, an arm and a netpoller trip (measured:
// an idle engine with a receive in flight, 1 ms: 10 % of a core; 10 ms: 2.7 %, the
// polling engine before it 5.7 % in the same minutes).
const engineSleepBound = 10 * time.Millisecond

// engineShareBound bounds the engine's sleep while another goroutine drives its rounds
// (see run); Go rounds it up to a millisecond when the process is otherwise idle.
const engineShareBound = 200 * time.Microsecond

// engineSpinFor is how long an idle engine polls without yielding before it yields
// between rounds.
const engineSpinFor = 50 * time.Microsecond

// engineYieldFor bounds the engine's yielding phase when its transport can sleep (as
// ucp's waits spin DefaultSpinTime before they park).
const engineYieldFor = 100 * time.Microsecond

// round is one pass of the engine unless another goroutine runs one (busy). active
// reports whether operations are pending.
func (e *Engine) round() (progressed, active, busy bool) { return e.roundOn(false) }

// roundOn is round; own says the engine's own goroutine runs it (its callbacks then
// mark that goroutine as in a callback: Close does not wait for it).
func (e *Engine) roundOn(own bool) (progressed, active, busy bool) {
	if !e.drive.TryLock() {
		return false, true, true
	}
	progressed, active = e.roundLocked(own)
	return progressed, active, false
}

func (e *Engine) roundLocked(own bool) (progressed, active bool) {
	defer e.unlockDrive(own)
	if e.quiet() {
		// Nothing to issue or retire: only progress what is in flight.
		if e.last.inflight && e.transport.Progress(e.waitOn) {
			return true, true
		}
		return false, true
	}
	defer func() { e.last.changed = progressed }()
	tr := e.trace.Load()
	e.last.completions = e.transport.Completions()
	inflight, unawaited := false, false
	var bell *streamcore.WordBlock // rung once this round's completions are stored
	var waitOn Issued
	e.mu.Lock()
	e.takeIncomingLocked()
	if len(e.active) == 0 {
		e.scan = e.scan[:0]
		e.mu.Unlock()
		return false, false
	}
	// Backwards, so removeLocked's swap only moves channels already visited.
	for i := len(e.order) - 1; i >= 0; i-- {
		ch := e.order[i]
		cond := ch.cond
		if cond.category == Graph {
			if e.persistentRoundLocked(ch) {
				progressed = true
			}
			if ch.running > 0 {
				inflight, unawaited = true, true
			}
			continue
		}
		trigger := cond.trigger.Load()
		var stopped error
		if n := len(ch.ops); cond.failer != nil && n > 0 && !ch.ops[n-1].issued && int64(trigger-ch.ops[n-1].seq) < 0 {
			if stopped = cond.failer.Failed(); stopped != nil {
				// Read again after the failure: a trigger the stream stored before
				// it stopped is in; those behind it never come.
				trigger = cond.trigger.Load()
			}
		}
		ch.seenTrigger = trigger
		ch.untriggered = false
		for _, p := range ch.ops {
			if p.issued {
				continue
			}
			if int64(trigger-p.seq) < 0 {
				if p.canceled && cond.category == KernelTriggered {
					// Canceled before its trigger, every earlier part triggered:
					// it retires now, in order (after them), rather than when a
					// trigger that may never come arrives. A later trigger of its
					// value or below finds nothing to issue; later parts wait for
					// their own. Not on a Stream condition: its stream stores the
					// trigger after work on the part's staging buffer, which goes
					// back only once the stream passed it.
					p.err = errCanceledBeforeTrigger(p.op.what)
					p.issued = true
					progressed = true
					continue
				}
				if stopped == nil {
					ch.untriggered = true
					break // later operations wait for a later trigger
				}
				p.err = errStreamStopped(p.op.what, stopped)
				p.issued = true
				progressed = true
				continue
			}
			if p.tl != nil && tr != nil {
				p.tl.Trigger = tr.Now()
			}
			if p.canceled {
				p.err = errCanceledBeforeTrigger(p.op.what)
			} else {
				if p.ring || cond.timeout > 0 {
					p.issuedAt = time.Now()
				}
				p.inner, p.err = p.op.operation.Issue(p.plan)
			}
			if p.tl != nil && tr != nil {
				p.tl.Issue = tr.Now()
			}
			p.issued = true
			progressed = true
		}
		for len(ch.ops) > 0 {
			p := ch.ops[0]
			if cond.timeout > 0 && p.issued && p.err == nil && !p.inner.Done() {
				timedOut(p, cond.timeout) // Param.Timeout
			}
			if !p.issued || (p.err == nil && !p.inner.Done()) {
				break
			}
			ch.ops[0] = nil
			ch.ops = ch.ops[1:]
			if p.ring && time.Since(p.issuedAt) >= p.op.plan.RingAfter {
				bell = cond.done.Block()
				if tr != nil {
					tr.Mark(cond.id, "ring")
				}
			}
			if p.tl != nil && tr != nil {
				p.tl.Done = tr.Now()
			}
			e.retired = append(e.retired, p)
		}
		if len(ch.ops) > 0 && ch.ops[0].issued {
			inflight = true
			if front := ch.ops[0]; waitOn == nil && front.err == nil && front.inner != nil {
				waitOn = front.inner
			}
			for _, p := range ch.ops {
				if unawaited || !p.issued {
					break
				}
				unawaited = !p.awaited
			}
		}
		if len(ch.ops) == 0 {
			e.removeLocked(ch)
		}
	}
	if e.nfollow.Load() > 0 {
		// The nodes that follow a fired launch start before its completion word is
		// stored: they issue in this round, and those that complete in their issue
		// call (eager sends) join e.fired and fire with it.
		for i := 0; i < len(e.fired); i++ {
			started, running := e.startFollowersLocked(e.fired[i].ch.cond.done)
			progressed = progressed || started
			inflight = inflight || running
			unawaited = unawaited || running
		}
	}
	for i := range e.fired {
		// A launch that failed as the transport closes: the engine lets go of the
		// condition before its completion word says so (fire), as Close does.
		if ch := e.fired[i].ch; e.fired[i].forGood && e.active[ch.cond] == ch {
			e.removeLocked(ch)
		}
	}
	e.scan = append(e.scan[:0], e.order...)
	// Stored before any completion word: a driver whose word came reads it (Release).
	if e.inflight.Load() != inflight {
		e.inflight.Store(inflight)
	}
	if e.unawaited.Load() != unawaited {
		e.unawaited.Store(unawaited)
	}
	for i := range e.fired {
		e.fired[i].fire(tr, &e.due)
		if e.fired[i].forGood {
			e.forgetFollows(e.fired[i].ch.cond) // failed now: Follow refuses its words
		}
		e.fired[i] = firedLaunch{}
	}
	e.fired = e.fired[:0]
	e.mu.Unlock()
	e.last.inflight, e.waitOn = inflight, waitOn
	if len(e.retired) > 0 {
		// Outside e.mu: retiring takes the condition's error lock. Callbacks run once
		// drive is released too (unlockDrive).
		for i, p := range e.retired {
			p.retire(nil, &e.due)
			// A condition's parts retire together: once after its last one.
			if c := p.cond; i+1 == len(e.retired) || e.retired[i+1].cond != c {
				if c.category == Graph {
					// A destroyed condition's: its words are freed now (Follow
					// refuses them), and what Follow armed since the channel went
					// is dropped.
					e.forgetFollows(c)
				}
				if c.backend.Kind() == streamcore.KindHost {
					// Host executors waiting on the completion word park on its block.
					c.words.Notify()
				}
			}
			if p.tl != nil && tr != nil {
				p.tl.Store = tr.Now()
				p.tl.Failed = p.err != nil || (p.inner != nil && p.inner.Err() != nil)
				p.recordTimeline(tr)
			}
			e.retired[i] = nil
		}
		e.retired = e.retired[:0]
		if bell != nil {
			// Best effort: unrung, the wait is still noticed, only later.
			_ = bell.Ring()
		}
		progressed = true
	}
	for i, b := range e.kickAfter {
		b.Kick()
		e.kickAfter[i] = nil
	}
	e.kickAfter = e.kickAfter[:0]
	// Spin in the transport on the oldest operation in flight rather than paying a
	// whole round per progress call.
	if inflight && e.transport.Progress(waitOn) {
		progressed = true
	}
	return progressed, true
}

// unlockDrive releases drive, then runs the callbacks of the Ops the round retired:
// outside the engine's locks, so that a callback may wait on another operation or
// close the engine (its worker). Rounds queue them under drive, so they run in
// retirement order, one at a time, on the goroutine running them already if there is
// one (it may be this one, further up its stack: a callback that drove a round).
func (e *Engine) unlockDrive(own bool) {
	run := e.due.head != nil && e.queueCallbacks(&e.due)
	e.drive.Unlock()
	if run {
		if own {
			e.ownInCallback.Store(true)
			defer e.ownInCallback.Store(false)
		}
		e.runCallbacks()
	}
}

// queueCallbacks moves l's Ops to the end of the callback queue and reports whether
// the caller is to run it (runCallbacks): no goroutine runs it already.
func (e *Engine) queueCallbacks(l *dueList) (run bool) {
	e.cbMu.Lock()
	e.callbacks.append(l)
	run = !e.cbRunning
	e.cbRunning = true
	e.cbMu.Unlock()
	return run
}

// runCallbacks runs the queued callbacks until none is left.
func (e *Engine) runCallbacks() {
	finished := false
	defer func() {
		if !finished { // a callback panicked: the next round's runner takes the rest
			e.cbMu.Lock()
			e.cbRunning = false
			e.cbMu.Unlock()
		}
	}()
	for {
		e.cbMu.Lock()
		o := e.callbacks.pop()
		if o == nil {
			e.cbRunning = false
			e.cbMu.Unlock()
			finished = true
			return
		}
		e.cbMu.Unlock()
		o.cb()
	}
}

// awaitExitOrCallback waits until the engine's goroutine exited, or is found running
// user callbacks (looked at every millisecond: it may enter one after a first look).
func (e *Engine) awaitExitOrCallback() {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !e.ownInCallback.Load() {
		select {
		case <-e.exited:
			return
		case <-tick.C:
		}
	}
}

// Follow implements streamcore.Follower for the completion words of the engine's Graph
// conditions: a host graph's launch calls it, before it stores the trigger of the
// operation whose completion word is done, for each node whose only dependency is
// that operation; the round that fires done stores their triggers and issues them.
//
// It refuses (false) a completion word that will not fire again: freed (its condition
// destroyed), failed for good (GraphFailed), or the engine closed. An entry made as
// that condition goes (between the launch's look at its words and this call) is
// dropped once its words are freed or failed (forgetFollows), so the engine keeps no
// entry for a word that never fires. A destroyed follower's trigger is armed: the
// round that fires done skips it (the launch then fails at the node, ErrClosed).
func (e *Engine) Follow(done, trigger *streamcore.Word) bool {
	if done == nil || trigger == nil || done == trigger {
		return false
	}
	e.followMu.Lock()
	defer e.followMu.Unlock()
	// Under followMu: forgetFollows, which comes after the words are freed or failed,
	// then drops what was armed before this look.
	if e.closed() || done.Block().Closed() || done.Load() == GraphFailed {
		return false
	}
	if e.follows == nil {
		e.follows = map[*streamcore.Word][]*streamcore.Word{}
	}
	list := e.follows[done]
	if slices.Contains(list, trigger) {
		return true // armed already: a launch on another stream, its trigger not taken yet
	}
	e.follows[done] = append(list, trigger)
	e.nfollow.Add(1)
	return true
}

// forgetFollows drops what Follow armed for c: the triggers to store when c's
// completion word fires, and c's trigger in the lists of other completion words. The
// engine calls it when it lets go of c (removeLocked), and again once c's words are
// freed or failed for good, after which Follow refuses them: a Follow between the two
// would otherwise leave an entry that no round ever takes (nfollow stayed above 0, and
// every round that fired a launch took followMu). Takes followMu.
func (e *Engine) forgetFollows(c *Condition) {
	e.followMu.Lock()
	defer e.followMu.Unlock()
	if len(e.follows) == 0 {
		return
	}
	dropped := len(e.follows[c.done])
	delete(e.follows, c.done)
	if int(e.nfollow.Load()) > dropped { // others are armed (nfollow changes under followMu)
		for done, list := range e.follows {
			kept := slices.DeleteFunc(list, func(t *streamcore.Word) bool { return t == c.trigger })
			dropped += len(list) - len(kept)
			e.follows[done] = kept
		}
	}
	e.nfollow.Add(-int32(dropped))
}

// startFollowersLocked stores the triggers armed to follow done's completion and
// issues the operations of those that are this engine's (persistentRoundLocked: one
// that completes in its issue call joins e.fired); another engine's is kicked after
// the round. It reports whether it stored any, and whether any is still running.
// Caller holds mu and drive.
func (e *Engine) startFollowersLocked(done *streamcore.Word) (started, running bool) {
	e.followMu.Lock()
	list := e.follows[done]
	e.following = append(e.following[:0], list...)
	if len(list) > 0 {
		clear(list)
		e.follows[done] = list[:0] // its array serves the next launch's Follow
		e.nfollow.Add(-int32(len(e.following)))
	}
	e.followMu.Unlock()
	for i, t := range e.following {
		e.following[i] = nil
		if !t.TryStore(1) {
			continue // destroyed: the launch fails the node, its completion word is gone too
		}
		started = true
		ch := e.byTrigger[t]
		if ch == nil {
			e.kickAfter = append(e.kickAfter, t.Block())
			continue
		}
		e.persistentRoundLocked(ch)
		running = running || ch.running > 0
	}
	e.following = e.following[:0]
	return started, running
}

// firedLaunch is a Graph condition's completed launch, with its first error. forGood:
// it failed as the transport closes (TransportClosing), so its operations can run no
// more; the round removed the channel.
type firedLaunch struct {
	ch      *channel
	err     error
	forGood bool
}

// fire stores the launch's completion and ends its operations' timelines. A launch
// that failed for good retires its operations instead (their callbacks join due), which
// marks the condition failed (GraphFailed): the launch fails rather than reading the
// canceled operations as done.
func (f *firedLaunch) fire(tr *trace.Recorder, due *dueList) {
	c := f.ch.cond
	if tr != nil {
		now := tr.Now()
		for _, p := range f.ch.ops {
			if p.tl != nil {
				p.tl.Done, p.tl.Store, p.tl.Failed = now, now, f.err != nil
				p.recordTimeline(tr)
			}
		}
	}
	if f.forGood {
		c.recordErr(f.err, "graph operation") // what the launch met, before the close's own error
		for _, p := range f.ch.ops {
			p.retire(errClosedWhile(p.op.what, "the graph operation can run no more"), due)
		}
	} else {
		c.fire(f.err)
	}
}

// quiet reports that no full round is needed: the last one changed nothing, no part
// was added, nothing completed and no trigger word moved since. Caller holds drive.
func (e *Engine) quiet() bool {
	if e.last.changed || len(e.scan) == 0 || e.added() || e.transport.Completions() != e.last.completions {
		return false
	}
	if e.canceled.Load() && e.canceled.Swap(false) {
		return false // a part was canceled before its trigger: a full round retires it
	}
	for _, ch := range e.scan {
		cond := ch.cond
		if cond.timeout > 0 && e.last.inflight {
			return false // a full round checks the operations' deadlines
		}
		if cond.category == Graph {
			if cond.trigger.Load() == 1 || cond.destroyed.Load() {
				return false
			}
		} else if cond.trigger.Load() != ch.seenTrigger {
			return false
		} else if ch.untriggered && cond.failer != nil && cond.failer.Failed() != nil {
			return false // its stream stopped: a full round fails what waits for it
		}
	}
	return true
}

// persistentRoundLocked runs the persistent operations of a Graph condition: each
// time a launch stores 1 into the trigger, the engine takes it (resets the trigger to
// 0, so the graph relaunches with no host update), issues every operation the
// condition carries and, once all completed, stores 1 into the completion word. An
// operation added while a launch runs joins from the next launch. A destroyed
// condition's operations end. Caller holds e.mu and drive.
func (e *Engine) persistentRoundLocked(ch *channel) bool {
	cond := ch.cond
	if ch.running > 0 {
		return e.launchDoneLocked(ch)
	}
	if cond.destroyed.Load() {
		e.removeLocked(ch)
		e.retired = append(e.retired, ch.ops...)
		return true
	}
	if cond.trigger.Load() != 1 || cond.chainRun.Load() != nil {
		return false // a trigger stored while a chain runs the operations waits for it
	}
	cond.trigger.Store(0)
	tr := e.trace.Load()
	for _, p := range ch.ops {
		if tr != nil {
			now := tr.Now()
			p.tl = p.op.timeline(tr, now)
			p.tl.Seq, p.tl.Trigger = p.seq, now
		}
		p.inner, p.err = p.op.operation.Issue(p.plan)
		p.issued, p.running = true, true
		if p.tl != nil {
			p.tl.Issue = tr.Now()
		}
	}
	ch.running = len(ch.ops)
	// Operations that completed in their issue call (eager sends) fire the launch in
	// this round, not the next.
	e.launchDoneLocked(ch)
	return true
}

// launchRunning reports whether c's trigger or completion word shows a launch
// (wordsShowLaunch), or the engine runs c's operations for one
// (Condition.launchRunningLocked). Under mu, which the round holds from taking the
// trigger to storing the completion word.
func (e *Engine) launchRunning(c *Condition) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ch := e.active[c]; ch != nil && ch.running > 0 {
		return true
	}
	return c.wordsShowLaunch()
}

// OweCompletion tells the engine whether a launch waits for the completion word done
// of one of its Graph conditions: owed true when a host graph's launch failed with the
// operation in flight and left (the completion, once stored, is owed to the graph's
// next launch, which takes it first), false once a launch took it. While owed, a
// stored completion does not keep Condition.Destroy refusing: before, Destroy refused
// until a relaunch took it. It reports whether done is the completion word of one of
// the engine's Graph conditions.
func (e *Engine) OweCompletion(done *streamcore.Word, owed bool) bool {
	if done == nil {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ch := range e.byTrigger {
		if ch.cond.done == done {
			ch.cond.owed.Store(owed)
			return true
		}
	}
	return false
}

// launchDoneLocked fires ch's launch if all its operations completed, and reports
// whether it did. Caller holds e.mu and drive.
func (e *Engine) launchDoneLocked(ch *channel) bool {
	var err error
	for _, p := range ch.ops {
		if !p.running {
			continue
		}
		if p.err == nil && !p.inner.Done() {
			return false
		}
		if err == nil {
			err = p.err
			if err == nil {
				err = p.inner.Err()
			}
		}
	}
	for _, p := range ch.ops {
		p.running = false
	}
	ch.running = 0
	// Failed as the transport closes (the close canceled the operations, or they
	// could not be issued): not a launch that completed with an error.
	forGood := err != nil && e.closing != nil && e.closing.Closing()
	e.fired = append(e.fired, firedLaunch{ch: ch, err: err, forGood: forGood})
	return true
}

// Close stops the engine and fails every operation it still holds, so no stream
// stays blocked on a completion word; later submissions fail with ErrClosed. Call it
// after the transport finished every operation the engine issued. A callback may
// call it; the engine's goroutine, if it ran the callback, ends once it returned.
func (e *Engine) Close() error {
	pending := e.incoming.Swap(closedIncoming)
	if pending == closedIncoming {
		return ErrClosed
	}
	close(e.stop)
	e.wakeUp()
	// Not when a callback run by the engine's goroutine closes it (that would wait for
	// itself), nor while that goroutine is in a callback (which may wait for an
	// operation only this Close ends): it holds no lock Close takes there, and stops
	// once the callback returned.
	if !goid.Is(e.id.Load()) {
		e.awaitExitOrCallback()
	}
	e.mu.Lock()
	e.channelLocked(pending)
	var left []*part
	for len(e.order) > 0 {
		ch := e.order[len(e.order)-1]
		left = append(left, ch.ops...)
		e.removeLocked(ch)
	}
	e.mu.Unlock()
	defer func() { _ = e.trace.Load().Flush() }()
	// Their callbacks join the queue, behind those already due: a Close from a
	// callback leaves them to the goroutine running the callbacks (further up its
	// stack), so they keep retirement order and run one at a time.
	var due dueList
	for _, p := range left {
		switch {
		case p.cond.category == Graph:
			p.retire(errClosedWhile(p.op.what, "the graph operation can run no more"), &due)
		case !p.issued:
			p.retire(errClosedWhile(p.op.what, "before the condition triggered"), &due)
		case p.err == nil && !p.inner.Done():
			p.retire(errClosedWhile(p.op.what, "with the operation in flight"), &due)
		default:
			p.retire(nil, &due)
		}
	}
	if due.head != nil && e.queueCallbacks(&due) {
		e.runCallbacks()
	}
	return e.planner.Close()
}

// timedOut fails p (issued, pending) if it has been in flight longer than timeout: the
// transport is asked to cancel it, and the engine retires it with ErrTimedOut.
func timedOut(p *part, timeout time.Duration) {
	if p.issuedAt.IsZero() || time.Since(p.issuedAt) < timeout {
		return
	}
	p.inner.Cancel()
	p.err = fmt.Errorf("%s: not completed %v after it was issued: %w", p.op.what, timeout, ErrTimedOut)
}

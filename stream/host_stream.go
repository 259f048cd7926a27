package stream

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ucpx/ucpx/internal/goid"
)

// opKind says what a queued host operation does.
type opKind uint8

const (
	opWriteValue opKind = iota + 1
	opWaitValue
	opHostFunc
	opCopy
	opWaitEvent
	opCopyWord
)

// hostOp is one queued operation, stored by value in the queue so that enqueueing
// allocates nothing once the queue's slices have grown.
type hostOp struct {
	kind  opKind
	cmp   Compare // opWaitValue
	word  *Word   // opWriteValue, opWaitValue; opCopyWord: the destination
	from  *Word   // opCopyWord: the source
	value uint64  // opWriteValue, opWaitValue; opWaitEvent: the peer sequence to reach
	fn    func()  // opHostFunc
	// dropped runs instead of fn when the stream drops the op (LaunchHostFuncOrDrop).
	dropped func()
	peer    *hostStream // opWaitEvent: the stream the event was recorded on
	dst     uintptr     // opCopy
	src     uintptr     // opCopy
	n       int         // opCopy
}

// Idle policy of the executor: after draining its queue it keeps polling for new work
// for idleSpinFor (an enqueue right after is picked up within a cache-line transfer),
// yielding the P every pollYieldEvery, then parks on its wake channel (an enqueue then
// costs a goroutine wake-up, a few microseconds).
const idleSpinFor = 20 * time.Microsecond

// maxRetainedBatch: after a batch this large the executor drops its slice rather than
// keeping megabytes of queue alive for a stream that is usually short.
const maxRetainedBatch = 1 << 14

// awaitSpinFor: how long Synchronize and event waits poll a stream's progress before
// parking on its progress channel.
const awaitSpinFor = 10 * time.Microsecond

// errStopped is internal: parkSeq was told to stop waiting.
var errStopped = errors.New("stream: wait stopped")

// hostStream is a serial CPU execution context: producers append operations to a
// mutex-guarded slice, and one executor goroutine swaps the whole slice out and runs
// it in order, without holding the lock. Operation k (counting from 1) has sequence
// number k; completed counts the operations run so far, so "stream position k is done"
// is completed >= k — that is all a host event is.
//
// Failure is sticky: once an operation fails (a host func panics, a word's block was
// freed, Close abandons a wait) the stream stops running work; queued work is dropped
// and every later call returns the error, as after a CUDA sticky error.
type hostStream struct {
	backend *hostBackend
	grace   time.Duration

	// Producer side, guarded by mu.
	mu      sync.Mutex
	pending []hostOp // enqueued, not yet taken by the executor
	parked  bool     // the executor sleeps on wake and needs a token
	closed  bool     // Close was called: no new work
	failed  error    // the stream failed (fail): no new work; sticky once dropped work is

	wake    chan struct{} // capacity 1; one token per park
	closing chan struct{} // closed by Close, wakes a parked wait
	// abandon is done the grace after Close (streamcore.Closing): host funcs that wait
	// themselves give up then, as the stream's own waits do.
	abandon    context.Context
	abandonNow context.CancelFunc
	done       chan struct{} // closed when the executor has exited

	closingFlag atomic.Bool           // Close was called (read by polling waits)
	sticky      atomic.Pointer[error] // first failure; nil while healthy

	_         [64]byte      // keep the producers' counter off the executor's line
	tail      atomic.Uint64 // operations enqueued so far (written under mu)
	_         [56]byte
	completed atomic.Uint64 // operations run so far, in order (executor only)
	taken     uint64        // operations taken from pending (executor only)
	at        int           // the index in its batch of the operation running (executor only)
	// held (executor only): the block whose driver the executor drove in a WaitValue
	// that ended and has not released yet. Back-to-back operations on the same driver
	// (a Stream condition's iterations) keep driving it; releasing after each one let
	// the next enqueue wake the driver's own goroutine, which then competed with the
	// executor for the rounds. Released before anything that may take long (a host
	// function, a wait on another stream), before the executor idles, and at exit.
	held *WordBlock
	_    [40]byte

	wordAccess atomic.Uint64 // odd while the executor is inside a word access bracket

	// Progress notification for Synchronize, events and other streams' WaitEvent:
	// a waiter stores the lowest sequence it needs in want and sleeps on progress;
	// the executor closes progress (and makes a new one) once completed reaches want,
	// or when the stream fails or exits.
	notifyMu sync.Mutex
	want     atomic.Uint64 // 0: no waiter
	progress chan struct{}
}

func newHostStream(b *hostBackend, cfg hostConfig) *hostStream {
	s := &hostStream{
		backend:  b,
		grace:    cfg.closeGrace,
		wake:     make(chan struct{}, 1),
		closing:  make(chan struct{}),
		done:     make(chan struct{}),
		progress: make(chan struct{}),
	}
	s.abandon, s.abandonNow = context.WithCancel(context.Background())
	registerWordAccessor(s)
	go s.run()
	return s
}

func (s *hostStream) Kind() Kind      { return KindHost }
func (s *hostStream) Handle() uintptr { return 0 }

// Capturing is false: host streams run their work, they never record it into a graph.
func (s *hostStream) Capturing() (bool, error) { return false, nil }

// errClosedStream is what calls on a closed stream return.
func errClosedStream() error { return fmt.Errorf("stream: host stream: %w", ErrClosed) }

// err returns the sticky error, or nil.
func (s *hostStream) err() error {
	if p := s.sticky.Load(); p != nil {
		return *p
	}
	return nil
}

// enqueue appends op. It is the hot path: one uncontended lock, one append by value,
// and a channel send only when the executor is parked.
func (s *hostStream) enqueue(op hostOp) error { return s.enqueueOps(op) }

// enqueue2 enqueues two operations with nothing between them.
func (s *hostStream) enqueue2(a, b hostOp) error { return s.enqueueOps(a, b) }

func (s *hostStream) enqueueOps(ops ...hostOp) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errClosedStream()
	}
	if s.failed != nil {
		s.mu.Unlock()
		return s.failed
	}
	s.pending = append(s.pending, ops...)
	s.tail.Store(s.tail.Load() + uint64(len(ops)))
	if s.parked {
		s.parked = false
		s.wake <- struct{}{}
	}
	s.mu.Unlock()
	return nil
}

// usable reports ErrClosed or the sticky error for calls that enqueue nothing.
func (s *hostStream) usable() error {
	if s.closingFlag.Load() {
		return errClosedStream()
	}
	return s.err()
}

func checkWord(op string, w *Word) error {
	if !w.Valid() {
		return fmt.Errorf("stream: host %s: nil word: %w", op, ErrInvalidArgument)
	}
	if w.HostPtr()%8 != 0 {
		return fmt.Errorf("stream: host %s: %v not 8-byte aligned: %w", op, w, ErrInvalidArgument)
	}
	if w.Block().Closed() {
		return fmt.Errorf("stream: host %s: %v: word block: %w", op, w, ErrClosed)
	}
	return nil
}

func (s *hostStream) WriteValue(w *Word, value uint64) error {
	if err := checkWord("WriteValue", w); err != nil {
		return err
	}
	return s.enqueue(hostOp{kind: opWriteValue, word: w, value: value})
}

func (s *hostStream) WaitValue(w *Word, value uint64, cmp Compare) error {
	if err := checkWord("WaitValue", w); err != nil {
		return err
	}
	if cmp > NOR {
		return fmt.Errorf("stream: host WaitValue: %v: %w", cmp, ErrInvalidArgument)
	}
	return s.enqueue(hostOp{kind: opWaitValue, word: w, value: value, cmp: cmp})
}

// PollValue is WaitValue(w, value, GEQ): the executor polls every wait.
func (s *hostStream) PollValue(w *Word, value uint64) error { return s.WaitValue(w, value, GEQ) }

// CopyWord checks both words as WriteValue and WaitValue do (a nil or zero word is
// ErrInvalidArgument, a word of a closed block ErrClosed); if either block is closed
// by the time the stream gets here, the stream fails with ErrClosed and dst is not
// touched.
func (s *hostStream) CopyWord(dst, src *Word) error {
	if err := checkWord("CopyWord", dst); err != nil {
		return err
	}
	if err := checkWord("CopyWord", src); err != nil {
		return err
	}
	return s.enqueue(hostOp{kind: opCopyWord, word: dst, from: src})
}

// execCopyWord copies from into word inside the executor's word access brackets, so a
// block freed meanwhile fails the stream instead of being read or written.
func (s *hostStream) execCopyWord(op *hostOp) error {
	v, ok := s.loadWord(op.from)
	if !ok {
		return fmt.Errorf("stream: host CopyWord(%v, %v): source word block: %w", op.word, op.from, ErrClosed)
	}
	if !s.storeWord(op.word, v) {
		return fmt.Errorf("stream: host CopyWord(%v, %v): destination word block: %w", op.word, op.from, ErrClosed)
	}
	op.word.Block().Notify()
	return nil
}

func (s *hostStream) WriteThenWait(w *Word, value uint64, waitOn *Word, waitValue uint64, cmp Compare) error {
	if err := checkWord("WriteThenWait", w); err != nil {
		return err
	}
	if err := checkWord("WriteThenWait", waitOn); err != nil {
		return err
	}
	if cmp > NOR {
		return fmt.Errorf("stream: host WriteThenWait: %v: %w", cmp, ErrInvalidArgument)
	}
	return s.enqueue2(hostOp{kind: opWriteValue, word: w, value: value}, hostOp{kind: opWaitValue, word: waitOn, value: waitValue, cmp: cmp})
}

// LaunchHostFunc runs fn on the stream's executor goroutine in stream order. If fn
// panics (or calls runtime.Goexit) the stream fails with a *PanicError (whose Value is
// ErrGoexit for a Goexit) as its sticky error; see hostStream.
func (s *hostStream) LaunchHostFunc(fn func()) error {
	if fn == nil {
		return fmt.Errorf("stream: host LaunchHostFunc: nil func: %w", ErrInvalidArgument)
	}
	return s.enqueue(hostOp{kind: opHostFunc, fn: fn})
}

// LaunchHostFuncOrDrop implements streamcore.HostFuncDropper.
func (s *hostStream) LaunchHostFuncOrDrop(fn, dropped func()) error {
	if fn == nil || dropped == nil {
		return fmt.Errorf("stream: host LaunchHostFuncOrDrop: nil func: %w", ErrInvalidArgument)
	}
	return s.enqueue(hostOp{kind: opHostFunc, fn: fn, dropped: dropped})
}

// Copy validates like the CUDA backend: positive length, non-nil addresses, no address
// wrap-around and no overlap. The addresses themselves cannot be checked: a bad one
// faults in C, like a bad pointer anywhere else.
func (s *hostStream) Copy(dst, src uintptr, n int) error {
	switch {
	case n <= 0:
		return fmt.Errorf("stream: host Copy: length %d: %w", n, ErrInvalidArgument)
	case dst == 0 || src == 0:
		return fmt.Errorf("stream: host Copy: nil address (dst %#x, src %#x): %w", dst, src, ErrInvalidArgument)
	case dst+uintptr(n) < dst || src+uintptr(n) < src:
		return fmt.Errorf("stream: host Copy: range wraps the address space: %w", ErrInvalidArgument)
	case dst < src+uintptr(n) && src < dst+uintptr(n):
		return fmt.Errorf("stream: host Copy: ranges [%#x,+%d) and [%#x,+%d) overlap: %w", dst, n, src, n, ErrInvalidArgument)
	}
	return s.enqueue(hostOp{kind: opCopy, dst: dst, src: src, n: n})
}

func asHostEvent(e Event) (*hostEvent, error) {
	if e == nil {
		return nil, fmt.Errorf("stream: host: nil event: %w", ErrInvalidArgument)
	}
	he, ok := e.(*hostEvent)
	if !ok {
		return nil, fmt.Errorf("stream: host stream given a %T: %w", e, ErrWrongBackend)
	}
	if he == nil {
		return nil, fmt.Errorf("stream: host: nil event: %w", ErrInvalidArgument)
	}
	return he, nil
}

// Record captures the stream's current end: e completes once everything enqueued on
// the stream before Record has run. Recording again moves e to the new end.
func (s *hostStream) Record(e Event) error {
	he, err := asHostEvent(e)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosedStream()
	}
	if err := s.err(); err != nil {
		return err
	}
	// Under s.mu no enqueue can slip between reading the end and storing it.
	return he.record(s, s.tail.Load())
}

// WaitEvent holds back later work until the position e captured when WaitEvent was
// called is done (a later Record of e does not change this wait, as on CUDA). An event
// never recorded is complete and adds no work.
func (s *hostStream) WaitEvent(e Event) error {
	he, err := asHostEvent(e)
	if err != nil {
		return err
	}
	peer, seq, err := he.snapshot()
	if err != nil {
		return err
	}
	if peer == nil || peer == s || peer.completed.Load() >= seq {
		// Nothing to wait for: never recorded, recorded on this stream (stream order
		// already implies it) or already done.
		return s.usable()
	}
	return s.enqueue(hostOp{kind: opWaitEvent, peer: peer, value: seq})
}

// Synchronize waits for everything enqueued before the call, then returns the sticky
// error, if any. Called from a host func of this stream, or of another host stream
// that this one waits for (directly or through others) past that func, it returns an
// error wrapping ErrInvalidArgument instead of deadlocking (see host_waits.go).
func (s *hostStream) Synchronize() error {
	if s.closingFlag.Load() {
		return errClosedStream()
	}
	refused, err := s.callerWait("Synchronize", s.tail.Load())
	if refused != nil {
		return refused
	}
	if err != nil {
		return err
	}
	return s.err()
}

// errOwnExecutor is what a call that would wait for the calling host func's own
// stream returns: the wait could never end.
func errOwnExecutor(what string) error {
	return fmt.Errorf("stream: host %s called from a host func of the stream it waits for (it would deadlock): %w",
		what, ErrInvalidArgument)
}

// Failed implements Failer: the sticky error, once the executor stopped on it.
func (s *hostStream) Failed() error { return s.err() }

func (s *hostStream) Query() (bool, error) {
	if err := s.usable(); err != nil {
		return false, err
	}
	return s.completed.Load() >= s.tail.Load(), nil
}

// Close refuses new work, lets the executor finish the queue and stops it.
//
// A wait (WaitValue, WaitEvent) that is blocked when Close is called, or blocks while
// Close drains the queue, keeps waiting for the close grace period (DefaultCloseGrace,
// see WithCloseGrace); if it still does not hold, Close abandons it: the wait and all
// work behind it are dropped and Close returns an error wrapping ErrAbandoned. So Close
// never hangs on a word nobody writes — but a host func that never returns does block
// it. Close returns the stream's sticky error if it had one; a second Close returns
// ErrClosed. Synchronize before Close when the queued work must run. Called from a
// host func of this stream (which Close would wait for), or of another host stream
// that this one waits for past that func, Close refuses with an error wrapping
// ErrInvalidArgument and closes nothing.
func (s *hostStream) Close() error {
	from := callingExecutor()
	if from == s {
		return errOwnExecutor("Close")
	}
	var e *waitEdge
	if from != nil && !s.exited() {
		var ok bool
		if e, ok = beginWait(from, s, ^uint64(0), true, false); !ok {
			return errWaitCycle("Close", from, s)
		}
	}
	if !s.beginClose() {
		if e != nil {
			endWait(from, e)
		}
		return errClosedStream()
	}
	<-s.done
	if e != nil {
		endWait(from, e)
	}
	s.backend.forget(s)
	return s.err()
}

// Abandon implements streamcore.Closing.
func (s *hostStream) Abandon() context.Context { return s.abandon }

// CloseGrace implements streamcore.Closing.
func (s *hostStream) CloseGrace() time.Duration { return s.grace }

// beginClose marks the stream closed and wakes its executor; false if already closed.
func (s *hostStream) beginClose() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.closed = true
	s.closingFlag.Store(true)
	close(s.closing)
	time.AfterFunc(s.grace, s.abandonNow)
	if s.parked {
		s.parked = false
		s.wake <- struct{}{}
	}
	return true
}

// ---- executor ----

// run is the executor goroutine.
func (s *hostStream) run() {
	id := goid.Current()
	registerExecutor(id, s)
	returned := false
	var batch []hostOp
	defer func() {
		unregisterExecutor(id)
		if returned {
			s.exit()
			return
		}
		// A host func called runtime.Goexit (t.FailNow in a test callback, for
		// one), which unwinds this goroutine past recover. Fail the stream (the rest
		// of its batch dropped) and carry on in a fresh goroutine, so Close and
		// waiters still see a live executor.
		s.fail(&PanicError{Value: ErrGoexit, Stack: debug.Stack()}, batch[s.at+1:])
		go s.run()
	}()
	for {
		var ok bool
		batch, ok = s.next(batch)
		if !ok {
			returned = true
			return
		}
		s.execBatch(batch)
		clear(batch) // drop references to funcs and words
		if cap(batch) > maxRetainedBatch {
			batch = nil
		} else {
			batch = batch[:0]
		}
	}
}

// next waits for work and swaps the pending slice with spare (empty). It returns false
// once the stream is closed and drained.
func (s *hostStream) next(spare []hostOp) ([]hostOp, bool) {
	if s.tail.Load() == s.taken {
		s.releaseHeld() // idle: the driver's goroutine takes its rounds back
	}
	if s.tail.Load() == s.taken && !s.closingFlag.Load() {
		s.idleWait()
	}
	s.mu.Lock()
	for len(s.pending) == 0 {
		if s.closed {
			s.mu.Unlock()
			return nil, false
		}
		s.parked = true
		s.mu.Unlock()
		<-s.wake
		s.mu.Lock()
	}
	batch := s.pending
	s.pending = spare
	s.taken += uint64(len(batch))
	s.mu.Unlock()
	return batch, true
}

// idleWait polls for new work (see idleSpinFor) before the executor parks.
func (s *hostStream) idleWait() {
	start := time.Now()
	single := singleP(start)
	var lastYield time.Duration
	for i := 1; s.tail.Load() == s.taken; i++ {
		if single {
			runtime.Gosched() // the producer needs this P to enqueue anything
		}
		if i%pollClockEvery != 0 {
			continue
		}
		if s.closingFlag.Load() {
			return
		}
		elapsed := time.Since(start)
		if elapsed >= idleSpinFor {
			return
		}
		if elapsed-lastYield >= pollYieldEvery {
			lastYield = elapsed
			runtime.Gosched()
		}
	}
}

// execBatch runs ops in order until one fails; after a failure the rest are dropped
// (their dropped funcs run).
func (s *hostStream) execBatch(batch []hostOp) {
	for i := range batch {
		if s.sticky.Load() != nil {
			dropAll(batch[i:])
			return
		}
		s.at = i
		if err := s.exec(&batch[i]); err != nil {
			s.fail(err, batch[i+1:])
			return
		}
		c := s.completed.Add(1)
		if w := s.want.Load(); w != 0 && c >= w {
			s.notify()
		}
	}
}

// dropAll runs the dropped funcs of ops the stream will not run, each exactly once,
// in order. A panic or a runtime.Goexit in one must not stop the executor (a Goexit
// unwinding it in the middle of fail would lose the failure and the drops after it,
// and rerun the ones before): each runs on a goroutine of its own, which a Goexit
// ends instead. Drops happen only after a failure, so the goroutine costs nothing on
// the hot path.
func dropAll(ops []hostOp) {
	for i := range ops {
		if d := ops[i].dropped; d != nil {
			ops[i].dropped = nil
			runDropped(d)
		}
	}
}

// runDropped runs d on a fresh goroutine and waits for it to return, panic or Goexit.
func runDropped(d func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = runHostFunc(d) // a panic in it is dropped with the op
	}()
	<-done
}

// releaseHeld hands the held block's driver back to its own goroutine.
func (s *hostStream) releaseHeld() {
	if b := s.held; b != nil {
		s.held = nil
		b.Release()
	}
}

func (s *hostStream) exec(op *hostOp) error {
	if s.held != nil && (op.kind == opHostFunc || op.kind == opWaitEvent) {
		s.releaseHeld()
	}
	switch op.kind {
	case opWriteValue:
		if !s.storeWord(op.word, op.value) {
			return fmt.Errorf("stream: host WriteValue(%v, %d): word block: %w", op.word, op.value, ErrClosed)
		}
		op.word.Block().Kick()
	case opWaitValue:
		return s.execWaitValue(op)
	case opHostFunc:
		return runHostFunc(op.fn)
	case opCopy:
		cCopy(op.dst, op.src, op.n)
	case opWaitEvent:
		return s.execWaitEvent(op)
	case opCopyWord:
		return s.execCopyWord(op)
	}
	return nil
}

func runHostFunc(fn func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	fn()
	return nil
}

// execWaitValue polls the word with the backoff policy of host_poll.go until the
// comparison holds, the word's block is freed, or Close's grace period runs out.
func (s *hostStream) execWaitValue(op *hostOp) error {
	block := op.word.Block()
	var b backoff
	var deadline time.Time
	drove := false
	for {
		var wake <-chan struct{}
		sleeping := b.sleeping()
		if sleeping {
			// Taken before the look, so a notification in between is not lost.
			wake = block.Changed()
		}
		v, ok := s.loadWord(op.word)
		if !ok {
			return fmt.Errorf("stream: host WaitValue(%v %v %d): word block: %w", op.word, op.cmp, op.value, ErrClosed)
		}
		if op.cmp.Holds(v, op.value) {
			if drove {
				s.held = block // kept driven for the next wait (see held)
			}
			return nil
		}
		if !drove {
			if s.held != block {
				s.releaseHeld() // another driver's: its goroutine takes its rounds back
			}
			drove = true
		}
		if block.Drive() {
			b = backoff{} // the driver moved: look again at once
			continue
		}
		if sleeping {
			// Between two looks the executor sleeps: the driver's own goroutine (the
			// engine's, which sleeps on the transport's events) takes over meanwhile.
			block.Release()
			drove, s.held = false, nil
		}
		if s.closingFlag.Load() {
			now := time.Now()
			if deadline.IsZero() {
				deadline = now.Add(s.grace)
			}
			if !now.Before(deadline) {
				return s.abandoned(fmt.Sprintf("WaitValue(%v %v %d), word is %d,", op.word, op.cmp, op.value, v))
			}
		}
		b.pauseOn(wake)
	}
}

// execWaitEvent waits until the peer stream has run op.value operations.
func (s *hostStream) execWaitEvent(op *hostOp) error {
	if ok, err := op.peer.spinSeq(op.value); ok && err == nil {
		return nil
	}
	// Registered so that a host func's wait closing a cycle through this one is
	// refused (host_waits.go); this wait itself is never refused.
	e, _ := beginWait(s, op.peer, op.value, false, false)
	defer endWait(s, e)
	stop := s.closing
	var grace *time.Timer
	defer func() {
		if grace != nil {
			grace.Stop()
		}
	}()
	for {
		var timeout <-chan time.Time
		if grace != nil {
			timeout = grace.C
		}
		err := op.peer.parkSeq(op.value, stop, timeout)
		switch {
		case err == nil:
			return nil
		case !errors.Is(err, errStopped):
			return fmt.Errorf("stream: host WaitEvent: the event's stream failed before the recorded point: %w", err)
		case grace != nil:
			return s.abandoned("WaitEvent")
		}
		// Close began while waiting: allow the grace period from now.
		grace = time.NewTimer(s.grace)
		stop = nil
	}
}

// abandoned builds the error for a wait Close gave up on; the stream is closed, so
// tail is final and the count of dropped work is exact.
func (s *hostStream) abandoned(what string) error {
	dropped := s.tail.Load() - s.completed.Load() - 1
	return fmt.Errorf("stream: host Close: %s still blocked after the %v grace; it and %d later ops dropped: %w",
		what, s.grace, dropped, ErrAbandoned)
}

// fail records err as the sticky error (the first one wins), rest being the operations
// of the failed one's batch after it, and wakes all waiters.
func (s *hostStream) fail(err error, rest []hostOp) {
	// No new work from here; the rest of the batch and all that is pending are
	// dropped (their dropped funcs run) before the failure shows (sticky), so whoever
	// sees it sees what they release released. Executor only.
	s.mu.Lock()
	if s.failed == nil {
		s.failed = err
	}
	pending := s.pending
	s.pending = nil
	s.taken += uint64(len(pending))
	s.mu.Unlock()
	dropAll(rest)
	dropAll(pending)
	s.sticky.CompareAndSwap(nil, &err)
	s.notify()
}

// exit runs when the executor stops for good.
func (s *hostStream) exit() {
	s.releaseHeld()
	unregisterWordAccessor(s)
	close(s.done)
	s.notify()
}

// notify wakes every goroutine sleeping in parkSeq on this stream.
func (s *hostStream) notify() {
	s.notifyMu.Lock()
	s.want.Store(0)
	close(s.progress)
	s.progress = make(chan struct{})
	s.notifyMu.Unlock()
}

// reached reports whether position target is settled: done (nil error), or never going
// to be done because the stream failed or exited first (the error).
func (s *hostStream) reached(target uint64) (bool, error) {
	if s.completed.Load() >= target {
		return true, nil
	}
	if err := s.err(); err != nil {
		return true, err
	}
	select {
	case <-s.done:
		// Exited without a sticky error means everything ran; reread completed, as
		// the executor may have finished between the two loads.
		if s.completed.Load() >= target {
			return true, nil
		}
		return true, fmt.Errorf("stream: host stream exited before position %d: %w", target, ErrAbandoned)
	default:
	}
	return false, nil
}

// spinSeq polls for position target of s for up to awaitSpinFor: ok once it is
// settled (see reached), with reached's error. A wait that does not settle then parks
// (parkSeq).
func (s *hostStream) spinSeq(target uint64) (ok bool, err error) {
	start := time.Now()
	single := singleP(start)
	for i := 1; ; i++ {
		if ok, err := s.reached(target); ok {
			return true, err
		}
		if single {
			runtime.Gosched() // let the executor we wait for run
		}
		if i%pollClockEvery == 0 && time.Since(start) >= awaitSpinFor {
			return false, nil
		}
	}
}

// parkSeq blocks until position target of s is settled (see reached), or until stop
// is closed or timeout fires (errStopped).
func (s *hostStream) parkSeq(target uint64, stop <-chan struct{}, timeout <-chan time.Time) error {
	for {
		// Publish the wish before rereading progress: the executor advances
		// completed before reading want, so one of the two sides sees the other.
		s.notifyMu.Lock()
		if w := s.want.Load(); w == 0 || target < w {
			s.want.Store(target)
		}
		ch := s.progress
		s.notifyMu.Unlock()
		if ok, err := s.reached(target); ok {
			return err
		}
		select {
		case <-ch:
		case <-stop:
			return errStopped
		case <-timeout:
			return errStopped
		}
	}
}

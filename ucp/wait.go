package ucp

import (
	"context"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ucpx/ucpx/cgo/ucx"
)

// The wait policy of Request.Wait and the blocking calls:
//
//  1. spin: progress the worker (256 rounds per cgo call), without Gosched, for
//     WorkerParams.SpinTime (DefaultSpinTime); past yieldAfter, each round also yields
//     the processor to other threads (sched_yield), so a peer that needs the core runs;
//  2. then, on a worker with wakeup, arm the event fd (ucp_worker_arm) and park until
//     it fires, the request completes on another goroutine, ctx ends or the worker
//     closes: no timed slices, no sleeps (but a millisecond at most while a copy of
//     the CUDA-IPC path, which the fd does not show, is pending). The first goroutine
//     to park sleeps in Go's netpoller on the event fd; others park on a channel it
//     closes when it wakes. No OS thread blocks;
//  3. without wakeup, keep polling, yielding the processor to other threads
//     (sched_yield) between rounds: on an oversubscribed machine the peer's thread gets
//     to run (measured: 4 MiB tag_bw over shm with a third busy process on 2 cores,
//     3.2 GB/s polling without yielding, 8.0 GB/s with). Other goroutines of the
//     processor run when the Go scheduler preempts the poller, or at reschedule.
//
// After a wakeup a waiter spins again: an event usually comes with more.

// DefaultSpinTime is how long a wait busy-polls before parking (WorkerParams.SpinTime).
const DefaultSpinTime = 100 * time.Microsecond

// spinRounds is the number of progress calls of one cgo call while spinning (its C loop
// returns as soon as the request completes): enough that an 8-byte round trip over
// shared memory usually completes within the first call.
const spinRounds = 256

// yieldAfter is how long a wait spins before it also yields the processor to other
// threads between rounds (sched_yield, which returns at once when none is runnable):
// a peer that shares this core gets to run. Not sooner: on a machine shared with other
// busy processes, a yield hands the core to one of them for a time slice, and an 8-byte
// ping-pong over shm whose waits yielded past 10 µs measured a 15-19 µs typical one-way
// latency in half the runs (0.35-0.42 µs with 100 µs, ucx_perftest 0.36-0.44, which
// never yields). With both processes pinned to one core a hop costs about this long.
const yieldAfter = 100 * time.Microsecond

// parkTries bounds the arm attempts of one park: each busy arm progresses once more.
const parkTries = 4

// waitRequest drives progress until r completes or ctx ends.
func (w *Worker) waitRequest(ctx context.Context, r *Request) error {
	done := ctx.Done()
	var start time.Duration
	started := false
	bound := parkBound{parkBoundMin}
	for i := 0; ; i++ {
		w.stepAside()
		w.mu.Lock()
		if !r.done.Load() {
			if w.closed.Load() {
				w.mu.Unlock()
				return r.errOr(opErr(r.op, ErrClosed, "worker closed"))
			}
			w.progressLocked(r, spinRounds)
		}
		tick := w.tickLocked()
		cbs := w.takeDeferredLocked()
		w.mu.Unlock()
		if cbs != nil {
			runDeferred(cbs)
		}
		if tick {
			w.reschedule()
		}
		if r.done.Load() {
			return r.err
		}
		if done != nil {
			select {
			case <-done:
				return ctx.Err()
			default:
			}
		}
		if i == 0 {
			continue // a wait that ends within its first round reads no clock
		}
		now := monotonic()
		if !started {
			start, started = now, true
			continue
		}
		if now-start >= yieldAfter {
			// The peer may be waiting for this core (an oversubscribed machine, or
			// both processes on one core): let it run. Not runtime.Gosched: with no
			// other goroutine to run it wakes an idle thread of the runtime, which
			// finds nothing and sleeps again, two context switches per call.
			osYield()
		}
		if now-start < w.spinTime || w.efd < 0 {
			continue // spin; without wakeup, keep polling
		}
		parked := monotonic()
		if finished, err := w.parkOn(ctx, r, bound.d); finished {
			return err
		}
		if bound.expired(parked) {
			start, i = monotonic()-w.spinTime, 1 // one progress pass, then park again
			continue
		}
		// After a wake-up, spin again.
		started, i = false, 0
	}
}

// reschedEvery is how often a goroutine that keeps the worker busy goes through the
// Go scheduler (see reschedule).
const reschedEvery = 5 * time.Millisecond

// tickLocked counts the worker's progressing calls and says when to consider a
// reschedule (every 256: a quarter of a millisecond of 8-byte round trips, about a
// millisecond of spinning rounds). Caller holds w.mu.
func (w *Worker) tickLocked() bool {
	w.ticks++
	return w.ticks&255 == 0
}

// reschedule passes through the Go scheduler if the last pass is reschedEvery old. A
// goroutine that spins on a worker without ever blocking keeps its scheduling tick:
// after 10 ms the runtime's monitor (sysmon) preempts it, takes its processor away
// while it is in a cgo call, and then wakes every 20 µs for a while, each wake-up
// taking a core from a spinning thread (measured, 8 B tag_lat over shm: ~9000 context
// switches/s and the p99 several times the median). A Gosched every few
// milliseconds costs two context switches of the runtime's, a few hundred times a
// second.
func (w *Worker) reschedule() {
	now := monotonic()
	if last := time.Duration(w.lastResched.Load()); now-last < reschedEvery {
		return
	}
	w.lastResched.Store(int64(now))
	runtime.Gosched()
}

// clockBase anchors monotonic.
var clockBase = time.Now()

// monotonic reads the monotonic clock once (time.Now reads it and the wall clock).
func monotonic() time.Duration { return time.Since(clockBase) }

// parkOn arms the worker and sleeps until something may have completed r. It reports
// whether the wait is over (r done, ctx ended, worker closed) and with what.
func (w *Worker) parkOn(ctx context.Context, r *Request, bound time.Duration) (bool, error) {
	w.mu.Lock()
	for try := 0; ; try++ {
		if r.done.Load() || w.closed.Load() {
			w.unlockDeferred()
			return true, r.errOr(opErr(r.op, ErrClosed, "worker closed"))
		}
		if w.armLocked() == ucx.OK {
			break
		}
		// Busy: events are pending.
		w.progressLocked(r, 1)
		if try == parkTries-1 {
			w.unlockDeferred()
			return r.done.Load(), r.errOr(nil)
		}
	}
	r.parked.Add(1)
	w.sleepUnlock(ctx, w.takeDeferredLocked(), time.Now().Add(bound))
	r.parked.Add(-1)
	if r.done.Load() {
		return true, r.err
	}
	if err := ctx.Err(); err != nil {
		return true, err
	}
	return false, nil
}

// A parked waiter sleeps at most parkBound, doubling from parkBoundMin up to
// parkBoundMax while it waits: UCX 1.13 does not signal every arrival on an armed
// worker (a shared-memory message that came while another goroutine's busy arm had
// taken the signal and before the next arm is neither signalled nor reported by the
// arm: a parked waiter slept on for good, graph tests of this session), so a lost
// wake-up costs a bounded delay, not a hang. A goroutine that waits for long wakes
// about once a second.
const (
	parkBoundMin = 50 * time.Millisecond
	parkBoundMax = time.Second
)

// parkBound is a wait's current sleep bound d.
type parkBound struct{ d time.Duration }

// expired reports whether the bound ended a sleep that began at parked (monotonic),
// and then doubles it: the sleep after it may be longer.
func (b *parkBound) expired(parked time.Duration) bool {
	if monotonic()-parked < b.d {
		return false
	}
	b.d = min(2*b.d, parkBoundMax)
	return true
}

// armLocked arms the worker for its event fd (ucp_worker_arm). Busy means events were
// pending, and the call consumed the fd's signal of them: a leader asleep in the
// netpoller would not see it, and until someone arms again the worker signals nothing
// more (a shared-memory message that arrives then is not signalled, and UCX 1.13's
// arm does not report it either). So a busy arm kicks the leader, which progresses
// and arms again. Caller holds w.mu.
func (w *Worker) armLocked() ucx.Status {
	st := w.raw.Arm()
	if st != ucx.OK {
		w.park.kickLeader()
	}
	return st
}

// sleepUnlock parks the calling goroutine on the armed worker: caller holds w.mu, which
// is released (then cbs run). It returns when the event fd fires, a request a parked
// goroutine waits on completes (wakeParkedLocked), ctx ends, deadline passes (zero:
// none) or the worker closes. In steady state it allocates nothing (without deadline).
// While work of the CUDA-IPC path is pending (copies, a pulled receive's data,
// tagpull.go), which the event fd does not show, it sleeps a millisecond at most.
func (w *Worker) sleepUnlock(ctx context.Context, cbs []func(), deadline time.Time) {
	if w.ipcPollsLocked() {
		if d := time.Now().Add(ipcSleep); deadline.IsZero() || d.Before(deadline) {
			deadline = d
		}
	}
	f, lead := w.park.enter(w.efd)
	progressed := w.raw.Progressed()
	w.mu.Unlock()
	runDeferred(cbs)
	if lead {
		w.park.poll(ctx, deadline, progressed)
		w.park.resign()
		return
	}
	if f == nil {
		return // closed, or the fd is not in the netpoller: the caller polls on
	}
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-f.ch:
	case <-ctx.Done():
	case <-timeout:
	}
	w.park.leave(f)
}

// ipcSleep bounds a sleep on the event fd while IPC work is pending.
const ipcSleep = time.Millisecond

// wakeParkedLocked wakes every parked goroutine: followers through their channel, the
// one in the netpoller through its read deadline. Caller holds w.mu.
func (w *Worker) wakeParkedLocked() { w.park.wake() }

// parker is where the waiters of a worker with wakeup sleep. One of them, the leader,
// waits in Go's netpoller for the worker's event fd (a duplicate of it, non-blocking,
// behind an os.File); the others, followers, wait on a channel of their own until the
// leader wakes, or whoever completes their request wakes them. A leader leaving (event,
// ctx, deadline) wakes the followers too, so one of them takes over. A watcher
// goroutine ends the leader's sleep when its ctx ends. Followers' channels are reused:
// parking allocates nothing in steady state.
type parker struct {
	mu        sync.Mutex
	followers []*follower // parked now
	free      []*follower
	leading   bool
	opened    bool
	closed    bool
	// sleeping: the leader is in (or about to enter) its read in the netpoller;
	// kicked: a wake for the leader it has not seen yet. A wake ends the leader's read
	// through its deadline, not through the event fd: signalling the worker
	// (ucp_worker_signal) is not enough, because any goroutine that arms the worker
	// before the netpoller reports the signal drains it (ucp_worker_arm reads the
	// signal fd and returns busy), and the leader would sleep on with its request done.
	sleeping bool
	kicked   bool
	// Set once, when the first goroutine parks.
	file   *os.File        // the event fd's duplicate
	rc     syscall.RawConn // file's
	readFn func(uintptr) bool
	first  bool // readFn's state, the leader's only
	// Stale readiness (the leader's only): the event fd was readable when the last
	// sleep began (level) and the worker's UCX progress has not moved since
	// (progressedAt): nothing UCX does consumes that readiness (a tcp socket left in
	// the event set for writability while its peer never progresses), and a sleep
	// that honoured it would return at once, every time. Such a sleep ignores the
	// level and waits for a new edge instead, bounded by staleWait (nonzero only
	// then; doubling up to staleWaitMax, since an edge Go's netpoller forgot before
	// the read is missed too).
	immediate    bool
	progressedAt uint64
	staleWait    time.Duration
	// The watcher: the leader hands it its ctx's Done channel before sleeping and
	// says when it woke (both unbuffered, one unwatch per watch).
	watch   chan (<-chan struct{})
	unwatch chan struct{}
	quit    chan struct{}
	// engineWake: the engine was kicked (workerTransport.Wake) since its last park.
	engineWake atomic.Bool
}

// follower is one parked goroutine that is not the leader.
type follower struct{ ch chan struct{} } // buffered: one wake-up

// aLongTimeAgo is a read deadline in the past: it wakes the netpoller's waiter.
var aLongTimeAgo = time.Unix(1, 0)

// enter registers a goroutine about to park: it leads (waits on the event fd) if
// nobody does, else it gets its follower slot. A closed parker, or one whose fd cannot
// go into the netpoller, returns neither: the caller polls on.
func (pk *parker) enter(efd int) (*follower, bool) {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if pk.closed {
		return nil, false
	}
	if !pk.opened {
		pk.opened = true
		pk.file, pk.rc = openEventFile(efd)
		if pk.file != nil {
			pk.readFn = pk.readReady
			pk.watch, pk.unwatch, pk.quit = make(chan (<-chan struct{})), make(chan struct{}), make(chan struct{})
			go pk.watchLoop(pk.file)
		}
	}
	if pk.file == nil {
		return nil, false
	}
	if !pk.leading {
		pk.leading = true
		return nil, true
	}
	var f *follower
	if n := len(pk.free); n > 0 {
		f = pk.free[n-1]
		pk.free = pk.free[:n-1]
		select {
		case <-f.ch: // a wake-up that came after it left last time
		default:
		}
	} else {
		f = &follower{ch: make(chan struct{}, 1)}
	}
	pk.followers = append(pk.followers, f)
	return f, false
}

// canSleep reports whether a goroutine that parks here sleeps: the parker is open and
// its fd is in the netpoller (or not tried yet). Otherwise enter returns at once.
func (pk *parker) canSleep() bool {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	return !pk.closed && (!pk.opened || pk.file != nil)
}

// leave returns a follower's slot once it woke.
func (pk *parker) leave(f *follower) {
	pk.mu.Lock()
	for i, g := range pk.followers { // still registered if it woke for ctx or deadline
		if g == f {
			last := len(pk.followers) - 1
			pk.followers[i] = pk.followers[last]
			pk.followers[last] = nil
			pk.followers = pk.followers[:last]
			break
		}
	}
	pk.free = append(pk.free, f)
	pk.mu.Unlock()
}

// Bounds of a sleep that skips a stale readiness (parker.immediate).
const (
	staleWaitMin = time.Millisecond
	staleWaitMax = 20 * time.Millisecond
)

// poll is the leader's sleep: in the netpoller until the event fd is readable, ctx
// ends, deadline passes or the file closes. progressed is the worker's UCX progress
// count when it armed (ucx.Worker.Progressed).
func (pk *parker) poll(ctx context.Context, deadline time.Time, progressed uint64) {
	pk.mu.Lock()
	file, rc, readFn := pk.file, pk.rc, pk.readFn
	pk.mu.Unlock()
	if d, ok := ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		deadline = d
	}
	if pk.immediate && progressed == pk.progressedAt {
		pk.staleWait = min(max(2*pk.staleWait, staleWaitMin), staleWaitMax)
		if d := time.Now().Add(pk.staleWait); deadline.IsZero() || d.Before(deadline) {
			deadline = d
		}
	} else {
		pk.staleWait = 0
	}
	pk.immediate, pk.progressedAt = false, progressed
	if file.SetReadDeadline(deadline) != nil {
		return // closed
	}
	pk.mu.Lock()
	if pk.kicked {
		pk.kicked = false
		pk.mu.Unlock()
		return
	}
	pk.sleeping = true
	pk.mu.Unlock()
	defer func() {
		pk.mu.Lock()
		pk.sleeping, pk.kicked = false, false
		pk.mu.Unlock()
	}()
	watched := false
	if done := ctx.Done(); done != nil {
		select {
		case pk.watch <- done:
			watched = true
		case <-pk.quit: // closing
			return
		}
	}
	pk.first = true
	_ = rc.Read(readFn)
	if watched {
		pk.unwatch <- struct{}{}
	}
}

// readReady is the leader's RawConn.Read callback. The first call checks the fd
// without consuming anything: readiness that came before the netpoller was asked
// counts too (it reports edges only), unless it is stale (parker.immediate). A later
// call follows a wake-up: done.
func (pk *parker) readReady(fd uintptr) bool {
	if pk.first {
		pk.first = false
		if !readable(fd) {
			return false
		}
		pk.immediate = true
		return pk.staleWait == 0
	}
	return true
}

// watchLoop ends the leader's sleep when the ctx it handed over ends.
func (pk *parker) watchLoop(file *os.File) {
	for {
		var done <-chan struct{}
		select {
		case done = <-pk.watch:
		case <-pk.quit:
			return
		}
		select {
		case <-done:
			_ = file.SetReadDeadline(aLongTimeAgo)
			<-pk.unwatch
		case <-pk.unwatch:
		}
	}
}

// resign ends the leader's turn and wakes the followers: one of them leads next.
func (pk *parker) resign() {
	pk.mu.Lock()
	pk.leading = false
	pk.wakeFollowersLocked()
	pk.mu.Unlock()
}

func (pk *parker) wakeFollowersLocked() {
	for i, f := range pk.followers {
		select {
		case f.ch <- struct{}{}:
		default:
		}
		pk.followers[i] = nil
	}
	pk.followers = pk.followers[:0]
}

// wake wakes every parked goroutine: the followers, and the leader (kickLocked).
func (pk *parker) wake() {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	pk.wakeFollowersLocked()
	pk.kickLocked()
}

// kickLeader ends the leader's sleep (see armLocked).
func (pk *parker) kickLeader() {
	pk.mu.Lock()
	pk.kickLocked()
	pk.mu.Unlock()
}

// kickLocked ends the leader's sleep, or the one it is about to begin (see kicked).
func (pk *parker) kickLocked() {
	if !pk.leading || pk.closed {
		return
	}
	pk.kicked = true
	if pk.sleeping {
		_ = pk.file.SetReadDeadline(aLongTimeAgo)
	}
}

// shutdown wakes everyone for good (worker closing; caller holds w.mu).
func (pk *parker) shutdown() {
	pk.mu.Lock()
	defer pk.mu.Unlock()
	pk.closed = true
	pk.wakeFollowersLocked()
	if pk.file != nil {
		_ = pk.file.SetReadDeadline(aLongTimeAgo)
	}
}

// close stops the watcher and releases the event fd's duplicate, after shutdown
// (waking a leader still in the netpoller). Caller does not hold w.mu.
func (pk *parker) close() {
	pk.mu.Lock()
	file := pk.file
	pk.mu.Unlock()
	if file != nil {
		close(pk.quit)
		_ = file.Close()
	}
}

// openEventFile puts a duplicate of the worker's event fd (an epoll fd: readable when
// one of UCX's descriptors is) into Go's netpoller. The duplicate shares the open file,
// so the fd becomes non-blocking for UCX too, which changes nothing for an epoll fd.
// nil when that fails: waiters then poll.
func openEventFile(efd int) (*os.File, syscall.RawConn) {
	fd, err := unix.FcntlInt(uintptr(efd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, nil
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		return nil, nil
	}
	f := os.NewFile(uintptr(fd), "ucp-worker-efd")
	rc, err := f.SyscallConn()
	if err == nil {
		err = f.SetReadDeadline(time.Time{}) // fails if the fd is not in the netpoller
	}
	if err != nil {
		_ = f.Close()
		return nil, nil
	}
	return f, rc
}

// readable polls fd without waiting.
func readable(fd uintptr) bool {
	fds := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds[:], 0)
	return err == nil && n > 0
}

// osYield gives the processor to another runnable thread of the machine, if any, and
// returns at once otherwise (sched_yield): a waiter that polls past its spin time then
// leaves the CPU to the peer it waits for when the machine is oversubscribed.
func osYield() { _, _, _ = unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

// WaitProgress parks the engine's goroutine on the worker's event fd until an event,
// Wake, done, or max (0: none) (condition.TransportWaiter). Without wakeup it returns
// false and the engine polls.
func (t workerTransport) WaitProgress(done <-chan struct{}, max time.Duration) bool {
	w := t.w
	if w.efd < 0 {
		return false
	}
	w.mu.Lock()
	for try := 0; ; try++ {
		if w.closed.Load() {
			w.mu.Unlock()
			return false
		}
		if w.park.engineWake.Swap(false) {
			w.mu.Unlock() // kicked: the engine runs a round
			return true
		}
		if w.armLocked() == ucx.OK {
			break
		}
		// Busy: events are pending, such as a message for a receive the engine has
		// not issued yet, which its rounds (nothing in flight) do not progress. Move
		// them on, else every arm finds them again and the engine never sleeps.
		if w.progressLocked(nil, 1) > 0 || try == parkTries-1 {
			w.unlockDeferred()
			return true
		}
	}
	var deadline time.Time
	if max > 0 {
		deadline = time.Now().Add(max)
	}
	w.sleepUnlock(doneCtx{done}, w.takeDeferredLocked(), deadline)
	w.park.engineWake.Store(false)
	return true
}

// Wake ends the engine's WaitProgress (condition.TransportWaiter): it wakes the parked
// goroutines. Under w.mu, which WaitProgress holds from its check of engineWake to its
// registration in the parker: a wake either comes before the check or finds the
// engine parked.
func (t workerTransport) Wake() {
	w := t.w
	w.park.engineWake.Store(true)
	w.mu.Lock()
	w.park.wake()
	w.mu.Unlock()
}

// doneCtx is a context that ends when done closes (the engine's stop channel).
type doneCtx struct{ done <-chan struct{} }

func (c doneCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c doneCtx) Done() <-chan struct{}       { return c.done }
func (c doneCtx) Value(any) any               { return nil }
func (c doneCtx) Err() error {
	select {
	case <-c.done:
		return context.Canceled
	default:
		return nil
	}
}

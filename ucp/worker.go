package ucp

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ucpx/ucpx/cgo/ucx"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream/streamcore"
)

// WorkerParams configures NewWorker.
type WorkerParams struct {
	// NoWakeup disables the event fd: waits then poll for as long as they wait (they
	// never sleep), which is the lowest latency and costs a core per waiting goroutine.
	NoWakeup bool
	// SpinTime is how long Request.Wait, the blocking calls (TagSend, TagRecv,
	// TagSendRecv) and the progress thread busy-poll the worker before parking on its
	// event fd (0: DefaultSpinTime; negative: park at once). Without wakeup they poll
	// throughout.
	SpinTime time.Duration
	// ProgressThread gives the worker a goroutine of its own that progresses it: a
	// process that is only the target of RMA, atomics or active messages, or whose
	// streams wait on signal words a peer writes, then needs no progress loop. It
	// polls for SpinTime after the last thing that progressed, then parks on the
	// worker's event fd: idle, it costs no CPU.
	ProgressThread bool
	// UnmatchedLimit bounds, per peer, the data its tag messages hold on this worker
	// before a receive matches them (Endpoint.UnmatchedHeld says how it is counted):
	// past it, every endpoint to that peer fails with an error matching
	// ErrExceedsLimit, and what the peer sent and sends unmatched is discarded. A
	// message is charged to the peer whose source id its tag carries (TagBits), an id
	// derived from what the peer's handshake or sealed address proved: with an auth
	// key only key holders can compute a peer's id; without one any peer can claim
	// another's and get it cut off. All peers
	// together may hold four limits; past that the peer holding most is cut off. 0:
	// DefaultUnmatchedLimit (256 MiB); negative: no limit, which also stops looking.
	UnmatchedLimit int64
}

// Worker is a ucp_worker_h: a progress engine with its own endpoints, listeners and
// requests. All methods are safe for concurrent use: the worker serialises UCX calls
// with one mutex (UCS_THREAD_MODE_SERIALIZED). See the package doc for who drives progress.
type Worker struct {
	ctx    *Context
	raw    *ucx.Worker
	mu     workerLock
	closed atomic.Bool
	// source: the id this worker's sends carry (unmatched.go); unmatchedLimit: its
	// ledger's limit per peer, 0 when off.
	source         uint64
	unmatchedLimit uint64

	// Under mu.
	pending   []*Request // slot -> request waiting on a UCX request
	freeSlots []int
	eps       map[unsafe.Pointer]*Endpoint
	replies   map[unsafe.Pointer]*replyPeer // senders by UCX reply endpoint (am.go)
	listeners map[uint64]*Listener
	am        map[uint64]*amHandler
	rkeys     map[*Rkey]struct{}
	nextID    uint64
	events    []ucx.Event
	deferred  []func() // user callbacks to run after mu is released
	// closeHooks run once Close is done (OnClose).
	closeHooks []*closeHook
	// The last Fence's gate (fence.go).
	fenceBefore  []*Request
	fenceFlush   *Request
	fenceHeld    atomic.Bool
	fenceFlushes atomic.Bool
	// pullsOut: sends of pulled active messages waiting for their receiver, by op id
	// (ampull.go; under mu); pullSeq numbers them.
	pullsOut map[uint64]*Request
	pullSeq  atomic.Uint64
	// pullsIn: pulled tag messages being copied here; truncOwed: answers to senders
	// whose pulled message did not fit its receive (tagpull.go; under mu).
	pullsIn   []pullIn
	truncOwed []truncAnswer
	pullAddr  []byte // this worker's sealed address, for pull descriptors
	// pullsSent numbers this worker's pulled tag sends per receiving worker and tag;
	// pullsSeen counts the pulled tag messages received here per sender and tag, so
	// that a truncation answer names its send (tagpull.go; under mu).
	pullsSent, pullsSeen pullSeqs
	// gonePeers: identities whose internal endpoint failed and was closed, for
	// revocation (tagpull.go; under mu).
	gonePeers [][idLen]byte

	efd      int           // -1 without wakeup
	spinTime time.Duration // WorkerParams.SpinTime, resolved
	// park is where waiters sleep on the event fd (Go's netpoller); wakeParked asks the
	// goroutine that completed a request somebody is parked on to wake them (under mu).
	park       parker
	wakeParked bool
	ticks      uint32 // progressing calls of waits (under mu)
	// lastResched is when a wait last went through the Go scheduler (since clockBase).
	lastResched atomic.Int64
	reqPool     []*Request        // the worker's own requests for fused calls (under mu)
	eng         *condition.Engine // the engine of conditioned operations, started on first use (under mu)
	// engReady is eng once started: enqueuers read it without mu, which the engine
	// holds while it progresses.
	engReady atomic.Pointer[condition.Engine]
	// completions counts requests completed asynchronously (completeLocked): the engine
	// rescans its operations only when this, a trigger word or its own operation set
	// changed.
	completions atomic.Uint64

	progress *progressThread // WorkerParams.ProgressThread, nil without
	// fast: the worker's record for C callers once shared with C (cshare.go; under mu).
	fast *ucx.Fast
	// maxAmHeader is UCX's limit on an active message's header (0: unknown).
	maxAmHeader int
	// orphans are the stand-ins of operations failed while UCX still held them
	// (watch.go), under mu.
	orphans map[*Request]bool
	// rawGone: Close destroyed the UCX worker (under mu); memory UCX owned is gone.
	rawGone bool
	// droppedChains: runners of chains collected undestroyed that UCX or a pull
	// still held (chain.go, dropped); Close frees them once the UCX worker is gone.
	droppedChains []*chainRunner

	// staging counts what this worker's operations staged (StagingStats); plain is
	// its staging memory for operations without a condition (ucp/staging.go).
	staging protocol.Stats
	plain   plainStaging

	// The CUDA IPC path (ipc.go), under mu: requests whose copies are in flight, spare
	// events, and the worker's own stream of the context's device.
	ipcQueues  []*ipcQueue // copies, by stream
	ipcPending []*Request  // flushes and staged operations
	ipcEvents  []streamcore.Event
	ipcStream  streamcore.Stream
	// ipcEvKept: how many of ipcEvents are kept for held event reservations whose
	// operation holds no event now (devstage.go): others take only the rest.
	ipcEvKept int
	// devPool: pinned staging memory of device operations with no stream (devstage.go).
	devPool *protocol.Pool
}

// NewWorker creates a worker on the context.
func (c *Context) NewWorker(p WorkerParams) (*Worker, error) {
	if c == nil {
		return nil, opErr("worker_create", ErrInvalidParam, "nil context")
	}
	w := &Worker{
		ctx:       c,
		eps:       map[unsafe.Pointer]*Endpoint{},
		listeners: map[uint64]*Listener{},
		am:        map[uint64]*amHandler{},
		rkeys:     map[*Rkey]struct{}{},
		efd:       -1,
		spinTime:  p.SpinTime,
	}
	if w.spinTime == 0 {
		w.spinTime = DefaultSpinTime
	}
	// Pulled sends are numbered from a random base per worker: a receiver's "pulled"
	// answer names the number, and one carried to another worker of the context
	// (replayed, or sent on a second endpoint) must not name a send of that worker.
	w.pullSeq.Store(randomPullBase())
	wakeup := !p.NoWakeup && c.features&FeatureWakeup != 0
	err := c.register(func() error {
		raw, st := c.raw.NewWorker(wakeup)
		if err := statusErr(st); err != nil {
			return opErr("worker_create", err, "")
		}
		w.raw = raw
		w.mu.yield = raw.YieldWord()
		w.maxAmHeader = raw.MaxAmHeader()
		if wakeup {
			// Before the context knows the worker: its Close may destroy it from then on.
			if fd, st := raw.EventFD(); st == ucx.OK {
				w.efd = fd
			}
		}
		c.workers[w] = struct{}{}
		return nil
	})
	if errors.Is(err, ErrClosed) {
		return nil, opErr("worker_create", err, "the context is closed")
	} else if err != nil {
		return nil, err
	}
	live.workers.Add(1)
	if err := w.startUnmatched(p.UnmatchedLimit); err != nil {
		_ = w.Close()
		return nil, opErr("worker_create", err, "")
	}
	// Revocation messages (revoke.go) come on a reserved active-message id.
	if c.features&FeatureAM != 0 {
		if err := w.setAmHandler(RevokeAM, w.onControl); err != nil {
			_ = w.Close()
			return nil, err
		}
		// Pulled active messages (ampull.go), which only a peer IPC reaches sends, and
		// the hellos ahead of AmReply messages (am.go), which any peer sends.
		if err := w.setAmHandler(PullAM, w.onPull); err != nil {
			_ = w.Close()
			return nil, err
		}
	}
	if p.ProgressThread {
		w.startProgressThread()
	}
	return w, nil
}

// Context returns the context the worker belongs to.
func (w *Worker) Context() *Context {
	if w == nil {
		return nil
	}
	return w.ctx
}

// Address returns the worker's address in ucpx's wire form, for ConnectAddress on a
// peer: sealed under the context's auth key (README, "Trust model"), with this
// process's pid for same-host peer watching.
func (w *Worker) Address() ([]byte, error) {
	if w == nil {
		return nil, opErr("worker_get_address", ErrInvalidParam, "nil worker")
	}
	info, err := w.selfInfo()
	if err != nil {
		return nil, opErr("worker_get_address", err, "")
	}
	return sealAddress(w.ctx.trust.seal, &info), nil
}

// Progress runs one round of UCX progress, completes the requests and delivers the
// events it produced (callbacks run on the calling goroutine). It returns the number
// of events handled.
func (w *Worker) Progress() int {
	if w == nil {
		return 0
	}
	return w.progressFor(nil, 1)
}

// progressFor progresses until r completes or spins rounds pass (once for a nil or
// completed r), then delivers the events; it returns the number handled.
func (w *Worker) progressFor(r *Request, spins uint) int {
	w.stepAside()
	w.mu.Lock()
	if w.closed.Load() {
		w.mu.Unlock()
		return 0
	}
	n := w.progressLocked(r, spins)
	tick := w.tickLocked()
	w.unlockDeferred()
	if tick {
		w.reschedule()
	}
	return n
}

// stepAside lets an engine waiting to issue an operation take mu first: a goroutine
// about to take mu only to progress yields while the yield word is set (bounded, so
// a wait can never spin behind it). The engine's issue step is on the critical path
// of every conditioned operation, and polling loops would otherwise retake mu ahead
// of it again and again.
func (w *Worker) stepAside() {
	for i := 0; i < 8 && atomic.LoadUint32(w.mu.yield) != 0; i++ {
		runtime.Gosched()
	}
}

// lockIssue takes mu for an nbx call. When mu is busy it sets the yield word while it
// waits, so that polling loops (a progress thread, a user's Progress loop, a Wait's
// spin) step aside instead of retaking mu ahead of the call again and again.
func (w *Worker) lockIssue() {
	if w.mu.TryLock() {
		return
	}
	atomic.AddUint32(w.mu.yield, 1)
	w.mu.Lock()
	atomic.AddUint32(w.mu.yield, ^uint32(0))
}

// issueLocking runs issue, an nbx call that takes mu, with the yield word set so that
// waits holding mu in a spin let go within one progress call.
func (w *Worker) issueLocking(issue func() (*Request, error)) (*Request, error) {
	atomic.AddUint32(w.mu.yield, 1)
	defer atomic.AddUint32(w.mu.yield, ^uint32(0))
	return issue()
}

// progressLocked progresses (until r completes or spins rounds pass, or once for a nil
// or completed r), completes what completed and handles the events, with one cgo call
// when nothing was queued. It returns the number of completions and events handled.
func (w *Worker) progressLocked(r *Request, spins uint) int {
	var req unsafe.Pointer
	own := false
	if r != nil && !r.done.Load() && r.req != nil {
		req, own = r.req, !r.notify
	}
	if req == nil {
		spins = 1
	}
	n := 0
	if w.raw.Wait(req, spins, own) {
		st, tag, length := w.raw.Own()
		w.completeTrackedLocked(r, st, length, tag)
		n++
	}
	return n + w.afterLocked()
}

// afterLocked completes the requests the last call reaped, reaps the rest, handles
// the queued events and wakes the goroutines parked on a request that completed. It
// returns the number of completions and events handled.
func (w *Worker) afterLocked() int {
	n := 0
	for {
		res := w.raw.TakeReaped()
		for i := range res {
			d := &res[i]
			slot := int(d.Slot)
			if slot < 0 || slot >= len(w.pending) || w.pending[slot] == nil {
				continue // cannot happen: every pending request has a slot
			}
			w.completeTrackedLocked(w.pending[slot], ucx.Status(d.Status), int(d.Length), d.Tag)
		}
		n += len(res)
		switch {
		case w.raw.Unreaped() > 0:
			w.raw.Reap()
		case w.raw.Pending() > 0:
			// Handling an event may complete more (a failed peer's receives are
			// canceled): loop until both are empty.
			n += w.drainLocked()
		default:
			if w.ipcBusyLocked() {
				n += w.pollIPCLocked()
			}
			if w.raw.TakeChainWake() || w.wakeParked {
				w.wakeParked = false
				w.wakeParkedLocked()
			}
			return n
		}
	}
}

// completeTrackedLocked completes a tracked request with its result and frees its slot.
func (w *Worker) completeTrackedLocked(r *Request, st ucx.Status, length int, tag uint64) {
	if w.orphans != nil {
		delete(w.orphans, r)
	}
	w.pending[r.slot] = nil
	w.freeSlots = append(w.freeSlots, int(r.slot))
	r.req = nil
	if tag&ucx.PullBit != 0 {
		w.pullArrivedLocked(r, st, length, tag)
		return
	}
	r.completeLocked(statusErr(st), length, tag)
}

// WaitForEvents blocks until the worker may have work (its event fd fired or Signal
// was called), ctx ends, or timeout passes; call Progress afterwards. The goroutine
// sleeps in Go's netpoller on the event fd. It returns at once when events are pending
// already, and without wakeup (WorkerParams.NoWakeup) after yielding the processor:
// there is nothing to sleep on, so the caller keeps polling. It returns ctx's error if
// ctx ended.
func (w *Worker) WaitForEvents(ctx context.Context, timeout time.Duration) error {
	if w == nil {
		return opErr("worker_wait", ErrInvalidParam, "nil worker")
	}
	if ctx == nil {
		return opErr("worker_wait", ErrInvalidParam, "nil context")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if w.closed.Load() {
		return opErr("worker_wait", ErrClosed, "")
	}
	if w.efd < 0 {
		runtime.Gosched()
		return ctx.Err()
	}
	var deadline time.Time
	if timeout < 100*365*24*time.Hour {
		deadline = time.Now().Add(timeout)
	}
	w.mu.Lock()
	if w.closed.Load() {
		w.mu.Unlock()
		return opErr("worker_wait", ErrClosed, "")
	}
	if w.armLocked() != ucx.OK {
		w.mu.Unlock() // busy: events are pending
		return ctx.Err()
	}
	w.sleepUnlock(ctx, nil, deadline)
	if w.closed.Load() {
		return opErr("worker_wait", ErrClosed, "")
	}
	return ctx.Err()
}

// Signal wakes the goroutines blocked in WaitForEvents (and the library's own waits),
// and a thread of the program's blocked on EventFD (ucp_worker_signal). A worker
// without wakeup has no event fd to block on (WaitForEvents only yields): there is
// nothing to wake, and UCX would print an error for the call.
func (w *Worker) Signal() error {
	if w == nil {
		return opErr("worker_signal", ErrInvalidParam, "nil worker")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed.Load() {
		return opErr("worker_signal", ErrClosed, "")
	}
	if w.efd < 0 {
		return nil
	}
	w.park.wake()
	return opErr("worker_signal", statusErr(w.raw.Signal()), "")
}

// EventFD returns the worker's event file descriptor (ucp_worker_get_efd), for a
// program that multiplexes it with its own descriptors: call Arm, wait until the fd is
// readable, then Progress. It stays owned by the worker (do not close it). Without
// wakeup it fails with ErrUnsupported.
func (w *Worker) EventFD() (int, error) {
	if w == nil {
		return -1, opErr("worker_get_efd", ErrInvalidParam, "nil worker") // -1 as on its other errors: 0 is a valid fd
	}
	if w.closed.Load() {
		return -1, opErr("worker_get_efd", ErrClosed, "")
	}
	if w.efd < 0 {
		return -1, opErr("worker_get_efd", ErrUnsupported, "worker without wakeup (WorkerParams.NoWakeup or no FeatureWakeup)")
	}
	return w.efd, nil
}

// Arm arms the event fd (ucp_worker_arm): it becomes readable on the next event. It
// fails with an error matching ErrBusy when events are pending already (Progress
// first), and with ErrUnsupported without wakeup.
func (w *Worker) Arm() error {
	if w == nil {
		return opErr("worker_arm", ErrInvalidParam, "nil worker")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed.Load() {
		return opErr("worker_arm", ErrClosed, "")
	}
	if w.efd < 0 {
		return opErr("worker_arm", ErrUnsupported, "worker without wakeup")
	}
	return opErr("worker_arm", statusErr(w.armLocked()), "")
}

// drainLocked delivers queued events. Completion work that touches only ucpx state
// happens here; user callbacks are deferred until mu is released.
func (w *Worker) drainLocked() int {
	total := 0
	for w.raw.Pending() > 0 {
		evs := w.raw.Drain(w.events[:0])
		w.events = nil // a handler that drains again must not reuse this batch
		for i := range evs {
			w.handleEventLocked(&evs[i])
		}
		total += len(evs)
		w.events = evs[:0]
	}
	return total
}

func (w *Worker) handleEventLocked(ev *ucx.Event) {
	switch ev.Type {
	case ucx.EvReqDone:
		slot := int(ev.ID)
		if slot < 0 || slot >= len(w.pending) || w.pending[slot] == nil {
			return // cannot happen: every pending request has a slot
		}
		w.completeTrackedLocked(w.pending[slot], ev.Status, ev.Length, ev.Tag)
	case ucx.EvEPError:
		if ep := w.eps[ev.Ptr]; ep != nil {
			ep.failLocked(Status(ev.Status))
		}
	case ucx.EvAmRecv:
		w.deliverAmLocked(ev)
	case ucx.EvCutOff:
		w.cutOffLocked(ev.ID, ev.Length)
	}
}

func (w *Worker) takeDeferredLocked() []func() {
	if len(w.deferred) == 0 {
		return nil
	}
	cbs := w.deferred
	w.deferred = nil
	return cbs
}

// unlockDeferred releases w.mu and runs the callbacks that became due under it.
func (w *Worker) unlockDeferred() {
	cbs := w.takeDeferredLocked()
	w.mu.Unlock()
	runDeferred(cbs)
}

func runDeferred(cbs []func()) {
	for _, f := range cbs {
		runRecovered(f)
	}
}

// trackLocked registers a pending UCX request so its completion event finds r.
func (w *Worker) trackLocked(r *Request, req unsafe.Pointer) {
	var slot int
	if n := len(w.freeSlots); n > 0 {
		slot = w.freeSlots[n-1]
		w.freeSlots = w.freeSlots[:n-1]
	} else {
		slot = len(w.pending)
		w.pending = append(w.pending, nil)
	}
	w.pending[slot] = r
	r.req = req
	r.slot = int32(slot)
	ucx.SetSlot(req, uint64(slot))
}

// closeKeepaliveRounds is how many of UCX's keepalive progress turns Close lets run
// before it force-closes the endpoints.
const closeKeepaliveRounds = 4

// Close cancels pending operations, force-closes endpoints and listeners, and
// destroys the worker. Pending requests complete with ErrCanceled or a peer error.
// A second Close returns ErrClosed. A callback may call it, on the progress thread or
// the engine's goroutine too: that goroutine ends once the callback returned.
func (w *Worker) Close() error {
	if w == nil {
		return opErr("worker_destroy", ErrInvalidParam, "nil worker")
	}
	if w.closed.Load() {
		return opErr("worker_destroy", ErrClosed, "")
	}
	w.stopProgressThread()
	w.mu.Lock()
	if w.closed.Load() {
		w.mu.Unlock()
		return opErr("worker_destroy", ErrClosed, "")
	}
	w.closed.Store(true)
	retireFast(&w.fast)
	w.park.shutdown() // parked waiters wake, and find the worker closed
	for _, l := range w.listeners {
		l.destroyLocked()
	}
	// Let a keepalive round UCX left unfinished (an endpoint still wiring up had no
	// resources) finish while the endpoints are whole: UCX 1.13 resumes it in the
	// progress below, and on a force-closed endpoint it dereferences a lane that is
	// gone (ucp_ep_do_uct_ep_am_keepalive: a crash seen about once in 20 runs of the
	// ucp tests). Keepalive runs every 32nd progress call.
	for range closeKeepaliveRounds * 32 {
		w.progressLocked(nil, 1)
	}
	for _, ep := range w.eps {
		ep.forceCloseLocked()
	}
	w.failPullsLocked(nil, opErr("worker_destroy", ErrCanceled, "worker closed"))
	for _, r := range w.pending {
		if r != nil && r.req != nil {
			w.raw.Cancel(r.req)
		}
	}
	// Let UCX finish what was canceled or force-closed; bounded so a stuck
	// transport cannot hang Close.
	deadline := time.Now().Add(2 * time.Second)
	for w.pendingCountLocked() > 0 && time.Now().Before(deadline) {
		w.progressLocked(nil, 1)
	}
	w.raw.Reap()
	w.afterLocked()
	for _, r := range w.pending {
		if r != nil { // UCX never completed it: fail it ourselves, and release it to UCX
			if r.req != nil {
				w.raw.Abandon(r.req)
			}
			r.req = nil
			r.completeLocked(opErr("worker_destroy", ErrCanceled, "worker closed"), 0, 0)
		}
	}
	w.pending = nil
	// Copies of the IPC path end on their own (unless a stream holds them back).
	for w.ipcBusyLocked() && time.Now().Before(deadline) {
		w.pollIPCLocked()
		if w.ipcBusyLocked() {
			w.mu.Unlock()
			time.Sleep(20 * time.Microsecond)
			w.mu.Lock()
		}
	}
	// The mappings those copies may write into are not released with their keys
	// below: abandonIPCLocked releases them once the copies ran.
	kept := w.abandonIPCLocked()
	w.eachIPCLocked(func(r *Request) {
		r.ipc.ev = nil // may still be in use: not reused, not closed (abandonIPCLocked closes them)
		r.completeLocked(opErr("worker_destroy", ErrCanceled, "worker closed with a CUDA IPC copy in flight"), 0, 0)
	})
	w.ipcQueues, w.ipcPending = nil, nil
	for _, in := range w.pullsIn { // receives whose pull did not finish
		if !in.r.done.Load() {
			in.r.completeLocked(opErr("worker_destroy", ErrCanceled, "worker closed while a pulled message was copied"), 0, in.tag)
		}
	}
	w.pullsIn, w.truncOwed = nil, nil
	ipcClose := w.closeIPCLocked()
	for rk := range w.rkeys {
		rk.destroyLocked()
		if !kept[rk] { // a kept key's exporter is told once its mapping is released
			rk.releasedLocked()
		}
	}
	for id, h := range w.am {
		h.arg.Free()
		delete(w.am, id)
	}
	// What became due runs while the UCX worker still exists: an active message's
	// data lives in UCX's buffers until the worker goes (a handler that ran after
	// ucp_worker_destroy read unmapped memory). The worker is closed: nothing
	// progresses it now, so no message is delivered after this.
	if cbs := w.takeDeferredLocked(); cbs != nil {
		w.mu.Unlock()
		runDeferred(cbs)
		w.mu.Lock()
	}
	cbs := w.takeDeferredLocked()
	w.rawGone = true
	w.raw.Destroy()
	dropped := w.droppedChains
	w.droppedChains = nil
	eng := w.eng
	w.mu.Unlock()
	w.park.close()
	if eng != nil {
		_ = eng.Close()
	}
	w.plain.close()
	for _, r := range dropped {
		_ = r.Destroy() // detached: freed
	}
	w.mu.Lock()
	if w.devPool != nil {
		_ = w.devPool.Close()
	}
	w.mu.Unlock()

	c := w.ctx
	c.mu.Lock()
	delete(c.workers, w)
	cleanup := c.cleanupOwed && len(c.workers) == 0
	if cleanup {
		c.cleanupOwed = false
	}
	c.mu.Unlock()
	live.workers.Add(-1)
	runDeferred(cbs)
	runDeferred(ipcClose)
	if cleanup {
		c.cleanup() // the context's Close came while this worker closed
	}
	w.mu.Lock()
	hooks := w.closeHooks
	w.closeHooks = nil
	w.mu.Unlock()
	for _, h := range hooks {
		h.fn()
	}
	return nil
}

// closeHook is one OnClose function (a pointer, so that its remover finds it).
type closeHook struct{ fn func() }

// OnClose adds fn to what runs once the worker closed, on the goroutine that closed
// it, without worker locks held: layers above ucp (prepared operations) fail what
// still waits on the worker, streams included. If Close was called already (it may
// still be under way on another goroutine), fn runs now. remove takes fn back
// (idempotent). A nil worker or fn adds nothing.
func (w *Worker) OnClose(fn func()) (remove func()) {
	if w == nil || fn == nil {
		return func() {}
	}
	h := &closeHook{fn: fn}
	w.mu.Lock()
	closed := w.closed.Load()
	if !closed {
		w.closeHooks = append(w.closeHooks, h)
	}
	w.mu.Unlock()
	if closed {
		fn()
		return func() {}
	}
	return hookRemover(w, &w.closeHooks, h)
}

// hookRemover is the remover OnClose and OnFailure return: it takes h out of *hooks
// under w.mu, once (later calls find it gone).
func hookRemover[H any](w *Worker, hooks *[]*H, h *H) func() {
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if i := slices.Index(*hooks, h); i >= 0 {
			*hooks = slices.Delete(*hooks, i, i+1)
		}
	}
}

func (w *Worker) pendingCountLocked() int {
	n := 0
	for _, r := range w.pending {
		if r != nil && !w.orphans[r] { // UCX would not finish an orphan: not waited for
			n++
		}
	}
	return n
}

package ucp

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ucpx/ucpx/cgo/ucx"
	"github.com/ucpx/ucpx/condition"
)

// WorkerParams configures NewWorker.
type WorkerParams struct {
	// NoWakeup disables the event fd; idle waits then back off with sleeps.
	NoWakeup bool
	// ProgressThread gives the worker a goroutine of its own that progresses it: a
	// process that is only the target of RMA, atomics or active messages, or whose
	// streams wait on signal words a peer writes, then needs no progress loop. Idle,
	// it parks on the worker's event fd.
	ProgressThread bool
}

// Worker is a ucp_worker_h: a progress engine with its own endpoints, listeners and
// requests. All methods are safe for concurrent use: the worker serialises UCX calls
// with one mutex (UCS_THREAD_MODE_SERIALIZED). See the package doc for who drives progress.
type Worker struct {
	ctx    *Context
	raw    *ucx.Worker
	mu     sync.Mutex
	closed atomic.Bool

	// Under mu.
	pending   []*Request // slot -> request waiting on a UCX request
	freeSlots []int
	eps       map[unsafe.Pointer]*Endpoint
	listeners map[uint64]*Listener
	am        map[uint64]*amHandler
	rkeys     map[*Rkey]struct{}
	nextID    uint64
	events    []ucx.Event
	deferred  []func() // user callbacks to run after mu is released

	efd int               // -1 without wakeup
	eng *condition.Engine // the engine of conditioned operations, started on first use (under mu)
	// engReady is eng once started: enqueuers read it without mu, which the engine
	// holds while it progresses.
	engReady atomic.Pointer[condition.Engine]
	// completions counts requests completed asynchronously (completeLocked): the engine
	// rescans its operations only when this, a trigger word or its own operation set
	// changed.
	completions atomic.Uint64

	progress *progressThread // WorkerParams.ProgressThread, nil without
}

// NewWorker creates a worker on the context.
func (c *Context) NewWorker(p WorkerParams) (*Worker, error) {
	w := &Worker{
		ctx:       c,
		eps:       map[unsafe.Pointer]*Endpoint{},
		listeners: map[uint64]*Listener{},
		am:        map[uint64]*amHandler{},
		rkeys:     map[*Rkey]struct{}{},
		efd:       -1,
	}
	wakeup := !p.NoWakeup && c.features&FeatureWakeup != 0
	err := c.register(func() error {
		raw, st := c.raw.NewWorker(wakeup)
		if err := statusErr(st); err != nil {
			return opErr("worker_create", err, "")
		}
		w.raw = raw
		c.workers[w] = struct{}{}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if wakeup {
		if fd, st := w.raw.EventFD(); st == ucx.OK {
			w.efd = fd
		}
	}
	live.workers.Add(1)
	if p.ProgressThread {
		w.startProgressThread()
	}
	return w, nil
}

// Context returns the context the worker belongs to.
func (w *Worker) Context() *Context { return w.ctx }

// Address returns the worker's address in ucpx's wire form, for ConnectAddress on a peer.
func (w *Worker) Address() ([]byte, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed.Load() {
		return nil, opErr("worker_get_address", ErrClosed, "")
	}
	a, st := w.raw.Address()
	if err := statusErr(st); err != nil {
		return nil, opErr("worker_get_address", err, "")
	}
	return encodeEnvelope(addressMagic, 0, 0, a), nil
}

// Progress runs one round of UCX progress, completes the requests and delivers the
// events it produced (callbacks run on the calling goroutine). It returns the number
// of events handled.
func (w *Worker) Progress() int { return w.progressFor(nil, 1) }

// progressFor progresses until r completes or spins rounds pass (once for a nil or
// completed r), then delivers the events; it returns the number handled.
func (w *Worker) progressFor(r *Request, spins uint) int {
	w.mu.Lock()
	if w.closed.Load() {
		w.mu.Unlock()
		return 0
	}
	var req unsafe.Pointer
	if r != nil && !r.done.Load() {
		req = r.req
	}
	if req == nil {
		spins = 1
	}
	n := w.progressLocked(req, spins)
	cbs := w.takeDeferredLocked()
	w.mu.Unlock()
	runDeferred(cbs)
	return n
}

// progressLocked progresses (until req completes or spins rounds pass, or once for a
// nil req) and handles the events, with one cgo call when a batch holds them all.
func (w *Worker) progressLocked(req unsafe.Pointer, spins uint) int {
	w.events = w.raw.ProgressDrain(req, spins, w.events[:0])
	n := len(w.events)
	for i := range w.events {
		w.handleEventLocked(&w.events[i])
	}
	if w.raw.Pending() > 0 {
		n += w.drainLocked()
	}
	return n
}

// WaitForEvents blocks until the worker may have work (its event fd fired), ctx ends,
// or at most timeout passes. Call Progress afterwards. It returns ctx's error if ctx ended.
func (w *Worker) WaitForEvents(ctx context.Context, timeout time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if w.closed.Load() {
		return opErr("worker_wait", ErrClosed, "")
	}
	w.mu.Lock()
	st := ucx.ErrBusy
	if w.efd >= 0 && !w.closed.Load() {
		st = w.raw.Arm()
	}
	w.mu.Unlock()
	if st != ucx.OK {
		// Busy: events are pending. Without wakeup, back off briefly instead.
		if w.efd < 0 {
			time.Sleep(min(timeout, 50*time.Microsecond))
		}
		return ctx.Err()
	}
	deadline := time.Now().Add(timeout)
	for {
		slice := min(time.Until(deadline), 10*time.Millisecond)
		if slice <= 0 {
			return ctx.Err()
		}
		fds := []unix.PollFd{{Fd: int32(w.efd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(slice/time.Millisecond)+1)
		if n > 0 || (err != nil && !errors.Is(err, unix.EINTR)) {
			return ctx.Err()
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if w.closed.Load() {
			return opErr("worker_wait", ErrClosed, "")
		}
	}
}

// Signal wakes a goroutine blocked in WaitForEvents.
func (w *Worker) Signal() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed.Load() {
		return opErr("worker_signal", ErrClosed, "")
	}
	return opErr("worker_signal", statusErr(w.raw.Signal()), "")
}

// drainLocked delivers queued events. Completion work that touches only ucpx state
// happens here; user callbacks are deferred until mu is released.
func (w *Worker) drainLocked() int {
	total := 0
	for w.raw.Pending() > 0 {
		w.events = w.raw.Drain(w.events[:0])
		for i := range w.events {
			w.handleEventLocked(&w.events[i])
		}
		total += len(w.events)
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
		r := w.pending[slot]
		w.pending[slot] = nil
		w.freeSlots = append(w.freeSlots, slot)
		r.req = nil
		r.completeLocked(statusErr(ev.Status), ev.Length, ev.Tag)
	case ucx.EvEPError:
		if ep := w.eps[ev.Ptr]; ep != nil {
			ep.failLocked(Status(ev.Status))
		}
	case ucx.EvConnReq:
		if l := w.listeners[ev.ID]; l != nil {
			l.deliverLocked(ucx.ConnRequestFromEvent(ev.Ptr))
		}
	case ucx.EvAmRecv:
		w.deliverAmLocked(ev)
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

func runDeferred(cbs []func()) {
	for _, f := range cbs {
		f()
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
	ucx.SetSlot(req, uint64(slot))
}

// Close cancels pending operations, force-closes endpoints and listeners, and
// destroys the worker. Pending requests complete with ErrCanceled or a peer error.
// A second Close returns ErrClosed.
func (w *Worker) Close() error {
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
	for _, l := range w.listeners {
		l.destroyLocked()
	}
	for _, ep := range w.eps {
		ep.forceCloseLocked()
	}
	for _, r := range w.pending {
		if r != nil && r.req != nil {
			w.raw.Cancel(r.req)
		}
	}
	// Let UCX finish what was canceled or force-closed; bounded so a stuck
	// transport cannot hang Close.
	deadline := time.Now().Add(2 * time.Second)
	for w.pendingCountLocked() > 0 && time.Now().Before(deadline) {
		w.raw.Progress(nil, 1)
		w.drainLocked()
	}
	w.drainLocked()
	for _, r := range w.pending {
		if r != nil { // UCX never completed it: fail it ourselves
			r.req = nil
			r.completeLocked(opErr("worker_destroy", ErrCanceled, "worker closed"), 0, 0)
		}
	}
	w.pending = nil
	for rk := range w.rkeys {
		rk.destroyLocked()
	}
	for id, h := range w.am {
		h.arg.Free()
		delete(w.am, id)
	}
	cbs := w.takeDeferredLocked()
	w.raw.Destroy()
	eng := w.eng
	w.mu.Unlock()
	if eng != nil {
		_ = eng.Close()
	}

	w.ctx.mu.Lock()
	delete(w.ctx.workers, w)
	w.ctx.mu.Unlock()
	live.workers.Add(-1)
	runDeferred(cbs)
	return nil
}

func (w *Worker) pendingCountLocked() int {
	n := 0
	for _, r := range w.pending {
		if r != nil {
			n++
		}
	}
	return n
}

// waitRequest drives progress until r completes or ctx ends. It spins first (the
// latency path), then parks on the event fd so an idle wait costs no CPU.
func (w *Worker) waitRequest(ctx context.Context, r *Request) error {
	const spinRounds = 64 // progress calls per cgo call
	start := time.Time{}
	for iter := 0; ; iter++ {
		w.mu.Lock()
		if !r.done.Load() {
			if w.closed.Load() {
				w.mu.Unlock()
				return r.errOr(opErr(r.op, ErrClosed, "worker closed"))
			}
			w.progressLocked(r.req, spinRounds)
		}
		cbs := w.takeDeferredLocked()
		w.mu.Unlock()
		runDeferred(cbs)
		if r.done.Load() {
			return r.err
		}
		if iter&63 == 63 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			default:
			}
			if start.IsZero() {
				start = time.Now()
			} else if time.Since(start) > 200*time.Microsecond {
				// Idle: park until the event fd fires, bounded so other goroutines'
				// progress and ctx are noticed.
				if err := w.WaitForEvents(ctx, time.Millisecond); err != nil && ctx.Err() != nil {
					return ctx.Err()
				}
			} else {
				runtime.Gosched()
			}
		}
	}
}

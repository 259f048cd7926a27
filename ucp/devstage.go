package ucp

import (
	"github.com/ucpx/ucpx/protocol"
)

// Device memory without a stream. UCX here cannot touch device memory, so an
// operation on a device buffer (RequestParam.MemoryType MemoryCUDA) with no condition,
// or one the engine issues at a trigger that has no stream of its own (kernel-triggered
// and graph conditions, a non-blocking receive), is staged through pinned host memory
// with the copies on the worker's stream of ContextParams.Device: an outgoing buffer
// is copied out first and the UCX operation issued once that copy is done; an incoming
// one is received into the staging buffer and copied in before the Request completes.
// The steps advance in the worker's progress (pollIPCLocked), like the IPC path's.

// devicePlain reports whether an operation without a condition stages device memory
// through the context's device.
func (w *Worker) devicePlain(p *RequestParam) bool {
	c := w.ctx
	if c.ipc == nil || c.SupportsMemoryType(MemoryCUDA) {
		return false
	}
	return declaredDevice(p)
}

// devicePool is the pinned staging pool of the context's device, made on first use.
func (w *Worker) devicePool() *protocol.Pool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.devPool == nil {
		w.devPool = protocol.NewPool(w.ctx.ipc.dev)
	}
	return w.devPool
}

// prepareDevice makes what a device operation of n bytes (0: not staged) will need
// before the engine issues it, so the engine makes no allocating driver call: a
// staging buffer held in res and an event of the worker's pool kept for ev, both until
// the operation ended (its condRequest releases them), and the worker's stream. Called
// at submit, on the caller's goroutine.
func (w *Worker) prepareDevice(n int, res *protocol.Reservation, ev *eventReservation) error {
	if n > 0 {
		if err := w.devicePool().Hold(res, n); err != nil {
			return err
		}
	}
	_, err := w.ipcSideStream()
	if err == nil {
		err = w.reserveEvent(ev)
	}
	if err != nil {
		res.Release()
		return err
	}
	return nil
}

// eventReservation keeps an event of the worker's pool (ipcEvents) for one operation
// the engine issues on the device, for as long as the operation lives (a graph's,
// every launch): each operation the engine may issue at one trigger finds its event in
// the pool, so the engine makes none (cuEventCreate allocates). The pool keeps
// Worker.ipcEvKept events for the held reservations whose operation holds none now;
// other takers take only the rest (takeIPCEventLocked). An issue takes the kept event
// (using), and its return (putIPCEvent) keeps it for the reservation again.
type eventReservation struct {
	w     *Worker
	held  bool // under w.mu
	using bool // the operation's issue holds the event (under w.mu)
}

// reserveEvent makes res hold an event of w's pool, making events as needed, on the
// caller's goroutine. A reservation held already stays as it is.
func (w *Worker) reserveEvent(res *eventReservation) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if res.held {
		return nil
	}
	for len(w.ipcEvents) <= w.ipcEvKept {
		if w.closed.Load() {
			return ErrClosed // closeIPCLocked released the pool: an event made now would leak
		}
		ev, err := w.ctx.ipc.dev.NewEvent()
		if err != nil {
			return err
		}
		w.ipcEvents = append(w.ipcEvents, ev)
	}
	w.ipcEvKept++
	res.w, res.held, res.using = w, true, false
	return nil
}

// release ends the reservation (a no-op on one not held): an event its operation
// still holds goes back to the pool as anyone's.
func (res *eventReservation) release() {
	w := res.w
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !res.held {
		return
	}
	res.held = false
	if !res.using {
		w.ipcEvKept--
	}
}

// endUseLocked: the event the operation's issue took is back in the pool, kept for
// res again while it is held. Caller holds w.mu.
func (res *eventReservation) endUseLocked() {
	if !res.using {
		return
	}
	res.using = false
	if res.held {
		res.w.ipcEvKept++
	}
}

// stagedDevice runs issue (the operation with no condition, on host memory) on a
// staging buffer standing for the device buffer buf.
func (w *Worker) stagedDevice(op string, p *RequestParam, buf []byte, dir protocol.Direction, issue func(b []byte, ip *RequestParam) (*Request, error)) (*Request, error) {
	ip := *p
	ip.MemoryType, ip.MemH, ip.Staging = MemoryHost, nil, protocol.StageWhenNeeded
	ip.stageRes, ip.evRes = nil, nil
	if len(buf) == 0 {
		// Nothing to stage: the operation is the caller's as it is.
		return issue(buf, &ip)
	}
	ip.Callback, ip.Request = nil, nil
	// The engine's issue takes the buffer reserved at the submit (no allocation there).
	mem, release, err := w.devicePool().LendReserved(p.stageRes, len(buf), &w.staging)
	if err != nil {
		return nil, opErr(op, err, "staging memory")
	}
	staged := mem.Bytes()[:len(buf)]
	// The event first (the engine's issue: the one reserved at the submit, p.evRes),
	// so that a failure leaves the caller's Request (RequestParam.Request) untouched.
	pre := ipcWait{evRes: p.evRes}
	ev, side, err := w.ipcResources(&pre)
	if err != nil {
		release()
		return nil, opErr(op, err, "")
	}
	r, x := w.newIPCRequest(op, p)
	x.evRes = pre.evRes // nil unless ev is the reserved event (takeIPCEventLocked)
	dev := uintptr(bufPtr(buf))
	fail := func(err error) (*Request, error) {
		release()
		w.mu.Lock()
		r.unpinIPC(ev)
		w.mu.Unlock()
		return nil, opErr(op, err, "")
	}

	if dir == protocol.Out {
		// Copy out, then issue; the Request follows the UCX operation.
		w.mu.Lock()
		err := side.Copy(mem.Addr(), dev, len(buf))
		if err == nil {
			err = side.Record(ev)
		}
		if err != nil {
			w.mu.Unlock()
			return fail(err)
		}
		x.ev = ev
		x.then = func(x *ipcWait, err error) (bool, error) {
			w.putIPCEvent(x, x.ev)
			x.ev = nil
			if err != nil {
				release()
				return true, err
			}
			w.issueLaterLocked(x, func() (*Request, error) { return issue(staged, &ip) }, func(*Request) { release() })
			return false, nil
		}
		w.trackIPCLocked(r)
		w.mu.Unlock()
		return r, nil
	}

	// Receive into the staging buffer, then copy in (a pulled tag message's data goes
	// to the device memory directly).
	ip.pullDev = dev
	in, err := issue(staged, &ip)
	if err != nil {
		return fail(err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	// ev waits, unused, for the copy in.
	x.deps = []*Request{in}
	x.then = func(x *ipcWait, err error) (bool, error) {
		if err != nil {
			release()
			return true, err
		}
		n := len(buf)
		if in.length > 0 || op == "tag_recv_nbx" {
			n = min(in.length, n)
		}
		x.length, x.tag = in.length, in.tag
		x.deps = nil
		if n == 0 || in.pulledDirect() {
			release()
			w.putIPCEvent(x, ev)
			return true, nil
		}
		s := w.ipcStream
		if s == nil {
			release()
			return true, opErr(op, ErrClosed, "the worker's device stream")
		}
		err = s.Copy(dev, mem.Addr(), n)
		if err == nil {
			err = s.Record(ev)
		}
		if err != nil {
			w.putIPCEvent(x, ev)
			release()
			return true, err
		}
		x.ev = ev // the event goes back to the pool when the request completes
		x.then = func(x *ipcWait, err error) (bool, error) {
			release()
			return true, err
		}
		return false, nil
	}
	w.trackIPCLocked(r)
	return r, nil
}

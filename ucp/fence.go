package ucp

import (
	"slices"
)

// Fence orders the worker's RMA and atomic operations (ucp_worker_fence): those
// issued after it are carried out at their targets after those issued before it, on
// every endpoint of the worker. It waits for nothing; UCX may keep an operation
// issued after the fence in the worker's queue until the earlier ones completed, so
// the worker must go on being progressed until they left.
//
// UCX's fence orders what UCX carries. With ContextParams.Device some operations move
// outside it: copies into a same-host peer's device region (CUDA IPC) and device
// buffers staged through host memory, whose UCX operation is issued only once their
// copy is done. An operation without a condition issued after the fence then waits,
// unissued, until those issued before it are done; a copy issued after it also waits
// for a worker flush of the UCX operations before it. Its Request completes once it
// was issued and completed. Operations under a condition are issued when their
// condition triggers (a Stream condition's copy at the call, in its stream's order):
// the fence orders them by that issue only as far as UCX carries them.
func (w *Worker) Fence() error {
	const op = "worker_fence"
	if w == nil {
		return opErr(op, ErrInvalidParam, "nil worker")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed.Load() {
		return opErr(op, ErrClosed, "")
	}
	if err := statusErr(w.raw.Fence()); err != nil {
		return opErr(op, err, "")
	}
	if w.ctx.ipc == nil {
		return nil // everything this worker moves, UCX carries
	}
	var before []*Request
	w.eachIPCLocked(func(r *Request) {
		if !r.done.Load() && fenceOrders(r.op) {
			before = append(before, r)
		}
	})
	w.fenceBefore = before
	w.fenceHeld.Store(len(before) > 0)
	// UCX's operations before the fence may still be on their way: the first copy
	// after it waits for a worker flush made then (a new one: one an earlier fence
	// made covers less).
	w.fenceFlush = nil
	w.fenceFlushes.Store(true)
	return nil
}

// The state of the last Fence (under w.mu): fenceBefore are the operations UCX does
// not carry (or not yet) issued before it, which every later RMA and atomic waits for
// while fenceHeld; fenceFlushes: a copy on a stream issued later waits for fenceFlush,
// a worker flush it starts, since UCX's fence does not order copies. The atomics are
// read without the lock on the issue paths: after a fence with nothing pending, an
// operation UCX carries takes no detour.

// fenceOrders reports whether Fence orders operations named op (RMA and atomics).
func fenceOrders(op string) bool {
	switch op {
	case "put_nbx", "get_nbx", "put_signal_nbx", "atomic_op_nbx":
		return true
	}
	return false
}

// fenceBinds reports whether the last Fence may hold back an operation without a
// condition issued now (direct: a copy on a stream or a CPU store, which UCX's fence
// does not order).
func (w *Worker) fenceBinds(direct bool) bool {
	return w.fenceHeld.Load() || (direct && w.fenceFlushes.Load())
}

// fenceHoldLocked returns what an operation issued now must wait for under the last
// Fence (nil: nothing), and lets go of what is done.
func (w *Worker) fenceHoldLocked(direct bool) []*Request {
	var deps []*Request
	if w.fenceHeld.Load() {
		live := w.fenceBefore[:0]
		for _, r := range w.fenceBefore {
			if !r.done.Load() {
				live = append(live, r)
			}
		}
		clear(w.fenceBefore[len(live):])
		w.fenceBefore = live
		w.fenceHeld.Store(len(live) > 0)
		deps = slices.Clone(live)
	}
	if !direct || !w.fenceFlushes.Load() {
		return deps
	}
	if w.fenceFlush == nil {
		r, err := w.postLocked("worker_flush_nbx", w.raw.Flush(defaultParam.flags()), &defaultParam, nil)
		if err != nil || r.done.Load() {
			// Nothing on its way (or the worker failed, which later operations see).
			w.fenceFlushes.Store(false)
			return deps
		}
		w.fenceFlush = r
	}
	if w.fenceFlush.done.Load() {
		w.fenceFlush = nil
		w.fenceFlushes.Store(false)
		return deps
	}
	return append(deps, w.fenceFlush)
}

// fenced issues an operation without a condition (issue, with the caller's param p)
// behind the last Fence: at once when nothing before the fence is pending (handled
// false), else as a Request that issues it once that is done. direct: the operation
// is a copy on a stream.
func (w *Worker) fenced(op string, p *RequestParam, direct bool, issue func(ip *RequestParam) (*Request, error)) (r *Request, handled bool) {
	if p.Condition != nil || p.unfenced || !w.fenceBinds(direct) {
		return nil, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	deps := w.fenceHoldLocked(direct)
	if len(deps) == 0 {
		return nil, false
	}
	ip := *p
	ip.Callback, ip.Request, ip.unfenced = nil, nil, true
	r, x := w.newIPCRequest(op, p)
	x.deps = deps
	x.then = func(x *ipcWait, _ error) (bool, error) {
		// What came before the fence is done (its failures are its own): issue.
		w.issueLaterLocked(x, func() (*Request, error) { return issue(&ip) }, func(in *Request) {
			if in != nil {
				r.fetched = in.Fetched()
			}
		})
		return false, nil
	}
	w.trackIPCLocked(r)
	return r, true
}

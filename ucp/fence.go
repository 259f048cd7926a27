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
	g := &fenceGate{needFlush: true}
	w.eachIPCLocked(func(r *Request) {
		if !r.done.Load() && fenceOrders(r.op) {
			g.before = append(g.before, r)
		}
	})
	w.fence = g
	w.fenceOn.Store(true)
	return nil
}

// fenceGate is what the last Fence holds later operations back for.
type fenceGate struct {
	// before: operations UCX does not carry (or not yet), issued before the fence.
	before []*Request
	// needFlush: UCX operations issued before the fence may still be on their way,
	// which a copy on a stream would overtake; flush is the worker flush the first copy
	// after the fence started for them.
	needFlush bool
	flush     *Request
}

// fenceOrders reports whether Fence orders operations named op (RMA and atomics).
func fenceOrders(op string) bool {
	switch op {
	case "put_nbx", "get_nbx", "put_signal_nbx", "atomic_op_nbx":
		return true
	}
	return false
}

// fenceHoldLocked returns what an operation issued now must wait for under the last
// Fence (nil: nothing); direct: it is a copy on a stream, which UCX's fence does not
// order. It drops the gate once nothing is left to wait for.
func (w *Worker) fenceHoldLocked(direct bool) []*Request {
	g := w.fence
	if g == nil {
		return nil
	}
	live := g.before[:0]
	for _, r := range g.before {
		if !r.done.Load() {
			live = append(live, r)
		}
	}
	clear(g.before[len(live):])
	g.before = live
	if g.flush != nil && g.flush.done.Load() {
		g.flush, g.needFlush = nil, false
	}
	if len(g.before) == 0 && !g.needFlush {
		w.fence = nil
		w.fenceOn.Store(false)
		return nil
	}
	if !direct {
		return slices.Clone(g.before)
	}
	if g.needFlush && g.flush == nil {
		r, err := w.postLocked("worker_flush_nbx", w.raw.Flush(defaultParam.flags()), &defaultParam, nil)
		if err != nil || r.done.Load() {
			// Nothing on its way (or the worker failed, which later operations see).
			g.needFlush = false
		} else {
			g.flush = r
		}
	}
	deps := slices.Clone(g.before)
	if g.flush != nil {
		deps = append(deps, g.flush)
	}
	return deps
}

// fenced issues an operation without a condition (issue, with the caller's param p)
// behind the last Fence: at once when nothing before the fence is pending (handled
// false), else as a Request that issues it once that is done. direct: the operation
// is a copy on a stream.
func (w *Worker) fenced(op string, p *RequestParam, direct bool, issue func(ip *RequestParam) (*Request, error)) (r *Request, handled bool) {
	if p.Condition != nil || p.unfenced || !w.fenceOn.Load() {
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

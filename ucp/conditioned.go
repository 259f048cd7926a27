package ucp

import (
	"runtime"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/trace"
)

// NonBlockingEnqueue, on an operation with a Stream condition, enqueues only the trigger:
// the stream does not wait for completion. Wait on the Request, or order a stream after
// it with Request.WaitOnStream (the MPIX Isend_enqueue / Wait_enqueue pattern).
const NonBlockingEnqueue OpFlags = 1 << 31

// ucpxOnlyFlags are OpFlags bits UCX never sees.
const ucpxOnlyFlags = NonBlockingEnqueue

// A conditioned operation crosses between ucp and condition twice: ucp hands it to the
// worker's engine once (Engine.Submit), and the engine calls it back once per trigger
// (conditioned.Issue), which runs the ordinary nbx path. The user's Request reads the
// engine's Op for its completion.

// conditioned is the condition.Operation of one nbx call.
type conditioned struct {
	w *Worker
	// param is what the nbx call gets: no condition, no callback. A tag operation's
	// names the condRequest's own inner Request (caller-owned): a tag operation moves in
	// one part, as is or staged, so the round that issues it as is allocates nothing,
	// and a graph's operation reuses it at every launch (the engine issues it again only
	// after it completed).
	param RequestParam
	issue func(off int, buf []byte, p *RequestParam) (*Request, error)
}

// Issue runs the nbx call on one part of the plan.
func (c *conditioned) Issue(p *protocol.Part) (condition.Issued, error) {
	ip := &c.param
	if p.Staged {
		// A staging buffer is host memory under no registration of the caller's, and
		// neither the inner Request nor the buffer's pin is its.
		staged := c.param
		staged.MemoryType, staged.MemH = MemoryHost, nil
		staged.Request, staged.pinnedBuf, staged.stageRes, staged.evRes = nil, false, nil, nil
		ip = &staged
	}
	r, err := c.w.issueLocking(func() (*Request, error) { return c.issue(p.Offset, p.Buf, ip) })
	if err != nil {
		return nil, err
	}
	return r, nil
}

// EnqueueChain adds the operation to a completion chain (condition.ChainOperation: a
// host graph launched as one chain): a tag send or receive of memory UCX takes as is,
// with the buffer, tag and peer of Issue. Others are refused (ErrUnsupported).
func (c *conditioned) EnqueueChain(ch *condition.Chain, p *protocol.Part) error {
	q := &c.param
	switch {
	case p == nil || p.Staged || p.Offset != 0:
		return opErr("chain", ErrUnsupported, "an operation moved staged or in parts")
	case q.Peer != nil || q.Flags != 0 || q.Callback != nil:
		return opErr("chain", ErrUnsupported, "an operation with Peer or Flags")
	case declaredDevice(q) || c.w.stagesPlain(q):
		return opErr("chain", ErrUnsupported, "device memory or staging")
	}
	// The condRequest's pin holds a graph operation's buffer for its life: the chain
	// pins nothing, so a chain never Closed leaves no pinned pointer to the collector.
	ip := RequestParam{Chain: ch, MemoryType: q.MemoryType, MemH: q.MemH, pinnedBuf: q.pinnedBuf}
	_, err := c.issue(p.Offset, p.Buf, &ip)
	return err
}

// condRequest is what one conditioned operation allocates: the user's Request, the
// engine's Op and the Operation, together.
type condRequest struct {
	Request
	op        condition.Op
	operation conditioned
	// inner: a tag operation's issued Request (conditioned.param).
	inner Request
	// pin holds the buffer of a graph's operation issued whole, from the call until the
	// operation completed for good (its condition destroyed, or the engine closed), so
	// its issue at every launch does not pin and unpin it.
	pin runtime.Pinner
	// res: the staging buffer of an operation the engine issues staged through the
	// device (devstage.go), reserved at the call for the same life as pin, so the
	// engine allocates no pinned memory at any issue; evRes: the event of the worker's
	// pool that issue records, reserved with res (also for a CUDA-IPC operation that
	// is not staged), so the engine makes no event either.
	res   protocol.Reservation
	evRes eventReservation
}

// releaseReservations ends what prepareDevice reserved for c (no-ops if nothing was).
func (c *condRequest) releaseReservations() {
	c.res.Release()
	c.evRes.release()
}

// engine returns the worker's engine, starting it on first use.
func (w *Worker) engine() (*condition.Engine, error) {
	if e := w.engReady.Load(); e != nil {
		return e, nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed.Load() {
		return nil, ErrClosed
	}
	if w.eng == nil {
		cfg := w.ctx.protocol
		cfg.Stats = &w.staging // Worker.StagingStats
		e, err := condition.NewEngine(workerTransport{w}, cfg, w.ctx.SupportsMemoryType(MemoryCUDA))
		if err != nil {
			return nil, err
		}
		e.SetTrace(trace.FromEnv()) // UCPX_TRACE
		w.eng = e
		w.engReady.Store(e)
	}
	return w.eng, nil
}

// workerTransport is the worker as the engine's transport.
type workerTransport struct{ w *Worker }

func (t workerTransport) Progress(oldest condition.Issued) bool {
	r, _ := oldest.(*Request)
	return t.w.progressFor(r, 16) > 0
}

func (t workerTransport) Completions() uint64 { return t.w.completions.Load() }

// Closing implements condition.TransportClosing: Close set closed before it cancels
// what is in flight, so a graph launch those cancellations fail fails for good.
func (t workerTransport) Closing() bool { return t.w.closed.Load() }

// submit hands an operation with a condition to the worker's engine: issue performs
// it (on the part of buf at offset off) once the condition triggers. Everything the
// call can check is checked here, so bad input fails at the call.
func (w *Worker) submit(op string, p *RequestParam, buf []byte, dir protocol.Direction, splittable bool, issue func(off int, buf []byte, p *RequestParam) (*Request, error)) (*Request, error) {
	return w.submitTransfer(op, p, buf, dir, splittable, false, false, issue)
}

// submitTransfer is submit; direct says the operation moves device memory itself (the
// CUDA IPC path), so the plan stages nothing; stageDirect, that the call at the trigger
// stages it through the device's pool (ipcIssueOn under StageAlways).
func (w *Worker) submitTransfer(op string, p *RequestParam, buf []byte, dir protocol.Direction, splittable, direct, stageDirect bool, issue func(off int, buf []byte, p *RequestParam) (*Request, error)) (*Request, error) {
	if w.closed.Load() {
		return nil, opErr(op, ErrClosed, "")
	}
	// Not under w.mu, which the engine holds while it progresses. A Close racing with
	// this is caught by the engine (closed: the operation fails) or its planner.
	eng, err := w.engine()
	if err != nil {
		return nil, opErr(op, err, "")
	}
	c := &condRequest{}
	r := &c.Request
	r.w, r.op, r.cop = w, op, &c.op
	c.operation.w, c.operation.issue = w, issue
	c.operation.param = *p
	c.operation.param.Condition, c.operation.param.Callback = nil, nil
	c.operation.param.Flags &^= ucpxOnlyFlags
	if !direct {
		// The plan applied the policy; a StageAlways message the call stages itself
		// (no stream to stage on) must not go by pull either.
		c.operation.param.noPull = p.noPull || p.Staging.Or(w.ctx.protocol.Staging) == protocol.StageAlways
		c.operation.param.Staging = protocol.StageWhenNeeded
	} // else the call at the trigger applies it (ipcIssue)
	// reserves: the engine's issue runs on the device: it records an event of the
	// worker's pool, from c.evRes, and if staged stages through the device's pool, from
	// c.res.
	reserves := direct
	if reserves {
		n := 0
		if stageDirect {
			n = len(buf)
		}
		if err := w.prepareDevice(n, &c.res, &c.evRes); err != nil {
			return nil, opErr(op, err, "device resources")
		}
	}
	pinned := false
	if op == "tag_send_nbx" || op == "tag_recv_nbx" {
		c.operation.param.Request = &c.inner
		if b := bufPtr(buf); b != nil && p.MemH == nil && p.Condition.Category() == condition.Graph {
			// A graph's operation is issued at every launch: pinned once for its life.
			// Others pin at their one issue, and only if it does not complete in place
			// (a Pinner allocates, and sets a finalizer, on its first pin).
			c.pin.Pin(b) // a no-op for memory Go does not manage
			c.operation.param.pinnedBuf, pinned = true, true
		}
	}
	sub := condition.Submission{
		What: op,
		Transfer: protocol.Transfer{
			Buf:            buf,
			Dir:            dir,
			Splittable:     splittable,
			RegisteredHost: p.MemH != nil && p.MemH.MemoryType() == MemoryHost,
			DeclaredDevice: p.MemoryType == MemoryCUDA || p.MemoryType == MemoryCUDAManaged,
			Staging:        p.Staging,
			Direct:         direct,
		},
		NonBlocking: p.Flags&NonBlockingEnqueue != 0,
	}
	if !direct && dir != protocol.NoBuffer && w.devicePlain(p) {
		// Where the plan finds no stream to stage on, the engine issues the call with
		// no condition at the trigger, which stages through the context's device
		// (devstage.go); what that needs is made when the plan decides so.
		sub.Transfer.StageOffStream = func() error { return w.prepareDevice(len(buf), &c.res, &c.evRes) }
		reserves = true
		// A tag receive a pulled message can fill (tagpull.go) is staged at the issue,
		// where the pull writes the device memory directly.
		sub.Transfer.PullableIn = op == "tag_recv_nbx" && len(buf) >= tagPullConditioned
	}
	if reserves {
		c.operation.param.stageRes = &c.res // held only if the plan stages off stream
		c.operation.param.evRes = &c.evRes
	}
	switch cb := p.Callback; {
	case pinned || reserves:
		sub.Callback = func() {
			c.releaseReservations() // no-ops if none was made
			if pinned {
				c.pin.Unpin()
			}
			if cb != nil {
				runRecovered(func() { cb(r) })
			}
		}
	case cb != nil:
		sub.Callback = func() { runRecovered(func() { cb(r) }) }
	}
	if err := eng.Submit(&c.op, p.Condition, &c.operation, sub); err != nil {
		if c.op.Submitted() {
			// The trigger is enqueued (the operation will run), something after it was
			// not: report it with the request.
			return r, opErr(op, err, "condition")
		}
		if pinned {
			c.pin.Unpin()
		}
		c.releaseReservations() // the plan may have reserved before the engine refused it
		return nil, opErr(op, err, "condition")
	}
	return r, nil
}

// Trace makes the worker's engine record the timeline of every conditioned operation
// into r from now on (nil stops): enqueue, the trigger the engine saw, the UCX issue,
// the completion and the completion store, as trace.Recorder writes them (Chrome trace
// JSON). UCPX_TRACE=file traces every worker of the process into file instead.
func (w *Worker) Trace(r *trace.Recorder) error {
	if w == nil {
		return opErr("trace", ErrInvalidParam, "nil worker")
	}
	e, err := w.engine()
	if err != nil {
		return opErr("trace", err, "")
	}
	e.SetTrace(r)
	return nil
}

package ucp

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/ucpx/ucpx/cgo/ucx"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream/streamcore"
)

// OpFlags are ucp_op_attr_t flags.
type OpFlags uint32

const (
	// NoImmediateCompletion makes every operation return a pending Request and run its
	// Callback, even when UCX could complete it in place.
	NoImmediateCompletion = OpFlags(ucx.OpNoImmCmpl)
	// FastCompletion expedites local completion, possibly delaying remote delivery.
	FastCompletion = OpFlags(ucx.OpFastCmpl)
	// ForceImmediateCompletion fails with ErrNoResource if the operation cannot complete in place.
	ForceImmediateCompletion = OpFlags(ucx.OpForceImmCmpl)
	// MultiSend optimises for bandwidth of many operations in flight.
	MultiSend = OpFlags(ucx.OpMultiSend)
)

// knownOpFlags are the flags an operation accepts; any other bit is refused at the call.
const knownOpFlags = NoImmediateCompletion | FastCompletion | ForceImmediateCompletion | MultiSend | NonBlockingEnqueue

// RequestParam mirrors ucp_request_param_t. A nil *RequestParam means defaults.
type RequestParam struct {
	// Callback runs when an operation that did not complete in place completes, on the
	// goroutine that drove the progress which completed it, without worker locks held.
	// As in UCX it does not run for operations that complete immediately (the call's
	// returned Request is already done); set NoImmediateCompletion to always get it.
	// With a Condition it runs after the engine's round that retired the operation, in
	// retirement order; that round may run on a host stream's executor, so a Callback
	// must not wait for later work of the condition's stream (as a CUDA host function
	// must not).
	Callback func(*Request)
	// MemoryType of the local buffer; the zero value means host memory for Go slices.
	// Use MemoryUnknown to let UCX detect it.
	MemoryType MemoryType
	// MemH is a registration covering the buffer, letting UCX skip its own lookup.
	MemH *MemH
	// Flags are operation attribute flags: NoImmediateCompletion, FastCompletion,
	// ForceImmediateCompletion, MultiSend, NonBlockingEnqueue; other bits are refused.
	Flags OpFlags
	// AmFlags are AM send flags (AmReply, AmEager, AmRendezvous; other bits are
	// refused); AmSendNbx only.
	AmFlags AmSendFlags
	// Peer, on a receive, names the endpoint the message is expected from: if that
	// endpoint fails, the receive completes with the peer's error instead of waiting
	// forever (tag receives are not tied to an endpoint in UCX).
	Peer *Endpoint
	// Condition defers the operation until the condition triggers (a stream reaches the
	// point of the call, a kernel or Trigger fires the handle). The worker's engine
	// issues it; the Request completes on the goroutine that ran the engine's round,
	// which also runs Callback. With a Stream condition, later work on the stream waits
	// for the completion unless Flags has NonBlockingEnqueue.
	Condition *condition.Condition
	// Chain enqueues the operation into a completion chain instead of posting it: it
	// starts when the chain's step before its own completed, posted from the UCX
	// completion callback in C (see condition.Chain; tag sends and receives only). The
	// call then returns a nil Request and nil error: the chain reports completion
	// (Chain.Wait, Chain.Err). Buffers stay pinned until the chain is destroyed (by
	// Destroy, or by a cleanup once the Chain is dropped undestroyed).
	// Callback, Condition, Request and Peer cannot go with it.
	Chain *condition.Chain
	// Request, if set, is a Request the caller owns and reuses across operations (a
	// loop's request): the call tracks the operation in it and returns it, so the call
	// allocates nothing. Any Request the caller holds that is done may be reused (a zero
	// Request too); one still pending gives ErrInvalidParam, and so does a Condition or
	// a call that issues several operations (PutSignalNbx). One that is done but whose
	// Callback has not returned yet (it runs on the goroutine that drove the progress,
	// which may be another) gives ErrBusy, also from within that Callback: the
	// Callback sees its own operation's results. Its previous results are gone once it
	// is reused. One goroutine at a time may reuse it: of two calls racing on one, the
	// second to post fails with ErrInvalidParam and touches no other operation.
	Request *Request
	// Staging is the operation's workspace policy (protocol.StageAlways,
	// StageNever, ...); the zero value takes the context's (ContextParams.Protocol).
	// The fused calls (TagSend, TagRecv, TagSendRecv) take no RequestParam and
	// never stage: they are the host-memory fast path.
	Staging protocol.Staging

	// staged runs once on completion of an operation moved through staging memory
	// with CPU copies (no condition): it copies a receive out and gives the memory back.
	staged func(r *Request)
	// unfenced: the operation is issued by a Fence's gate (fence.go), which already
	// waited for what came before the fence.
	unfenced bool
	// pullDev: a tag receive into a staging buffer standing for this device memory,
	// where a pulled message's data goes directly (devstage.go, tagpull.go).
	pullDev uintptr
	// noPull: a message the engine issues under StageAlways is staged, not pulled.
	noPull bool
	// pinnedBuf: the buffer stays pinned for the operation's life by its owner (a
	// conditioned operation's condRequest), so an issue does not pin it again.
	pinnedBuf bool
	// stageRes: the staging buffer reserved at the submit of an operation the engine
	// issues staged through the device (its condRequest's), lent at the issue.
	stageRes *protocol.Reservation
	// evRes: the event reserved at the same submit, with the same life (devstage.go).
	evRes *eventReservation
}

var defaultParam RequestParam

// Request tracks one operation. A Request returned with a nil error is either done
// (the operation completed in place) or pending; Wait, Test and Callback observe the
// completion. Fields are read-only to the user.
type Request struct {
	w    *Worker
	op   string
	req  unsafe.Pointer // UCX request while pending (under w.mu)
	done atomic.Bool
	// cbDue: the operation's Callback is queued and has not returned yet; a reuse
	// then would show the Callback the next operation.
	cbDue atomic.Bool
	// parked counts goroutines parked on the event fd for this request: its completion
	// by another goroutine must wake them.
	parked atomic.Int32
	slot   int32 // index in w.pending while pending
	pinned bool
	// notify: the completion comes through the event queue (cb is set), not the done
	// list, so a wait must not take it itself.
	notify bool
	// pooled: one of the worker's own requests (fused calls), never the caller's.
	pooled bool
	err    error
	length int
	tag    uint64
	// fetched is the remote value before an atomic with fetch semantics.
	fetched uint64
	cb      func(*Request)
	peer    *Endpoint
	pin     runtime.Pinner
	// finish runs once on completion under w.mu (atomic fetch results, C memory release).
	finish func(r *Request)

	// cop is the engine's view of a conditioned operation, which completes it.
	cop *condition.Op
	// ipc: a copy of the same-host device path, or a flush waiting for such copies
	// (ipc.go); completed by the worker's progress polling it.
	ipc *ipcWait
	// dest: where a tag receive on a context with a device lands, for a pulled
	// message (tagpull.go); nil elsewhere. Kept across reuse.
	dest *recvDest
}

// issued is the UCX request a one-part conditioned operation ran as, once done (nil
// otherwise): its results are the operation's.
func (r *Request) issued() *Request {
	in, _ := r.cop.Issued().(*Request)
	return in
}

// completedRequest is shared by every send that completes in place: it carries no
// per-operation data, so one immutable value serves all and costs no allocation.
var completedRequest = func() *Request {
	r := &Request{op: "completed"}
	r.done.Store(true)
	return r
}()

// Done reports whether the operation completed, without driving progress.
func (r *Request) Done() bool {
	if r == nil {
		return false
	}
	if r.cop != nil {
		return r.cop.Done()
	}
	return r.done.Load()
}

// Err is the operation's result once Done; nil while pending.
func (r *Request) Err() error {
	if r == nil {
		return opErr("request", ErrInvalidParam, "nil request")
	}
	if r.cop != nil {
		return r.cop.Err()
	}
	if !r.done.Load() {
		return nil
	}
	return r.err
}

// Length is the received length (tag receive, AM receive) once Done.
func (r *Request) Length() int {
	if r == nil {
		return 0
	}
	if r.cop != nil {
		if in := r.issued(); in != nil {
			return in.length
		}
	}
	return r.length
}

// SenderTag is the tag of the matched message (tag receive) once Done.
func (r *Request) SenderTag() uint64 {
	if r == nil {
		return 0
	}
	if r.cop != nil {
		if in := r.issued(); in != nil {
			return in.tag
		}
	}
	return r.tag
}

// Test drives one round of progress if the request is pending and reports whether
// it is done, with its error.
func (r *Request) Test() (bool, error) {
	if r == nil {
		return false, opErr("test", ErrInvalidParam, "nil request")
	}
	if r.cop != nil {
		return r.cop.Test()
	}
	if r.done.Load() {
		return true, r.err
	}
	if r.w == nil {
		return false, opErr("test", ErrInvalidParam, "a Request never issued")
	}
	r.w.progressFor(r, 1)
	if r.done.Load() {
		return true, r.err
	}
	return false, nil
}

// Wait drives progress until the operation completes or ctx ends. When ctx ends first
// it returns ctx.Err() and the operation stays pending (Cancel it if it should stop).
func (r *Request) Wait(ctx context.Context) error {
	if r == nil {
		return opErr("wait", ErrInvalidParam, "nil request")
	}
	if ctx == nil {
		return opErr("wait", ErrInvalidParam, "nil context")
	}
	if r.cop != nil {
		return r.cop.Wait(ctx)
	}
	if r.done.Load() {
		return r.err
	}
	if r.w == nil {
		return opErr("wait", ErrInvalidParam, "a Request never issued")
	}
	if r.ipc != nil {
		return r.w.waitIPC(ctx, r)
	}
	return r.w.waitRequest(ctx, r)
}

// WaitOnStream orders s after a conditioned operation: work enqueued on s afterwards runs
// only once the operation has completed (MPIX Wait_enqueue). s must be of the
// condition's backend. A done operation, or one without a condition, needs no wait.
func (r *Request) WaitOnStream(s streamcore.Stream) error {
	if r == nil {
		return opErr("wait_on_stream", ErrInvalidParam, "nil request")
	}
	if s == nil {
		return opErr("wait_on_stream", ErrInvalidParam, "nil stream")
	}
	if r.cop == nil {
		if r.ipc != nil {
			return r.w.ipcWaitOnStream(r, s)
		}
		if !r.done.Load() {
			return opErr("wait_on_stream", ErrInvalidParam, "%s has no condition: wait on the host", r.op)
		}
		return nil
	}
	return opErr("wait_on_stream", r.cop.WaitOnStream(s), "%s", r.op)
}

// Cancel asks UCX to cancel a pending operation; it then completes with ErrCanceled
// (or its real result if it completed first). Canceling a done request does nothing.
func (r *Request) Cancel() {
	if r == nil {
		return
	}
	if r.cop != nil {
		r.cop.Cancel()
		return
	}
	if r.done.Load() || r.w == nil { // a zero Request was never issued
		return
	}
	w := r.w
	if r.ipc != nil {
		// A staged operation: cancel the UCX operation it waits for (a receive into
		// staging memory); copies and flushes have nothing to cancel.
		w.mu.Lock()
		var deps []*Request
		if !r.ipc.flush {
			deps = append(deps, r.ipc.deps...)
		}
		w.mu.Unlock()
		for _, d := range deps {
			d.Cancel()
		}
		return
	}
	w.mu.Lock()
	if r.req != nil && !w.closed.Load() {
		w.raw.Cancel(r.req)
		w.raw.Reap()
		w.afterLocked()
	}
	w.unlockDeferred()
}

func (r *Request) errOr(err error) error {
	if r.done.Load() {
		return r.err
	}
	return err
}

// completeLocked records the result, releases what the operation held and queues the
// user callback. Called once, under w.mu.
func (r *Request) completeLocked(err error, length int, tag uint64) {
	if err != nil {
		if r.peer != nil && r.peer.err != nil && errors.Is(err, ErrCanceled) {
			err = r.peer.err // canceled because the named peer failed
		}
		if _, ok := err.(*OpError); !ok {
			err = &OpError{Op: r.op, Err: err}
		}
	}
	r.err, r.length, r.tag = err, length, tag
	if r.finish != nil {
		r.finish(r)
	}
	if r.pinned {
		r.pin.Unpin()
		r.pinned = false
	}
	if r.peer != nil {
		delete(r.peer.recvs, r)
	}
	if r.cb != nil {
		// Before done: a reuse that sees done sees cbDue too (checkReuse).
		r.cbDue.Store(true)
		cb := r.cb
		r.w.deferred = append(r.w.deferred, func() {
			defer r.cbDue.Store(false) // also when cb panics (runDeferred recovers)
			cb(r)
		})
	}
	r.done.Store(true)
	r.w.completions.Add(1)
	if r.parked.Load() > 0 {
		r.w.wakeParked = true
	}
}

// reset makes r track a new operation (a caller-owned or pooled request).
func (r *Request) reset(w *Worker, op string, cb func(*Request)) {
	r.w, r.op, r.req = w, op, nil
	r.err, r.length, r.tag, r.fetched = nil, 0, 0, 0
	r.cb, r.peer, r.finish, r.ipc = cb, nil, nil, nil
	if r.dest != nil {
		*r.dest = recvDest{}
	}
	r.notify = cb != nil
	r.done.Store(false)
}

// checkReuse validates RequestParam.Request for op.
func (p *RequestParam) checkReuse(op string) error {
	r := p.Request
	switch {
	case r == nil:
		return nil
	case p.Condition != nil:
		return opErr(op, ErrInvalidParam, "RequestParam.Request cannot track an operation with a Condition (the engine's Request does)")
	case op == "put_signal_nbx":
		return opErr(op, ErrInvalidParam, "RequestParam.Request: put_signal_nbx issues two operations")
	case r == completedRequest || r.cop != nil || r.pooled:
		return opErr(op, ErrInvalidParam, "RequestParam.Request is not the caller's to reuse (%s)", r.op)
	}
	return r.checkReusable(op)
}

// checkReusable is checkReuse's part that another goroutine can change: checkReuse
// runs it before the call, and postLocked again under w.mu (two goroutines reusing one
// Request at once both passed checkReuse, and both posts tracked it). A done Request
// is told by its atomics alone: the check of one reused at once reads no field that
// the other call's reset writes.
func (r *Request) checkReusable(op string) error {
	switch {
	case !r.done.Load() && r.w != nil:
		return opErr(op, ErrInvalidParam, "RequestParam.Request is still pending (%s): wait for it or use another", r.op)
	case r.cbDue.Load(): // after done: see completeLocked
		return opErr(op, ErrBusy, "RequestParam.Request is done but its Callback has not returned yet (%s): reuse it after that or use another", r.op)
	}
	return nil
}

// flags are the operation's flags for the glue: the user's UCX flags (check refused
// any other bit), and Notify when a callback waits for the completion.
func (p *RequestParam) flags() uint32 {
	f := uint32(p.Flags&^ucpxOnlyFlags) &^ ucx.Notify
	if p.Callback != nil {
		f |= ucx.Notify
	}
	return f
}

// post finishes an nbx call: ptr is UCX's status pointer. pins are the Go buffers UCX
// may keep while the operation is pending (pinned only then: Go's heap does not move
// objects, and the caller's slice keeps them alive across the call). immediate fills
// the results of an operation that completed in place; without it such a send returns
// the shared completed Request (or the caller's, RequestParam.Request).
//
// A caller's Request (RequestParam.Request) that another call took since this call's
// checkReuse (reused by two goroutines at once, which its doc forbids) is left alone:
// the call fails with checkReuse's error, and an operation UCX holds is tracked by a
// request of the worker's own and canceled (a receive stops; a send may still go out;
// one that completed in place stays done).
func (w *Worker) postLocked(op string, ptr unsafe.Pointer, p *RequestParam, immediate func(*Request), pins ...unsafe.Pointer) (*Request, error) {
	req, st := ucx.PtrStatus(ptr)
	if p.Request != nil && (st == ucx.OK || st == ucx.InProgress) {
		if err := p.Request.checkReusable(op); err != nil {
			err = &OpError{Op: op, Err: unwrapOp(err),
				Detail: "RequestParam.Request was taken by a concurrent call after this call checked it: one goroutine at a time may reuse it"}
			if st == ucx.InProgress {
				w.holdLocked(w.pooledLocked(op), req, p, pins)
				w.raw.Cancel(req)
			}
			return nil, err
		}
	}
	switch st {
	case ucx.OK:
		r := p.Request
		if r == nil {
			if immediate == nil {
				return completedRequest, nil
			}
			r = &Request{w: w, op: op}
		} else {
			r.reset(w, op, nil)
		}
		if immediate != nil {
			immediate(r)
		}
		r.done.Store(true)
		return r, nil
	case ucx.InProgress:
		r := p.Request
		if r == nil {
			r = &Request{w: w, op: op, cb: p.Callback, notify: p.Callback != nil}
		} else {
			r.reset(w, op, p.Callback)
		}
		w.holdLocked(r, req, p, pins)
		return r, nil
	default:
		return nil, &OpError{Op: op, Err: Status(st)}
	}
}

// holdLocked makes r (reset: no finish, nothing pinned) track UCX's pending operation
// req of a call with p: p's staging finish, and pins pinned while UCX holds them.
// Caller holds w.mu.
func (w *Worker) holdLocked(r *Request, req unsafe.Pointer, p *RequestParam, pins []unsafe.Pointer) {
	r.finish = p.staged
	if p.MemH == nil && !p.pinnedBuf { // a registration keeps its memory in place already
		for _, b := range pins {
			if b != nil {
				r.pin.Pin(b)
				r.pinned = true
			}
		}
	}
	w.trackLocked(r, req)
}

package ucp

import (
	"context"
	"errors"
	"fmt"
	"unsafe"

	"github.com/ucpx/ucpx/cgo/ucx"
)

// The blocking calls fuse an operation with its wait: one cgo call posts the operation
// and spins on it (a ping-pong's round trip usually completes inside it); only an
// operation still pending afterwards gets a Request, one of the worker's own, reused,
// which then waits as Request.Wait does. In steady state they allocate nothing.
// Buffers are host memory; they may be reused once the call returns with a nil error.

// fusedSpins is the number of progress rounds the cgo call of a blocking call spins.
const fusedSpins = spinRounds

// TagSend sends buf with tag (ucp_tag_send_nbx) and waits until buf may be reused.
// When ctx ends first it returns ctx's error; the send may still be in flight then, so
// buf must stay untouched until the endpoint is flushed or closed.
func (ep *Endpoint) TagSend(ctx context.Context, buf []byte, tag uint64) error {
	const op = "tag_send"
	if ep == nil {
		return opErr(op, ErrInvalidParam, "nil endpoint")
	}
	if ctx == nil {
		return opErr(op, ErrInvalidParam, "nil context")
	}
	if err := checkTag(op, tag); err != nil {
		return err
	}
	w := ep.w
	w.mu.Lock()
	if err := ep.usableLocked(op); err != nil {
		w.mu.Unlock()
		return err
	}
	ptr := w.raw.TagSend(ep.raw, bufPtr(buf), len(buf), tag, 0, int(MemoryHost), nil, fusedSpins)
	return ep.tagSendAfterLocked(ctx, ptr, buf, tag)
}

// tagSendAfterLocked is TagSend once its cgo call returned ptr (or a C caller's, which
// resumes here): it releases w.mu and waits.
func (ep *Endpoint) tagSendAfterLocked(ctx context.Context, ptr unsafe.Pointer, buf []byte, tag uint64) error {
	const op = "tag_send"
	w := ep.w
	req, st := ucx.PtrStatus(ptr)
	var r *Request
	if st == ucx.InProgress {
		r = w.trackPooledLocked(op, req, bufPtr(buf))
	}
	w.afterCallUnlock()
	switch st {
	case ucx.OK:
		return nil
	case ucx.InProgress:
		_, _, err := w.finishPooled(ctx, r)
		return err
	}
	return opErr(op, Status(st), "len %d tag %#x", len(buf), tag)
}

// TagRecv receives a message whose tag matches tag under mask into buf
// (ucp_tag_recv_nbx) and waits for it. It returns the received length and the
// sender's tag; a longer message fails with ErrMessageTruncated, and n and senderTag
// then tell the message's length and tag. When ctx ends first it cancels the receive
// and returns ctx's error.
func (w *Worker) TagRecv(ctx context.Context, buf []byte, tag, mask uint64) (n int, senderTag uint64, err error) {
	const op = "tag_recv"
	if w == nil {
		return 0, 0, opErr(op, ErrInvalidParam, "nil worker")
	}
	if ctx == nil {
		return 0, 0, opErr(op, ErrInvalidParam, "nil context")
	}
	if err := checkTag(op, tag); err != nil {
		return 0, 0, err
	}
	w.mu.Lock()
	if w.closed.Load() {
		w.mu.Unlock()
		return 0, 0, opErr(op, ErrClosed, "")
	}
	ptr := w.raw.TagRecv(bufPtr(buf), len(buf), tag, mask, 0, int(MemoryHost), nil, fusedSpins)
	return w.tagRecvAfterLocked(ctx, ptr, buf, tag, mask)
}

// tagRecvAfterLocked is TagRecv once its cgo call returned ptr (or a C caller's, which
// resumes here): it releases w.mu and waits.
func (w *Worker) tagRecvAfterLocked(ctx context.Context, ptr unsafe.Pointer, buf []byte, tag, mask uint64) (n int, senderTag uint64, err error) {
	const op = "tag_recv"
	req, st := ucx.PtrStatus(ptr)
	var r *Request
	if st == ucx.InProgress {
		r = w.trackPooledLocked(op, req, bufPtr(buf))
		r.setRecvBuf(w.ctx, buf, 0)
	} else {
		senderTag, n = w.raw.RecvInfo()
		if senderTag&ucx.PullBit != 0 {
			r, st = w.pulledNowLocked(op, buf, st, n, senderTag), ucx.InProgress
		}
	}
	w.afterCallUnlock()
	switch st {
	case ucx.OK:
		return n, senderTag, nil
	case ucx.InProgress:
		return w.finishPooled(ctx, r)
	case ucx.ErrMessageTruncated:
		// What arrived, as Request.Length and SenderTag tell it for an nbx receive.
		return n, senderTag, opErr(op, Status(st), "len %d tag %#x mask %#x: message %d bytes", len(buf), tag, mask, n)
	}
	return 0, 0, opErr(op, Status(st), "len %d tag %#x mask %#x", len(buf), tag, mask)
}

// ErrSendIncomplete is matched by TagSendRecv's error when the reply was received
// (the call returns its length and sender tag, and rbuf holds it) but the send did not
// complete: the error also matches the send's cause (ctx's error while the send is
// still in flight, or the send's failure).
var ErrSendIncomplete = errors.New("the reply was received but the send did not complete")

// TagSendRecv sends sbuf with stag, then receives the reply, a message whose tag
// matches rtag under rmask, into rbuf, and waits for both: a ping-pong's round trip in
// one call (usually one cgo call). What it returns:
//   - both done: the reply's length and sender tag, and a nil error (ErrMessageTruncated
//     for a longer reply, whose length and tag n and senderTag then tell, as TagRecv);
//   - the reply received but the send not completed (ctx ended while it was in flight,
//     or it failed): the reply's length and sender tag, with an error matching
//     ErrSendIncomplete and the send's cause (and ErrMessageTruncated for a longer
//     reply). The reply is the caller's: a later receive does not get it again;
//   - no reply received: 0, 0 and the error, the send's failure when the send failed
//     (the receive is then canceled), else the receive's (ctx's error when ctx ended
//     first: the receive is canceled).
//
// When ctx ends while the send is still in flight (with or without a reply), sbuf must
// stay untouched until the endpoint is flushed or closed, as with TagSend.
func (ep *Endpoint) TagSendRecv(ctx context.Context, sbuf []byte, stag uint64, rbuf []byte, rtag, rmask uint64) (n int, senderTag uint64, err error) {
	const op = "tag_send_recv"
	if ep == nil {
		return 0, 0, opErr(op, ErrInvalidParam, "nil endpoint")
	}
	if ctx == nil {
		return 0, 0, opErr(op, ErrInvalidParam, "nil context")
	}
	if err := checkTag(op, stag); err != nil {
		return 0, 0, err
	}
	if err := checkTag(op, rtag); err != nil {
		return 0, 0, err
	}
	w := ep.w
	w.mu.Lock()
	if err := ep.usableLocked(op); err != nil {
		w.mu.Unlock()
		return 0, 0, err
	}
	rptr := w.raw.TagSendRecv(ep.raw, bufPtr(sbuf), len(sbuf), stag, bufPtr(rbuf), len(rbuf), rtag, rmask, 0, fusedSpins)
	return ep.tagSendRecvAfterLocked(ctx, rptr, sbuf, stag, rbuf, rtag, rmask)
}

// tagSendRecvAfterLocked is TagSendRecv once its cgo call returned rptr (or a C
// caller's, which resumes here): it releases w.mu and waits.
func (ep *Endpoint) tagSendRecvAfterLocked(ctx context.Context, rptr unsafe.Pointer, sbuf []byte, stag uint64, rbuf []byte, rtag, rmask uint64) (n int, senderTag uint64, err error) {
	const op = "tag_send_recv"
	w := ep.w
	sreq, sst := ucx.PtrStatus(w.raw.SendReq())
	rreq, rst := ucx.PtrStatus(rptr)
	var serr error // the send's failure
	if sst != ucx.OK && sst != ucx.InProgress {
		serr = opErr(op, Status(sst), "send: len %d tag %#x", len(sbuf), stag)
	}
	// A send that failed at once posted no receive (the glue reports it canceled).
	posted := serr == nil || rst != ucx.ErrCanceled
	var sr, rr *Request
	if sst == ucx.InProgress {
		sr = w.trackPooledLocked(op, sreq, bufPtr(sbuf))
	}
	var rerr error // the receive's failure (truncation included)
	switch {
	case rst == ucx.InProgress:
		rr = w.trackPooledLocked(op, rreq, bufPtr(rbuf))
		rr.setRecvBuf(w.ctx, rbuf, 0)
		if serr != nil {
			// The send failed while the receive waits: UCX would fill rbuf after the call
			// returned, with a message a later receive should have had. Canceled, and
			// waited for, before the call returns (a reply that came first is returned).
			w.raw.Cancel(rreq)
		}
	case posted:
		senderTag, n = w.raw.RecvInfo()
		if senderTag&ucx.PullBit != 0 {
			rr = w.pulledNowLocked(op, rbuf, rst, n, senderTag)
			break
		}
		switch rst {
		case ucx.OK: // received
		case ucx.ErrMessageTruncated:
			rerr = opErr(op, Status(rst), "receive: len %d tag %#x mask %#x: message %d bytes", len(rbuf), rtag, rmask, n)
		default:
			rerr = opErr(op, Status(rst), "receive: len %d tag %#x mask %#x", len(rbuf), rtag, rmask)
		}
	}
	w.afterCallUnlock()
	if rr != nil {
		n, senderTag, rerr = w.finishPooled(ctx, rr)
	}
	if sr != nil {
		_, _, serr = w.finishPooled(ctx, sr)
	}
	// The reply is in rbuf, or (a longer one) its length and tag are known, as TagRecv
	// reports them; otherwise nothing was received.
	received := posted && (rerr == nil || errors.Is(rerr, ErrMessageTruncated))
	switch {
	case !received && sr == nil && serr != nil:
		return 0, 0, serr // the send failed in the call (the receive was canceled or never posted)
	case !received:
		return 0, 0, rerr
	case serr != nil:
		return n, senderTag, sendIncomplete(op, serr, rerr, len(sbuf), stag)
	}
	return n, senderTag, rerr
}

// sendIncomplete is TagSendRecv's error when the reply arrived but the send did not
// complete (serr): it matches ErrSendIncomplete, serr, and rerr, the reply's
// truncation, if any.
func sendIncomplete(op string, serr, rerr error, slen int, stag uint64) error {
	err := fmt.Errorf("%w: %w", ErrSendIncomplete, unwrapOp(serr))
	if rerr != nil {
		err = fmt.Errorf("%w; the reply: %w", err, unwrapOp(rerr))
	}
	return &OpError{Op: op, Detail: fmt.Sprintf("send: len %d tag %#x", slen, stag), Err: err}
}

// pulledNowLocked is the Request of a fused receive that completed in the call with a
// pulled message (its tag has the pull bit): pending until the data is pulled, or
// completed with the reason it cannot be. Caller holds w.mu.
func (w *Worker) pulledNowLocked(op string, buf []byte, st ucx.Status, n int, tag uint64) *Request {
	r := w.pooledLocked(op)
	r.setRecvBuf(w.ctx, buf, 0)
	w.pullArrivedLocked(r, st, n, tag)
	return r
}

// afterCallUnlock handles what a fused call reaped and queued, releases w.mu and runs
// the callbacks that became due.
func (w *Worker) afterCallUnlock() {
	w.afterLocked()
	tick := w.tickLocked()
	cbs := w.takeDeferredLocked()
	w.mu.Unlock()
	if cbs != nil {
		runDeferred(cbs)
	}
	if tick {
		w.reschedule()
	}
}

// trackPooledLocked tracks a pending operation of a fused call in one of the worker's
// own requests, pinning buf (a Go buffer UCX keeps while the operation is pending).
func (w *Worker) trackPooledLocked(op string, req, buf unsafe.Pointer) *Request {
	r := w.pooledLocked(op)
	if buf != nil {
		r.pin.Pin(buf)
		r.pinned = true
	}
	w.trackLocked(r, req)
	return r
}

// pooledLocked is one of the worker's own requests, reset for op.
func (w *Worker) pooledLocked(op string) *Request {
	var r *Request
	if n := len(w.reqPool); n > 0 {
		r = w.reqPool[n-1]
		w.reqPool[n-1] = nil
		w.reqPool = w.reqPool[:n-1]
	} else {
		r = &Request{pooled: true}
	}
	r.reset(w, op, nil)
	return r
}

// finishPooled waits for a fused call's request and returns it to the pool once done.
// When ctx ends first the operation is canceled (a receive stops; a send may go on); a
// request that is still pending then is left to complete on its own.
func (w *Worker) finishPooled(ctx context.Context, r *Request) (n int, tag uint64, err error) {
	err = w.waitRequest(ctx, r)
	if !r.done.Load() {
		r.Cancel()
		if !r.done.Load() {
			return 0, 0, err
		}
	}
	// Done: its own result, also when it completed as ctx ended (a receive's message is
	// the caller's then), except a cancel that ctx's end caused, which reports ctx's error.
	if err == nil || !errors.Is(r.err, ErrCanceled) {
		err = r.err
	}
	n, tag = r.length, r.tag
	w.mu.Lock()
	w.reqPool = append(w.reqPool, r)
	w.mu.Unlock()
	return n, tag, err
}

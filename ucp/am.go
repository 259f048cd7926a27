package ucp

import (
	"sync/atomic"
	"unsafe"

	"github.com/ucpx/ucpx/cgo/ucx"
	"github.com/ucpx/ucpx/protocol"
)

// AmSendFlags are ucp_am_send_flags.
type AmSendFlags uint32

const (
	// AmReply lets the receiver reply through AmMessage.ReplyEndpoint.
	AmReply = AmSendFlags(ucx.AmSendReply)
	// AmEager forces the eager protocol.
	AmEager = AmSendFlags(ucx.AmSendEager)
	// AmRendezvous forces the rendezvous protocol: the receiver pulls the data with AmMessage.RecvData.
	AmRendezvous = AmSendFlags(ucx.AmSendRndv)
)

// knownAmFlags are the AM send flags an operation accepts (RequestParam.AmFlags).
const knownAmFlags = AmReply | AmEager | AmRendezvous

// AmHandler receives active messages of one id. It runs on the goroutine that drove
// progress, without worker locks held, so it may call any ucpx method.
type AmHandler func(msg *AmMessage)

type amHandler struct {
	fn  AmHandler
	arg *ucx.CallbackArg
}

// AmMessage is an active message delivered to an AmHandler.
//
// Eager data (IsRendezvous false) is available from Data during the handler; after the
// handler returns it is released unless the handler called Retain. Rendezvous data must
// be pulled with RecvData (during the handler, or later after Retain); a message
// neither received nor retained is dropped when the handler returns.
type AmMessage struct {
	w        *Worker
	ID       uint
	Header   []byte // a Go copy, the handler may keep it
	length   int
	data     unsafe.Pointer
	flags    uint64
	replyEP  *Endpoint
	retained atomic.Bool
	consumed bool     // under w.mu
	pull     *pullRef // the data lies in the sender's device buffer (ampull.go)
}

// SetAmHandler installs fn for messages sent with id (nil removes the handler).
func (w *Worker) SetAmHandler(id uint, fn AmHandler) error {
	if w == nil {
		return opErr("set_am_recv_handler", ErrInvalidParam, "nil worker")
	}
	if id > 0xffff {
		return opErr("set_am_recv_handler", ErrInvalidParam, "id %d exceeds 16 bits", id)
	}
	if id == RevokeAM || id == PullAM {
		return opErr("set_am_recv_handler", ErrInvalidParam, "id %#x is reserved by ucpx (RevokeAM, PullAM)", id)
	}
	return w.setAmHandler(id, fn)
}

func (w *Worker) setAmHandler(id uint, fn AmHandler) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed.Load() {
		return opErr("set_am_recv_handler", ErrClosed, "")
	}
	old := w.am[uint64(id)]
	if fn == nil {
		if old == nil {
			return nil
		}
		st := w.raw.SetAmHandler(id, nil, false)
		old.arg.Free()
		delete(w.am, uint64(id))
		return opErr("set_am_recv_handler", statusErr(st), "id %d", id)
	}
	h := &amHandler{fn: fn, arg: w.raw.NewCallbackArg(uint64(id))}
	if st := w.raw.SetAmHandler(id, h.arg, true); st != ucx.OK {
		h.arg.Free()
		return opErr("set_am_recv_handler", statusErr(st), "id %d", id)
	}
	if old != nil {
		old.arg.Free()
	}
	w.am[uint64(id)] = h
	return nil
}

func (w *Worker) deliverAmLocked(ev *ucx.Event) {
	msg := &AmMessage{w: w, ID: uint(ev.ID), length: ev.Length, data: ev.Ptr, flags: ev.Flags}
	if ev.HeaderLen > 0 {
		msg.Header = append([]byte(nil), unsafe.Slice((*byte)(ev.Header), ev.HeaderLen)...)
		ucx.Free(ev.Header)
	}
	if ev.Flags&ucx.AmRecvReplyEP != 0 {
		msg.replyEP = w.replyEndpointLocked(ev.ReplyEP)
	}
	if ev.ID == RevokeAM && w.pullControlLocked(msg.Header) {
		msg.releaseLocked()
		return
	}
	h := w.am[ev.ID]
	if h == nil { // removed after UCX queued the message
		msg.releaseLocked()
		return
	}
	fn := h.fn
	w.deferred = append(w.deferred, func() {
		// Released even if fn panics (runDeferred recovers the panic).
		defer func() {
			if !msg.retained.Load() {
				msg.Release()
			}
		}()
		fn(msg)
	})
}

// Length is the length of the message's data.
func (m *AmMessage) Length() int {
	if m == nil {
		return 0
	}
	return m.length
}

// IsRendezvous reports whether the data must be pulled with RecvData.
func (m *AmMessage) IsRendezvous() bool { return m != nil && m.flags&ucx.AmRecvRndv != 0 }

// ReplyEndpoint is the endpoint to reply on, if the sender set AmReply.
func (m *AmMessage) ReplyEndpoint() *Endpoint {
	if m == nil {
		return nil
	}
	return m.replyEP
}

// Data is the eager data (nil for rendezvous messages, after Release, and once the
// worker closed unless the data was copied out of UCX's buffers). It points into UCX
// or C memory: copy what must outlive the handler or call Retain.
func (m *AmMessage) Data() []byte {
	if m == nil || m.w == nil || m.IsRendezvous() || m.data == nil || m.length == 0 {
		return nil
	}
	m.w.mu.Lock()
	defer m.w.mu.Unlock()
	if m.consumed || (m.w.rawGone && m.flags&ucx.AmRecvCopied == 0) {
		return nil // released, or UCX's buffer went with the worker
	}
	return unsafe.Slice((*byte)(m.data), m.length)
}

// Retain keeps the message's data beyond the handler; the holder must later call
// Release or RecvData.
func (m *AmMessage) Retain() {
	if m != nil {
		m.retained.Store(true)
	}
}

// RecvData receives the message's data into buf (ucp_am_recv_data_nbx for
// rendezvous; a copy for eager data). It consumes the message.
func (m *AmMessage) RecvData(buf []byte, p *RequestParam) (*Request, error) {
	const op = "am_recv_data_nbx"
	if m == nil || m.w == nil {
		return nil, opErr(op, ErrInvalidParam, "nil or zero message")
	}
	p = param(p)
	if err := p.check(op, m.w.ctx); err != nil {
		return nil, err
	}
	w := m.w
	if m.pull != nil || w.devicePlain(p) {
		if len(buf) < m.length {
			return nil, opErr(op, ErrMessageTruncated, "buffer %d < message %d", len(buf), m.length)
		}
		if m.pull != nil {
			return m.recvPulled(op, buf, p)
		}
		// UCX cannot write device memory here: received into staging, copied in.
		return w.stagedDevice(op, p, buf, protocol.In, func(b []byte, ip *RequestParam) (*Request, error) {
			return m.RecvData(b, ip)
		})
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if m.consumed || w.closed.Load() {
		return nil, opErr(op, ErrClosed, "message already received or released")
	}
	if len(buf) < m.length {
		return nil, opErr(op, ErrMessageTruncated, "buffer %d < message %d", len(buf), m.length)
	}
	n := m.length
	if !m.IsRendezvous() {
		copy(buf, unsafe.Slice((*byte)(m.data), m.length))
		m.releaseLocked()
		return w.postLocked(op, nil, p, func(r *Request) { r.length = n })
	}
	m.consumed = true
	ptr := w.raw.AmRecvData(m.data, bufPtr(buf), m.length, p.flags(), p.memType(), p.MemH.rawOrNil())
	return w.postLocked(op, ptr, p, func(r *Request) { r.length = n }, bufPtr(buf))
}

// Release drops the message's data. Releasing twice does nothing.
func (m *AmMessage) Release() {
	if m == nil || m.w == nil {
		return
	}
	m.w.mu.Lock()
	defer m.w.mu.Unlock()
	m.releaseLocked()
}

func (m *AmMessage) releaseLocked() {
	if m.consumed {
		return
	}
	m.consumed = true
	if m.pull != nil {
		m.releasePulledLocked()
		return
	}
	switch {
	case m.flags&ucx.AmRecvCopied != 0:
		ucx.Free(m.data)
	case m.w.rawGone:
		// the worker's destruction released UCX's descriptors already
	case m.data != nil:
		m.w.raw.AmDataRelease(m.data)
	}
	m.data = nil
}

// AmSendNbx sends an active message with id, a header and data (ucp_am_send_nbx).
// The receiver's handler for id gets it. header and buf must stay untouched until done.
func (ep *Endpoint) AmSendNbx(id uint, header, buf []byte, p *RequestParam) (*Request, error) {
	const op = "am_send_nbx"
	if ep == nil {
		return nil, opErr(op, ErrInvalidParam, "nil endpoint")
	}
	p = param(p)
	if err := p.check(op, ep.w.ctx); err != nil {
		return nil, err
	}
	if id > 0xffff {
		return nil, opErr(op, ErrInvalidParam, "id %d exceeds 16 bits", id)
	}
	if id == RevokeAM || id == PullAM {
		return nil, opErr(op, ErrInvalidParam, "id %#x is reserved by ucpx (RevokeAM, PullAM)", id)
	}
	if m := ep.w.maxAmHeader; m > 0 && len(header) > m {
		// UCX aborts the process on a header its transports cannot carry.
		return nil, opErr(op, ErrInvalidParam, "header of %d bytes exceeds the worker's max_am_header (%d)", len(header), m)
	}
	if p.Condition != nil {
		reissue := func(_ int, b []byte, ip *RequestParam) (*Request, error) { return ep.AmSendNbx(id, header, b, ip) }
		if ep.pullable(p, buf, true) {
			// Issued at the trigger as a send without a condition: the receiver pulls.
			return ep.w.submitDirect(op, p, buf, reissue)
		}
		return ep.w.submit(op, p, buf, protocol.Out, false, reissue)
	}
	if ep.pullable(p, buf, false) {
		if r, ok, err := ep.amPull(op, id, header, buf, p); ok {
			return r, err
		}
	}
	if ep.w.stagesPlain(p) {
		return ep.w.stagedPlain(op, p, buf, protocol.Out, func(b []byte, ip *RequestParam) (*Request, error) {
			return ep.AmSendNbx(id, header, b, ip)
		})
	}
	w := ep.w
	w.lockIssue()
	defer w.mu.Unlock()
	if err := ep.usableLocked(op); err != nil {
		return nil, err
	}
	ptr := w.raw.AmSend(ep.raw, id, bufPtr(header), len(header), bufPtr(buf), len(buf), p.flags(), uint32(p.AmFlags), p.memType(), p.MemH.rawOrNil())
	return ep.sent(w.postLocked(op, ptr, p, nil, bufPtr(header), bufPtr(buf)))
}

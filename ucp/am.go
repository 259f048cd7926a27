package ucp

import (
	"cmp"
	"hash/maphash"
	"slices"
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
	if ev.Flags&ucx.AmRecvReplyEP != 0 && ev.ReplyEP != nil {
		if ev.ID == PullAM && w.replyHelloLocked(msg.Header, ev.ReplyEP) {
			msg.releaseLocked()
			return
		}
		if ev.ID != PullAM { // a pulled message replies on its sender's endpoint (onPull)
			msg.replyEP = w.replyEndpointLocked(ev.ReplyEP)
		}
	}
	if ev.ID == RevokeAM && w.drainedControlLocked(msg.Header) {
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

// ReplyEndpoint is the endpoint to reply on, if the sender set AmReply: an endpoint
// this worker owns to the sender, never UCX's internal reply endpoint (UCX destroys
// that one, unreported, when the connection fails, so a later call on it would use
// freed memory). It is this worker's own endpoint the message came through, or else
// the one made to the sender from the address a ucpx sender sends ahead of its first
// AmReply message on an endpoint (or the address a pulled message carries). It stays
// valid beyond the handler and the message, like any endpoint: once the sender is
// gone, its calls fail with an error matching ErrPeerFailed.
//
// A worker remembers at most 4096 such senders (those whose messages arrive on
// endpoints it did not make). Past that it forgets those whose endpoint failed, else
// the ones it heard from least recently (256 at once), and tells each: the sender sends
// its address again ahead of its next AmReply message on that endpoint, and its
// messages have a reply endpoint again from there on. Memory stays bounded against a
// peer that floods the worker with senders, and the senders it pushes out are answered
// again.
//
// nil without AmReply, or where no such endpoint can be had: the sender's address
// never came (a sender that is not ucpx's); the message was sent after the worker
// forgot its sender and before the sender heard of it; the worker's endpoints made
// for pulls and replies are at their limit (1024), so that the sender could not be
// told or answered.
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
			return ep.w.submitDirect(op, p, buf, false, reissue)
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
	var hello []byte
	if p.AmFlags&AmReply != 0 && !ep.replyHello.Load() {
		hello = ep.replyHelloMessage()
	}
	w.lockIssue()
	defer w.mu.Unlock()
	if err := ep.usableLocked(op); err != nil {
		return nil, err
	}
	if hello != nil && ep.replyHello.CompareAndSwap(false, true) {
		// Ahead of the message on the same endpoint: its receiver knows whom to reply to.
		ep.sendHelloLocked(op, hello, AmReply)
	}
	ptr := w.raw.AmSend(ep.raw, id, bufPtr(header), len(header), bufPtr(buf), len(buf), p.flags(), uint32(p.AmFlags), p.memType(), p.MemH.rawOrNil())
	return ep.sent(w.postLocked(op, ptr, p, nil, bufPtr(header), bufPtr(buf)))
}

// Reply endpoints. UCX hands an active message's receiver the endpoint the sender's
// connection ends in (ucp_am_recv_param_t.reply_ep). Where the receiver made no
// endpoint of its own to the sender, that is one UCX made itself: not the user's, so
// when the connection fails UCX destroys it at once, from whichever progress call
// noticed (the one that delivered the message included), and tells nobody (no error
// callback: ucp_ep_set_failed in UCX 1.13). ucpx runs handlers after progress, so such
// an endpoint may be gone before the handler even runs: it is never used. Instead a
// sender sends its sealed address on PullAM (a hello with AmReply) ahead of its first
// AmReply message on an endpoint; the receiver records the sender by UCX's endpoint
// (w.replies) and resolves later messages through it to an endpoint it owns to the
// sender (senderEndpointLocked: its own, or an internal one made from the address),
// whose failure it is told about.
//
// UCX's endpoints come and go unreported, so w.replies is bounded (maxReplies): past
// it the receiver forgets the senders whose endpoint failed, else the replyRoom least
// recently used ones, and tells each (ctlReplyHello, on an endpoint it owns to the
// sender's worker) which of its endpoints it forgot, by the token its hello carried;
// the sender sends the hello again ahead of that endpoint's next AmReply message. A
// peer that floods the receiver with senders thus costs it at most maxReplies entries,
// and the senders it pushes out are answered again from their next message on
// (before, the hello went once per endpoint, and a forgotten sender's messages had no
// reply endpoint for good). The sender is told, not asked on each message, because a
// message names nothing but UCX's endpoint, which the receiver must not use; what it
// sent before it was told has no reply endpoint.

// replyPeer is the sender behind one UCX reply endpoint (w.replies).
type replyPeer struct {
	peer      peerInfo
	src       uint64
	noPeerErr bool
	// token names the sender's endpoint to the sender (replyToken), for ctlReplyHello;
	// 0 where its hello named none.
	token uint64
	used  uint64    // replyClock when recorded or last resolved: the least recently used goes first
	ep    *Endpoint // the last endpoint resolved to the sender
}

// replyClock orders the uses of reply senders (replyPeer.used).
var replyClock atomic.Uint64

// replySeed keys replyToken: a token tells the peer nothing about this process's memory.
var replySeed = maphash.MakeSeed()

// replyToken names ep in its reply hellos, so that a receiver that forgot it can say
// which endpoint must send its hello again. Never 0.
func replyToken(ep *Endpoint) uint64 { return maphash.Comparable(replySeed, ep) | 1 }

// replyHelloMessage is the hello that goes ahead of ep's first AmReply message (and
// its first after the receiver forgot it), nil where it cannot go (the address
// unavailable, or longer than an AM header may be). The op field, which a hello does
// not otherwise use, carries ep's token.
func (ep *Endpoint) replyHelloMessage() []byte {
	w := ep.w
	self, err := w.pullAddress()
	if err != nil {
		return nil
	}
	hello := ep.helloMessage(self, replyToken(ep))
	if m := w.maxAmHeader; m > 0 && len(hello) > m {
		return nil
	}
	return hello
}

// replyHelloLocked records the sender of a hello that came with reply endpoint raw;
// it reports whether header was such a hello. Caller holds w.mu.
func (w *Worker) replyHelloLocked(header []byte, raw unsafe.Pointer) bool {
	sender, plain, err := w.ctx.trust.seal.open(pullMagic, header)
	if err != nil {
		return false
	}
	_, flags, ref, _, addr, _, ok := decodePull(plain)
	if !ok || flags&pullHelloFlag == 0 {
		return false
	}
	peer, err := openAddress(w.ctx.trust.seal, addr)
	if err != nil || peer.id != sender {
		return true // a forged address: no reply goes to it
	}
	if w.eps[raw] != nil {
		return true // this worker's own endpoint: the reply endpoint, nothing to remember
	}
	if w.replies == nil {
		w.replies = map[unsafe.Pointer]*replyPeer{}
	}
	// raw replaces whoever had it before: UCX reuses a destroyed endpoint's memory.
	if _, had := w.replies[raw]; !had && len(w.replies) >= maxReplies {
		w.forgetReplyLocked()
	}
	w.replies[raw] = &replyPeer{
		peer:      peer,
		src:       sourceOf(w.ctx.trust, peer.id, peer.addr),
		noPeerErr: flags&pullNoPeerErrFlag != 0,
		token:     ref.op,
		used:      replyClock.Add(1),
	}
	return true
}

// maxReplies bounds the senders a worker remembers for reply endpoints.
const maxReplies = 4096

// forgetReplyLocked makes room in w.replies. Entries whose resolved endpoint failed go
// (their sender is gone; UCX destroyed their endpoint), and those whose endpoint
// became this worker's own; if that leaves it full, the replyRoom least recently used
// senders go, each told to send its hello again. A flood of senders thus costs the
// receiver a sort of w.replies per replyRoom hellos. Caller holds w.mu.
func (w *Worker) forgetReplyLocked() {
	type aged struct {
		raw  unsafe.Pointer
		used uint64
	}
	live := make([]aged, 0, len(w.replies))
	for raw, rp := range w.replies {
		if rp.ep != nil && rp.ep.err != nil || w.eps[raw] != nil {
			delete(w.replies, raw)
			continue
		}
		live = append(live, aged{raw, rp.used})
	}
	if len(live) < maxReplies {
		return
	}
	slices.SortFunc(live, func(a, b aged) int { return cmp.Compare(a.used, b.used) })
	type asked struct {
		peer  [idLen]byte
		token uint64
	}
	told := map[asked]bool{}
	for _, e := range live[:len(live)-(maxReplies-replyRoom)] {
		rp := w.replies[e.raw]
		delete(w.replies, e.raw)
		if k := (asked{rp.peer.id, rp.token}); !told[k] {
			told[k] = true
			w.askHelloLocked(rp)
		}
	}
}

// replyRoom is how many live senders forgetReplyLocked forgets at once.
const replyRoom = maxReplies / 16

// askHelloLocked tells the sender of rp, which this worker forgot, to send its hello
// again ahead of its endpoint's next AmReply message, on an endpoint this worker owns
// to it (made if need be: none can be had at the limit of internal endpoints, and
// then that sender's later messages have no reply endpoint). Caller holds w.mu.
func (w *Worker) askHelloLocked(rp *replyPeer) {
	if rp.token == 0 {
		return // its hello named no endpoint: nothing to ask
	}
	ep := rp.ep
	if ep == nil || ep.usableLocked("") != nil {
		var err error
		if ep, err = w.senderEndpointLocked(&rp.peer, rp.src, 0, rp.noPeerErr); err != nil {
			return
		}
	}
	ep.sendControlLocked(ctlReplyHello, rp.token)
}

// helloAgainLocked handles a ctlReplyHello from peer: the endpoint of this worker that
// token names sends its hello again ahead of its next AmReply message. Caller holds
// w.mu.
func (w *Worker) helloAgainLocked(peer [idLen]byte, token uint64) {
	for _, ep := range w.eps {
		if ep.replyHello.Load() && (!ep.peerKnown || ep.peer.id == peer) && replyToken(ep) == token {
			ep.replyHello.Store(false)
		}
	}
}

// replyEndpointLocked resolves the UCX reply endpoint raw of a message being
// delivered to an endpoint this worker owns (ReplyEndpoint), or nil. Caller holds w.mu.
func (w *Worker) replyEndpointLocked(raw unsafe.Pointer) *Endpoint {
	if ep := w.eps[raw]; ep != nil {
		// This worker's own (UCX matched the endpoint it made to the sender with the
		// sender's): UCX keeps it until ucpx closes it, and the entry is of no use.
		delete(w.replies, raw)
		return ep
	}
	rp := w.replies[raw]
	if rp == nil {
		return nil
	}
	rp.used = replyClock.Add(1)
	if rp.ep != nil && rp.ep.usableLocked("") == nil {
		return rp.ep
	}
	ep, err := w.senderEndpointLocked(&rp.peer, rp.src, 0, rp.noPeerErr)
	if err != nil {
		return nil
	}
	rp.ep = ep
	return ep
}

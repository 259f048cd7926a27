package ucp

import (
	"errors"
	"unsafe"

	"github.com/ucpx/ucpx/cgo/ucx"
)

// Tag messages whose data the receiver pulls. A tag send of a device buffer
// (MemoryCUDA, no chain) to a peer CUDA IPC reaches carries, instead of its data, a
// sealed descriptor: the allocation's key (exported once, as for pulled active
// messages), the offset, the length and the send's id; the tag's pull bit (ucpx's
// top bit) says so. Matching is UCX's, unchanged: the message matches the receives
// its tag matches, in order. The receive that gets it (any: nbx, blocking, chained,
// staged, conditioned) copies the data out of the sender's mapped buffer by the copy
// engine, into the device memory itself for a staged receive of device memory, and
// completes only then; the receiver tells the sender (ctlPulled) and the send
// completes. A receive shorter than the message completes with ErrMessageTruncated
// and copies nothing. One too short even for the descriptor answers the sender by tag
// (ctlPullTrunc) once the pulls of that tag it is doing from that sender are done; the
// sender then completes its oldest send of the tag, which is the truncated one:
// messages of one tag from one sender match in order. The sender is the one whose
// source id the tag carries, which nothing in a truncated message proves: with an
// auth key a peer without it cannot compute another's id (sourceOf); without a key a
// forged message could complete another sender's send early. Before its first pulled message
// on an endpoint the sender sends its address (a hello on PullAM): a receiver with no
// endpoint to it makes one then, so that even an answer by tag has somewhere to go. A
// send falls back to staging where the descriptor would be longer than the data.

const tagPullMagic = "UCT2"

// pullHelloFlag marks a PullAM message that only carries its sender's address.
const pullHelloFlag = 1 << 31

// pullNoPeerErrFlag marks a descriptor whose sender's endpoint has no peer error
// handling (EndpointParams.NoPeerErrorHandling): an endpoint the receiver makes to
// answer it must have none either, as UCX refuses a pair whose two ends differ
// ("asymmetric endpoint configuration") and the pull then never completes.
const pullNoPeerErrFlag = 1 << 30

// pullFlags are the internal flags of a descriptor sent on ep.
func (ep *Endpoint) pullFlags() AmSendFlags {
	if ep.params.NoPeerErrorHandling {
		return pullNoPeerErrFlag
	}
	return 0
}

// tagPullConditioned is the smallest conditioned send that goes by pull: the engine
// issues it at the trigger, where falling back to staging (the descriptor longer than
// the data) would allocate. Descriptors are a few hundred bytes.
const tagPullConditioned = 4096

// pullIn is a pulled tag message being copied here (w.pullsIn, under w.mu): its
// receive, and its sender's source id and tag.
type pullIn struct {
	r        *Request
	src, tag uint64
}

// truncAnswer is owed to the sender(s) of source id src: a pulled message of tag
// matched a receive too short for its descriptor.
type truncAnswer struct{ src, tag uint64 }

// tagPullable reports whether a tag send of buf goes by pull: as an active message
// does, and a conditioned one from tagPullConditioned bytes.
func (ep *Endpoint) tagPullable(p *RequestParam, buf []byte, conditioned bool) bool {
	return !(conditioned && len(buf) < tagPullConditioned) && ep.pullable(p, buf, conditioned)
}

// tagPull sends a tag message of a device buffer for the receiver to pull. It reports
// false (nothing sent) where the message cannot go so: the caller stages it.
func (ep *Endpoint) tagPull(op string, buf []byte, tag uint64, p *RequestParam) (*Request, bool, error) {
	w := ep.w
	d, ok := ep.pullDescriptor(tagPullMagic, buf, 0, ep.pullFlags(), nil)
	if !ok || len(d.sealed) > len(buf) {
		return nil, false, nil // a receive that fits the data must fit the descriptor
	}
	return ep.postPull(op, p, d, func(x *ipcWait) unsafe.Pointer {
		x.tagged, x.sentTag = true, tag
		if !ep.pullHello {
			// Once per endpoint, before its first pulled tag message: this worker's
			// address, so that a receiver with no endpoint to it makes one (a receive
			// too short for a descriptor can only be answered on an endpoint it has).
			ep.pullHello = true
			ep.sendHelloLocked(op, ep.helloMessage(d.self), 0)
		}
		return w.raw.TagSend(ep.raw, bufPtr(d.sealed), len(d.sealed), tag|ucx.PullBit, 0, int(MemoryHost), nil, 0)
	})
}

// helloMessage is ep's hello: this worker's sealed address self, alone on PullAM
// (ahead of a pulled tag message, or of an AmReply message: am.go).
func (ep *Endpoint) helloMessage(self []byte) []byte {
	t := ep.w.ctx.trust
	return t.seal.seal(pullMagic, t.id, encodePull(0, pullHelloFlag|ep.pullFlags(), 0, 0, 0, nil, self, nil))
}

// sendHelloLocked posts hello on PullAM, with amFlags, waiting for nothing. Caller
// holds w.mu.
func (ep *Endpoint) sendHelloLocked(op string, hello []byte, amFlags AmSendFlags) {
	w := ep.w
	_, _ = w.postLocked(op, w.raw.AmSend(ep.raw, PullAM, bufPtr(hello), len(hello), nil, 0, 0, uint32(amFlags), -1, nil), &defaultParam, nil, bufPtr(hello))
}

// pullAddress is this worker's sealed address for pull descriptors, made once.
func (w *Worker) pullAddress() ([]byte, error) {
	w.mu.Lock()
	a := w.pullAddr
	w.mu.Unlock()
	if a != nil {
		return a, nil
	}
	a, err := w.Address()
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pullAddr == nil {
		w.pullAddr = a
	}
	return w.pullAddr, nil
}

// onPullTruncLocked completes sender's oldest pulled send of tag: its receiver was
// too short for the descriptor. Caller holds w.mu.
func (w *Worker) onPullTruncLocked(sender [idLen]byte, tag uint64) {
	var oldest uint64
	found := false
	for id, r := range w.pullsOut {
		x := r.ipc
		if x.tagged && x.sentTag == tag && x.ep != nil && x.ep.peer.id == sender && (!found || id < oldest) {
			oldest, found = id, true
		}
	}
	if found {
		r := w.pullsOut[oldest]
		delete(w.pullsOut, oldest)
		r.ipc.held = false
	}
}

// recvDest is where a tag receive lands: a pulled message's descriptor, then its data;
// dev: the device memory a staging buf stands for, which the pull fills directly
// (direct then says so).
type recvDest struct {
	buf    unsafe.Pointer
	n      int
	dev    uintptr
	direct bool
}

// setRecvBuf records where a tag receive lands, on a context where messages may be
// pulled (one with a device); elsewhere it records nothing and allocates nothing.
func (r *Request) setRecvBuf(c *Context, buf []byte, dev uintptr) {
	if c.ipc == nil {
		return
	}
	if r.dest == nil {
		r.dest = &recvDest{}
	}
	*r.dest = recvDest{buf: bufPtr(buf), n: len(buf), dev: dev}
}

// pulledDirect reports whether a pull filled the device memory r's staging buffer
// stands for.
func (r *Request) pulledDirect() bool { return r.dest != nil && r.dest.direct }

// pullArrivedLocked completes a tag receive whose message has the pull bit: where the
// data cannot be pulled (truncated, forged) at once, with the error; else r stays
// pending while the data is pulled (pullRecv runs after the round that completed it,
// outside the lock) and completes once it is in place. Caller holds w.mu.
func (w *Worker) pullArrivedLocked(r *Request, st ucx.Status, length int, tag uint64) {
	src, utag := splitPullTag(tag)
	if st != ucx.OK {
		if st == ucx.ErrMessageTruncated {
			w.owePullTruncLocked(src, utag)
		}
		r.completeLocked(statusErr(st), length, utag)
		return
	}
	d := r.dest
	if d == nil || d.buf == nil {
		// No device here (a sender would not pull to us), or no buffer.
		r.completeLocked(opErr(r.op, ErrUnsupported, "a pulled message matched a receive that cannot take one"), 0, utag)
		return
	}
	desc := unsafe.Slice((*byte)(d.buf), min(length, d.n))
	sender, plain, err := w.ctx.trust.seal.open(tagPullMagic, desc)
	if err != nil {
		r.completeLocked(opErr(r.op, err, "a message marked pulled"), 0, utag)
		return
	}
	_, flags, ref, packed, addr, _, ok := decodePull(plain)
	if !ok {
		r.completeLocked(opErr(r.op, ErrInvalidParam, "a pulled message's descriptor is malformed"), 0, utag)
		return
	}
	ref.ep = w.pullSenderLocked(sender, src) // nil: made from addr, outside the lock
	// The pull is tracked as an IPC request of its own (polled by every progress
	// call); r, whose waiters know nothing of it, completes when it does.
	pr := &Request{}
	pr.reset(w, "tag_pull", nil)
	pr.ipc = &ipcWait{held: true, ep: ref.ep}
	w.trackIPCLocked(pr)
	// A goroutine asleep on the event fd would not see the pull (no event comes of
	// it): wake it, so that it sleeps again with the bound IPC work sets.
	w.park.wake()
	w.pullsIn = append(w.pullsIn, pullIn{r: r, src: src, tag: utag})
	// The receive buffer may be a staging buffer lent again: keep copies.
	packed, addr = append([]byte(nil), packed...), append([]byte(nil), addr...)
	w.deferred = append(w.deferred, func() { w.pullRecv(r, pr, ref, sender, src, packed, addr, utag, flags&pullNoPeerErrFlag != 0) })
}

// splitPullTag splits a pulled message's sender tag into its sender's source id and
// the user's tag.
func splitPullTag(tag uint64) (src, user uint64) {
	return (tag &^ ucx.PullBit) >> TagBits, tag & MaxTag
}

// pullSenderLocked is the endpoint to the worker that sent a pulled message: of the
// sender's context, with its source id (an endpoint to another worker of that
// context would carry the answer to a worker that never sent it); nil if none.
func (w *Worker) pullSenderLocked(sender [idLen]byte, src uint64) *Endpoint {
	for _, ep := range w.eps {
		if ep.peerKnown && ep.peer.id == sender && ep.source == src && ep.usableLocked("") == nil {
			return ep
		}
	}
	return nil
}

// anySource: replyEndpoint's caller knows no source id to check (an active message).
const anySource = 1 << 16

// maxInternalEndpoints bounds the endpoints a worker makes itself to answer pulls
// (each sender it has no endpoint to, a restarted peer included, adds one). A
// variable: tests lower it.
var maxInternalEndpoints = 1024

// replyEndpoint is the endpoint to the worker that sent a pulled message, found by the
// sealed address its descriptor carries (of the sender's context; its source id want
// unless anySource): the one this worker has, or one made from the address. A
// receiver need not hold an endpoint to whoever sends to it (UCX tag matching takes
// messages from anyone), but a pull must be answered, and to that worker only. An
// endpoint made here is internal: closed when its peer fails or when one made later
// to the same worker replaces it. Past maxInternalEndpoints none is made: the pull
// fails here, and its sender (op, unless 0) is answered as for any failed pull, on an
// endpoint closed behind the answer. noPeerErr: the sender's endpoint has no peer
// error handling, and neither may one made here.
func (w *Worker) replyEndpoint(sender [idLen]byte, addr []byte, want, op uint64, noPeerErr bool) (*Endpoint, error) {
	peer, err := openAddress(w.ctx.trust.seal, addr)
	if err != nil {
		return nil, err
	}
	src := sourceOf(w.ctx.trust, peer.id, peer.addr)
	if peer.id != sender || (want != anySource && src != want) {
		return nil, opErr("pull", ErrInvalidParam, "a pulled message's address is not its sender's")
	}
	w.mu.Lock()
	defer w.unlockDeferred()
	return w.senderEndpointLocked(&peer, src, op, noPeerErr)
}

// senderEndpointLocked is replyEndpoint for an opened, checked address: the endpoint
// to peer (source id src) this worker has, or one made to it. Caller holds w.mu.
func (w *Worker) senderEndpointLocked(peer *peerInfo, src, op uint64, noPeerErr bool) (*Endpoint, error) {
	sender := peer.id
	if ep := w.pullSenderLocked(sender, src); ep != nil {
		return ep, nil
	}
	if w.closed.Load() {
		return nil, opErr("pull", ErrClosed, "")
	}
	n := 0
	for _, ep := range w.eps {
		switch {
		case !ep.internal:
		case ep.peer.id == sender && ep.source == src:
			w.closeInternalLocked(ep) // unusable (else found above): replaced
		default:
			n++
		}
	}
	params := &EndpointParams{NoPeerErrorHandling: noPeerErr}
	if n >= maxInternalEndpoints {
		if op != 0 {
			w.answerRefusedLocked(peer, params, op)
		}
		return nil, opErr("pull", ErrExceedsLimit, "%d endpoints made for pulls already", n)
	}
	ep, err := w.connectLocked(peer, params, "pull-sender", "pull sender's address")
	if err != nil {
		return nil, err
	}
	ep.internal = true
	// Closed (and forgotten) once its peer fails; who holds it as a reply endpoint
	// then gets the failure (usableLocked).
	ep.failureHooks = append(ep.failureHooks, &failureHook{fn: func(ep *Endpoint, _ error) {
		w.mu.Lock()
		w.closeInternalLocked(ep)
		w.unlockDeferred()
	}})
	w.answerTruncLocked() // answers that waited for an endpoint to this sender
	// startWatch takes w.mu: after the deferred unlock.
	w.deferred = append(w.deferred, ep.startWatch)
	return ep, nil
}

// closeInternalLocked closes an internal endpoint at once; a failed one's peer is
// remembered (bounded) so that revocations still see it dead. Caller holds w.mu.
func (w *Worker) closeInternalLocked(ep *Endpoint) {
	if ep.closed || w.closed.Load() {
		return
	}
	if ep.err != nil && ep.peerKnown {
		if len(w.gonePeers) >= maxInternalEndpoints {
			w.gonePeers = append(w.gonePeers[:0], w.gonePeers[1:]...)
		}
		w.gonePeers = append(w.gonePeers, ep.peer.id)
	}
	ep.forceCloseLocked()
}

// peerGoneLocked reports whether an internal endpoint to peer failed and was closed.
// Caller holds w.mu.
func (w *Worker) peerGoneLocked(peer [idLen]byte) bool {
	for _, id := range w.gonePeers {
		if id == peer {
			return true
		}
	}
	return false
}

// answerRefusedLocked tells the sender of a pull refused here (no internal endpoint
// to it could be made) that its send may complete, as pullDoneLocked does for any
// failed pull, on an endpoint made for that one message and closed (flushed) behind
// it. Caller holds w.mu.
func (w *Worker) answerRefusedLocked(peer *peerInfo, params *EndpointParams, op uint64) {
	ep, err := w.connectLocked(peer, params, "pull-refused", "pull sender's address")
	if err != nil {
		return
	}
	ep.sendControlLocked(ctlPulled, op)
	_, _ = ep.closeNbxLocked(false)
}

// pullRecv copies a pulled message into r's buffer (or the device memory it stands
// for) and completes r, through pr, once the copy is done.
func (w *Worker) pullRecv(r, pr *Request, ref *pullRef, sender [idLen]byte, src uint64, packed, addr []byte, tag uint64, noPeerErr bool) {
	var err error
	if ref.ep == nil {
		ref.ep, err = w.replyEndpoint(sender, addr, src, ref.op, noPeerErr)
	}
	var rk *Rkey
	if err == nil {
		rk, err = ref.ep.pulledRange(packed, ref)
	}
	var get *Request
	direct, truncated := false, false
	switch {
	case err != nil:
	case ref.length > uint64(r.dest.n):
		truncated = true
	default:
		n := int(ref.length)
		dst, gp := unsafe.Slice((*byte)(r.dest.buf), n), &RequestParam{MemoryType: MemoryHost}
		if r.dest.dev != 0 {
			dst, gp, direct = DeviceBuffer(r.dest.dev, n), &RequestParam{MemoryType: MemoryCUDA}, true
		}
		get, err = ref.ep.GetNbx(dst, rk.Base()+ref.off, rk, gp)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if pr.done.Load() {
		ref.key.doneLocked()
		return // the worker closed meanwhile: r was failed
	}
	x := pr.ipc
	x.held, x.ep = false, ref.ep
	finish := func(err error) {
		w.pullDoneLocked(r, ref, err == nil && direct, err, tag)
	}
	switch {
	case truncated:
		err = statusErr(ucx.ErrMessageTruncated)
		fallthrough
	case err != nil:
		x.failed = err
		finish(err)
		return
	}
	x.after(get, finish)
}

// pullDoneLocked completes a pulled receive, tells its sender (where there is an
// endpoint to it), and sends the truncation answers that waited for it. Caller holds
// w.mu.
func (w *Worker) pullDoneLocked(r *Request, ref *pullRef, direct bool, err error, tag uint64) {
	for i, in := range w.pullsIn {
		if in.r == r {
			w.pullsIn = append(w.pullsIn[:i], w.pullsIn[i+1:]...)
			break
		}
	}
	ref.key.doneLocked() // the copy is done (or never started)
	if r.done.Load() {
		return // failed already (the worker closed)
	}
	if ref.ep != nil {
		ref.ep.sendControlLocked(ctlPulled, ref.op)
		if err != nil && !errors.Is(err, ErrPeerFailed) && ref.ep.err != nil {
			err = ref.ep.err
		}
	}
	r.dest.direct = direct
	r.completeLocked(err, int(ref.length), tag)
	w.answerTruncLocked()
}

// owePullTruncLocked queues a truncation answer; it goes once the round's other
// completions were seen (a pull of the same tag they start comes first). Caller holds
// w.mu.
func (w *Worker) owePullTruncLocked(src, tag uint64) {
	w.truncOwed = append(w.truncOwed, truncAnswer{src: src, tag: tag})
	w.deferred = append(w.deferred, func() {
		w.mu.Lock()
		w.answerTruncLocked()
		w.mu.Unlock()
	})
}

// answerTruncLocked sends the owed truncation answers whose sender has no pull of
// the same tag still being copied here (its ack must reach the sender first).
func (w *Worker) answerTruncLocked() {
	if len(w.truncOwed) == 0 {
		return
	}
	kept := w.truncOwed[:0]
	for _, t := range w.truncOwed {
		busy := false
		for _, in := range w.pullsIn {
			if in.tag == t.tag && in.src == t.src {
				busy = true
				break
			}
		}
		if busy {
			kept = append(kept, t)
			continue
		}
		sent := false
		for _, ep := range w.eps {
			if ep.peerKnown && ep.source == t.src && ep.usableLocked("") == nil {
				ep.sendControlLocked(ctlPullTrunc, t.tag)
				sent = true
			}
		}
		if !sent {
			// No endpoint to the sender yet: its hello (tagPull) makes one, and the
			// answer goes then.
			kept = append(kept, t)
		}
	}
	clear(w.truncOwed[len(kept):])
	w.truncOwed = kept
	if n := len(w.truncOwed); n > maxTruncOwed {
		// Messages marked pulled from sources with no endpoint (forged, or long gone)
		// must not grow this without bound: the oldest go.
		w.truncOwed = append(w.truncOwed[:0], w.truncOwed[n-maxTruncOwed:]...)
	}
}

// maxTruncOwed bounds the truncation answers kept for senders with no endpoint.
const maxTruncOwed = 1024

package ucp

import (
	"cmp"
	"encoding/binary"
	"errors"
	"slices"
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
// and copies nothing. One too short even for the descriptor cannot read the send's id,
// so a sender numbers its pulled sends of each tag to each worker (1, 2, ...: the
// descriptor's header) and a receiver accounts for the numbers of each sender's
// messages of each tag as it reads their descriptors; once the pulls of that tag it
// is doing from that sender are done (every message that matched before the truncated
// one was seen by then), the truncated message takes the first number not accounted
// for (messages of one tag from one sender match in order), and the answer
// (ctlPullTrunc) names the tag, that number and both workers' source ids. The sender
// completes the send so numbered only if it is its oldest send of that tag to that
// worker still waiting (the answers to the older ones came first); any other answer
// (the same one again: replayed, duplicated, sent on two endpoints; one for another
// worker; one numbered ahead) completes nothing and is counted (staleControls).
// Before, an answer completed the oldest waiting send of its tag, so the same answer
// again completed a newer send while its receiver still pulled (or had not yet
// received) it, and the sender could reuse the buffer under the copy.
//
// What a truncated message does not prove: its sender is the one whose source id the
// tag carries (with an auth key a peer without it cannot compute another's id,
// sourceOf; 15 bits, so it can guess one), and nothing dates it: a message with the
// pull bit sent again that meets a receive too short for it takes the next number of
// its tag, and its answer completes the sender's next send of the tag, if that is
// waiting, before it was received. Without an auth key the seal proves nothing (its
// key is public): anyone can seal an answer naming the oldest waiting send of a tag,
// and a ctlPulled naming any op id. What holds with or without a key is that a
// truncation answer sent again, later or to another worker, completes nothing.
//
// Before its first pulled message on an endpoint the sender sends its address (a hello
// on PullAM): a receiver with no endpoint to it makes one then, so that even an answer
// by tag has somewhere to go. A send falls back to staging where the descriptor would
// be longer than the data.

const tagPullMagic = "UCT3" // 3: the descriptor's header is the send's number

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

// pullSeqKey names the pulled tag messages of one tag from one worker to another:
// at the sender, the receiving worker's context (peer) and source id (src); at the
// receiver, which knows a sender of a truncated message by its source id alone, the
// sender's source id (peer zero).
type pullSeqKey struct {
	peer     [idLen]byte
	src, tag uint64
}

// pullSeqs are the numbers of pulled tag messages, per key: at a sender the numbers
// given (Worker.pullsSent), at a receiver those seen (Worker.pullsSeen). Under w.mu.
type pullSeqs struct {
	m       map[pullSeqKey]*pullSeq
	clock   uint64 // stamps uses, for eviction
	evicted bool   // keys were forgotten: a new one may be one of them
}

// pullSeq is one key's numbers. At a sender, n is the last one given. At a receiver,
// every number up to n is accounted for and seen holds the ranges seen beyond it
// (sorted, apart): a descriptor read says its number, and a truncated message takes
// the first number not accounted for, once the messages matched before it were seen
// (the answer waits for them: answerTruncLocked). A receive may be seen before one
// that matched ahead of it (one completes in its call while the other's completion
// is still queued), so a truncated message cannot just take the next number. forgot:
// made after keys were forgotten, so the numbers below the first descriptor seen may
// be long gone rather than still to come: it counts from that one.
type pullSeq struct {
	n, used uint64
	seen    []seqRange
	forgot  bool
}

type seqRange struct{ lo, hi uint64 }

// maxSeqRanges bounds a receiver's ranges per key: past it, the lowest gap is given up
// (counted as seen).
const maxSeqRanges = 64

// saw records, at a receiver, a descriptor numbered s.
func (e *pullSeq) saw(s uint64) {
	if s <= e.n || e.forgot {
		// The sender numbers afresh (it forgot the tag: maxPullSeqs), or the same
		// descriptor came again: count on from it.
		e.n, e.seen, e.forgot = s, e.seen[:0], false
		return
	}
	i := 0
	for i < len(e.seen) && e.seen[i].hi+1 < s {
		i++
	}
	switch {
	case i == len(e.seen) || s+1 < e.seen[i].lo:
		e.seen = slices.Insert(e.seen, i, seqRange{s, s})
	case s+1 == e.seen[i].lo:
		e.seen[i].lo = s
	case s == e.seen[i].hi+1:
		e.seen[i].hi = s
		if i+1 < len(e.seen) && e.seen[i+1].lo == s+1 {
			e.seen[i].hi = e.seen[i+1].hi
			e.seen = slices.Delete(e.seen, i+1, i+2)
		}
	} // else s is in e.seen[i] already
	if len(e.seen) > maxSeqRanges {
		e.n = e.seen[0].hi
		e.seen = slices.Delete(e.seen, 0, 1)
	}
	e.settle()
}

// unseen takes, at a receiver, the first number not accounted for: a truncated
// message's.
func (e *pullSeq) unseen() uint64 {
	e.n++
	s := e.n
	e.settle()
	return s
}

func (e *pullSeq) settle() {
	for len(e.seen) > 0 && e.seen[0].lo <= e.n+1 {
		e.n = max(e.n, e.seen[0].hi)
		e.seen = slices.Delete(e.seen, 0, 1)
	}
}

// maxPullSeqs bounds each table (tags are the user's: they need not repeat). Past it
// the least recently used quarter goes, but for the keys of sends still waiting (at a
// sender) or of answers owed (at a receiver). A forgotten key counts from 0 again (a
// receiver takes the number of the next descriptor it reads); a truncation answer the
// two sides number differently meanwhile names no waiting send (or one already
// pulled), and the truncated send waits until its endpoint fails or closes, never
// completing another early. A variable: tests lower it.
var maxPullSeqs = 1 << 14

// get is k's entry, made (with n 0) if there is none; keep (nil: none) spares keys
// from eviction.
func (s *pullSeqs) get(k pullSeqKey, keep func() func(pullSeqKey) bool) *pullSeq {
	e := s.m[k]
	if e == nil {
		if len(s.m) >= maxPullSeqs {
			s.evict(keep)
		}
		if s.m == nil {
			s.m = map[pullSeqKey]*pullSeq{}
		}
		e = &pullSeq{forgot: s.evicted}
		s.m[k] = e
	}
	s.clock++
	e.used = s.clock
	return e
}

// evict drops the least recently used quarter of the keys keep does not spare.
func (s *pullSeqs) evict(keep func() func(pullSeqKey) bool) {
	var spare func(pullSeqKey) bool
	if keep != nil {
		spare = keep()
	}
	type aged struct {
		k    pullSeqKey
		used uint64
	}
	old := make([]aged, 0, len(s.m))
	for k, e := range s.m {
		if spare == nil || !spare(k) {
			old = append(old, aged{k, e.used})
		}
	}
	slices.SortFunc(old, func(a, b aged) int { return cmp.Compare(a.used, b.used) })
	s.evicted = true
	for _, a := range old[:min(len(old), max(len(s.m)/4, 1))] {
		delete(s.m, a.k)
	}
}

// waitingPullKeys spares, at a sender, the keys of sends still waiting for their
// receiver: their numbers must go on. Caller holds w.mu.
func (w *Worker) waitingPullKeys() func(pullSeqKey) bool {
	waiting := map[pullSeqKey]bool{}
	for _, r := range w.pullsOut {
		if x := r.ipc; x.tagged && x.ep != nil {
			waiting[pullSeqKey{peer: x.ep.peer.id, src: x.ep.source, tag: x.sentTag}] = true
		}
	}
	return func(k pullSeqKey) bool { return waiting[k] }
}

// owedPullKeys spares, at a receiver, the keys of truncation answers still owed: they
// take their numbers when they go. Caller holds w.mu.
func (w *Worker) owedPullKeys() func(pullSeqKey) bool {
	owed := map[pullSeqKey]bool{}
	for _, t := range w.truncOwed {
		owed[pullSeqKey{src: t.src, tag: t.tag}] = true
	}
	return func(k pullSeqKey) bool { return owed[k] }
}

// truncSources is a truncation answer's count: the source ids of the sender of the
// message and of the receiver that answers.
func truncSources(sender, receiver uint64) uint64 { return sender | receiver<<16 }

// tagPullable reports whether a tag send of buf goes by pull: as an active message
// does, and a conditioned one from tagPullConditioned bytes.
func (ep *Endpoint) tagPullable(p *RequestParam, buf []byte, conditioned bool) bool {
	return !(conditioned && len(buf) < tagPullConditioned) && ep.pullable(p, buf, conditioned)
}

// tagPull sends a tag message of a device buffer for the receiver to pull. It reports
// false (nothing sent) where the message cannot go so: the caller stages it.
func (ep *Endpoint) tagPull(op string, buf []byte, tag uint64, p *RequestParam) (*Request, bool, error) {
	w := ep.w
	// As pullDescriptor, but the descriptor is sealed under the lock, with the send's
	// number, which is given in the order UCX sends (the receiver counts them so).
	e, self, ok := w.pullSource(buf)
	if !ok {
		return nil, false, nil
	}
	flags := ep.pullFlags()
	size := sealOverhead + pullFixed + len(e.packed) + len(self) + 8
	if size > len(buf) {
		return nil, false, nil // a receive that fits the data must fit the descriptor
	}
	d := pullDesc{sealed: make([]byte, size), self: self, op: w.pullSeq.Add(1)}
	return ep.postPull(op, p, d, func(x *ipcWait) unsafe.Pointer {
		x.tagged, x.sentTag = true, tag
		s := w.pullsSent.get(pullSeqKey{peer: ep.peer.id, src: ep.source, tag: tag}, w.waitingPullKeys)
		s.n++
		x.pullSeq = s.n
		copy(d.sealed, w.ctx.trust.seal.seal(tagPullMagic, w.ctx.trust.id,
			encodePull(0, flags, d.op, uint64(uintptr(bufPtr(buf)))-e.base, uint64(len(buf)), e.packed, self, binary.LittleEndian.AppendUint64(nil, s.n))))
		if !ep.pullHello {
			// Once per endpoint, before its first pulled tag message: this worker's
			// address, so that a receiver with no endpoint to it makes one (a receive
			// too short for a descriptor can only be answered on an endpoint it has).
			ep.pullHello = true
			ep.sendHelloLocked(op, ep.helloMessage(d.self, 0), 0)
		}
		sent := w.raw.TagSend(ep.raw, bufPtr(d.sealed), len(d.sealed), tag|ucx.PullBit, 0, int(MemoryHost), nil, 0)
		if _, st := ucx.PtrStatus(sent); st != ucx.OK && st != ucx.InProgress {
			s.n-- // not sent (the send fails): the receiver never counts it
		}
		return sent
	})
}

// helloMessage is ep's hello: this worker's sealed address self, alone on PullAM
// (ahead of a pulled tag message, or of an AmReply message: am.go). token (0: none)
// names ep in the op field, which a hello does not otherwise use (replyToken).
func (ep *Endpoint) helloMessage(self []byte, token uint64) []byte {
	t := ep.w.ctx.trust
	return t.seal.seal(pullMagic, t.id, encodePull(0, pullHelloFlag|ep.pullFlags(), token, 0, 0, nil, self, nil))
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

// onPullTruncLocked takes a truncation answer m from a worker of context sender: it
// completes the pulled send it names (tag m.value, number m.seq, to the worker whose
// source id m.count carries, from this one) only if that is the oldest send of the tag
// to that worker still waiting; anything else (an answer again, one meant for another
// worker, one numbered ahead) is refused and counted. Caller holds w.mu.
func (w *Worker) onPullTruncLocked(sender [idLen]byte, m control) {
	from, to := m.count>>16, m.count&0xffff
	var oldest *Request
	var oldestID uint64
	if to == w.source && m.seq != 0 {
		for id, r := range w.pullsOut {
			x := r.ipc
			if x.tagged && x.sentTag == m.value && x.ep != nil && x.ep.peer.id == sender && x.ep.source == from &&
				(oldest == nil || x.pullSeq < oldest.ipc.pullSeq) {
				oldest, oldestID = r, id
			}
		}
	}
	if oldest == nil || oldest.ipc.pullSeq != m.seq {
		staleControls.Add(1)
		return
	}
	delete(w.pullsOut, oldestID)
	oldest.ipc.held = false
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
	_, flags, ref, packed, addr, header, ok := decodePull(plain)
	if !ok || len(header) != 8 || binary.LittleEndian.Uint64(header) == 0 {
		r.completeLocked(opErr(r.op, ErrInvalidParam, "a pulled message's descriptor is malformed"), 0, utag)
		return
	}
	w.pullsSeen.get(pullSeqKey{src: src, tag: utag}, w.owedPullKeys).saw(binary.LittleEndian.Uint64(header))
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
// completions were seen (a pull of the same tag they start comes first), and takes its
// number then. Caller holds w.mu.
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
		to := func(ep *Endpoint) bool { return ep.peerKnown && ep.source == t.src && ep.usableLocked("") == nil }
		var seq uint64 // taken once there is an endpoint to answer on
		for _, ep := range w.eps {
			if !to(ep) {
				continue
			}
			if seq == 0 {
				// Every message of the tag from that sender that matched before this
				// one was seen by now: the first number not accounted for is this one's.
				seq = w.pullsSeen.get(pullSeqKey{src: t.src, tag: t.tag}, w.owedPullKeys).unseen()
			}
			ep.sendControlMsgLocked(control{typ: ctlPullTrunc, value: t.tag, count: truncSources(t.src, w.source), seq: seq})
		}
		if seq == 0 {
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

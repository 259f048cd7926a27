package ucp

import (
	"crypto/rand"
	"encoding/binary"
	"unsafe"

	"github.com/ucpx/ucpx/cgo/ucx"
	"github.com/ucpx/ucpx/protocol"
)

// Active messages whose data the receiver pulls. An active message of a device buffer
// (MemoryCUDA, no condition) to a peer that CUDA IPC reaches does not carry its data:
// the sender exports the buffer's allocation once (one MemH over the whole allocation,
// kept while the allocation is the same one: its buffer id) and sends, on PullAM, a
// sealed header naming the message's id, header, offset and length and the packed key.
// The receiver's handler sees a rendezvous message (IsRendezvous, Length);
// RecvData is a get of the sender's mapped buffer by the copy engine (any buffer, any
// condition a get takes), and once it completed, or once the message was released
// unreceived, the receiver tells the sender (ctlPulled) and the send completes. A send
// whose peer fails completes with the failure.

// PullAM is the active-message id ucpx reserves for messages whose data the receiver
// pulls; SetAmHandler and AmSendNbx refuse it.
const PullAM = 0xfffc

const (
	pullMagic = "UCP2"
	pullFixed = 2 + 4 + 8 + 8 + 8 + 4 + 4 // id, flags, op, offset, length, key and address lengths
)

// pullExport is an allocation exported for pulls.
type pullExport struct {
	base, size uint64
	bufferID   uint64
	memh       *MemH
	packed     []byte
}

// pullRef is what a pulled message's receiver needs: the sender's endpoint and key
// (unpacked, the range checked against it), where the data lies in the allocation,
// and the send it completes.
type pullRef struct {
	ep          *Endpoint
	rk          *Rkey
	key         *pullKey // rk's entry, held (pullKey.uses) until the pull is done
	off, length uint64
	op          uint64
}

// pullable reports whether an active message of buf goes by pull (conditioned: the
// engine issues it at its trigger).
func (ep *Endpoint) pullable(p *RequestParam, buf []byte, conditioned bool) bool {
	c := ep.w.ctx
	return len(buf) > 0 && !p.noPull && (p.Condition != nil) == conditioned && c.ipc != nil && !c.SupportsMemoryType(MemoryCUDA) &&
		declaredDevice(p) && p.Staging.Or(c.protocol.Staging) != protocol.StageAlways &&
		c.features&FeatureAM != 0 && ep.Reach(c.ipc.dev.CanAccessPeer).IPC()
}

// pullKey is the export of the allocation holding ptr, made on first use (and again
// when the allocation at that base is another one than the export's).
func (c *Context) pullKey(ptr uintptr) (*pullExport, error) {
	a, err := c.ipc.dev.IPCAllocation(ptr)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	old := c.pulls[a.Base]
	if old != nil && old.bufferID == a.BufferID && old.size == a.Size {
		c.mu.Unlock()
		return old, nil
	}
	c.mu.Unlock()
	m, err := c.MemMapPtr(uintptr(a.Base), int(a.Size), MemoryCUDA)
	if err != nil {
		return nil, err
	}
	packed, err := m.PackRkey()
	if err != nil {
		_ = m.Close()
		return nil, err
	}
	e := &pullExport{base: a.Base, size: a.Size, bufferID: a.BufferID, memh: m, packed: packed}
	c.mu.Lock()
	cur := c.pulls[a.Base]
	if cur != nil && cur.bufferID == a.BufferID && cur.size == a.Size {
		c.mu.Unlock() // another send made it meanwhile
		go m.Close()
		return cur, nil
	}
	if c.pulls == nil {
		c.pulls = map[uint64]*pullExport{}
	}
	c.pulls[a.Base] = e
	sweep := len(c.pulls) > max(c.pullsSweep, minPullsSweep)
	c.mu.Unlock()
	if cur != nil {
		// The allocation was freed and another made at its base: its importers are
		// told (revocation waits for their acknowledgements, so not here). Whoever
		// takes an export out of c.pulls closes it, once.
		go cur.memh.Close()
	}
	if sweep {
		c.sweepPulls()
	}
	return e, nil
}

// minPullsSweep is the number of pull exports below which pullKey does not look for
// freed ones. A variable: tests lower it.
var minPullsSweep = 16

// sweepPulls drops the pull exports whose allocation is gone (freed: the driver does
// not know its base, or another allocation is there), closing their regions, whose
// revocation unmaps them at the receivers. The user never registered this memory, so
// no Close says when it is freed, and nothing else would end an export whose base is
// not reused: the exports, and the receivers' mappings, which keep freed device memory
// from the driver, would grow with every allocation ever sent. pullKey sweeps once the
// exports doubled since the last sweep (a driver query each, about two per new
// export), so at most about as many freed allocations as live ones, or
// minPullsSweep, stay exported.
func (c *Context) sweepPulls() {
	c.mu.Lock()
	es := make([]*pullExport, 0, len(c.pulls))
	for _, e := range c.pulls {
		es = append(es, e)
	}
	c.mu.Unlock()
	var gone []*pullExport
	for _, e := range es { // driver calls: outside the lock
		a, err := c.ipc.dev.IPCAllocation(uintptr(e.base))
		if err != nil || a.Base != e.base || a.BufferID != e.bufferID || a.Size != e.size {
			gone = append(gone, e)
		}
	}
	c.mu.Lock()
	closing := gone[:0]
	for _, e := range gone {
		if c.pulls[e.base] == e { // else replaced or swept meanwhile, and closed there
			delete(c.pulls, e.base)
			closing = append(closing, e)
		}
	}
	c.pullsSweep = 2 * len(c.pulls)
	c.mu.Unlock()
	for _, e := range closing {
		go e.memh.Close() // revocation waits for the receivers' acknowledgements
	}
}

// amPull sends an active message of a device buffer for the receiver to pull. It
// reports false (nothing sent) where the message cannot go so: the caller stages it.
func (ep *Endpoint) amPull(op string, id uint, header, buf []byte, p *RequestParam) (*Request, bool, error) {
	w := ep.w
	d, ok := ep.pullDescriptor(pullMagic, buf, id, p.AmFlags|ep.pullFlags(), header)
	if !ok || (w.maxAmHeader > 0 && len(d.sealed) > w.maxAmHeader) {
		return nil, false, nil // the key and the header do not fit one: staged
	}
	var flags uint32
	if p.AmFlags&AmReply != 0 {
		flags = uint32(AmReply)
	}
	return ep.postPull(op, p, d, func(*ipcWait) unsafe.Pointer {
		return w.raw.AmSend(ep.raw, PullAM, bufPtr(d.sealed), len(d.sealed), nil, 0, 0, flags, -1, nil)
	})
}

// pullDesc is a pulled message's sealed descriptor, its send's id and this worker's
// sealed address (which it carries).
type pullDesc struct {
	sealed, self []byte
	op           uint64
}

// pullDescriptor seals the descriptor of a pulled message of buf (magic: its kind;
// id, flags and header: an active message's) under a new send id. ok is false where
// buf's allocation cannot be exported (VMM memory): the message is staged.
func (ep *Endpoint) pullDescriptor(magic string, buf []byte, id uint, flags AmSendFlags, header []byte) (pullDesc, bool) {
	w := ep.w
	e, self, ok := w.pullSource(buf)
	if !ok {
		return pullDesc{}, false
	}
	d := pullDesc{self: self, op: w.pullSeq.Add(1)}
	d.sealed = w.ctx.trust.seal.seal(magic, w.ctx.trust.id, encodePull(id, flags, d.op, uint64(uintptr(bufPtr(buf)))-e.base, uint64(len(buf)), e.packed, self, header))
	return d, true
}

// pullSource is what a pulled message's descriptor says of buf's memory: the export
// of its allocation, and this worker's sealed address. ok is false where either
// cannot be had (VMM memory cannot be exported): the message is staged.
func (w *Worker) pullSource(buf []byte) (e *pullExport, self []byte, ok bool) {
	e, err := w.ctx.pullKey(uintptr(bufPtr(buf)))
	if err != nil {
		return nil, nil, false
	}
	if self, err = w.pullAddress(); err != nil {
		return nil, nil, false
	}
	return e, self, true
}

// postPull sends a pulled message's descriptor d (post posts it, under w.mu, after
// filling in the send's wait) and returns the send's Request, which completes with the
// receiver's word (the descriptor's own send is done once UCX sent it).
func (ep *Endpoint) postPull(op string, p *RequestParam, d pullDesc, post func(x *ipcWait) unsafe.Pointer) (*Request, bool, error) {
	w := ep.w
	r, x := w.newIPCRequest(op, p)
	x.ep = ep
	x.held = true // until the receiver says it pulled (onPulledLocked, onPullTruncLocked)
	x.pullSend = true
	w.lockIssue()
	defer w.mu.Unlock()
	if err := ep.usableLocked(op); err != nil {
		return nil, true, err
	}
	if _, err := w.postLocked(op, post(x), &defaultParam, nil, bufPtr(d.sealed)); err != nil {
		return nil, true, opErr(op, unwrapOp(err), "")
	}
	if w.pullsOut == nil {
		w.pullsOut = map[uint64]*Request{}
	}
	w.pullsOut[d.op] = r
	w.trackIPCLocked(r)
	return r, true, nil
}

// encodePull is the plain text of a pulled message's descriptor: id, flags, op,
// offset, length, the key's and the address's lengths, the key, the sender's sealed
// worker address (the receiver may hold no endpoint to answer on: it makes one from
// it), the message's own header.
func encodePull(id uint, flags AmSendFlags, op, off, length uint64, packed, addr, header []byte) []byte {
	b := make([]byte, pullFixed, pullFixed+len(packed)+len(addr)+len(header))
	binary.LittleEndian.PutUint16(b, uint16(id))
	binary.LittleEndian.PutUint32(b[2:], uint32(flags))
	binary.LittleEndian.PutUint64(b[6:], op)
	binary.LittleEndian.PutUint64(b[14:], off)
	binary.LittleEndian.PutUint64(b[22:], length)
	binary.LittleEndian.PutUint32(b[30:], uint32(len(packed)))
	binary.LittleEndian.PutUint32(b[34:], uint32(len(addr)))
	return append(append(append(b, packed...), addr...), header...)
}

// randomPullBase is where a worker's pulled-send numbers start: random, below 2^62 so
// that they never wrap to 0.
func randomPullBase() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return binary.LittleEndian.Uint64(b[:]) >> 2
}

// onPulled completes the send opID of sender's once the receiver pulled its data.
// Caller holds w.mu.
func (w *Worker) onPulledLocked(sender [idLen]byte, opID uint64) {
	r := w.pullsOut[opID]
	if r == nil || r.ipc.ep == nil || r.ipc.ep.peer.id != sender {
		return // not ours, or another peer's claim: ignored
	}
	delete(w.pullsOut, opID)
	r.ipc.held = false
}

// failPullsLocked fails ep's sends still waiting for their receiver (the peer failed)
// or every one (ep nil: the worker closes). Caller holds w.mu.
func (w *Worker) failPullsLocked(ep *Endpoint, err error) {
	for id, r := range w.pullsOut {
		if ep == nil || r.ipc.ep == ep {
			delete(w.pullsOut, id)
			r.ipc.failed = err
			r.ipc.held = false
		}
	}
}

// onPull delivers a pulled message (the internal handler of PullAM) to the handler of
// its id, as a rendezvous message whose data RecvData pulls.
func (w *Worker) onPull(msg *AmMessage) {
	if w.ctx.ipc == nil {
		return // nobody pulls here (reply hellos are handled as they are drained: am.go)
	}
	sender, plain, err := w.ctx.trust.seal.open(pullMagic, msg.Header)
	if err != nil {
		return // not from a peer of ours: dropped
	}
	id, flags, ref, packed, addr, header, ok := decodePull(plain)
	if !ok {
		return
	}
	// The endpoint to the worker that sent it (made from its address if there is
	// none; a forged address is refused): a hello only asks for that.
	answer := ref.op
	if flags&pullHelloFlag != 0 {
		answer = 0 // a hello waits for no answer
	}
	if ref.ep, err = w.replyEndpoint(sender, addr, anySource, answer, flags&pullNoPeerErrFlag != 0); err != nil || flags&pullHelloFlag != 0 {
		return
	}
	// The length is the sender's word: it must lie in the allocation its key names
	// before a handler sizes a buffer by it. A message that does not is dropped (and
	// its send completed, so that nothing waits on it).
	if ref.rk, err = ref.ep.pulledRange(packed, ref); err != nil {
		w.mu.Lock()
		ref.ep.sendControlLocked(ctlPulled, ref.op)
		w.mu.Unlock()
		return
	}
	um := &AmMessage{w: w, ID: id, Header: header, length: int(ref.length), flags: ucx.AmRecvRndv, pull: ref}
	if AmSendFlags(flags)&AmReply != 0 {
		um.replyEP = ref.ep // the sender's endpoint (UCX's reply endpoint is never used: am.go)
	}
	w.mu.Lock()
	h := w.am[uint64(id)]
	w.mu.Unlock()
	if h == nil {
		um.Release()
		return
	}
	defer func() {
		if !um.retained.Load() {
			um.Release()
		}
	}()
	h.fn(um)
}

// decodePull reads encodePull's fields; ok is false for what is too short or
// inconsistent.
func decodePull(plain []byte) (id uint, flags uint32, ref *pullRef, packed, addr, header []byte, ok bool) {
	if len(plain) < pullFixed {
		return 0, 0, nil, nil, nil, nil, false
	}
	id = uint(binary.LittleEndian.Uint16(plain))
	flags = binary.LittleEndian.Uint32(plain[2:])
	ref = &pullRef{
		op:     binary.LittleEndian.Uint64(plain[6:]),
		off:    binary.LittleEndian.Uint64(plain[14:]),
		length: binary.LittleEndian.Uint64(plain[22:]),
	}
	keyLen := uint64(binary.LittleEndian.Uint32(plain[30:]))
	addrLen := uint64(binary.LittleEndian.Uint32(plain[34:]))
	if keyLen+addrLen > uint64(len(plain)-pullFixed) || ref.length > 1<<62 {
		return 0, 0, nil, nil, nil, nil, false
	}
	rest := plain[pullFixed:]
	return id, flags, ref, rest[:keyLen], rest[keyLen : keyLen+addrLen], rest[keyLen+addrLen:], true
}

// pulledRange is pulledKey, with ref's range checked against the allocation the key
// names. On success ref holds the key (ref.key) until the pull is done.
func (ep *Endpoint) pulledRange(packed []byte, ref *pullRef) (*Rkey, error) {
	pk, err := ep.pulledKey(packed)
	if err != nil {
		return nil, err
	}
	rk := pk.rk
	if ref.off > rk.length || ref.length > rk.length-ref.off {
		ep.w.mu.Lock()
		pk.doneLocked()
		ep.w.unlockDeferred()
		return nil, opErr("pull", ErrInvalidParam, "%d bytes at offset %d lie outside the sender's allocation of %d", ref.length, ref.off, rk.length)
	}
	ref.key = pk
	return rk, nil
}

// maxPullKeys bounds the keys an endpoint keeps for pulls: a sender cycling through
// allocations would otherwise grow them without end. A variable: tests lower it.
var maxPullKeys = 256

// pullKey is an Rkey unpacked for pulls from an endpoint's peer (ep.pullKeys by packed
// bytes, and Rkey.pull; under w.mu). Nobody else holds it, so it is destroyed
// once it is dead (revoked and flushed, evicted, its endpoint closed) and no pull in
// flight uses it.
type pullKey struct {
	ep     *Endpoint
	rk     *Rkey
	packed string
	uses   int    // pulls in flight holding rk
	used   uint64 // ep.pullUses at the last use (eviction takes the oldest)
	dead   bool
}

func (pk *pullKey) useLocked() {
	pk.uses++
	pk.ep.pullUses++
	pk.used = pk.ep.pullUses
}

// doneLocked ends a pull's use of the key; the last use of a dead one destroys it.
func (pk *pullKey) doneLocked() {
	if pk == nil {
		return
	}
	if pk.uses--; pk.uses <= 0 && pk.dead {
		pk.retireLocked()
	}
}

// retireLocked marks the key dead and destroys it unless a pull in flight still uses
// it (its doneLocked does then). Caller holds w.mu.
func (pk *pullKey) retireLocked() {
	pk.dead = true
	pk.unlinkLocked()
	if pk.uses > 0 {
		return
	}
	pk.rk.pull = nil
	if !pk.rk.closed { // the worker's Close destroys every key
		pk.rk.destroyLocked()
		pk.rk.releasedLocked()
	}
}

// unlinkLocked takes the key out of its endpoint's lookup: no new pull finds it.
func (pk *pullKey) unlinkLocked() {
	if pk.ep.pullKeys[pk.packed] == pk {
		delete(pk.ep.pullKeys, pk.packed)
	}
}

// pulledKey is the receiver's key of a pull's packed key, unpacked once per key and
// kept while it is not revoked (at most maxPullKeys per endpoint), with one use taken
// for the caller (doneLocked gives it back).
func (ep *Endpoint) pulledKey(packed []byte) (*pullKey, error) {
	w := ep.w
	w.mu.Lock()
	pk := ep.pullKeys[string(packed)]
	if pk != nil && (pk.rk.revoked || pk.rk.closed) {
		pk.unlinkLocked() // its revocation destroys it
		pk = nil
	}
	if pk != nil {
		pk.useLocked()
		w.mu.Unlock()
		return pk, nil
	}
	w.mu.Unlock()
	rk, err := ep.UnpackRkey(packed)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	if cur := ep.pullKeys[string(packed)]; cur != nil && !cur.rk.revoked && !cur.rk.closed {
		cur.useLocked()
		w.mu.Unlock()
		_ = rk.Close()
		return cur, nil
	}
	if ep.closed || w.closed.Load() {
		// Closed meanwhile: its keys were dropped already, and this one would stay.
		w.mu.Unlock()
		_ = rk.Close()
		return nil, opErr("pull", ErrClosed, "%s", ep)
	}
	if old := ep.pullKeys[string(packed)]; old != nil {
		old.unlinkLocked()
	}
	ep.evictPullKeysLocked()
	if ep.pullKeys == nil {
		ep.pullKeys = map[string]*pullKey{}
	}
	pk = &pullKey{ep: ep, rk: rk, packed: string(packed)}
	pk.useLocked()
	ep.pullKeys[pk.packed] = pk
	rk.pull = pk
	w.unlockDeferred()
	return pk, nil
}

// evictPullKeysLocked makes room for one more key: the least recently used keys no
// pull in flight uses go (revoked ones only leave the lookup: their revocation
// destroys them once flushed). Keys all in use are kept: they are bounded by the
// pulls in flight. Caller holds w.mu.
func (ep *Endpoint) evictPullKeysLocked() {
	for len(ep.pullKeys) >= maxPullKeys {
		var lru *pullKey
		for _, pk := range ep.pullKeys {
			if pk.uses == 0 && (lru == nil || pk.used < lru.used) {
				lru = pk
			}
		}
		if lru == nil {
			return
		}
		if lru.rk.revoked {
			lru.unlinkLocked()
		} else {
			lru.retireLocked()
		}
	}
}

// dropPullKeysLocked retires the keys of a closing endpoint (those in use go when
// their pull is done). Caller holds w.mu.
func (ep *Endpoint) dropPullKeysLocked() {
	if ep.w.closed.Load() {
		return // the worker's Close destroys every key
	}
	for _, pk := range ep.pullKeys {
		if pk.rk.revoked {
			pk.unlinkLocked() // its revocation destroys it once flushed
		} else {
			pk.retireLocked()
		}
	}
}

// settlePullKeysLocked retires the pull keys among rks (revoked and flushed: nothing
// can use them again). Caller holds w.mu.
func (w *Worker) settlePullKeysLocked(rks []*Rkey) {
	for _, rk := range rks {
		if rk.pull != nil {
			rk.pull.retireLocked()
		}
	}
}

// recvPulled is RecvData of a pulled message: a get of the sender's buffer, after
// which the sender is told.
func (m *AmMessage) recvPulled(op string, buf []byte, p *RequestParam) (*Request, error) {
	w, ref := m.w, m.pull
	w.mu.Lock()
	if m.consumed || w.closed.Load() {
		w.mu.Unlock()
		return nil, opErr(op, ErrClosed, "message already received or released")
	}
	m.consumed = true
	w.mu.Unlock()
	gp := *p
	gp.Callback, gp.Request = nil, nil
	get, err := ref.ep.GetNbx(buf[:ref.length], ref.rk.Base()+ref.off, ref.rk, &gp)
	if err != nil {
		w.mu.Lock()
		m.consumed = false // the caller may try again or release it
		w.mu.Unlock()
		return nil, opErr(op, unwrapOp(err), "")
	}
	r, x := w.newIPCRequest(op, p)
	x.length = int(ref.length)
	x.after(get, func(error) {
		ref.ep.sendControlLocked(ctlPulled, ref.op)
		ref.key.doneLocked()
	})
	w.mu.Lock()
	w.trackIPCLocked(r)
	w.mu.Unlock()
	return r, nil
}

// releasePulledLocked tells the sender of a pulled message nobody received that it
// may complete. Caller holds w.mu.
func (m *AmMessage) releasePulledLocked() {
	m.pull.ep.sendControlLocked(ctlPulled, m.pull.op)
	m.pull.key.doneLocked()
}

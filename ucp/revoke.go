package ucp

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Revocation. Each exported region has a random key id sealed into its packed rkeys.
// An importer tells the exporter when it unpacks a key (and when it closes it); the
// exporter's MemH.Close revokes: every importer (every worker of the importing
// context) marks its Rkeys revoked (later use fails at the call with ErrRevoked),
// flushes the endpoint the key was used on (so no put is still on its way), unmaps
// device regions and acknowledges. The memory is unmapped only after every
// importer acknowledged or died; a peer that does neither within RevokeTimeout keeps
// the memory registered, and Close says which peer it was.
//
// The messages are active messages on RevokeAM, sealed like rkeys. Importers in this
// process are handled directly, without messages.
//
// Freshness. The seal proves who sent a message, not when: the same bytes sent again
// (a replay, a duplicate from a buggy peer or a forwarder) open as well. So no message
// counts as a change: an importer's notices say how many keys of the region its
// context holds now (ctlImport after an unpack, ctlRelease after a close), numbered
// from one process-wide sequence (stateSeq), and the exporter takes a notice only if
// it is newer than the last one it took from that importer; a stale one (a replay, or
// one overtaken by a later notice sent on another endpoint) is refused. Before, each
// notice counted one up or down: a replayed release made the exporter forget an
// importer that still held a key, and MemH.Close freed the memory under it. An
// acknowledgement carries the sequence number the importer's revocation started at
// (every key noticed up to it was revoked by then), and settles the importer only if
// no newer notice came since: an old acknowledgement cannot answer for a key unpacked
// after it. A revocation, which names a key revoked for good (key ids are random per
// region), may come twice (the exporter answers an import during its Close with one
// as well): an importer acknowledges only once no revocation of the key is running in
// its context (heldKey.revoking), so that a second one that finds nothing left to
// revoke does not acknowledge while the first still flushes and unmaps.

// RevokeAM is the active-message id ucpx reserves for revocation; SetAmHandler refuses it.
const RevokeAM = 0xfffd

// DefaultRevokeTimeout bounds how long MemH.Close waits for importers of its key.
const DefaultRevokeTimeout = 2 * time.Second

const (
	ctlImport  = 1 // importer -> exporter: a key was unpacked; the keys held now (count, seq)
	ctlRelease = 2 // importer -> exporter: a key was closed; the keys held now (count, seq)
	ctlRevoke  = 3 // exporter -> importer: the key is revoked
	// ctlAck: importer -> exporter: revoked keys are unusable and flushed, every key
	// noticed up to seq included.
	ctlAck    = 4
	ctlPulled = 5 // receiver -> sender: a pulled message's data was copied or dropped (ampull.go)
	// ctlPullTrunc: receiver -> sender: a pulled tag message (the value: its tag; seq:
	// its number among the sender's sends of the tag to the receiver's worker; count:
	// the two workers' source ids) met a receive too short for its descriptor
	// (tagpull.go).
	ctlPullTrunc = 6
	// ctlReplyHello: receiver -> sender of AmReply messages: it forgot the sender of
	// the endpoint the value names, which sends its hello again (am.go).
	ctlReplyHello = 7
	ctlLen        = 1 + 8 + 8 + 8
)

// control is a control message's contents.
type control struct {
	typ   byte
	value uint64 // the key id; for pulls the op id or tag; for ctlReplyHello the endpoint's token
	// count: ctlImport, ctlRelease: the keys of the region the importer's context
	// holds; ctlPullTrunc: the two workers' source ids (truncSources).
	count uint64
	// seq: ctlImport, ctlRelease: the notice's number (stateSeq); ctlAck: the
	// revocation's start; ctlPullTrunc: the truncated send's number.
	seq uint64
}

// stateSeq numbers this process's import notices and the starts of its revocations:
// a notice numbered later says what its context holds later.
var stateSeq atomic.Uint64

// staleControls counts control messages refused as stale (replayed or overtaken).
var staleControls atomic.Uint64

// heldKey names the keys of one region (exporter, keyID) that one context of this
// process holds; held is what it knows of them. Both under heldKeys' lock, which is
// taken last (under w.mu and ctx.mu, never the other way).
type heldKey struct {
	c        *Context
	exporter [idLen]byte
	keyID    uint64
}

type held struct {
	rkeys    map[*Rkey]struct{} // of exporters elsewhere: unpacked, not destroyed
	revoking int                // revocations of the key running in c
	acks     []func()           // acknowledgements waiting for them to end
}

var heldKeys = struct {
	sync.Mutex
	m map[heldKey]*held
}{m: map[heldKey]*held{}}

// heldOf is k's record, made if there is none. Caller holds heldKeys' lock.
func heldOf(k heldKey) *held {
	h := heldKeys.m[k]
	if h == nil {
		h = &held{rkeys: map[*Rkey]struct{}{}}
		heldKeys.m[k] = h
	}
	return h
}

// holdLocked records rk, an Rkey of an exporter in another process, and returns the
// notice of it: the keys of its region c holds now, and the notice's number. Caller
// holds rk's w.mu, with rk in w.rkeys already: a revocation that starts after the
// number was taken finds it.
func holdLocked(c *Context, rk *Rkey) control {
	k := heldKey{c, rk.exporter, rk.keyID}
	heldKeys.Lock()
	defer heldKeys.Unlock()
	h := heldOf(k)
	h.rkeys[rk] = struct{}{}
	return control{typ: ctlImport, value: rk.keyID, count: uint64(len(h.rkeys)), seq: stateSeq.Add(1)}
}

// unholdLocked forgets rk (destroyed) and returns the notice of it; ok is false if rk
// was not recorded (its exporter is in this process, or was when it was unpacked).
func unholdLocked(c *Context, rk *Rkey) (msg control, ok bool) {
	k := heldKey{c, rk.exporter, rk.keyID}
	heldKeys.Lock()
	defer heldKeys.Unlock()
	h := heldKeys.m[k]
	if h == nil {
		return msg, false
	}
	if _, ok = h.rkeys[rk]; !ok {
		return msg, false
	}
	delete(h.rkeys, rk)
	if len(h.rkeys) == 0 && h.revoking == 0 {
		delete(heldKeys.m, k)
	}
	return control{typ: ctlRelease, value: rk.keyID, count: uint64(len(h.rkeys)), seq: stateSeq.Add(1)}, true
}

// contexts is every open context of this process by identity: importers here are
// revoked directly.
var contexts sync.Map // [idLen]byte -> *Context

// importer is one peer (context) that holds unpacked rkeys of a MemH.
type importer struct {
	peer  [idLen]byte
	local *Context // the importer's context, if in this process
	w     *Worker  // the exporter's worker the notice came through
	count int      // Rkeys unpacked and not closed (as far as we know)
	seq   uint64   // the last notice taken (noteHeld), for one elsewhere
	told  bool     // the revocation was sent (under the exporter's ctx.mu)
	acked bool     // an acknowledgement came, covering the notices up to ackSeq
	// ackSeq is the newest start of a revocation peer acknowledged.
	ackSeq uint64
}

// settled reports whether the importer needs no revocation now: it holds no key, or
// acknowledged one that covers its last notice. Caller holds the exporter's ctx.mu.
func (i *importer) settled() bool {
	return i.count <= 0 || i.acked && i.ackSeq >= i.seq
}

func (i *importer) String() string { return "peer " + hex.EncodeToString(i.peer[:8]) }

func encodeControlMsg(msg control) []byte {
	b := make([]byte, ctlLen)
	b[0] = msg.typ
	binary.LittleEndian.PutUint64(b[1:], msg.value)
	binary.LittleEndian.PutUint64(b[9:], msg.count)
	binary.LittleEndian.PutUint64(b[17:], msg.seq)
	return b
}

// decodeControlMsg opens a control message; anything else is ErrInvalidParam/ErrAuth.
func decodeControlMsg(s sealer, header []byte) (sender [idLen]byte, msg control, err error) {
	sender, plain, err := s.open(controlMagic, header)
	if err != nil {
		return sender, msg, err
	}
	if len(plain) != ctlLen || plain[0] < ctlImport || plain[0] > ctlReplyHello {
		return sender, msg, fmt.Errorf("control message of %d bytes: %w", len(plain), ErrInvalidParam)
	}
	return sender, control{
		typ:   plain[0],
		value: binary.LittleEndian.Uint64(plain[1:]),
		count: binary.LittleEndian.Uint64(plain[9:]),
		seq:   binary.LittleEndian.Uint64(plain[17:]),
	}, nil
}

// sendControl is sendControlLocked taking ep's worker lock; a nil ep (no endpoint to
// the peer) sends nothing.
func (ep *Endpoint) sendControl(typ byte, value uint64) {
	ep.sendControlMsg(control{typ: typ, value: value})
}

func (ep *Endpoint) sendControlMsg(msg control) {
	if ep == nil {
		return
	}
	ep.w.mu.Lock()
	ep.sendControlMsgLocked(msg)
	ep.w.mu.Unlock()
}

// sendControlLocked posts a control message on ep without waiting for it.
func (ep *Endpoint) sendControlLocked(typ byte, value uint64) {
	ep.sendControlMsgLocked(control{typ: typ, value: value})
}

func (ep *Endpoint) sendControlMsgLocked(msg control) {
	if ep.usableLocked("am_send_nbx") != nil || ep.w.ctx.features&FeatureAM == 0 {
		return // without active messages, peers in other processes are not told
	}
	w := ep.w
	h := w.ctx.trust.seal.seal(controlMagic, w.ctx.trust.id, encodeControlMsg(msg))
	ptr := w.raw.AmSend(ep.raw, RevokeAM, bufPtr(h), len(h), nil, 0, 0, 0, -1, nil)
	_, _ = w.postLocked("am_send_nbx", ptr, &defaultParam, nil, bufPtr(h))
}

// onControl handles a revocation message (the internal handler of RevokeAM).
func (w *Worker) onControl(msg *AmMessage) {
	sender, m, err := decodeControlMsg(w.ctx.trust.seal, msg.Header)
	if err != nil {
		return // not from a key holder: dropped
	}
	switch m.typ {
	case ctlImport, ctlRelease:
		w.ctx.noteHeld(w, sender, m)
	case ctlAck:
		w.ctx.noteAck(sender, m.value, m.seq)
	case ctlRevoke:
		w.revokeEveryWorker(sender, m.value)
	}
}

// revokeEveryWorker handles a revocation message: the exporter counts importers per
// context and tells one worker, so every worker of the context revokes its keys, and
// one acknowledgement goes back once all of them flushed and unmapped (an ack after
// this worker's alone let the exporter free memory another worker still mapped).
func (w *Worker) revokeEveryWorker(exporter [idLen]byte, keyID uint64) {
	w.ctx.revokeWorkers(exporter, keyID, func(seq uint64) {
		w.controlEndpoint(exporter).sendControlMsg(control{typ: ctlAck, value: keyID, seq: seq})
	})
}

// revokeWorkers revokes the key (exporter, keyID) in every worker of c and calls
// acked once all of them acknowledged and no other revocation of the key is running
// in c (at once without workers); it returns them. acked gets the revocation's start
// (stateSeq): every key of c noticed up to it is revoked.
func (c *Context) revokeWorkers(exporter [idLen]byte, keyID uint64, acked func(seq uint64)) []*Worker {
	k := heldKey{c, exporter, keyID}
	heldKeys.Lock()
	h := heldOf(k)
	h.revoking++
	seq := stateSeq.Load() // keys noticed up to here are in their worker's rkeys already
	heldKeys.Unlock()
	finishNow := func() {
		heldKeys.Lock()
		h.acks = append(h.acks, func() { acked(seq) })
		h.revoking--
		var due []func()
		if h.revoking == 0 {
			due, h.acks = h.acks, nil
			if len(h.rkeys) == 0 && heldKeys.m[k] == h {
				delete(heldKeys.m, k)
			}
		}
		heldKeys.Unlock()
		for _, f := range due {
			f()
		}
	}
	finish := finishNow
	c.limboMu.Lock()
	limbo := append([]chan struct{}(nil), c.limbo[heldKeyID{exporter, keyID}]...)
	c.limboMu.Unlock()
	if len(limbo) > 0 {
		// A closed worker keeps mappings of the key with abandoned copies still
		// queued into them: acknowledge once they were released.
		finish = func() {
			go func() {
				for _, g := range limbo {
					<-g
				}
				finishNow()
			}()
		}
	}
	ws := c.workerList()
	if len(ws) == 0 {
		finish()
		return ws
	}
	last := countdown(len(ws))
	ack := func() {
		if last() {
			finish()
		}
	}
	for _, w := range ws {
		w.revokeImported(exporter, keyID, ack)
	}
	return ws
}

// drainedControlLocked handles the control messages that are handled as they are
// drained, under w.mu: a pull's (ctlPulled, ctlPullTrunc), so that a sender sees its
// receiver's words in the order they were sent (a truncation answer must name the
// oldest send of its tag still waiting: the acknowledgements sent before it must have
// completed theirs), and ctlReplyHello, before the sender's next AmReply message goes.
// It reports whether the message was one. Caller holds w.mu.
func (w *Worker) drainedControlLocked(header []byte) bool {
	sender, m, err := decodeControlMsg(w.ctx.trust.seal, header)
	switch {
	case err != nil:
		return false
	case m.typ == ctlPulled:
		w.onPulledLocked(sender, m.value)
	case m.typ == ctlPullTrunc:
		w.onPullTruncLocked(sender, m)
	case m.typ == ctlReplyHello:
		w.helloAgainLocked(sender, m.value)
	default:
		return false
	}
	return true
}

// noteImport records that local, a context of this process, unpacked the key keyID
// (revoked directly, without messages) and reports whether the key is live; of a
// revoked key the importer is not recorded: its unpack fails.
func (c *Context) noteImport(w *Worker, peer [idLen]byte, local *Context, keyID uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.exports[keyID]
	if m == nil || m.revoked {
		return false
	}
	imp := m.importers[peer]
	if imp == nil {
		imp = &importer{peer: peer, local: local, w: w}
		m.importers[peer] = imp
	}
	imp.count++
	return true
}

// noteHeld takes an import notice (ctlImport, ctlRelease) from peer, a context in
// another process: the keys of msg.value it holds now. A notice no newer than the last
// one taken from peer is stale and refused. An importer that holds keys of a key
// revoked (or unknown: closed already) is sent the revocation; one that is still
// being revoked is recorded too, so that Close waits for it. An importer's record
// stays while the region does, at zero keys too: it remembers the last notice.
func (c *Context) noteHeld(w *Worker, peer [idLen]byte, msg control) {
	keyID := msg.value
	c.mu.Lock()
	m := c.exports[keyID]
	if m == nil {
		c.mu.Unlock()
		if msg.typ == ctlImport && msg.count > 0 {
			w.endpointTo(peer).sendControl(ctlRevoke, keyID)
		}
		return
	}
	imp := m.importers[peer]
	if imp != nil && (imp.local != nil || msg.seq <= imp.seq) {
		c.mu.Unlock()
		staleControls.Add(1)
		return
	}
	if imp == nil {
		imp = &importer{peer: peer, w: w}
		m.importers[peer] = imp
	}
	imp.count, imp.seq = int(msg.count), msg.seq
	revoked := m.revoked
	c.mu.Unlock()
	if revoked && msg.typ == ctlImport {
		// Close may have stopped waiting already (it then deletes the export).
		w.endpointTo(peer).sendControl(ctlRevoke, keyID)
	}
}

// noteRelease takes the close of a key of keyID by peer, a context of this process.
func (c *Context) noteRelease(peer [idLen]byte, keyID uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := c.exports[keyID]; m != nil {
		if imp := m.importers[peer]; imp != nil && imp.local != nil {
			if imp.count--; imp.count <= 0 {
				delete(m.importers, peer)
			}
		}
	}
}

// noteAck takes peer's acknowledgement of the revocation of keyID, which covers the
// keys peer noticed up to seq: one older than peer's last notice (a replay, or one
// that crossed a newer import) does not settle peer.
func (c *Context) noteAck(peer [idLen]byte, keyID, seq uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m := c.exports[keyID]; m != nil {
		if imp := m.importers[peer]; imp != nil {
			if seq < imp.seq {
				staleControls.Add(1)
				return
			}
			imp.acked = true
			imp.ackSeq = max(imp.ackSeq, seq)
		}
	}
}

// endpointTo finds an open endpoint of w whose authenticated peer is peer.
func (w *Worker) endpointTo(peer [idLen]byte) *Endpoint {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ep := range w.eps {
		if ep.peerKnown && ep.peer.id == peer && ep.usableLocked("") == nil {
			return ep
		}
	}
	return nil
}

// peerDead reports whether every endpoint of c to peer failed (or was watched dying).
func (c *Context) peerDead(peer [idLen]byte) bool {
	workers := c.workerList()
	seen, dead := false, true
	for _, w := range workers {
		w.mu.Lock()
		for _, ep := range w.eps {
			if ep.peerKnown && ep.peer.id == peer {
				seen = true
				if ep.err == nil {
					dead = false
				}
			}
		}
		if w.peerGoneLocked(peer) {
			seen = true // its failed internal endpoint was closed (tagpull.go)
		}
		w.mu.Unlock()
	}
	return seen && dead
}

// revokeImported makes this worker's Rkeys of (exporter, keyID) unusable, flushes the
// endpoints they were used on, unmaps their device regions, then calls ack.
func (w *Worker) revokeImported(exporter [idLen]byte, keyID uint64, ack func()) {
	w.mu.Lock()
	var eps []*Endpoint
	var mapped, pulls []*Rkey
	for rk := range w.rkeys {
		if rk.exporter == exporter && rk.keyID == keyID && !rk.revoked {
			rk.revoked = true
			eps = append(eps, rk.ep)
			if rk.ipc != nil || rk.shared != nil {
				mapped = append(mapped, rk)
			}
			if rk.pull != nil {
				pulls = append(pulls, rk)
			}
		}
	}
	w.mu.Unlock()
	last := countdown(len(eps))
	done := func() {
		if !last() {
			return
		}
		acknowledge := func() {
			if len(pulls) > 0 {
				// Keys of pulls are ours alone: flushed and unmapped, they go now (or
				// when the pull still using one is done), not when the worker closes.
				w.mu.Lock()
				w.settlePullKeysLocked(pulls)
				w.unlockDeferred()
			}
			ack()
		}
		if len(mapped) == 0 {
			acknowledge()
			return
		}
		// Device regions: their copies are flushed; unmap them before acknowledging,
		// so the exporter frees memory nobody here maps (off this goroutine: the
		// unmap may wait for the device).
		go func() {
			w.mu.Lock()
			var rel []*rkeyIPC
			var gone []chan struct{}
			for _, rk := range mapped {
				for _, x := range [...]*rkeyIPC{rk.ipc, rk.shared} {
					if x != nil && x.gone != nil {
						gone = append(gone, x.gone) // a closed key's release under way
					}
				}
				rel = append(rel, rk.takeMappingsLocked()...)
			}
			w.mu.Unlock()
			for _, x := range rel {
				x.release(w.ctx)
			}
			for _, g := range gone {
				<-g
			}
			acknowledge()
		}()
	}
	if len(eps) == 0 {
		ack() // nothing here (closed already): the exporter need not wait for us
		return
	}
	for _, ep := range eps {
		epDone := sync.OnceFunc(done) // the callback and an immediate completion may both see it done
		cb := &RequestParam{Callback: func(*Request) { epDone() }}
		r, err := ep.FlushNbx(cb)
		if err != nil {
			// A closed or failed endpoint is no proof that nothing is in flight on it:
			// CloseNbx does not wait for the CUDA IPC copies issued on it, and a failed
			// peer's copies still run on this worker's streams into the local mappings
			// this revocation unmaps (and, once acknowledged, into memory the exporter
			// frees). Wait for those copies, whatever became of the endpoint.
			w.mu.Lock()
			r = w.flushIPCLocked("rkey_revoke", completedRequest, ep, cb)
			w.mu.Unlock()
		}
		if r.Done() {
			epDone()
		}
	}
}

// revoke tells every importer of m that its key is revoked and waits (progressing
// this context's workers, and importers' in this process) until each acknowledged or
// died, or timeout passed; it returns the importers that did neither. Importers that
// announce themselves meanwhile are told and waited for too.
func (m *MemH) revoke(timeout time.Duration) []*importer {
	c := m.ctx
	// Take in the import notices that arrived already.
	for _, w := range c.workerList() {
		for i := 0; i < 16 && w.Progress() > 0; i++ {
		}
	}
	c.mu.Lock()
	for _, imp := range m.importers {
		imp.told = false // a Close after a timed-out one tells again
	}
	c.mu.Unlock()
	deadline := time.Now().Add(timeout)
	var workers []*Worker // what to progress while waiting
	for {
		var tell, left []*importer
		c.mu.Lock()
		for _, imp := range m.importers {
			if imp.settled() {
				continue
			}
			if !imp.told {
				imp.told = true
				tell = append(tell, imp)
			}
			left = append(left, imp)
		}
		c.mu.Unlock()
		for _, imp := range tell {
			workers = append(workers, m.tell(imp)...)
		}
		var alive []*importer
		for _, imp := range left {
			if imp.local != nil && imp.local.isClosed() || imp.local == nil && c.peerDead(imp.peer) {
				continue
			}
			alive = append(alive, imp)
		}
		if len(alive) == 0 || time.Now().After(deadline) {
			return alive
		}
		n := 0
		for _, w := range append(c.workerList(), workers...) {
			n += w.Progress()
		}
		if n == 0 {
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// tell revokes the key at one importer: directly for one in this process (returning
// its workers, which the wait progresses), else with a message.
func (m *MemH) tell(imp *importer) []*Worker {
	c := m.ctx
	if imp.local == nil {
		imp.w.controlEndpoint(imp.peer).sendControl(ctlRevoke, m.keyID)
		return nil
	}
	return imp.local.revokeWorkers(c.trust.id, m.keyID, func(seq uint64) { c.noteAck(imp.peer, m.keyID, seq) })
}

// revokeInProcess lets importers in this process be revoked directly; tests turn it
// off to run the message protocol between contexts of one process.
var revokeInProcess = true

// localContext is the open context of this process with identity id, if importers of
// its keys are revoked directly (revokeInProcess), else nil.
func localContext(id [idLen]byte) *Context {
	if !revokeInProcess {
		return nil
	}
	c, _ := contexts.Load(id)
	local, _ := c.(*Context)
	return local
}

func (c *Context) workerList() []*Worker {
	c.mu.Lock()
	defer c.mu.Unlock()
	ws := make([]*Worker, 0, len(c.workers))
	for w := range c.workers {
		ws = append(ws, w)
	}
	return ws
}

func (c *Context) anyEndpointTo(peer [idLen]byte) *Endpoint {
	workers := c.workerList()
	for _, w := range workers {
		if ep := w.endpointTo(peer); ep != nil {
			return ep
		}
	}
	return nil
}

// controlEndpoint is an endpoint to peer for a control message: w's, else one of
// another worker of its context (nil if none).
func (w *Worker) controlEndpoint(peer [idLen]byte) *Endpoint {
	if ep := w.endpointTo(peer); ep != nil {
		return ep
	}
	return w.ctx.anyEndpointTo(peer)
}

func (c *Context) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// unpackRkey is UnpackRkey: open the sealed key, check it was packed by ep's peer,
// unpack it in UCX, and tell the exporter who holds it.
func (ep *Endpoint) unpackRkey(packed []byte) (*Rkey, error) {
	const op = "ep_rkey_unpack"
	w := ep.w
	k, err := openRkey(w.ctx.trust.seal, packed)
	if err != nil {
		return nil, opErr(op, err, "%d bytes", len(packed))
	}
	w.mu.Lock()
	if err := ep.usableLocked(op); err != nil {
		w.mu.Unlock()
		return nil, err
	}
	if !ep.peerKnown {
		w.mu.Unlock()
		return nil, opErr(op, ErrAuth, "%s has no authenticated peer (a reply endpoint): unpack on an endpoint made by Connect, Accept or ConnectAddress", ep)
	}
	if k.sender != ep.peer.id {
		w.mu.Unlock()
		return nil, opErr(op, ErrAuth, "the key was packed by %x, not by %s's peer %x", k.sender[:8], ep, ep.peer.id[:8])
	}
	if k.ipc != nil {
		w.mu.Unlock()
		return ep.unpackRkeyIPC(k)
	}
	if ep.watch != nil && ep.watch.exited() {
		// UCX 1.13 crashes unpacking a shared-memory key whose segment went with its
		// process (ucp_ep_rkey_unpack's error path): refuse it before UCX sees it.
		w.mu.Unlock()
		return nil, opErr(op, ErrConnectionReset, "%s: the peer process exited", ep)
	}
	raw, st := ep.raw.RkeyUnpack(k.payload)
	if err := statusErr(st); err != nil {
		w.mu.Unlock()
		return nil, opErr(op, err, "")
	}
	rk, err := ep.addRkeyUnlock(&Rkey{ep: ep, raw: raw, base: k.base, length: k.length, exporter: k.sender, keyID: k.keyID})
	if err != nil {
		return nil, err
	}
	if k.shared != nil {
		if x := ep.mapSharedWords(*k.shared); x != nil {
			w.mu.Lock()
			drop := rk.closed || rk.revoked
			if !drop {
				rk.shared = x
			}
			w.mu.Unlock()
			if drop {
				x.release(w.ctx)
			}
		}
	}
	return rk, nil
}

// addRkeyUnlock records an unpacked key and tells its exporter of the import, then
// releases w.mu (held by the caller). A key whose exporter in this process closed (or
// is closing) its region is destroyed and refused with ErrRevoked: nobody would
// revoke it, and the memory may be freed already. An exporter elsewhere answers the
// import of such a key with its revocation; until that arrives the key works (keys
// of a region the peer may have closed must not be unpacked, as with UCX).
func (ep *Endpoint) addRkeyUnlock(rk *Rkey) (*Rkey, error) {
	w := ep.w
	live.rkeys.Add(1)
	// Recorded before the exporter hears of it, so that a revocation finds it.
	w.rkeys[rk] = struct{}{}
	local := localContext(rk.exporter)
	if local == nil {
		ep.sendControlMsgLocked(holdLocked(w.ctx, rk))
	}
	w.mu.Unlock()
	if local != nil && !local.noteImport(w, w.ctx.trust.id, w.ctx, rk.keyID) {
		w.mu.Lock()
		if !rk.closed { // else the worker's Close destroyed it
			rk.revoked = true // not recorded: no release notice
			rk.destroyLocked()
		}
		w.mu.Unlock()
		return nil, opErr("ep_rkey_unpack", ErrRevoked, "the key's region [%#x, +%d) was closed by its owner", rk.base, rk.length)
	}
	return rk, nil
}

// releasedLocked tells the exporter that an Rkey of its key was closed (destroyed).
// Every destruction of a key comes here, so its record (heldKeys) goes.
func (r *Rkey) releasedLocked() {
	if note := r.releaseNoteLocked(); note != nil {
		// Not under w.mu: the exporter takes its own locks.
		r.ep.w.deferred = append(r.ep.w.deferred, note)
	}
}

// releaseNoteLocked is releasedLocked but for telling an exporter in this process,
// which it returns (nil if none) for the caller to run without w.mu.
func (r *Rkey) releaseNoteLocked() func() {
	w := r.ep.w
	msg, elsewhere := unholdLocked(w.ctx, r)
	if r.revoked {
		return nil
	}
	if elsewhere {
		r.ep.sendControlMsgLocked(msg)
		return nil
	}
	if c := localContext(r.exporter); c != nil {
		me := w.ctx.trust.id
		return func() { c.noteRelease(me, r.keyID) }
	}
	return nil
}

// countdown returns a function that reports whether it has been called n times (or
// more): the last of n parallel steps goes on.
func countdown(n int) func() bool {
	var left atomic.Int64
	left.Store(int64(n))
	return func() bool { return left.Add(-1) <= 0 }
}

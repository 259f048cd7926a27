package prepare

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// The prepare phase: each request sends its peer one active message (on the
// reserved id HandshakeAM) with what later iterations need — the receiver's buffer
// and arrival counters, the sender's ready flags, as sealed remote keys — and the
// peer matches it to its own request by (endpoint, tag, order of init). The sender
// speaks first; the receiver answers once it knows the sender's partition count
// (its arrival counters are per sender partition). After this, no iteration matches
// anything.

// HandshakeAM is the active-message id the prepare phase uses on every worker that
// has prepared requests; applications must not install a handler for it.
const HandshakeAM = 0xfffe

type matchKey struct {
	peer  *ucp.Endpoint
	tag   uint64
	role  role
	index int
}

// registry matches a worker's requests with their peers' handshakes, and holds the
// senders' ack words.
type registry struct {
	w     *ucp.Worker
	mu    sync.Mutex
	next  map[matchKey]int // by (peer, tag, role) with index 0: the next index
	reqs  map[matchKey]*Request
	early map[matchKey]earlyHandshake // handshakes that came before their request
	// earlyBytes: what early holds; earlyOf: what each peer's handshakes in it hold
	// (keepEarlyLocked bounds both); earlySweep: expireEarly is due.
	earlyBytes int
	earlyOf    map[*ucp.Endpoint]earlyCount
	earlySweep bool
	// clock tells the age of a kept handshake: time.Now (a test may stop it).
	clock func() time.Time
	acks  *ackBlock      // the block new ack slots come from
	host  stream.Backend // of the ack words
	// unacked: sender requests whose iteration completed before its ack came;
	// draining: the drainer runs or is due; eagerLeft: an ack was late, and the drainer
	// starts at once for this many more drains (the registry is eager while it is
	// positive; see drain).
	unacked   map[*Request]iterSince
	draining  bool
	eagerLeft int
	relaxed   int // how many times an eager registry went lazy again
	// waiters: senders whose readied partitions wait for the receiver's readiness;
	// moving: the mover runs or is due (mover.go).
	waiters map[*Request]iterSince
	moving  bool
}

// iterSince is a sender's iteration the registry looks after (its ack, for the
// drainer; its readied partitions, for the mover), since when.
type iterSince struct {
	iter  uint64
	since time.Time
}

// drain hands the registry's drainer sender r, whose iteration it completed before
// the receiver's ack came: the drainer progresses the worker until the ack arrives
// (or r failed or was freed), so that a put-with-signal UCX still holds behind its
// fence leaves even if the application stops progressing. It parks on the worker's
// event fd between rounds: idle, it costs nothing, and it ends when nothing is left.
//
// Lazily, the drainer starts only drainDelay later (drainLater): where the transport
// completes puts at the target as it issues them (shared memory) and the application
// goes on (the next Start, Wait or Test progresses the worker), the ack is there by
// then, and a loop of iterations pays no goroutine and no progress round of its own
// per iteration. An iteration still unacknowledged after the delay (a transport that
// needs the sender's progress, such as tcp's emulated puts, or an application that
// stopped) makes the registry eager: for the next eagerDrains drains the drainer
// starts at once, as the data may be waiting for it. Then the registry tries lazy
// again: one late ack (a pause of the application) must not leave a drainer
// progressing the worker beside every later iteration, where it makes the sender see
// the receiver's readiness in the middle of its Pready calls and move the rest of the
// partitions one by one instead of together.
func (g *registry) drain(r *Request, iter uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.unacked == nil {
		g.unacked = map[*Request]iterSince{}
	}
	g.unacked[r] = iterSince{iter, time.Now()}
	eager := g.eagerLeft > 0
	if eager {
		if g.eagerLeft--; g.eagerLeft == 0 {
			g.relaxed++
		}
	}
	if g.draining {
		return
	}
	g.draining = true
	if eager {
		go g.drainer()
		return
	}
	time.AfterFunc(drainDelay, g.drainLater)
}

// eagerDrains is how many drains an eager registry starts its drainer at once for
// (or finds it running).
// A transport that needs it stays eager but for one delayed drain in eagerDrains.
const eagerDrains = 128

// drainDelay is how long an unacknowledged iteration waits for the application's own
// progress before a registry that is not eager starts its drainer.
const drainDelay = 200 * time.Microsecond

// drainLater is a lazy registry's delayed start of the drainer.
func (g *registry) drainLater() {
	if g.dropAcked() == 0 {
		return
	}
	g.mu.Lock()
	late := false
	for _, u := range g.unacked {
		if time.Since(u.since) >= drainDelay {
			late = true
			break
		}
	}
	if late {
		g.eagerLeft = eagerDrains
	}
	g.mu.Unlock()
	if late {
		g.drainer()
		return
	}
	time.AfterFunc(drainDelay, g.drainLater) // only younger iterations wait: give them their delay
}

// dropAcked forgets the senders whose ack came (or that failed or were freed) and
// returns how many are left; at none the drainer is done (draining is cleared).
func (g *registry) dropAcked() int {
	return g.sweep(&g.unacked, &g.draining, func(r *Request, it iterSince) bool {
		return int64(r.ack.load()-it.iter) >= 0 || r.gone()
	})
}

// sweep visits every request of *set (the drainer's or the mover's, under g.mu) with
// the registry unlocked, as requests lock their own mutex before the registry's, and
// forgets those visit drops unless their entry was replaced meanwhile (another
// iteration). With none left it clears *running under the same lock, so that a
// request recorded after it starts the goroutine again. It returns how many are left.
func (g *registry) sweep(set *map[*Request]iterSince, running *bool, visit func(*Request, iterSince) bool) int {
	type entry struct {
		r  *Request
		it iterSince
	}
	g.mu.Lock()
	snap := make([]entry, 0, len(*set))
	for r, it := range *set {
		snap = append(snap, entry{r, it})
	}
	g.mu.Unlock()
	var done []entry
	for _, e := range snap {
		if visit(e.r, e.it) {
			done = append(done, e)
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	m := *set
	for _, e := range done {
		if m[e.r].iter == e.it.iter {
			delete(m, e.r)
		}
	}
	if len(m) == 0 {
		*running = false
	}
	return len(m)
}

// drainer progresses the worker until every unacknowledged sender is done with.
func (g *registry) drainer() {
	g.progressWhile(&g.unacked, &g.draining, drainPoll, drainPoll, func() (bool, bool) {
		return g.dropAcked() > 0, false
	})
}

// progressWhile is the drainer's and the mover's loop: it progresses the worker for as
// long as more reports work left, sleeping on the worker's event fd after a round in
// which nothing happened (neither more's moved nor UCX's progress), for poll at first,
// doubling to max while nothing happens. When the worker closes it forgets *set's
// requests and clears *running.
func (g *registry) progressWhile(set *map[*Request]iterSince, running *bool, poll, max time.Duration, more func() (left, moved bool)) {
	ctx := context.Background()
	bound := poll
	for {
		left, moved := more()
		switch {
		case !left:
			return
		case moved || g.w.Progress() > 0:
			bound = poll
			continue
		}
		if err := g.w.WaitForEvents(ctx, bound); err != nil {
			g.mu.Lock()
			*set, *running = nil, false // the worker closed
			g.mu.Unlock()
			return
		}
		bound = min(2*bound, max)
	}
}

// drainPoll bounds a drainer's sleep on the event fd (not every transport's event
// wakes it).
const drainPoll = 100 * time.Microsecond

// gone reports whether r failed or was freed: nothing more to drain.
func (r *Request) gone() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.freed || r.err != nil
}

// ackBlock is registered C memory holding senders' ack words, one slot per sender
// request ever made on the worker: slots are never reused and the memory is never
// freed (its registration ends with the context), so a receiver's ack that lands late
// writes into no one else's memory, and a request's Test after its context closed
// still reads memory.
type ackBlock struct {
	words *ucp.Signals
	key   []byte // packed once
	used  int
}

const ackSlotsPerBlock = 64

// ackSlot is one ack word.
type ackSlot struct {
	block *ackBlock
	i     int
}

func (a ackSlot) addr() uint64 { return a.block.words.Addr(a.i) }
func (a ackSlot) load() uint64 { return a.block.words.Word(a.i).Load() }

// newAckSlot hands out a zeroed ack word.
func (g *registry) newAckSlot() (ackSlot, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.acks == nil || g.acks.used == ackSlotsPerBlock {
		if g.host == nil {
			b, err := stream.Open(stream.Host)
			if err != nil {
				return ackSlot{}, err
			}
			g.host = b
		}
		words, err := g.w.NewSignals(g.host, ackSlotsPerBlock)
		if err != nil {
			return ackSlot{}, err
		}
		key, err := words.PackRkey()
		if err != nil {
			_ = words.Close()
			return ackSlot{}, err
		}
		g.acks = &ackBlock{words: words, key: key}
	}
	a := ackSlot{block: g.acks, i: g.acks.used}
	g.acks.used++
	return a, nil
}

var registries sync.Map // *ucp.Worker -> *registry

func registryOf(w *ucp.Worker) (*registry, error) {
	if r, ok := registries.Load(w); ok {
		return r.(*registry), nil
	}
	reg := &registry{
		w: w, next: map[matchKey]int{}, reqs: map[matchKey]*Request{},
		early: map[matchKey]earlyHandshake{}, earlyOf: map[*ucp.Endpoint]earlyCount{}, clock: time.Now,
	}
	actual, loaded := registries.LoadOrStore(w, reg)
	if loaded {
		return actual.(*registry), nil
	}
	if err := w.SetAmHandler(HandshakeAM, reg.deliver); err != nil {
		registries.Delete(w)
		return nil, fmt.Errorf("prepare phase handler: %w", err)
	}
	w.OnClose(reg.workerClosed)
	return reg, nil
}

// workerClosed fails every request of the closed worker, which releases the streams
// and graphs waiting on their words (Request.fail), and forgets the registry and the
// handshakes it kept.
func (g *registry) workerClosed() {
	registries.CompareAndDelete(g.w, g)
	g.mu.Lock()
	g.early, g.earlyOf, g.earlyBytes = map[matchKey]earlyHandshake{}, map[*ucp.Endpoint]earlyCount{}, 0
	reqs := make([]*Request, 0, len(g.reqs))
	for _, r := range g.reqs {
		reqs = append(reqs, r)
	}
	g.mu.Unlock()
	for _, r := range reqs {
		r.fail(fmt.Errorf("the worker closed: %w", ErrClosed))
	}
}

// add gives r its index and hands it a handshake that came before it.
func (g *registry) add(r *Request) {
	g.mu.Lock()
	base := matchKey{peer: r.peer, tag: r.tag, role: r.role}
	r.index = g.next[base]
	g.next[base] = r.index + 1
	k := base
	k.index = r.index
	g.reqs[k] = r
	e, early := g.early[k]
	if early {
		g.dropEarlyLocked(k, e)
	}
	g.mu.Unlock()
	if early {
		r.onHandshake(e.h)
	}
}

func (g *registry) remove(r *Request) {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := matchKey{peer: r.peer, tag: r.tag, role: r.role, index: r.index}
	if g.reqs[k] == r {
		delete(g.reqs, k)
	}
}

// deliver is the handler of HandshakeAM.
func (g *registry) deliver(msg *ucp.AmMessage) {
	peer := msg.ReplyEndpoint()
	h, err := unmarshalHandshake(msg.Data())
	if peer == nil || err != nil {
		return // not ours to answer: a well-formed handshake always names its endpoint
	}
	k := matchKey{peer: peer, tag: h.tag, role: sender, index: int(h.index)}
	if h.role == sender {
		k.role = receiver
	}
	base := k
	base.index = 0
	g.mu.Lock()
	r := g.reqs[k]
	freed := r == nil && k.index < g.next[base]
	if r == nil && !freed && h.role == sender {
		// A receiver answers a sender that exists (or was freed since): only a
		// sender's handshake can come before its request.
		g.keepEarlyLocked(k, h, g.clock())
	}
	g.mu.Unlock()
	switch {
	case r != nil:
		r.onHandshake(h)
	case freed && !h.refused():
		answerFreed(peer, k)
	}
}

// answerFreed answers a handshake that names a request this worker made and freed
// since (no request takes it, ever) with a refusal of length 0, which fails the peer's
// request with ErrCanceled: a sender would otherwise resend until its context ended
// (Start: for good), and a receiver whose answer came after its sender was freed
// would wait for iterations nobody moves. Best effort, like every refusal.
func answerFreed(peer *ucp.Endpoint, k matchKey) {
	ref := freedRefusal(k.role, k.tag, k.index)
	_, _ = sendHandshake(peer, ref.marshal())
}

// Handshakes kept for requests not made yet are bounded: a peer (a faulty or hostile
// one) sending handshakes nobody asks for must not grow the process without limit,
// nor take the room other peers' handshakes need, nor keep one for good. A worker
// keeps at most maxEarly of them in maxEarlyBytes, a peer (a reply endpoint) a quarter
// of that, each for earlyTTL to 1.5 earlyTTL after it came (a later one for the same
// request replaces it). Past a bound a handshake is dropped, and one too old is
// forgotten: a sender resends its handshake every resendAfter while its PrepareAll or
// Start waits, so that costs an honest pair a resend, not the match. A receiver's
// answer is never kept: its sender exists before the receiver speaks (one freed since
// is answered by answerFreed).
const (
	maxEarly             = 4096
	maxEarlyBytes        = 16 << 20
	maxEarlyPerPeer      = maxEarly / 4
	maxEarlyBytesPerPeer = maxEarlyBytes / 4
	earlyTTL             = time.Second
)

// earlyHandshake is a handshake kept for a request not made yet, and when it came.
type earlyHandshake struct {
	h  handshake
	at time.Time
}

// earlyCount is how many handshakes one peer has kept, and their size.
type earlyCount struct{ n, bytes int }

// keepEarlyLocked keeps h, which came at now, for the request k names until it is
// made, within the bounds (past them h is dropped). Caller holds g.mu.
func (g *registry) keepEarlyLocked(k matchKey, h handshake, now time.Time) {
	if old, ok := g.early[k]; ok {
		g.dropEarlyLocked(k, old)
	}
	size, c := h.size(), g.earlyOf[k.peer]
	if len(g.early) >= maxEarly || g.earlyBytes+size > maxEarlyBytes ||
		c.n >= maxEarlyPerPeer || c.bytes+size > maxEarlyBytesPerPeer {
		return
	}
	g.early[k] = earlyHandshake{h: h, at: now}
	g.earlyBytes += size
	g.earlyOf[k.peer] = earlyCount{c.n + 1, c.bytes + size}
	if !g.earlySweep {
		g.earlySweep = true
		time.AfterFunc(earlyTTL/2, g.expireEarly)
	}
}

// dropEarlyLocked forgets the kept handshake e of k. Caller holds g.mu.
func (g *registry) dropEarlyLocked(k matchKey, e earlyHandshake) {
	delete(g.early, k)
	size := e.h.size()
	g.earlyBytes -= size
	if c := g.earlyOf[k.peer]; c.n > 1 {
		g.earlyOf[k.peer] = earlyCount{c.n - 1, c.bytes - size}
	} else {
		delete(g.earlyOf, k.peer) // and with it the peer's endpoint
	}
}

// expireEarly forgets the kept handshakes that came earlyTTL ago or more, every
// earlyTTL/2 for as long as any is kept.
func (g *registry) expireEarly() {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.clock()
	for k, e := range g.early {
		if now.Sub(e.at) >= earlyTTL {
			g.dropEarlyLocked(k, e)
		}
	}
	if len(g.early) > 0 {
		time.AfterFunc(earlyTTL/2, g.expireEarly)
		return
	}
	g.earlySweep = false
	// A map keeps the room it once grew to: a flood's is given back.
	g.early, g.earlyOf = map[matchKey]earlyHandshake{}, map[*ucp.Endpoint]earlyCount{}
}

// onHandshake takes the peer's handshake. One r cannot take (buffers of different
// lengths, partitions that do not split the peer's, keys that do not unpack) fails r
// and is answered with a refusal, which fails the peer's request too: each side learns
// why at its PrepareAll or Start, where otherwise a sender would resend until its
// context ended and a receiver would wait for data that never comes.
func (r *Request) onHandshake(h handshake) {
	refusal, failed := r.takeHandshake(h)
	if failed != nil {
		r.fail(failed) // no stream stays blocked on the request
	}
	if refusal != nil {
		// Best effort: a peer that does not get it fails its own way (its context, or
		// the endpoint's failure). AmHandlers may call ucpx methods.
		_, _ = r.sendHandshake(refusal.marshal())
	}
}

// takeHandshake is onHandshake under r.mu: the refusal to answer with, if any, and
// the error r fails with (which onHandshake applies once r.mu is released).
func (r *Request) takeHandshake(h handshake) (refusal *handshake, failed error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.freed:
		// A handshake found just before Free forgot r (taking its keys would leak them):
		// answered as deliver answers one that names r afterwards.
		if h.refused() {
			return nil, nil
		}
		ref := freedRefusal(r.role, r.tag, r.index)
		return &ref, nil
	case r.role == sender && r.isPrepared():
		// The receiver's answer prepared r: what comes later is a duplicate, or the
		// refusal of a freed receiver to a resend it had answered before (a receiver
		// refuses a sender's handshake instead of answering it, never after).
		return nil, nil
	case h.refused() && h.length == 0:
		return nil, fmt.Errorf("prepare: the peer's request was freed before the match completed: %w", ErrCanceled)
	case h.refused():
		return nil, fmt.Errorf("prepare: the peer refused the match (its buffer has %d bytes, this one %d): %w", h.length, len(r.buf), ErrInvalidParam)
	case r.isPrepared():
		return nil, nil // a duplicate (of the sender's handshake): the first one counts
	case r.peerInfo.parts != 0:
		return nil, nil // a resent handshake that came again before this side finished
	case r.err != nil && r.refusedPeer:
		ref := r.refusal()
		return &ref, nil // answer a resent handshake of a peer refused before
	case r.err != nil:
		return nil, nil
	}
	var err error
	switch {
	case h.length != uint64(len(r.buf)):
		err = fmt.Errorf("prepare: the peer's buffer has %d bytes, this one %d: %w", h.length, len(r.buf), ErrInvalidParam)
	case h.length%uint64(h.parts) != 0:
		err = fmt.Errorf("prepare: the peer's %d partitions do not split %d bytes: %w", h.parts, h.length, ErrInvalidParam)
	default:
		err = r.takeRemoteLocked(h)
	}
	if err != nil {
		r.refusedPeer = true
		ref := r.refusal()
		return &ref, err
	}
	r.peerInfo = h
	r.stats.TagMatches++
	if r.role == sender {
		close(r.prepared)
	}
	// A receiver is prepared once its own handshake went out (PrepareAll).
	return nil, nil
}

// sendHandshake sends b, a marshalled handshake, to r's peer.
func (r *Request) sendHandshake(b []byte) (*ucp.Request, error) { return sendHandshake(r.peer, b) }

// sendHandshake sends b, a marshalled handshake, to peer.
func sendHandshake(peer *ucp.Endpoint, b []byte) (*ucp.Request, error) {
	return peer.AmSendNbx(HandshakeAM, nil, b, &ucp.RequestParam{AmFlags: ucp.AmReply | ucp.AmEager})
}

// takeRemoteLocked unpacks the peer's keys.
func (r *Request) takeRemoteLocked(h handshake) error {
	r.remote.parts = int(h.parts)
	wk, err := r.peer.UnpackRkey(h.wordKey)
	if err != nil {
		return fmt.Errorf("prepare: the peer's words: %w", err)
	}
	r.remote.wordKey, r.remote.wordBase = wk, h.wordBase
	if r.role == sender {
		bk, err := r.peer.UnpackRkey(h.bufKey)
		if err != nil {
			return fmt.Errorf("prepare: the peer's buffer: %w", err)
		}
		r.remote.bufKey, r.remote.bufBase = bk, h.base
		return r.checkDirectKeysLocked()
	}
	ak, err := r.peer.UnpackRkey(h.ackKey)
	if err != nil {
		return fmt.Errorf("prepare: the peer's ack word: %w", err)
	}
	r.remote.ackKey, r.remote.ackBase = ak, h.ackBase
	return nil
}

// ownHandshake is what r tells its peer.
func (r *Request) ownHandshakeLocked() (handshake, error) {
	h := handshake{role: r.role, tag: r.tag, index: uint32(r.index), parts: uint32(r.parts), length: uint64(len(r.buf))}
	wk, err := r.words.PackRkey()
	if err != nil {
		return h, err
	}
	h.wordKey, h.wordBase = wk, r.words.Addr(0)
	if r.role == receiver {
		bk, err := r.memh.PackRkey()
		if err != nil {
			return h, err
		}
		h.bufKey, h.base = bk, uint64(ptrOf(r.xfer))
		return h, nil
	}
	h.ackKey, h.ackBase = r.ack.block.key, r.ack.addr()
	return h, nil
}

func ptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// receiverWordsLocked makes a receiver's arrival counters (one per sender partition)
// and the source of its readiness write (filled at each Start), once the sender's
// partition count is known.
func (r *Request) receiverWordsLocked() error {
	words, err := r.w.NewSignals(r.backend, r.remote.parts)
	if err != nil {
		return err
	}
	ones, err := r.w.Context().MemAlloc(8 * (r.remote.parts + 1))
	if err != nil {
		_ = words.Close()
		return err
	}
	r.words, r.ones = words, ones
	return nil
}

// PrepareAll runs the prepare phase of every request that has not run it (MPI
// partitioned communication's matching step, once): each is matched with its peer's
// request and learns what its iterations need, in one exchange. The peers must call
// PrepareAll (or Start) too. It is idempotent; it returns when all are prepared, ctx
// ends, or a peer fails.
func PrepareAll(ctx context.Context, reqs ...*Request) error {
	if ctx == nil {
		return fmt.Errorf("prepare all: nil context: %w", ErrInvalidParam)
	}
	for _, r := range reqs {
		if r == nil {
			return fmt.Errorf("prepare all: nil request: %w", ErrInvalidParam)
		}
	}
	for i := 0; ; i++ {
		done := true
		for _, r := range reqs {
			ok, err := r.prepareStep()
			if err != nil {
				return err
			}
			done = done && ok
		}
		if done {
			return nil
		}
		progressed := false
		seen := map[*ucp.Worker]bool{}
		for _, r := range reqs {
			if !seen[r.w] {
				seen[r.w] = true
				progressed = r.w.Progress() > 0 || progressed
			}
		}
		if progressed {
			continue
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("prepare all: %w", err)
		}
		if i > 1024 {
			time.Sleep(20 * time.Microsecond)
		} else {
			runtime.Gosched()
		}
	}
}

// resendAfter: a sender whose handshake was not answered sends it again after this
// long. A peer's worker drops an active message that comes before the peer made its
// first prepared request (no handler yet), so the first one may be lost.
const resendAfter = 20 * time.Millisecond

// resendDueLocked reports whether a sender should send its handshake again.
func (r *Request) resendDueLocked() bool {
	return r.role == sender && r.sent && r.hsReq.Done() && time.Since(r.sentAt) >= resendAfter && !r.isPrepared()
}

// isPrepared reports whether r's prepare phase is done.
func (r *Request) isPrepared() bool {
	select {
	case <-r.prepared:
		return true
	default:
		return false
	}
}

// prepareStep advances r's prepare phase: send its handshake when it may (a sender at
// once, a receiver once it knows the sender), and report whether r is prepared.
func (r *Request) prepareStep() (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.errLocked(); err != nil {
		return false, err
	}
	if r.role == receiver && r.remote.parts == 0 {
		return false, nil // the sender speaks first
	}
	if !r.sent || r.resendDueLocked() {
		if r.role == receiver {
			if err := r.receiverWordsLocked(); err != nil {
				return false, fmt.Errorf("prepare: %w", err)
			}
		}
		h, err := r.ownHandshakeLocked()
		if err != nil {
			return false, fmt.Errorf("prepare: %w", err)
		}
		r.hsData = h.marshal()
		req, err := r.sendHandshake(r.hsData)
		if err != nil {
			return false, fmt.Errorf("prepare: send handshake: %w", err)
		}
		r.hsReq, r.sent, r.sentAt = req, true, time.Now()
	}
	if !r.hsReq.Done() {
		return false, nil
	}
	if err := r.hsReq.Err(); err != nil {
		r.err = fmt.Errorf("prepare: send handshake: %w", err)
		return false, r.err
	}
	if r.isPrepared() {
		return true, nil
	}
	if r.role == receiver {
		close(r.prepared)
		return true, nil
	}
	return false, nil // a sender waits for the receiver's answer
}

package protocol

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ucpx/ucpx/stream/streamcore"
)

// Config holds the tuning values of the transfer protocol. The zero value of a field
// means its default (DefaultConfig); docs/performance.md has the measurements behind
// the defaults.
type Config struct {
	// StagingPart: a staged RMA of a device buffer larger than this moves in parts of
	// this size, so that part i's transfer overlaps part i+1's staging copy.
	StagingPart int
	// PollCompletionBytes: a stream-ordered operation moving at least this many bytes
	// has its stream wait for completion with Stream.PollValue (an active poll), not a
	// memop wait, which a GPU looks at again only every few microseconds once it is
	// not satisfied at once.
	PollCompletionBytes int
	// RingAfter: the engine rings the GPU's doorbell (streamcore.WordBlock.Ring) when a
	// stream-ordered operation on a CUDA stream completes at least this long after it
	// was issued: late enough for the GPU to have stopped watching the memop wait.
	// Earlier completions are not rung (a ring then only slows the stream).
	RingAfter time.Duration
	// ReserveBuffers is how many staging buffers of the smallest class each CUDA
	// backend's pool allocates when first used, so that small staged messages never
	// allocate pinned memory on their way.
	ReserveBuffers int
	// Staging is the workspace policy of every operation that does not set its own
	// (Transfer.Staging); the zero value is StageWhenNeeded.
	Staging Staging
	// Workspace, if set, is the staging memory of every staged operation on its
	// backend (see Workspace): bounded, with back-pressure. Operations on other
	// backends, and all without it, stage through the planner's pool. The caller
	// closes it after the planners (contexts) using it.
	Workspace *Workspace
	// Stats, if set, counts what the planner staged (package ucp sets it per worker
	// for Worker.StagingStats).
	Stats *Stats
}

// MinStagingPart is the smallest Config.StagingPart (a workspace's smallest slot).
const MinStagingPart = 4 << 10

// Defaults of Config.
const (
	DefaultStagingPart         = 4 << 20
	DefaultPollCompletionBytes = 16 << 10
	DefaultRingAfter           = 2 * time.Microsecond
	DefaultReserveBuffers      = 4
)

// DefaultConfig is the configuration the zero Config stands for.
func DefaultConfig() Config {
	return Config{
		StagingPart:         DefaultStagingPart,
		PollCompletionBytes: DefaultPollCompletionBytes,
		RingAfter:           DefaultRingAfter,
		ReserveBuffers:      DefaultReserveBuffers,
	}
}

// Resolve checks c and fills its zero fields with the defaults.
func (c Config) Resolve() (Config, error) {
	if c.StagingPart < 0 || c.PollCompletionBytes < 0 || c.RingAfter < 0 || c.ReserveBuffers < 0 {
		return c, fmt.Errorf("protocol config %+v: negative value: %w", c, ErrInvalidParam)
	}
	if !c.Staging.valid() {
		return c, fmt.Errorf("protocol config: unknown staging policy %v: %w", c.Staging, ErrInvalidParam)
	}
	if c.StagingPart != 0 && c.StagingPart < MinStagingPart {
		// Each part holds a staging buffer and its own stream work: tiny parts multiply
		// both (a byte per part made a transfer of n bytes n parts).
		return c, fmt.Errorf("protocol config: StagingPart %d below %d: %w", c.StagingPart, MinStagingPart, ErrInvalidParam)
	}
	d := DefaultConfig()
	if c.StagingPart == 0 {
		c.StagingPart = d.StagingPart
	}
	if c.PollCompletionBytes == 0 {
		c.PollCompletionBytes = d.PollCompletionBytes
	}
	if c.RingAfter == 0 {
		c.RingAfter = d.RingAfter
	}
	if c.ReserveBuffers == 0 {
		c.ReserveBuffers = d.ReserveBuffers
	}
	return c, nil
}

// Direction says which way an operation's buffer moves.
type Direction int

const (
	// NoBuffer: flush, atomics.
	NoBuffer Direction = iota
	// Out: sends and puts read the buffer.
	Out
	// In: receives and gets write the buffer.
	In
)

// Transfer is what an operation asks of the protocol.
type Transfer struct {
	Buf []byte
	Dir Direction
	// Splittable: the operation may move in parts (RMA: part i goes to the remote
	// address plus its offset). Messages are one UCX message each.
	Splittable bool
	// RegisteredHost: the buffer is covered by a host-memory registration, so it is
	// host memory and needs no look-up.
	RegisteredHost bool
	// DeclaredDevice: the caller said the buffer is device memory (RequestParam.MemoryType).
	DeclaredDevice bool
	// Staging is the operation's workspace policy; StageDefault takes Config.Staging.
	Staging Staging
	// Direct: the operation moves the buffer itself, whatever memory it is (the CUDA
	// IPC path: copy-engine copies into a same-host peer's mapped memory), so nothing
	// is staged and device memory needs no stream.
	Direct bool
	// StageOffStream, when set, takes a device buffer that has no stream to stage on
	// (kernel-triggered and graph conditions, captured operations, host-stream
	// backends, non-blocking receives) instead of the plan refusing it: the plan moves
	// the buffer as is, the caller staging it when the operation is issued, and
	// StageOffStream makes what that will need, on the caller's goroutine.
	StageOffStream func() error
	// PullableIn: a message receive whose data a pull may put into the device buffer
	// itself (the CUDA-IPC path): staged at the issue (StageOffStream) where it would be
	// staged on the stream, whose copy in would overwrite what was pulled.
	PullableIn bool
}

// Route is how the operation is triggered and completed.
type Route struct {
	Backend streamcore.Backend
	// OnStream: a Stream condition carries the operation (staging copies need a stream).
	OnStream bool
	// StreamOrdered: later work on the stream waits for the operation's completion.
	StreamOrdered bool
	// Grouped: the operation joins an open group (one trigger: no parts).
	Grouped bool
	// What names the triggering for messages ("kernel-triggered condition", ...).
	What string
}

// Part is one piece of an operation's plan: what the operation moves, and the stream
// work around its trigger.
type Part struct {
	// Offset of the part in the user's buffer.
	Offset int
	// Buf is what the UCX operation moves: the user's bytes, or a staging buffer.
	Buf []byte
	// Staged: Buf is a staging buffer (host memory) standing for device memory.
	Staged bool
	// Before is enqueued before the trigger (a device-to-host copy), After after the
	// completion wait (a host-to-device copy); nil when there is nothing to do.
	Before, After func(s streamcore.Stream) error
	// Release returns the staging buffer of an outgoing part once the operation is
	// done with it (an incoming part's goes back on the stream, after the copy in:
	// where the stream refuses that, After fails with a *GiveBackRefused).
	Release func()
	// unused returns the staging buffer of a part that will never run; quiet does the
	// same without any driver call (no doorbell), so a CUDA host function may run it
	// (TakeUnused). quiet nil: unused makes none.
	unused, quiet func()
}

// GiveBackRefused is the error of an incoming part's After whose copy in is enqueued
// but whose stream refused the host function that gives the staging buffer back after
// it (cuLaunchHostFunc failing). Give gives the buffer back: the caller runs it once
// the stream has passed the copy, never before (the copy still reads the buffer). It
// makes no driver call, so it may run as a stream host function.
type GiveBackRefused struct {
	Err  error
	Give func()
}

func (e *GiveBackRefused) Error() string {
	return "enqueue the staging buffer's give-back after the copy in: " + e.Err.Error()
}

func (e *GiveBackRefused) Unwrap() error { return e.Err }

// giveBackAfter enqueues give on s, after the copy in just enqueued there.
func giveBackAfter(s streamcore.Stream, give func()) error {
	if err := s.LaunchHostFunc(give); err != nil {
		return &GiveBackRefused{Err: err, Give: give}
	}
	return nil
}

// TakeUnused takes the give-back of the part's staging (nil if it has none), for a
// caller that gives the buffer back itself once nothing uses it any more: Unused and
// Release give it back no more. The function makes no driver call, so it may run as
// a stream host function.
func (p *Part) TakeUnused() func() {
	give := p.quiet
	if give == nil {
		give = p.unused
	}
	p.unused, p.quiet, p.Release = nil, nil, nil
	return give
}

// Plan is how one operation's buffer travels.
type Plan struct {
	// Parts: one for an operation moved as is or staged whole; several for a staged
	// RMA moved in parts.
	Parts []Part
	// Poll: the stream waits for completion with Stream.PollValue.
	Poll bool
	// Ring: a late completion rings the GPU's doorbell.
	Ring bool
	// RingAfter is Config.RingAfter.
	RingAfter time.Duration
	single    [1]Part
}

// Planner decides how buffers travel for one communication engine: which memory
// needs staging, through which pool, in how many parts, and how the stream waits.
type Planner struct {
	cfg           Config
	cudaTransport bool // the transport moves device memory itself: no staging

	mu     sync.Mutex
	pools  map[streamcore.Backend]*Pool
	closed bool
	// last is the pool used last: the common case of one backend costs no lock.
	last atomic.Pointer[lastPool]
}

type lastPool struct {
	b    streamcore.Backend
	pool *Pool
}

// NewPlanner makes a planner with cfg (resolved: see Config.Resolve). cudaTransport
// says the transport can move device memory itself.
func NewPlanner(cfg Config, cudaTransport bool) (*Planner, error) {
	cfg, err := cfg.Resolve()
	if err != nil {
		return nil, err
	}
	return &Planner{cfg: cfg, cudaTransport: cudaTransport}, nil
}

// Config is the planner's resolved configuration.
func (pl *Planner) Config() Config {
	if pl == nil {
		return Config{}
	}
	return pl.cfg
}

// Prepare makes the staging pool of backend b ready (reserving its buffers) where b
// may stage, so that no later operation allocates pinned memory on the engine's path.
// Callers call it where blocking is harmless: on the user's goroutine.
func (pl *Planner) Prepare(b streamcore.Backend) error {
	if pl == nil || b == nil {
		return fmt.Errorf("staging pool: nil planner or backend: %w", ErrInvalidParam)
	}
	_, err := pl.pool(b)
	return err
}

// Lent is how many staging buffers the planner's pools have lent and not got back
// (workspace slots aside): zero once every staged operation ended and its streams
// passed the copies on its buffers.
func (pl *Planner) Lent() int {
	if pl == nil {
		return 0
	}
	pl.mu.Lock()
	defer pl.mu.Unlock()
	n := 0
	for _, p := range pl.pools {
		n += p.Lent()
	}
	return n
}

// pool returns b's staging pool, made on first use (pinned buffers on CUDA, reserved
// at once where device memory needs staging; mapped host memory on host backends).
func (pl *Planner) pool(b streamcore.Backend) (*Pool, error) {
	if last := pl.last.Load(); last != nil && last.b == b {
		return last.pool, nil // a closed pool refuses Get itself
	}
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.closed {
		return nil, fmt.Errorf("staging pool: %w", ErrClosed)
	}
	if p := pl.pools[b]; p != nil {
		pl.last.Store(&lastPool{b, p})
		return p, nil
	}
	p := NewPool(b)
	if b.Kind() == streamcore.KindCUDA && !pl.cudaTransport {
		if err := p.Reserve(minClass, pl.cfg.ReserveBuffers); err != nil {
			_ = p.Close()
			return nil, fmt.Errorf("staging pool: %w", err)
		}
	}
	if pl.pools == nil {
		pl.pools = map[streamcore.Backend]*Pool{}
	}
	pl.pools[b] = p
	pl.last.Store(&lastPool{b, p})
	return p, nil
}

// Plan decides how t travels on route r, into pl2 (which the caller may keep inside a
// larger object: a one-part plan allocates nothing). It fails at the call, with the
// reason, for what cannot travel at all (device memory without a stream to stage on,
// device memory on a host backend, device memory with no direct path under
// StageNever).
func (pl *Planner) Plan(t Transfer, r Route, pl2 *Plan) error {
	if pl == nil || pl2 == nil || r.Backend == nil {
		return fmt.Errorf("plan: nil planner, plan or route backend: %w", ErrInvalidParam)
	}
	*pl2 = Plan{RingAfter: pl.cfg.RingAfter}
	pl2.Poll = r.StreamOrdered && len(t.Buf) >= pl.cfg.PollCompletionBytes
	pl2.Ring = r.StreamOrdered && !pl2.Poll && r.Backend.Kind() == streamcore.KindCUDA
	pl2.single[0] = Part{Buf: t.Buf}
	pl2.Parts = pl2.single[:]
	if t.Direct {
		return nil
	}
	if t.DeclaredDevice && r.Backend.Kind() == streamcore.KindHost {
		if t.StageOffStream != nil {
			return t.StageOffStream()
		}
		return fmt.Errorf("device memory (RequestParam.MemoryType) with a host-stream backend: host streams run on the CPU and cannot move device memory: %w", ErrInvalidParam)
	}
	if !t.Staging.valid() {
		return fmt.Errorf("unknown staging policy %v: %w", t.Staging, ErrInvalidParam)
	}
	if t.Dir == NoBuffer || len(t.Buf) == 0 {
		return nil
	}
	policy := t.Staging.Or(pl.cfg.Staging)
	always := policy == StageAlways
	if t.RegisteredHost && !always {
		return nil
	}
	cuda := r.Backend.Kind() == streamcore.KindCUDA
	if !always && (!cuda || pl.cudaTransport) {
		return nil // a direct path for every buffer: no look-up
	}
	pool, err := pl.pool(r.Backend)
	if err != nil {
		return err
	}
	addr := uintptr(unsafe.Pointer(&t.Buf[0]))
	kind := KindHost
	if cuda && !t.RegisteredHost {
		if kind, err = pool.Classify(addr); err != nil {
			return fmt.Errorf("buffer %#x: %w", addr, err)
		}
	}
	device := kind == KindDevice
	noDirect := device && cuda && !pl.cudaTransport
	switch {
	case policy == StageNever && noDirect:
		return fmt.Errorf("device buffer with StageNever: the transport here has no CUDA support and no IPC path reaches the peer, and staging is refused: %w", ErrUnsupported)
	case !always && !noDirect:
		return nil
	case t.PullableIn && !always && device && t.StageOffStream != nil:
		return t.StageOffStream()
	case !r.OnStream:
		if !device {
			return nil // StageAlways, but nothing to copy on: a host buffer moves as is
		}
		if t.StageOffStream != nil {
			return t.StageOffStream()
		}
		return fmt.Errorf("device buffer with a %s: the transport here has no CUDA support, and staging needs a stream: %w", r.What, ErrUnsupported)
	case t.Dir == In && !r.StreamOrdered:
		if !device {
			return nil
		}
		if t.StageOffStream != nil {
			return t.StageOffStream()
		}
		return fmt.Errorf("device receive buffer with a non-blocking enqueue: staged data is copied in on the stream after completion: %w", ErrUnsupported)
	}
	if ws := pl.cfg.Workspace; ws != nil && ws.backend == r.Backend {
		if err := pl.planWorkspace(ws, pool, t, r, pl2, addr); err != nil {
			pl2.Unused(0)
			return err
		}
		return nil
	}
	n := len(t.Buf)
	count := 1
	if t.Splittable && !r.Grouped && n > pl.cfg.StagingPart {
		count = (n + pl.cfg.StagingPart - 1) / pl.cfg.StagingPart
		pl2.Parts = make([]Part, count)
	}
	for i := range count {
		off := i * pl.cfg.StagingPart
		size := n - off
		if count > 1 {
			size = min(pl.cfg.StagingPart, size)
		} else {
			off, size = 0, n
		}
		if err := stage(pool, pl.cfg.Stats, &pl2.Parts[i], addr+uintptr(off), off, size, t.Dir); err != nil {
			pl2.Unused(0)
			return fmt.Errorf("staging part %d of %d bytes: %w", i, size, err)
		}
	}
	return nil
}

// planWorkspace stages t through ws: an RMA in parts of one slot each, a message in
// consecutive slots (or memory of its own from pool when larger than a half).
func (pl *Planner) planWorkspace(ws *Workspace, pool *Pool, t Transfer, r Route, pl2 *Plan, dev uintptr) error {
	st := pl.cfg.Stats
	n := len(t.Buf)
	if !(t.Splittable && !r.Grouped) {
		k := ws.slotsFor(n)
		if k == 0 {
			st.movedAside()
			if err := stage(pool, st, &pl2.Parts[0], dev, 0, n, t.Dir); err != nil {
				return fmt.Errorf("staging a message of %d bytes (larger than the workspace's half): %w", n, err)
			}
			return nil
		}
		ws.mu.Lock()
		l, err := ws.takeLocked(n, k, t.Dir, st)
		var prev []uint64
		var busy bool
		if err == nil {
			prev, busy = l.pendingPrevLocked()
		}
		ws.mu.Unlock()
		if err != nil {
			return err
		}
		st.staged(n)
		stageLease(&pl2.Parts[0], l, prev, busy, false, pool, st, dev, 0, t.Dir)
		return nil
	}
	count := (n + ws.slot - 1) / ws.slot
	if count > 1 {
		pl2.Parts = make([]Part, count)
	}
	leases := make([]*lease, count)
	// Only the first round's parts may wait for other operations' uses of their slots;
	// later parts reuse this operation's own (stageReuse).
	var prevs [WorkspaceSlots][]uint64
	var busys [WorkspaceSlots]bool
	ws.mu.Lock() // one operation's slots in one run of the ring
	for i := range count {
		size := min(ws.slot, n-i*ws.slot)
		l, err := ws.takeLocked(size, 1, t.Dir, st)
		if err != nil {
			ws.mu.Unlock()
			for _, l := range leases[:i] {
				l.free()
			}
			return err
		}
		leases[i] = l
		if i < WorkspaceSlots {
			prevs[i], busys[i] = l.pendingPrevLocked()
		}
	}
	ws.mu.Unlock()
	mems := make([]*leaseMem, count)
	for i, l := range leases {
		st.staged(l.n)
		off := i * ws.slot
		p := &pl2.Parts[i]
		reused := t.Dir == In && i+WorkspaceSlots < count
		if i < WorkspaceSlots {
			mems[i] = stageLease(p, l, prevs[i], busys[i], reused, pool, st, dev+uintptr(off), off, t.Dir)
		} else {
			mems[i] = stageReuse(p, mems[i-WorkspaceSlots], l, reused, pool, st, dev, off, t.Dir)
		}
	}
	return nil
}

// leaseMem is the memory of a part staged through the workspace: the lease's slots, or
// pool memory of its own once waiting for the slots proved unsafe (stageLease).
type leaseMem struct {
	l    *lease
	own  *Buffer
	pool *Pool
	st   *Stats
}

func (m *leaseMem) addr() uintptr {
	if m.own != nil {
		return m.own.Addr()
	}
	return m.l.addr()
}

// free gives the memory back; release also rings (not from CUDA host functions).
func (m *leaseMem) free()    { m.giveBack(m.l.free) }
func (m *leaseMem) release() { m.giveBack(m.l.release) }

func (m *leaseMem) giveBack(freeLease func()) {
	if b := m.own; b != nil {
		m.own = nil
		m.st.giveBack(b.Size())
		m.pool.Put(b)
		return
	}
	freeLease()
}

// stageLease fills p so that n bytes at dev move through l's slots. When busy, the
// slots' previous uses were not done at plan time: the stream waits for them before
// the part, where that is safe (lease.armOn); where it is not, the part moves through
// pool memory of its own instead (counted as oversize), so that no wait can deadlock.
// reused: a later part of the same operation copies this incoming part out and gives
// its memory back (stageReuse); its Release only says that it landed.
func stageLease(p *Part, l *lease, prev []uint64, busy, reused bool, pool *Pool, st *Stats, dev uintptr, off int, dir Direction) *leaseMem {
	*p = Part{Offset: off, Buf: l.bytes(), Staged: true}
	m := &leaseMem{l: l, pool: pool, st: st}
	// prepare runs first in Before: it records the stream and picks the memory.
	prepare := func(s streamcore.Stream) error {
		if l.armOn(s) {
			if busy {
				st.waited()
				return l.waitFree(s, prev)
			}
			return nil
		}
		return m.aside(p)
	}
	p.unused, p.quiet = m.release, m.free
	if dir == Out {
		p.Before = func(s streamcore.Stream) error {
			if err := prepare(s); err != nil {
				return err
			}
			return s.Copy(m.addr(), dev, l.n)
		}
		p.Release = m.release
		return m
	}
	p.Before = prepare
	if reused {
		p.Release = l.land
		return m
	}
	p.After = func(s streamcore.Stream) error {
		if err := s.Copy(dev, m.addr(), l.n); err != nil {
			return err
		}
		return giveBackAfter(s, m.free)
	}
	return m
}

// aside moves p to pool memory of its own, giving its slots back unused (later uses of
// them do not wait for it). The engine's issue reads p.Buf after the trigger, which
// comes after this.
func (m *leaseMem) aside(p *Part) error {
	n := m.l.n
	b, err := m.pool.Get(n)
	if err != nil {
		return fmt.Errorf("staging %d bytes aside from a busy workspace: %w", n, err)
	}
	m.l.release()
	m.st.movedAside()
	m.st.lend(b.Size())
	m.own = b
	p.Buf = b.Bytes()[:n]
	return nil
}

// stageReuse fills p, a part of one operation reusing the slot of an earlier part of
// it (prev): the stream waits until prev is done with the slot first. An outgoing prev
// is done once it completed (its Release frees the slot); an incoming one once its data
// landed and this part's Before copied it out to the device (dev plus prev's offset).
// reused: as for stageLease.
func stageReuse(p *Part, prev *leaseMem, l *lease, reused bool, pool *Pool, st *Stats, dev uintptr, off int, dir Direction) *leaseMem {
	*p = Part{Offset: off, Buf: l.bytes(), Staged: true}
	m := &leaseMem{l: l, pool: pool, st: st}
	// prev waited for the slot's earlier uses, so this part may wait for prev; prev
	// took memory of its own when that was unsafe, and then so does this part.
	prepare := func(s streamcore.Stream) (wait bool, err error) {
		l.armOn(s)
		if prev.own != nil {
			return false, m.aside(p)
		}
		return true, nil
	}
	if dir == Out {
		p.Before = func(s streamcore.Stream) error {
			wait, err := prepare(s)
			if err != nil {
				return err
			}
			if wait {
				st.waited()
				if err := l.waitFree(s, []uint64{l.uses[0] - 1}); err != nil {
					return err
				}
			}
			return s.Copy(m.addr(), dev+uintptr(off), l.n)
		}
		p.Release, p.unused, p.quiet = m.release, m.release, m.free
		return m
	}
	pl := prev.l
	prevOff := off - WorkspaceSlots*pl.ws.slot
	p.Before = func(s streamcore.Stream) error {
		wait, err := prepare(s)
		if err != nil {
			return err
		}
		if wait {
			st.waited()
		}
		if err := s.WaitValue(pl.ws.landedWord(pl.h, pl.first), pl.uses[0], streamcore.GEQ); err != nil {
			return err
		}
		return s.Copy(dev+uintptr(prevOff), prev.addr(), pl.n)
	}
	// prev's copy-out ran before this part's trigger, so this part done means prev's
	// memory is free.
	p.unused = func() { prev.release(); m.release() }
	p.quiet = func() { prev.free(); m.free() }
	p.Release = func() { prev.release(); l.land() }
	if reused {
		return m
	}
	p.After = func(s streamcore.Stream) error {
		if err := s.Copy(dev+uintptr(off), m.addr(), l.n); err != nil {
			return err
		}
		return giveBackAfter(s, m.free)
	}
	return m
}

// stage fills p so that n bytes of device memory at dev move through a buffer of pool:
// copied out before the trigger (Out) or in after the completion (In).
func stage(pool *Pool, st *Stats, p *Part, dev uintptr, off, n int, dir Direction) error {
	buf, err := pool.Get(n)
	if err != nil {
		return err
	}
	st.staged(n)
	st.lend(buf.Size())
	put := func() { st.giveBack(buf.Size()); pool.Put(buf) }
	*p = Part{Offset: off, Buf: buf.Bytes()[:n], Staged: true}
	p.unused = put
	if dir == Out {
		p.Before = func(s streamcore.Stream) error { return s.Copy(buf.Addr(), dev, n) }
		p.Release = p.unused
		return nil
	}
	p.After = func(s streamcore.Stream) error {
		if err := s.Copy(dev, buf.Addr(), n); err != nil {
			return err
		}
		return giveBackAfter(s, put)
	}
	return nil
}

// Unused gives back the staging buffers of parts from..end, which will never run.
func (p *Plan) Unused(from int) {
	for i := from; i < len(p.Parts); i++ {
		if u := p.Parts[i].unused; u != nil {
			p.Parts[i].unused, p.Parts[i].quiet, p.Parts[i].Release = nil, nil, nil
			u()
		}
	}
}

// Staged reports whether the plan moves its buffer through staging.
func (p *Plan) Staged() bool { return len(p.Parts) > 0 && p.Parts[0].Staged }

// Close frees every pool's cached buffers (buffers still lent are freed once back,
// by a later Close). Plans made afterwards that need staging fail with ErrClosed.
func (pl *Planner) Close() error {
	if pl == nil {
		return fmt.Errorf("planner close: nil planner: %w", ErrInvalidParam)
	}
	pl.mu.Lock()
	// The pools stay (closed): Lent counts what they still lend, and a later Close
	// frees what came back since.
	pools := make([]*Pool, 0, len(pl.pools))
	for _, p := range pl.pools {
		pools = append(pools, p)
	}
	pl.closed = true
	pl.last.Store(nil)
	pl.mu.Unlock()
	var first error
	for _, p := range pools {
		if err := p.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

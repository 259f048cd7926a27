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
}

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
	// done with it (an incoming part's goes back on the stream, after the copy in).
	Release func()
	// unused returns the staging buffer of a part that will never run.
	unused func()
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
func (pl *Planner) Config() Config { return pl.cfg }

// Prepare makes the staging pool of backend b ready (reserving its buffers) where b
// may stage, so that no later operation allocates pinned memory on the engine's path.
// Callers call it where blocking is harmless: on the user's goroutine.
func (pl *Planner) Prepare(b streamcore.Backend) error {
	_, err := pl.pool(b)
	return err
}

// pool returns b's staging pool, made on first use; nil where b never stages.
func (pl *Planner) pool(b streamcore.Backend) (*Pool, error) {
	if b.Kind() != streamcore.KindCUDA || pl.cudaTransport {
		return nil, nil
	}
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
	if err := p.Reserve(minClass, pl.cfg.ReserveBuffers); err != nil {
		_ = p.Close()
		return nil, fmt.Errorf("staging pool: %w", err)
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
// device memory on a host backend).
func (pl *Planner) Plan(t Transfer, r Route, pl2 *Plan) error {
	*pl2 = Plan{RingAfter: pl.cfg.RingAfter}
	pl2.Poll = r.StreamOrdered && len(t.Buf) >= pl.cfg.PollCompletionBytes
	pl2.Ring = r.StreamOrdered && !pl2.Poll && r.Backend.Kind() == streamcore.KindCUDA
	pl2.single[0] = Part{Buf: t.Buf}
	pl2.Parts = pl2.single[:]
	if t.DeclaredDevice && r.Backend.Kind() == streamcore.KindHost {
		return fmt.Errorf("device memory (RequestParam.MemoryType) with a host-stream backend: host streams run on the CPU and cannot move device memory: %w", ErrInvalidParam)
	}
	if t.Dir == NoBuffer || len(t.Buf) == 0 || t.RegisteredHost {
		return nil
	}
	pool, err := pl.pool(r.Backend)
	if pool == nil || err != nil {
		return err
	}
	addr := uintptr(unsafe.Pointer(&t.Buf[0]))
	kind, err := pool.Classify(addr)
	if err != nil {
		return fmt.Errorf("buffer %#x: %w", addr, err)
	}
	if kind != KindDevice {
		return nil
	}
	switch {
	case !r.OnStream:
		return fmt.Errorf("device buffer with a %s: the transport here has no CUDA support, and staging needs a stream: %w", r.What, ErrUnsupported)
	case t.Dir == In && !r.StreamOrdered:
		return fmt.Errorf("device receive buffer with a non-blocking enqueue: staged data is copied in on the stream after completion: %w", ErrUnsupported)
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
		if err := stage(pool, &pl2.Parts[i], addr+uintptr(off), off, size, t.Dir); err != nil {
			pl2.Unused(0)
			return fmt.Errorf("staging part %d of %d bytes: %w", i, size, err)
		}
	}
	return nil
}

// stage fills p so that n bytes of device memory at dev move through a buffer of pool:
// copied out before the trigger (Out) or in after the completion (In).
func stage(pool *Pool, p *Part, dev uintptr, off, n int, dir Direction) error {
	buf, err := pool.Get(n)
	if err != nil {
		return err
	}
	*p = Part{Offset: off, Buf: buf.Bytes()[:n], Staged: true}
	p.unused = func() { pool.Put(buf) }
	if dir == Out {
		p.Before = func(s streamcore.Stream) error { return s.Copy(buf.Addr(), dev, n) }
		p.Release = p.unused
		return nil
	}
	p.After = func(s streamcore.Stream) error {
		if err := s.Copy(dev, buf.Addr(), n); err != nil {
			return err
		}
		return s.LaunchHostFunc(func() { pool.Put(buf) })
	}
	return nil
}

// Unused gives back the staging buffers of parts from..end, which will never run.
func (p *Plan) Unused(from int) {
	for i := from; i < len(p.Parts); i++ {
		if u := p.Parts[i].unused; u != nil {
			p.Parts[i].unused, p.Parts[i].Release = nil, nil
			u()
		}
	}
}

// Staged reports whether the plan moves its buffer through staging.
func (p *Plan) Staged() bool { return len(p.Parts) > 0 && p.Parts[0].Staged }

// Close frees every pool's cached buffers (buffers still lent are freed once back,
// by a later Close). Plans made afterwards that need staging fail with ErrClosed.
func (pl *Planner) Close() error {
	pl.mu.Lock()
	pools := pl.pools
	pl.pools, pl.closed = nil, true
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

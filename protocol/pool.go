package protocol

import (
	"fmt"
	"math/bits"
	"sync"

	"github.com/ucpx/ucpx/internal/errs"
	"github.com/ucpx/ucpx/stream/streamcore"
)

// Kind is where a buffer lives.
type Kind int

const (
	KindHost Kind = iota
	KindDevice
	KindManaged
)

func (k Kind) String() string {
	switch k {
	case KindHost:
		return "host"
	case KindDevice:
		return "device"
	case KindManaged:
		return "managed"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Errors: the roots every ucpx package shares (ucp.ErrClosed and friends match them).
var (
	ErrClosed       = errs.Closed
	ErrInvalidParam = errs.InvalidParam
	ErrUnsupported  = errs.Unsupported
)

// minClass is the smallest staging buffer: small messages share one size so the pool
// stays small; larger ones round up to a power of two.
const minClass = 64 << 10

// Buffer is a page-locked host buffer lent by a Pool: the staging workspace a device
// buffer moves through. Its memory is C memory, so UCX and the GPU's copy engine may
// hold its address.
type Buffer struct {
	mem    streamcore.Pinned
	pooled bool // in the pool, not lent (under the pool's mu)
}

// Bytes is the whole buffer (its size class: at least what was asked for).
func (b *Buffer) Bytes() []byte {
	if b == nil {
		return nil
	}
	return b.mem.Bytes()
}

// Addr is the buffer's address.
func (b *Buffer) Addr() uintptr {
	if b == nil {
		return 0
	}
	return b.mem.Addr()
}

// Size is the buffer's size in bytes (its size class).
func (b *Buffer) Size() int {
	if b == nil {
		return 0
	}
	return b.mem.Size()
}

// Pool classifies buffers and lends page-locked host buffers for staging. One serves
// one stream backend, through the backend's streamcore.HostStaging (the CUDA
// backend's cuPointerGetAttributes and cuMemHostAlloc); on backends without it (host
// backends) every buffer is host memory, and what it lends (for StageAlways) is
// mapped host memory.
// Buffers are cached by size class and reused: allocating pinned memory costs far more
// than a message, and may wait for the user's own stream work.
type Pool struct {
	staging   streamcore.HostStaging // nil on host backends
	mu        sync.Mutex
	free      map[int][]*Buffer
	freeLater []*Buffer // returned after Close, freed by the next Close
	lent      int
	closed    bool
	// idle counts, per class, the Reservations held and not lending: each keeps one
	// free buffer of its class that Get does not take.
	idle map[int]int
}

// NewPool makes the staging pool of backend b.
func NewPool(b streamcore.Backend) *Pool {
	s := &Pool{free: map[int][]*Buffer{}, idle: map[int]int{}}
	if hs, ok := b.(streamcore.HostStaging); ok {
		s.staging = hs
	}
	return s
}

// Classify reports where addr lives. On host backends, and for memory CUDA does not
// know (ordinary pageable memory), it is host memory.
func (s *Pool) Classify(addr uintptr) (Kind, error) {
	if s == nil {
		return KindHost, fmt.Errorf("classify: nil pool: %w", ErrInvalidParam)
	}
	if s.staging == nil || addr == 0 {
		return KindHost, nil
	}
	// An address the driver does not know is pageable host memory: neither, no error.
	device, managed, err := s.staging.Locate(addr)
	if err != nil {
		return KindHost, fmt.Errorf("classify %#x: %w", addr, err)
	}
	switch {
	case managed:
		return KindManaged, nil
	case device:
		return KindDevice, nil
	}
	return KindHost, nil
}

// maxBuffer bounds what Get lends (class rounds up to a power of two, which must not
// overflow).
const maxBuffer = 1 << 40

// checkSize refuses a buffer size Get, Hold and LendReserved cannot lend.
func checkSize(n int) error {
	if n <= 0 || n > maxBuffer {
		return fmt.Errorf("staging buffer of %d bytes (1 to %d): %w", n, maxBuffer, ErrInvalidParam)
	}
	return nil
}

func class(n int) int {
	if n <= minClass {
		return minClass
	}
	return 1 << bits.Len(uint(n-1))
}

// Get lends a pinned buffer of at least n bytes.
func (s *Pool) Get(n int) (*Buffer, error) {
	if s == nil {
		return nil, fmt.Errorf("staging buffer: nil pool: %w", ErrInvalidParam)
	}
	if err := checkSize(n); err != nil {
		return nil, err
	}
	b, _, err := s.get(class(n), nil)
	return b, err
}

// get lends a buffer of class c: a cached one beyond those the idle Reservations keep,
// or (own), for r held for class c and not lending, the one r keeps.
func (s *Pool) get(c int, r *Reservation) (b *Buffer, own bool, err error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, false, ErrClosed
	}
	keep := s.idle[c]
	own = r != nil && r.pool == s && r.held && !r.lending && r.class == c
	if own {
		keep-- // the free buffer r keeps is taken now
		s.idle[c]--
		r.lending = true
	}
	if l := s.free[c]; len(l) > keep {
		m := l[len(l)-1]
		s.free[c] = l[:len(l)-1]
		s.lent++
		s.mu.Unlock()
		// A new handle per loan: a stale Put of an earlier loan's handle (pooled for
		// good) cannot give the memory back under this loan's user.
		return &Buffer{mem: m.mem}, own, nil
	}
	s.lent++
	s.mu.Unlock()
	m, err := s.alloc(c)
	if err != nil {
		s.mu.Lock()
		s.lent--
		if own {
			s.endLendingLocked(r)
		}
		s.mu.Unlock()
		return nil, false, err
	}
	return &Buffer{mem: m}, own, nil
}

// alloc allocates a buffer of class c.
func (s *Pool) alloc(c int) (streamcore.Pinned, error) {
	m, err := allocStaging(s.staging, c) // host backends stage only under StageAlways
	if err != nil {
		return nil, fmt.Errorf("staging buffer of %d bytes: %w", c, err)
	}
	return m, nil
}

// Put returns a lent buffer. Safe from any goroutine (including stream host functions,
// where it must not call CUDA: it only queues the buffer). A buffer put back twice is
// taken once, also after its memory was lent again (each loan has its own *Buffer):
// lent twice, two users would share it.
func (s *Pool) Put(m *Buffer) {
	if s == nil || m == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.putLocked(m)
}

func (s *Pool) putLocked(m *Buffer) {
	if m.pooled {
		return
	}
	m.pooled = true
	s.lent--
	if s.closed {
		s.freeLater = append(s.freeLater, m)
		return
	}
	c := m.Size()
	s.free[c] = append(s.free[c], m)
}

// Lent is the number of buffers lent and not returned.
func (s *Pool) Lent() int {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lent
}

// Close frees the cached buffers; buffers still lent are freed by a later Close once
// returned. A second Close only frees what came back since.
func (s *Pool) Close() error {
	if s == nil {
		return fmt.Errorf("pool close: nil pool: %w", ErrInvalidParam)
	}
	s.mu.Lock()
	s.closed = true
	var all []*Buffer
	for c, l := range s.free {
		all = append(all, l...)
		delete(s.free, c)
	}
	all = append(all, s.freeLater...)
	s.freeLater = nil
	s.mu.Unlock()
	var first error
	for _, m := range all {
		if err := m.mem.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// maxReserve bounds Reserve's count: a reservation is a few buffers per class.
const maxReserve = 4096

// Reserve allocates count buffers of at least n bytes into the cache now (beyond those
// Reservations keep), so that the operations that need them later likely find them
// without an allocation. One operation's own claim on a buffer is Hold.
func (s *Pool) Reserve(n, count int) error {
	if s == nil || count < 0 || count > maxReserve {
		return fmt.Errorf("reserve %d buffers (at most %d): %w", count, maxReserve, ErrInvalidParam)
	}
	bufs := make([]*Buffer, 0, count)
	defer func() {
		for _, b := range bufs {
			s.Put(b)
		}
	}()
	for range count {
		b, err := s.Get(n)
		if err != nil {
			return err
		}
		bufs = append(bufs, b)
	}
	return nil
}

// Lend lends a buffer of at least n bytes from s for one staged part of n bytes,
// counted in st (bytes, parts, high water); release gives it back and uncounts it.
// Get may allocate pinned memory: call it where blocking is harmless.
func (s *Pool) Lend(n int, st *Stats) (buf *Buffer, release func(), err error) {
	return s.LendReserved(nil, n, st)
}

// Reservation is one operation's claim, from its submit to its end, on a staging
// buffer of a Pool (Hold): the engine issues the operation later, where it must not
// allocate pinned memory (a driver call that may wait for the user's stream work).
// Reservations add up: each keeps one cached buffer of its class out of Get's reach
// while it is not lending it. The zero value holds nothing.
type Reservation struct {
	_       noCopy // a copy released beside its original would release twice
	pool    *Pool
	class   int
	held    bool // under pool.mu
	lending bool // its buffer is lent (LendReserved), under pool.mu
}

// noCopy makes go vet's copylocks check report copies of the struct holding it.
type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}

// Hold reserves a buffer of at least n bytes for r, allocating it now unless the cache
// has one to spare. Release ends the reservation.
func (s *Pool) Hold(r *Reservation, n int) error {
	if s == nil || r == nil {
		return fmt.Errorf("hold: nil pool or reservation: %w", ErrInvalidParam)
	}
	if err := checkSize(n); err != nil {
		return err
	}
	c := class(n)
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.held {
		return fmt.Errorf("hold: the reservation is held already: %w", ErrInvalidParam)
	}
	for len(s.free[c]) <= s.idle[c] {
		if s.closed {
			return ErrClosed
		}
		s.mu.Unlock() // allocating takes long: Get and Put go on meanwhile
		m, err := s.alloc(c)
		s.mu.Lock()
		if err != nil {
			return err
		}
		b := &Buffer{mem: m, pooled: true}
		if s.closed {
			s.freeLater = append(s.freeLater, b)
			return ErrClosed
		}
		s.free[c] = append(s.free[c], b)
	}
	if s.closed {
		return ErrClosed
	}
	s.idle[c]++
	r.pool, r.class, r.held, r.lending = s, c, true, false
	return nil
}

// Release ends r's reservation (a no-op on one not held, or ended already); a buffer
// it lends stays lent until given back.
func (r *Reservation) Release() {
	if r == nil || r.pool == nil {
		return
	}
	s := r.pool
	s.mu.Lock()
	defer s.mu.Unlock()
	if !r.held {
		return
	}
	r.held = false
	if !r.lending {
		s.idle[r.class]--
	}
}

// endLendingLocked marks r's buffer given back: while r is held, the pool keeps a
// buffer for it again (in the same critical section as the Put, so no Get takes it).
func (s *Pool) endLendingLocked(r *Reservation) {
	if r.lending {
		r.lending = false
		if r.held {
			s.idle[r.class]++
		}
	}
}

// LendReserved is Lend of the buffer r (held on s for n bytes' class, nil for none)
// keeps, which needs no allocation; otherwise it lends as Lend does.
func (s *Pool) LendReserved(r *Reservation, n int, st *Stats) (buf *Buffer, release func(), err error) {
	if s == nil {
		return nil, nil, fmt.Errorf("lend: nil pool: %w", ErrInvalidParam)
	}
	if err := checkSize(n); err != nil {
		return nil, nil, err
	}
	b, own, err := s.get(class(n), r)
	if err != nil {
		return nil, nil, err
	}
	st.staged(n)
	st.lend(b.Size())
	var once sync.Once
	return b, func() {
		once.Do(func() {
			st.giveBack(b.Size())
			s.mu.Lock()
			s.putLocked(b)
			if own {
				s.endLendingLocked(r)
			}
			s.mu.Unlock()
		})
	}, nil
}

// Package protocol holds the mechanisms that decide how a buffer travels: memory-kind
// detection and the staging workspace through which device memory moves when UCX
// cannot send from it directly (Debian's UCX has no CUDA transports).
package protocol

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/internal/errs"
	"github.com/ucpx/ucpx/stream"
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

// ErrClosed is returned after Close.
var ErrClosed = errs.Closed

// minClass is the smallest staging buffer: small messages share one size so the pool
// stays small; larger ones round up to a power of two.
const minClass = 64 << 10

// Stager classifies buffers and lends page-locked host buffers for staging. One serves
// one stream backend; on host backends every buffer is host memory and nothing is lent.
// Buffers are cached by size class and reused: allocating pinned memory costs far more
// than a message.
type Stager struct {
	ctx       *cuda.Context // nil on host backends
	mu        sync.Mutex
	free      map[int][]*cuda.HostMemory
	freeLater []*cuda.HostMemory // returned after Close, freed by the next Close
	lent      int
	closed    bool
}

// NewStager makes the stager of backend b.
func NewStager(b stream.Backend) *Stager {
	s := &Stager{free: map[int][]*cuda.HostMemory{}}
	if ctx, _, ok := stream.CUDAContext(b); ok {
		s.ctx = ctx
	}
	return s
}

// Classify reports where addr lives. On host backends, and for memory CUDA does not
// know (ordinary pageable memory), it is host memory.
func (s *Stager) Classify(addr uintptr) (Kind, error) {
	if s.ctx == nil || addr == 0 {
		return KindHost, nil
	}
	a, err := s.ctx.PointerAttributes(addr)
	if errors.Is(err, cuda.ErrInvalidValue) {
		return KindHost, nil // an address the driver does not know: pageable host memory
	}
	if err != nil {
		return KindHost, fmt.Errorf("classify %#x: %w", addr, err)
	}
	switch {
	case a.Managed:
		return KindManaged, nil
	case a.Type == cuda.MemoryDevice:
		return KindDevice, nil
	}
	return KindHost, nil
}

func class(n int) int {
	if n <= minClass {
		return minClass
	}
	return 1 << bits.Len(uint(n-1))
}

// Get lends a pinned buffer of at least n bytes.
func (s *Stager) Get(n int) (*cuda.HostMemory, error) {
	if s.ctx == nil {
		return nil, fmt.Errorf("staging on a host backend: %w", stream.ErrNotSupported)
	}
	c := class(n)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	if l := s.free[c]; len(l) > 0 {
		m := l[len(l)-1]
		s.free[c] = l[:len(l)-1]
		s.lent++
		s.mu.Unlock()
		return m, nil
	}
	s.lent++
	s.mu.Unlock()
	m, err := s.ctx.MemHostAlloc(c, cuda.HostAllocPortable)
	if err != nil {
		s.mu.Lock()
		s.lent--
		s.mu.Unlock()
		return nil, fmt.Errorf("staging buffer of %d bytes: %w", c, err)
	}
	return m, nil
}

// Put returns a lent buffer. Safe from any goroutine (including stream host functions,
// where it must not call CUDA: it only queues the buffer).
func (s *Stager) Put(m *cuda.HostMemory) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lent--
	if s.closed {
		s.freeLater = append(s.freeLater, m)
		return
	}
	c := m.Size()
	s.free[c] = append(s.free[c], m)
}

// Lent is the number of buffers lent and not returned.
func (s *Stager) Lent() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lent
}

// Close frees the cached buffers; buffers still lent are freed by a later Close once
// returned. A second Close only frees what came back since.
func (s *Stager) Close() error {
	s.mu.Lock()
	s.closed = true
	var all []*cuda.HostMemory
	for c, l := range s.free {
		all = append(all, l...)
		delete(s.free, c)
	}
	all = append(all, s.freeLater...)
	s.freeLater = nil
	s.mu.Unlock()
	var first error
	for _, m := range all {
		if err := m.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

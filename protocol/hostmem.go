package protocol

import (
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ucpx/ucpx/stream/streamcore"
)

// hostMem is anonymous mapped memory standing in for pinned memory on host backends:
// it is not Go memory, so its address stays put while UCX or a host stream holds it.
type hostMem struct {
	mu sync.Mutex
	b  []byte
}

// allocStaging allocates n bytes of staging memory: page-locked through hs, or mapped
// host memory where hs is nil (host backends).
func allocStaging(hs streamcore.HostStaging, n int) (streamcore.Pinned, error) {
	if hs != nil {
		return hs.AllocPinned(n)
	}
	m, err := allocHost(n)
	if err != nil {
		return nil, err
	}
	return m, nil
}

func allocHost(n int) (*hostMem, error) {
	if n <= 0 {
		return nil, fmt.Errorf("host staging memory of %d bytes: %w", n, ErrInvalidParam)
	}
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("host staging memory of %d bytes: %w", n, err)
	}
	return &hostMem{b: b}, nil
}

func (m *hostMem) Bytes() []byte { return m.b }
func (m *hostMem) Addr() uintptr { return uintptr(unsafe.Pointer(&m.b[0])) }
func (m *hostMem) Size() int     { return len(m.b) }

func (m *hostMem) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.b == nil {
		return fmt.Errorf("host staging memory: %w", ErrClosed)
	}
	b := m.b
	m.b = nil
	return unix.Munmap(b)
}

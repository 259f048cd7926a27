// Package fakeipc is a test double of a CUDA backend's IPC side
// (streamcore.DeviceIPC) on host streams: "device memory" is C memory it allocates,
// a handle names an allocation by its base and buffer id, and opening one in any
// context of the process maps it at its own address. Two ucp contexts of one process
// then run the whole same-host device path (exporting keys, mapping, copies on
// streams, revocation) without a GPU, so CI exercises it. It counts handles made,
// opened and closed, so tests can assert the cache's once-per-allocation promise.
// IPCAllocation reports an allocation's real size for its mapping too, as CUDA does
// for an opened handle, so a key claiming more than that is caught.
package fakeipc

/*
#include <stdint.h>
#include <stdlib.h>
static void *fakeipc_ptr(uintptr_t p) { return (void *)p; }
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ucpx/ucpx/internal/shm"
	"github.com/ucpx/ucpx/stream/streamcore"
)

// Device is a host backend with a fake device's IPC calls.
type Device struct {
	streamcore.Backend
	uuid  [16]byte
	peers sync.Map // [16]byte -> true: devices GrantPeerAccess allowed
}

// The process's fake allocations, shared by every Device (processes share a GPU).
var (
	mu      sync.Mutex
	allocs  = map[uintptr]*Alloc{}
	nextID  uint64
	counts  Counts
	mapping = map[uintptr]int{} // open count per base
)

// Counts are the IPC calls the fake saw.
type Counts struct {
	Exports, Opens, Closes                 int
	SharedAllocs, SharedMaps, SharedUnmaps int // shared signal words
	DeviceCopies                           int // CopyDevice calls
	SameDeviceCopies                       int // those told both sides are on this device
}

// Stats returns the counts so far (process-wide).
func Stats() Counts {
	mu.Lock()
	defer mu.Unlock()
	return counts
}

// New wraps host (a host stream backend) as a device with the given UUID.
func New(host streamcore.Backend, uuid [16]byte) *Device { return &Device{Backend: host, uuid: uuid} }

// Alloc is fake device memory: C memory, so streams and the CPU may both use it.
type Alloc struct {
	ptr  unsafe.Pointer
	size int
	id   uint64
}

// Malloc allocates n bytes of fake device memory, zeroed.
func Malloc(n int) *Alloc {
	p := C.calloc(C.size_t(n), 1)
	mu.Lock()
	defer mu.Unlock()
	nextID++
	a := &Alloc{ptr: p, size: n, id: nextID}
	allocs[uintptr(p)] = a
	return a
}

// Ptr is the allocation's address.
func (a *Alloc) Ptr() uintptr { return uintptr(a.ptr) }

// Bytes views the memory.
func (a *Alloc) Bytes() []byte { return unsafe.Slice((*byte)(a.ptr), a.size) }

// Allocation is what the fake driver reports for a (IPCAllocation): its real base,
// size and buffer id. A test playing a hostile peer claims another size in the
// message it builds; the importer must hold that claim to this one.
func (a *Alloc) Allocation() streamcore.IPCAllocation {
	return streamcore.IPCAllocation{Base: uint64(uintptr(a.ptr)), Size: uint64(a.size), BufferID: a.id, LegacyIPC: true}
}

// Handle is the handle IPCGetMemHandle makes for a, without counting an export: for
// tests that build a peer's IPC message themselves.
func (a *Alloc) Handle() streamcore.IPCHandle { return handleOf(uintptr(a.ptr), a.id) }

// Mapped is how many opens of the allocation at base are not closed yet.
func Mapped(base uintptr) int {
	mu.Lock()
	defer mu.Unlock()
	return mapping[base]
}

// Free releases the memory.
func (a *Alloc) Free() {
	mu.Lock()
	delete(allocs, uintptr(a.ptr))
	mu.Unlock()
	C.free(a.ptr)
}

func (d *Device) DeviceUUID() ([16]byte, error) { return d.uuid, nil }
func (d *Device) CanAccessPeer(uuid [16]byte) bool {
	_, ok := d.peers.Load(uuid)
	return uuid == d.uuid || ok
}

// GrantPeerAccess lets d reach the memory of the fake device with that UUID, as peer
// access between two GPUs of one host does.
func (d *Device) GrantPeerAccess(uuid [16]byte) { d.peers.Store(uuid, true) }

func (d *Device) IPCAllocation(ptr uintptr) (streamcore.IPCAllocation, error) {
	mu.Lock()
	defer mu.Unlock()
	for base, a := range allocs {
		if ptr >= base && ptr < base+uintptr(a.size) {
			return streamcore.IPCAllocation{Base: uint64(base), Size: uint64(a.size), BufferID: a.id, LegacyIPC: true}, nil
		}
	}
	return streamcore.IPCAllocation{}, fmt.Errorf("fakeipc: %#x is not fake device memory: %w", ptr, streamcore.ErrInvalidArgument)
}

func (d *Device) IPCGetMemHandle(base uintptr) (streamcore.IPCHandle, error) {
	mu.Lock()
	defer mu.Unlock()
	a := allocs[base]
	if a == nil {
		return streamcore.IPCHandle{}, fmt.Errorf("fakeipc: no allocation at %#x: %w", base, streamcore.ErrInvalidArgument)
	}
	counts.Exports++
	return handleOf(base, a.id), nil
}

func handleOf(base uintptr, id uint64) streamcore.IPCHandle {
	var h streamcore.IPCHandle
	binary.LittleEndian.PutUint64(h[:], uint64(base))
	binary.LittleEndian.PutUint64(h[8:], id)
	return h
}

func (d *Device) IPCOpenMemHandle(h streamcore.IPCHandle) (uintptr, error) {
	base := uintptr(binary.LittleEndian.Uint64(h[:]))
	mu.Lock()
	defer mu.Unlock()
	if a := allocs[base]; a == nil || a.id != binary.LittleEndian.Uint64(h[8:]) {
		return 0, fmt.Errorf("fakeipc: handle of a freed allocation: %w", streamcore.ErrInvalidArgument)
	}
	counts.Opens++
	mapping[base]++
	return base, nil
}

func (d *Device) IPCCloseMemHandle(p uintptr) error {
	mu.Lock()
	defer mu.Unlock()
	if mapping[p] == 0 {
		return fmt.Errorf("fakeipc: %#x is not mapped: %w", p, streamcore.ErrInvalidArgument)
	}
	mapping[p]--
	counts.Closes++
	return nil
}

// CopyDevice is the stream's Copy (fake device memory is host memory).
func (d *Device) CopyDevice(s streamcore.Stream, dst, src uintptr, n int, sameDevice bool) error {
	mu.Lock()
	counts.DeviceCopies++
	if sameDevice {
		counts.SameDeviceCopies++
	}
	mu.Unlock()
	return s.Copy(dst, src, n)
}

// CopyDeviceUncaptured is CopyDevice where the stream is not capturing.
func (d *Device) CopyDeviceUncaptured(s streamcore.Stream, dst, src uintptr, n int, sameDevice bool) (bool, error) {
	if c, err := s.Capturing(); c || err != nil {
		return c, err
	}
	return false, d.CopyDevice(s, dst, src, n, sameDevice)
}

// WriteValueAt stores value at addr in stream order (an atomic store on the stream's
// CPU thread).
func (d *Device) WriteValueAt(s streamcore.Stream, addr uintptr, value uint64) error {
	if addr == 0 || addr%8 != 0 {
		return fmt.Errorf("fakeipc: WriteValueAt %#x: %w", addr, streamcore.ErrInvalidArgument)
	}
	return s.LaunchHostFunc(func() { atomic.StoreUint64(word(addr), value) })
}

// WaitValueAt holds s back until cmp(word at addr, value) holds (a polling host
// function).
func (d *Device) WaitValueAt(s streamcore.Stream, addr uintptr, value uint64, cmp streamcore.Compare) error {
	if addr == 0 || addr%8 != 0 {
		return fmt.Errorf("fakeipc: WaitValueAt %#x: %w", addr, streamcore.ErrInvalidArgument)
	}
	return s.LaunchHostFunc(func() {
		for !cmp.Holds(atomic.LoadUint64(word(addr)), value) {
			time.Sleep(time.Microsecond)
		}
	})
}

func word(addr uintptr) *uint64 { return (*uint64)(C.fakeipc_ptr(C.uintptr_t(addr))) }

// AllocSharedWords allocates n words in a shared segment; on host streams the
// device address is the host address.
func (d *Device) AllocSharedWords(n int) (*streamcore.WordBlock, streamcore.SharedWords, error) {
	seg, err := shm.Create(8 * n)
	if err != nil {
		return nil, streamcore.SharedWords{}, err
	}
	p := unsafe.Pointer(&seg.Mem[0])
	mu.Lock()
	counts.SharedAllocs++
	mu.Unlock()
	return streamcore.NewWordBlock(d.Kind(), p, 0, n, seg.Close, nil), streamcore.SharedWords{FD: seg.FD, Size: len(seg.Mem)}, nil
}

// MapSharedWords maps a process's shared words (this process's, in tests) at a
// second address.
func (d *Device) MapSharedWords(pid int, w streamcore.SharedWords) (uintptr, uintptr, func() error, error) {
	seg, err := shm.Open(pid, w.FD, w.Size)
	if err != nil {
		return 0, 0, nil, err
	}
	mu.Lock()
	counts.SharedMaps++
	mu.Unlock()
	unmap := func() error {
		mu.Lock()
		counts.SharedUnmaps++
		mu.Unlock()
		return seg.Close()
	}
	addr := uintptr(unsafe.Pointer(&seg.Mem[0]))
	return addr, addr, unmap, nil
}

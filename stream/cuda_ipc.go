package stream

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/internal/shm"
	"github.com/ucpx/ucpx/stream/streamcore"
)

// The CUDA backend maps device memory across processes of one host (CUDA IPC).
var _ DeviceIPC = (*cudaBackend)(nil)

// ipcMaps are the backend's open mappings of other processes' memory, by address.
// Opening a handle again in one context returns the same address with a count, so
// each address holds one IPCMapping per open, each closed by one IPCCloseMemHandle.
type ipcMaps struct {
	mu   sync.Mutex
	maps map[uintptr][]*cuda.IPCMapping
	// peer caches CanAccessPeer by the other device's UUID.
	peer map[[16]byte]bool
}

func (b *cudaBackend) DeviceUUID() ([16]byte, error) { return b.ctx.Device().UUID() }

func (b *cudaBackend) CanAccessPeer(uuid [16]byte) bool {
	b.ipc.mu.Lock()
	defer b.ipc.mu.Unlock()
	if ok, known := b.ipc.peer[uuid]; known {
		return ok
	}
	ok := b.canAccessPeer(uuid)
	if b.ipc.peer == nil {
		b.ipc.peer = map[[16]byte]bool{}
	}
	b.ipc.peer[uuid] = ok
	return ok
}

func (b *cudaBackend) canAccessPeer(uuid [16]byte) bool {
	self := b.ctx.Device()
	if u, err := self.UUID(); err == nil && u == uuid {
		return true
	}
	n, err := cuda.DeviceCount()
	if err != nil {
		return false
	}
	for i := range n {
		d, err := cuda.GetDevice(i)
		if err != nil {
			continue
		}
		if u, err := d.UUID(); err == nil && u == uuid {
			ok, err := self.CanAccessPeer(d)
			return err == nil && ok
		}
	}
	return false // a device this process cannot see (CUDA_VISIBLE_DEVICES)
}

func (b *cudaBackend) IPCAllocation(ptr uintptr) (IPCAllocation, error) {
	a, err := b.ctx.AllocationOf(ptr)
	if err != nil {
		return IPCAllocation{}, cudaErr("IPCAllocation", err)
	}
	return IPCAllocation{Base: uint64(a.Base), Size: a.Size, BufferID: a.BufferID, LegacyIPC: a.LegacyIPC}, nil
}

// ownExports are the handles this process exported, with what they named: CUDA
// refuses to open a handle in the process that made it, and there the allocation is
// already in the address space (two workers of one process).
var ownExports = struct {
	sync.Mutex
	m    map[IPCHandle]IPCAllocation
	refs map[uintptr]int // opens of own allocations, by base
}{m: map[IPCHandle]IPCAllocation{}, refs: map[uintptr]int{}}

func (b *cudaBackend) IPCGetMemHandle(base uintptr) (IPCHandle, error) {
	raw, err := b.ctx.IPCMemHandle(base)
	if err != nil {
		return IPCHandle{}, cudaErr("IPCGetMemHandle", err)
	}
	h := IPCHandle(raw)
	if a, err := b.IPCAllocation(base); err == nil {
		ownExports.Lock()
		for old, o := range ownExports.m {
			if o.Base == a.Base {
				delete(ownExports.m, old) // an allocation freed at this address
			}
		}
		ownExports.m[h] = a
		ownExports.Unlock()
	}
	return h, nil
}

// openOwn opens a handle this process exported: the allocation's own address, if it
// is still the allocation the handle named (same base and buffer id).
func (b *cudaBackend) openOwn(h IPCHandle) (uintptr, bool, error) {
	ownExports.Lock()
	a, ok := ownExports.m[h]
	ownExports.Unlock()
	if !ok {
		return 0, false, nil
	}
	now, err := b.IPCAllocation(uintptr(a.Base))
	if err != nil || now.Base != a.Base || now.BufferID != a.BufferID || now.Size != a.Size {
		return 0, true, fmt.Errorf("stream: cuda IPCOpenMemHandle: the allocation this process exported at %#x is gone: %w", a.Base, ErrInvalidArgument)
	}
	ownExports.Lock()
	ownExports.refs[uintptr(a.Base)]++
	ownExports.Unlock()
	return uintptr(a.Base), true, nil
}

func (b *cudaBackend) IPCOpenMemHandle(h IPCHandle) (uintptr, error) {
	if p, own, err := b.openOwn(h); own {
		return p, err
	}
	if err := b.acquire(); err != nil {
		return 0, err
	}
	m, err := b.ctx.OpenIPCMemHandle(cuda.IPCMemHandle(h), cuda.IPCLazyEnablePeerAccess)
	if err != nil {
		_ = b.release()
		return 0, cudaErr("IPCOpenMemHandle", err)
	}
	b.ipc.mu.Lock()
	defer b.ipc.mu.Unlock()
	if b.ipc.maps == nil {
		b.ipc.maps = map[uintptr][]*cuda.IPCMapping{}
	}
	b.ipc.maps[m.Ptr()] = append(b.ipc.maps[m.Ptr()], m)
	return m.Ptr(), nil
}

func (b *cudaBackend) IPCCloseMemHandle(mapped uintptr) error {
	ownExports.Lock()
	if ownExports.refs[mapped] > 0 {
		if ownExports.refs[mapped]--; ownExports.refs[mapped] == 0 {
			delete(ownExports.refs, mapped)
		}
		ownExports.Unlock()
		return nil
	}
	ownExports.Unlock()
	b.ipc.mu.Lock()
	var m *cuda.IPCMapping
	if ms := b.ipc.maps[mapped]; len(ms) > 0 {
		m = ms[len(ms)-1]
		if len(ms) == 1 {
			delete(b.ipc.maps, mapped)
		} else {
			b.ipc.maps[mapped] = ms[:len(ms)-1]
		}
	}
	b.ipc.mu.Unlock()
	if m == nil {
		return fmt.Errorf("stream: cuda IPCCloseMemHandle: %#x is not a mapping of this backend: %w", mapped, ErrInvalidArgument)
	}
	err := cudaErr("IPCCloseMemHandle", m.Close())
	return errors.Join(err, b.release())
}

func (b *cudaBackend) CopyDevice(s Stream, dst, src uintptr, n int, sameDevice bool) error {
	cs, ok := s.(*cudaStream)
	if !ok {
		return fmt.Errorf("stream: cuda CopyDevice: %T is not a CUDA stream: %w", s, ErrInvalidArgument)
	}
	if grid := b.copyGrid(cs, dst, src, n, sameDevice); grid > 0 {
		// Captured, the copy is a memcpy node: a graph launch costs the same whatever
		// its nodes, and the copy engine leaves the SMs to the graph's kernels.
		st, err := cs.s.LaunchCopyUncaptured(b.copyKernel, grid, copyKernelBlock, dst, src, n)
		if err != nil || st == cuda.CaptureNone {
			return cs.wrap("CopyDevice", err)
		}
	}
	return cs.wrap("CopyDevice", cs.s.MemcpyDtoD(dst, src, n))
}

func (b *cudaBackend) CopyDeviceUncaptured(s Stream, dst, src uintptr, n int, sameDevice bool) (bool, error) {
	cs, ok := s.(*cudaStream)
	if !ok {
		return false, fmt.Errorf("stream: cuda CopyDeviceUncaptured: %T is not a CUDA stream: %w", s, ErrInvalidArgument)
	}
	var st cuda.CaptureStatus
	var err error
	if grid := b.copyGrid(cs, dst, src, n, sameDevice); grid > 0 {
		st, err = cs.s.LaunchCopyUncaptured(b.copyKernel, grid, copyKernelBlock, dst, src, n)
	} else {
		st, err = cs.s.MemcpyDtoDUncaptured(dst, src, n)
	}
	if err != nil {
		return false, cs.wrap("CopyDeviceUncaptured", err)
	}
	return capturing(st)
}

// A same-device copy of at most copyKernelMax bytes between addresses equal modulo
// 16 runs as ucpx_copy (device.KernelCopy) in blocks of copyKernelBlock threads, at
// most copyKernelBlocksPerSM per SM: its launch costs the CPU less than
// cuMemcpyDtoDAsync, and up to 16 MiB the SMs also copy faster than the copy engine;
// above it the copy engine is faster (docs/performance.md, "CUDA IPC").
const (
	copyKernelMax         = 16 << 20
	copyKernelBlock       = 512
	copyKernelBlocksPerSM = 4
)

// copyGrid is the grid of a copy by kernel on cs, or 0 where the copy engine copies.
// The kernel runs only on streams of b's own context: its module is loaded there, and
// there the peers' memory is mapped (a wrapped stream of another context, or of
// another device, copies by the copy engine, which reaches any address).
func (b *cudaBackend) copyGrid(cs *cudaStream, dst, src uintptr, n int, sameDevice bool) uint32 {
	if !sameDevice || b.copyKernel == nil || n <= 0 || n > copyKernelMax || (dst-src)%16 != 0 ||
		cs.b.ctx.Handle() != b.ctx.Handle() {
		return 0
	}
	blocks := (n + 16*copyKernelBlock - 1) / (16 * copyKernelBlock)
	return uint32(min(blocks, b.copyKernelBlocks))
}

func (b *cudaBackend) WriteValueAt(s Stream, addr uintptr, value uint64) error {
	cs, err := b.rawStream("WriteValueAt", s, addr)
	if err != nil {
		return err
	}
	if !b.caps.StreamMemOps64 {
		return fmt.Errorf("stream: cuda WriteValueAt: device has only 32-bit stream memops: %w", ErrNotSupported)
	}
	return cs.wrap("WriteValueAt", cs.s.WriteValue64(addr, value, cuda.WriteDefault))
}

func (b *cudaBackend) WaitValueAt(s Stream, addr uintptr, value uint64, cmp Compare) error {
	cs, err := b.rawStream("WaitValueAt", s, addr)
	if err != nil {
		return err
	}
	if !b.caps.StreamMemOps64 {
		return fmt.Errorf("stream: cuda WaitValueAt: device has only 32-bit stream memops: %w", ErrNotSupported)
	}
	if cmp > NOR || (cmp == NOR && !b.caps.WaitValueNOR) {
		return fmt.Errorf("stream: cuda WaitValueAt: %v: %w", cmp, ErrInvalidArgument)
	}
	return cs.wrap("WaitValueAt", cs.s.WaitValue64(addr, value, cuda.WaitFlags(cmp)))
}

func (b *cudaBackend) rawStream(op string, s Stream, addr uintptr) (*cudaStream, error) {
	cs, ok := s.(*cudaStream)
	if !ok {
		return nil, fmt.Errorf("stream: cuda %s: %T is not a CUDA stream: %w", op, s, ErrInvalidArgument)
	}
	if addr == 0 || addr%8 != 0 {
		return nil, fmt.Errorf("stream: cuda %s: address %#x is nil or not 8-byte aligned: %w", op, addr, ErrInvalidArgument)
	}
	return cs, nil
}

// AllocSharedWords allocates n zeroed words in a shared segment, page-locked and
// mapped for the device.
func (b *cudaBackend) AllocSharedWords(n int) (*WordBlock, SharedWords, error) {
	if n <= 0 || n > 1<<24 {
		return nil, SharedWords{}, fmt.Errorf("stream: cuda AllocSharedWords(%d): %w", n, ErrInvalidArgument)
	}
	seg, err := shm.Create(8 * n)
	if err != nil {
		return nil, SharedWords{}, err
	}
	if err := b.acquire(); err != nil {
		_ = seg.Close()
		return nil, SharedWords{}, err
	}
	reg, err := b.ctx.MemHostRegister(uintptr(unsafe.Pointer(&seg.Mem[0])), len(seg.Mem), cuda.HostRegisterPortable|cuda.HostRegisterDeviceMap)
	if err != nil {
		_ = seg.Close()
		_ = b.release()
		return nil, SharedWords{}, cudaErr("AllocSharedWords", err)
	}
	desc := SharedWords{FD: seg.FD, Size: len(seg.Mem)}
	free := func() error {
		err := cudaErr("WordBlock.Close", reg.Close())
		return errors.Join(err, seg.Close(), b.release())
	}
	var ring func() error
	if b.bell != nil {
		ring = b.bell.ring
	}
	return streamcore.NewWordBlock(KindCUDA, unsafe.Pointer(&seg.Mem[0]), reg.DevicePtr(), n, free, ring), desc, nil
}

// MapSharedWords maps another process's shared words for this device.
func (b *cudaBackend) MapSharedWords(pid int, w SharedWords) (uintptr, uintptr, func() error, error) {
	seg, err := shm.Open(pid, w.FD, w.Size)
	if err != nil {
		return 0, 0, nil, err
	}
	if err := b.acquire(); err != nil {
		_ = seg.Close()
		return 0, 0, nil, err
	}
	reg, err := b.ctx.MemHostRegister(uintptr(unsafe.Pointer(&seg.Mem[0])), len(seg.Mem), cuda.HostRegisterPortable|cuda.HostRegisterDeviceMap)
	if err != nil {
		_ = seg.Close()
		_ = b.release()
		return 0, 0, nil, cudaErr("MapSharedWords", err)
	}
	unmap := func() error {
		err := cudaErr("MapSharedWords unmap", reg.Close())
		return errors.Join(err, seg.Close(), b.release())
	}
	return uintptr(unsafe.Pointer(&seg.Mem[0])), reg.DevicePtr(), unmap, nil
}

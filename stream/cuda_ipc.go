package stream

import (
	"errors"
	"fmt"
	"math"
	"slices"
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
	// exportsDropped: the backend is released, its entries in ownExports are gone and
	// it records no more (under ownExports' lock, not mu).
	exportsDropped bool
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
// already in the address space (two workers of one process), so openOwn returns it.
//
// An entry is kept while its allocation may still be opened. It goes when its
// allocation is seen freed or replaced (not IPCAllocation.Same, as
// protocol.IPCExporter tells them apart): by an export at its base or of its handle,
// by an open of its handle, or by a sweep of every entry each time their number has
// doubled since the last (CUDA has no callback for cuMemFree, so nothing else tells);
// and it goes with the last of the backends that exported it (at their release). So
// the entries number no more than ownExportsSweepMin or twice the live ones the last
// sweep left, however many addresses the process used before, and an export costs
// O(1): the sweep's queries, one per entry, made on the exporter's goroutine outside
// the lock, are amortized over the exports that doubled the map.
var ownExports = struct {
	sync.Mutex
	byBase   map[uint64]*ownExport
	byHandle map[IPCHandle]uint64 // each entry's base, by its handle
	refs     map[uintptr]int      // opens of own allocations, by base
	// sweepAt: the number of entries at which the next export sweeps them.
	sweepAt int
}{byBase: map[uint64]*ownExport{}, byHandle: map[IPCHandle]uint64{}, refs: map[uintptr]int{}, sweepAt: ownExportsSweepMin}

// ownExportsSweepMin is the fewest entries that are swept.
const ownExportsSweepMin = 64

type ownExport struct {
	handle IPCHandle
	alloc  IPCAllocation
	// owners: the backends that exported it and are not released yet.
	owners []*cudaBackend
}

func (b *cudaBackend) IPCGetMemHandle(base uintptr) (IPCHandle, error) {
	raw, err := b.ctx.IPCMemHandle(base)
	if err != nil {
		return IPCHandle{}, cudaErr("IPCGetMemHandle", err)
	}
	h := IPCHandle(raw)
	if a, err := b.IPCAllocation(base); err == nil && b.rememberExport(h, a) {
		b.sweepOwnExports()
	}
	return h, nil
}

// rememberExport records that b exported allocation a as h, replacing what was known
// at a's base or under h (an allocation freed there); it reports whether the entries
// are due for a sweep.
func (b *cudaBackend) rememberExport(h IPCHandle, a IPCAllocation) bool {
	ownExports.Lock()
	defer ownExports.Unlock()
	if b.ipc.exportsDropped {
		return false // released: release dropped what b exported, and b exports no more
	}
	if base, ok := ownExports.byHandle[h]; ok && base != a.Base {
		dropOwnExportLocked(base) // a handle CUDA made again: the old allocation is gone
	}
	x := ownExports.byBase[a.Base]
	if x != nil && !x.alloc.Same(a) {
		dropOwnExportLocked(a.Base) // an allocation freed at this address
		x = nil
	}
	if x == nil {
		x = &ownExport{alloc: a}
		ownExports.byBase[a.Base] = x
	} else if x.handle != h {
		delete(ownExports.byHandle, x.handle) // another handle of the same allocation
	}
	x.handle = h
	ownExports.byHandle[h] = a.Base
	for _, o := range x.owners {
		if o == b {
			return false
		}
	}
	x.owners = append(x.owners, b)
	return len(ownExports.byBase) >= ownExports.sweepAt
}

func dropOwnExportLocked(base uint64) {
	x := ownExports.byBase[base]
	if x == nil {
		return
	}
	delete(ownExports.byBase, base)
	if hb, ok := ownExports.byHandle[x.handle]; ok && hb == base {
		delete(ownExports.byHandle, x.handle)
	}
}

// dropOwnExportIfLocked drops the entry at a's base if it still names a.
func dropOwnExportIfLocked(a IPCAllocation) {
	if x := ownExports.byBase[a.Base]; x != nil && x.alloc.Same(a) {
		dropOwnExportLocked(a.Base)
	}
}

// sweepOwnExports drops the entries whose allocation is freed or replaced, asking the
// driver about each outside the lock (a pointer query: it waits for no stream work).
// One sweep runs at a time: sweepAt is out of reach until it ends.
func (b *cudaBackend) sweepOwnExports() {
	ownExports.Lock()
	if len(ownExports.byBase) < ownExports.sweepAt {
		ownExports.Unlock()
		return
	}
	ownExports.sweepAt = math.MaxInt
	known := make([]IPCAllocation, 0, len(ownExports.byBase))
	for _, x := range ownExports.byBase {
		known = append(known, x.alloc)
	}
	ownExports.Unlock()
	var gone []IPCAllocation
	for _, a := range known {
		if now, err := b.IPCAllocation(uintptr(a.Base)); err != nil || !a.Same(now) {
			gone = append(gone, a)
		}
	}
	ownExports.Lock()
	for _, a := range gone {
		dropOwnExportIfLocked(a)
	}
	ownExports.sweepAt = max(ownExportsSweepMin, 2*len(ownExports.byBase))
	ownExports.Unlock()
}

// dropOwnExports forgets b as an exporter (its last reference is released): an entry
// no other backend exported goes, and b records no more.
func (b *cudaBackend) dropOwnExports() {
	ownExports.Lock()
	defer ownExports.Unlock()
	b.ipc.exportsDropped = true
	for base, x := range ownExports.byBase {
		x.owners = slices.DeleteFunc(x.owners, func(o *cudaBackend) bool { return o == b })
		if len(x.owners) == 0 {
			dropOwnExportLocked(base)
		}
	}
}

// openOwn opens a handle this process exported: the allocation's own address, if it
// is still the allocation the handle named (same base and buffer id); one that is not
// is forgotten.
func (b *cudaBackend) openOwn(h IPCHandle) (uintptr, bool, error) {
	ownExports.Lock()
	var a IPCAllocation
	base, ok := ownExports.byHandle[h]
	if x := ownExports.byBase[base]; ok && x != nil {
		a = x.alloc
	} else {
		ok = false
	}
	ownExports.Unlock()
	if !ok {
		return 0, false, nil
	}
	now, err := b.IPCAllocation(uintptr(a.Base))
	if err != nil || !a.Same(now) {
		ownExports.Lock()
		dropOwnExportIfLocked(a)
		ownExports.Unlock()
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

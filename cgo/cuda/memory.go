package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"strconv"
	"sync"
	"unsafe"
)

// DeviceMemory is a device allocation (cuMemAlloc or cuMemAllocManaged).
type DeviceMemory struct {
	ctx     *Context
	size    int
	managed bool

	mu  sync.Mutex
	ptr C.CUdeviceptr // 0 once freed
}

// MemAlloc allocates size bytes of device memory.
func (c *Context) MemAlloc(size int) (*DeviceMemory, error) {
	h, err := c.raw("cuMemAlloc")
	if err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, invalid("cuMemAlloc", "size %d", size)
	}
	var p C.CUdeviceptr
	if err := check("cuMemAlloc", C.ucpx_mem_alloc(h, &p, C.size_t(size))); err != nil {
		return nil, err
	}
	return &DeviceMemory{ctx: c, size: size, ptr: p}, nil
}

// MemAllocManaged allocates size bytes of managed (unified) memory, reachable
// from the host and every device (CU_MEM_ATTACH_GLOBAL).
func (c *Context) MemAllocManaged(size int) (*DeviceMemory, error) {
	h, err := c.raw("cuMemAllocManaged")
	if err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, invalid("cuMemAllocManaged", "size %d", size)
	}
	var p C.CUdeviceptr
	if err := check("cuMemAllocManaged", C.ucpx_mem_alloc_managed(h, &p, C.size_t(size), 1)); err != nil {
		return nil, err
	}
	return &DeviceMemory{ctx: c, size: size, ptr: p, managed: true}, nil
}

// Ptr is the device address, 0 after Close.
func (m *DeviceMemory) Ptr() uintptr {
	m.mu.Lock()
	defer m.mu.Unlock()
	return uintptr(m.ptr)
}

// Size is the allocation size in bytes.
func (m *DeviceMemory) Size() int { return m.size }

// Managed reports whether the memory came from MemAllocManaged.
func (m *DeviceMemory) Managed() bool { return m.managed }

// Close frees the memory (cuMemFree). Work still using it must be finished.
// A second Close returns an error matching ErrInvalidHandle.
func (m *DeviceMemory) Close() error {
	if m == nil {
		return closedErr("cuMemFree", "device memory")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ptr == 0 {
		return closedErr("cuMemFree", "device memory")
	}
	p := m.ptr
	m.ptr = 0
	return check("cuMemFree", C.ucpx_mem_free(m.ctx.h, p))
}

// HostAllocFlags are cuMemHostAlloc flags.
type HostAllocFlags uint32

const (
	// HostAllocPortable: pinned for every context, not only the allocating one.
	HostAllocPortable HostAllocFlags = 0x1
	// HostAllocDeviceMap: mapped into the device address space (DevicePtr).
	HostAllocDeviceMap HostAllocFlags = 0x2
	// HostAllocWriteCombined: fast for the GPU to read, slow for the CPU to read.
	HostAllocWriteCombined HostAllocFlags = 0x4
)

// HostMemory is page-locked host memory from cuMemHostAlloc. It is C memory:
// Go, C and (with HostAllocDeviceMap) the GPU may all hold its address.
type HostMemory struct {
	ctx  *Context
	size int
	dev  uintptr

	mu sync.Mutex
	p  unsafe.Pointer // nil once freed
}

// MemHostAlloc allocates size bytes of pinned host memory, zeroed. With
// HostAllocDeviceMap the device address is fetched as well (DevicePtr).
// Signal words use HostAllocPortable|HostAllocDeviceMap.
func (c *Context) MemHostAlloc(size int, flags HostAllocFlags) (*HostMemory, error) {
	h, err := c.raw("cuMemHostAlloc")
	if err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, invalid("cuMemHostAlloc", "size %d", size)
	}
	if flags&^(HostAllocPortable|HostAllocDeviceMap|HostAllocWriteCombined) != 0 {
		return nil, invalid("cuMemHostAlloc", "unknown flags %#x", uint32(flags))
	}
	var p unsafe.Pointer
	if err := check("cuMemHostAlloc", C.ucpx_mem_host_alloc(h, &p, C.size_t(size), C.uint(flags))); err != nil {
		return nil, err
	}
	if p == nil {
		return nil, fmt.Errorf("cuMemHostAlloc: %d bytes: the driver returned no memory: %w", size, ErrOutOfMemory)
	}
	clear(unsafe.Slice((*byte)(p), size))
	m := &HostMemory{ctx: c, size: size, p: p}
	if flags&HostAllocDeviceMap != 0 {
		var d C.CUdeviceptr
		if err := check("cuMemHostGetDevicePointer", C.ucpx_mem_host_get_device_pointer(h, &d, C.uintptr_t(uintptr(p)))); err != nil {
			C.ucpx_mem_free_host(h, p)
			return nil, err
		}
		m.dev = uintptr(d)
	}
	return m, nil
}

// Ptr is the host address, nil after Close.
func (m *HostMemory) Ptr() unsafe.Pointer {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.p
}

// Addr is the host address as an integer, for copies; 0 after Close.
func (m *HostMemory) Addr() uintptr { return uintptr(m.Ptr()) }

// Bytes views the memory as a byte slice, valid until Close.
func (m *HostMemory) Bytes() []byte {
	p := m.Ptr()
	if p == nil {
		return nil
	}
	return unsafe.Slice((*byte)(p), m.size)
}

// DevicePtr is the device address of the memory (0 unless allocated with
// HostAllocDeviceMap). With unified addressing it usually equals Addr.
func (m *HostMemory) DevicePtr() uintptr { return m.dev }

// Size is the allocation size in bytes.
func (m *HostMemory) Size() int { return m.size }

// Close frees the memory (cuMemFreeHost). A second Close returns an error
// matching ErrInvalidHandle.
func (m *HostMemory) Close() error {
	if m == nil {
		return closedErr("cuMemFreeHost", "host memory")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.p == nil {
		return closedErr("cuMemFreeHost", "host memory")
	}
	p := m.p
	m.p = nil
	return check("cuMemFreeHost", C.ucpx_mem_free_host(m.ctx.h, p))
}

// HostGetDevicePointer returns the device address of mapped pinned host memory
// (cuMemHostAlloc with DEVICEMAP, or cuMemHostRegister with DEVICEMAP).
func (c *Context) HostGetDevicePointer(host uintptr) (uintptr, error) {
	h, err := c.raw("cuMemHostGetDevicePointer")
	if err != nil {
		return 0, err
	}
	if host == 0 {
		return 0, invalid("cuMemHostGetDevicePointer", "nil host address")
	}
	var d C.CUdeviceptr
	if err := check("cuMemHostGetDevicePointer", C.ucpx_mem_host_get_device_pointer(h, &d, C.uintptr_t(host))); err != nil {
		return 0, err
	}
	return uintptr(d), nil
}

// HostRegisterFlags are cuMemHostRegister flags.
type HostRegisterFlags uint32

const (
	HostRegisterPortable  HostRegisterFlags = 0x1
	HostRegisterDeviceMap HostRegisterFlags = 0x2
	HostRegisterIOMemory  HostRegisterFlags = 0x4
	HostRegisterReadOnly  HostRegisterFlags = 0x8
)

// HostRegistration is a host range page-locked with cuMemHostRegister.
type HostRegistration struct {
	ctx  *Context
	size int
	dev  uintptr

	mu   sync.Mutex
	addr uintptr // 0 once unregistered
}

// MemHostRegister page-locks [addr, addr+size) and maps it for the device. The
// range must be C or mmap memory, never Go heap memory: the driver keeps the
// address after the call returns.
func (c *Context) MemHostRegister(addr uintptr, size int, flags HostRegisterFlags) (*HostRegistration, error) {
	h, err := c.raw("cuMemHostRegister")
	if err != nil {
		return nil, err
	}
	if addr == 0 || size <= 0 {
		return nil, invalid("cuMemHostRegister", "range %#x+%d", addr, size)
	}
	if flags&^(HostRegisterPortable|HostRegisterDeviceMap|HostRegisterIOMemory|HostRegisterReadOnly) != 0 {
		return nil, invalid("cuMemHostRegister", "unknown flags %#x", uint32(flags))
	}
	if err := check("cuMemHostRegister", C.ucpx_mem_host_register(h, C.uintptr_t(addr), C.size_t(size), C.uint(flags))); err != nil {
		return nil, err
	}
	r := &HostRegistration{ctx: c, size: size, addr: addr}
	if flags&HostRegisterDeviceMap != 0 {
		var d C.CUdeviceptr
		if err := check("cuMemHostGetDevicePointer", C.ucpx_mem_host_get_device_pointer(h, &d, C.uintptr_t(addr))); err != nil {
			C.ucpx_mem_host_unregister(h, C.uintptr_t(addr))
			return nil, err
		}
		r.dev = uintptr(d)
	}
	return r, nil
}

// DevicePtr is the device address of the range (0 without HostRegisterDeviceMap).
func (r *HostRegistration) DevicePtr() uintptr { return r.dev }

// Close unregisters the range (cuMemHostUnregister). A second Close returns an
// error matching ErrInvalidHandle.
func (r *HostRegistration) Close() error {
	if r == nil {
		return closedErr("cuMemHostUnregister", "host registration")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.addr == 0 {
		return closedErr("cuMemHostUnregister", "host registration")
	}
	a := r.addr
	r.addr = 0
	return check("cuMemHostUnregister", C.ucpx_mem_host_unregister(r.ctx.h, C.uintptr_t(a)))
}

func checkCopy(op string, dst, src uintptr, n int) error {
	if n <= 0 {
		return invalid(op, "copy of %d bytes", n)
	}
	if dst == 0 || src == 0 {
		return invalid(op, "nil address (dst %#x, src %#x)", dst, src)
	}
	return nil
}

// Memcpy enqueues a copy of n bytes between any two addresses the driver knows
// (device, pinned or registered host, managed) by unified addressing
// (cuMemcpyAsync). Pageable host memory makes the call synchronous.
func (s *Stream) Memcpy(dst, src uintptr, n int) error {
	const op = "cuMemcpyAsync"
	if err := checkCopy(op, dst, src, n); err != nil {
		return err
	}
	if err := s.rlock(op); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	return check(op, C.ucpx_memcpy_async(s.ctx.h, C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n), s.h))
}

// MemcpyHtoD enqueues a copy of n bytes from host address src to device address dst.
func (s *Stream) MemcpyHtoD(dst, src uintptr, n int) error {
	const op = "cuMemcpyHtoDAsync"
	if err := checkCopy(op, dst, src, n); err != nil {
		return err
	}
	if err := s.rlock(op); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	return check(op, C.ucpx_memcpy_htod_async(s.ctx.h, C.CUdeviceptr(dst), C.uintptr_t(src), C.size_t(n), s.h))
}

// MemcpyDtoH enqueues a copy of n bytes from device address src to host address dst.
func (s *Stream) MemcpyDtoH(dst, src uintptr, n int) error {
	const op = "cuMemcpyDtoHAsync"
	if err := checkCopy(op, dst, src, n); err != nil {
		return err
	}
	if err := s.rlock(op); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	return check(op, C.ucpx_memcpy_dtoh_async(s.ctx.h, C.uintptr_t(dst), C.CUdeviceptr(src), C.size_t(n), s.h))
}

// MemcpyDtoD enqueues a copy of n bytes between device addresses.
func (s *Stream) MemcpyDtoD(dst, src uintptr, n int) error {
	const op = "cuMemcpyDtoDAsync"
	if err := checkCopy(op, dst, src, n); err != nil {
		return err
	}
	if err := s.rlock(op); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	return check(op, C.ucpx_memcpy_dtod_async(s.ctx.h, C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n), s.h))
}

// MemcpyDtoDUncaptured is MemcpyDtoD unless s is capturing: then it enqueues nothing
// and returns the capture status (cuStreamIsCapturing and the copy in one call).
func (s *Stream) MemcpyDtoDUncaptured(dst, src uintptr, n int) (CaptureStatus, error) {
	const op = "cuMemcpyDtoDAsync"
	if err := checkCopy(op, dst, src, n); err != nil {
		return CaptureNone, err
	}
	if err := s.rlock(op); err != nil {
		return CaptureNone, err
	}
	defer s.mu.RUnlock()
	var st C.CUstreamCaptureStatus
	err := check(op, C.ucpx_memcpy_dtod_async_uncaptured(s.ctx.h, C.CUdeviceptr(dst), C.CUdeviceptr(src), C.size_t(n), s.h, &st))
	return CaptureStatus(st), err
}

// MemcpyPeer enqueues a copy of n bytes from src in srcCtx to dst in dstCtx
// (cuMemcpyPeerAsync): a copy-engine transfer between GPUs, over NVLink where
// there is one.
func (s *Stream) MemcpyPeer(dst uintptr, dstCtx *Context, src uintptr, srcCtx *Context, n int) error {
	const op = "cuMemcpyPeerAsync"
	if err := checkCopy(op, dst, src, n); err != nil {
		return err
	}
	dh, err := dstCtx.raw(op)
	if err != nil {
		return err
	}
	sh, err := srcCtx.raw(op)
	if err != nil {
		return err
	}
	if err := s.rlock(op); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	return check(op, C.ucpx_memcpy_peer_async(s.ctx.h, C.CUdeviceptr(dst), dh, C.CUdeviceptr(src), sh, C.size_t(n), s.h))
}

// MemsetD8 enqueues setting n bytes at device address dst to v.
func (s *Stream) MemsetD8(dst uintptr, v uint8, n int) error {
	const op = "cuMemsetD8Async"
	if dst == 0 || n <= 0 {
		return invalid(op, "memset of %d bytes at %#x", n, dst)
	}
	if err := s.rlock(op); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	return check(op, C.ucpx_memset_d8_async(s.ctx.h, C.CUdeviceptr(dst), C.uchar(v), C.size_t(n), s.h))
}

// MemsetD32 enqueues setting count 32-bit words at device address dst (4-byte
// aligned) to v.
func (s *Stream) MemsetD32(dst uintptr, v uint32, count int) error {
	const op = "cuMemsetD32Async"
	if dst == 0 || count <= 0 {
		return invalid(op, "memset of %d words at %#x", count, dst)
	}
	if dst%4 != 0 {
		return invalid(op, "address %#x is not 4-byte aligned", dst)
	}
	if err := s.rlock(op); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	return check(op, C.ucpx_memset_d32_async(s.ctx.h, C.CUdeviceptr(dst), C.uint(v), C.size_t(count), s.h))
}

// MemoryType is where memory physically lives (CUmemorytype), plus Unregistered
// for addresses the driver does not know.
type MemoryType int

const (
	MemoryUnregistered MemoryType = 0 // not allocated, registered or mapped by CUDA (plain malloc, Go heap)
	MemoryHost         MemoryType = 1 // pinned or registered host memory
	MemoryDevice       MemoryType = 2 // device memory, including managed memory
	MemoryArray        MemoryType = 3
	MemoryUnified      MemoryType = 4
)

func (t MemoryType) String() string {
	switch t {
	case MemoryUnregistered:
		return "unregistered"
	case MemoryHost:
		return "host"
	case MemoryDevice:
		return "device"
	case MemoryArray:
		return "array"
	case MemoryUnified:
		return "unified"
	}
	return "MemoryType(" + strconv.Itoa(int(t)) + ")"
}

// PointerAttributes tells memory kinds apart (cuPointerGetAttributes).
type PointerAttributes struct {
	Type          MemoryType
	Managed       bool    // managed memory (Type is then MemoryDevice)
	DeviceOrdinal int     // device the memory was allocated or registered on (-1 if unknown)
	Context       uintptr // raw CUcontext of the allocation, 0 if none
	RangeStart    uintptr // start of the allocation containing the address
	RangeSize     uint64  // size of that allocation
}

// PointerAttributes classifies addr. Unlike the driver's single-attribute query it
// does not fail for unknown addresses: they come back as MemoryUnregistered.
func (c *Context) PointerAttributes(addr uintptr) (PointerAttributes, error) {
	h, err := c.raw("cuPointerGetAttributes")
	if err != nil {
		return PointerAttributes{}, err
	}
	var a C.ucpx_ptr_attrs
	if err := check("cuPointerGetAttributes", C.ucpx_pointer_get_attributes(h, &a, C.CUdeviceptr(addr))); err != nil {
		return PointerAttributes{}, err
	}
	out := PointerAttributes{
		Type:          MemoryType(uint32(a.memory_type)),
		Managed:       a.is_managed != 0,
		DeviceOrdinal: int(int32(uint32(a.device_ordinal))),
		Context:       uintptr(a.context),
		RangeStart:    uintptr(a.range_start),
		RangeSize:     uint64(a.range_size),
	}
	if out.Type == MemoryUnregistered {
		out.DeviceOrdinal = -1
	}
	return out, nil
}

// PointerAttribute is a CUpointer_attribute, for PointerGetAttribute.
type PointerAttribute int32

const (
	PointerAttrContext       PointerAttribute = 1
	PointerAttrMemoryType    PointerAttribute = 2
	PointerAttrDevicePointer PointerAttribute = 3
	PointerAttrHostPointer   PointerAttribute = 4
	PointerAttrBufferID      PointerAttribute = 7
	PointerAttrIsManaged     PointerAttribute = 8
	PointerAttrDeviceOrdinal PointerAttribute = 9
	PointerAttrRangeStart    PointerAttribute = 11
	PointerAttrRangeSize     PointerAttribute = 12
	PointerAttrMapped        PointerAttribute = 13
	// PointerAttrLegacyIPCCapable: the memory can be exported with cuIpcGetMemHandle
	// (cuMemAlloc memory; not VMM memory from cuMemCreate).
	PointerAttrLegacyIPCCapable PointerAttribute = 10
)

// Allocation is the device allocation containing an address, as CUDA IPC needs it.
type Allocation struct {
	Base     uintptr // start of the allocation (CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
	Size     uint64  // its size (CU_POINTER_ATTRIBUTE_RANGE_SIZE)
	BufferID uint64  // unique in the process's lifetime (CU_POINTER_ATTRIBUTE_BUFFER_ID)
	// LegacyIPC: IPCMemHandle can export it (CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE).
	LegacyIPC bool
}

// AllocationOf describes the allocation containing device address addr in one
// cuPointerGetAttributes call. A buffer freed and allocated again at the same address
// has a new BufferID, which is how IPC caches tell them apart. Addresses the driver
// does not know fail with ErrInvalidValue.
func (c *Context) AllocationOf(addr uintptr) (Allocation, error) {
	const op = "cuPointerGetAttributes"
	if addr == 0 {
		return Allocation{}, invalid(op, "nil device address")
	}
	h, err := c.raw(op)
	if err != nil {
		return Allocation{}, err
	}
	var a C.ucpx_alloc_attrs
	if err := check(op, C.ucpx_pointer_get_allocation(h, &a, C.CUdeviceptr(addr))); err != nil {
		return Allocation{}, err
	}
	if a.range_start == 0 || a.buffer_id == 0 {
		// cuPointerGetAttributes reports unknown memory as zeros rather than failing.
		return Allocation{}, invalid(op, "%#x is not device memory this process allocated", addr)
	}
	return Allocation{
		Base:      uintptr(a.range_start),
		Size:      uint64(a.range_size),
		BufferID:  uint64(a.buffer_id),
		LegacyIPC: a.legacy_ipc&0xff != 0,
	}, nil
}

// PointerGetAttribute returns one attribute of addr as an integer
// (cuPointerGetAttribute). Unknown addresses fail with ErrInvalidValue.
func (c *Context) PointerGetAttribute(attr PointerAttribute, addr uintptr) (uint64, error) {
	h, err := c.raw("cuPointerGetAttribute")
	if err != nil {
		return 0, err
	}
	var v C.uint64_t
	if err := check("cuPointerGetAttribute", C.ucpx_pointer_get_attribute(h, &v, C.CUpointer_attribute(attr), C.CUdeviceptr(addr))); err != nil {
		return 0, err
	}
	return uint64(v), nil
}

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"encoding/hex"
	"sync"
	"unsafe"
)

// IPCHandleSize is the size of CUDA IPC handles (CU_IPC_HANDLE_SIZE).
const IPCHandleSize = 64

// IPCMemHandle names a device allocation for another process on the same host
// (cuIpcGetMemHandle). It is plain bytes, to send over any wire.
type IPCMemHandle [IPCHandleSize]byte

// IPCEventHandle names an interprocess event for another process.
type IPCEventHandle [IPCHandleSize]byte

// MarshalBinary returns the 64 handle bytes.
func (h IPCMemHandle) MarshalBinary() ([]byte, error) { return append([]byte(nil), h[:]...), nil }

// UnmarshalBinary sets the handle from exactly 64 bytes.
func (h *IPCMemHandle) UnmarshalBinary(b []byte) error {
	return unmarshalHandle("IPCMemHandle", h[:], b)
}

// MarshalText encodes the handle as hex (so it fits JSON, env vars, flags).
func (h IPCMemHandle) MarshalText() ([]byte, error) { return hexOf(h[:]), nil }

// UnmarshalText decodes MarshalText's output.
func (h *IPCMemHandle) UnmarshalText(b []byte) error { return unhex("IPCMemHandle", h[:], b) }

// String is the hex form.
func (h IPCMemHandle) String() string { return string(hexOf(h[:])) }

// MarshalBinary returns the 64 handle bytes.
func (h IPCEventHandle) MarshalBinary() ([]byte, error) { return append([]byte(nil), h[:]...), nil }

// UnmarshalBinary sets the handle from exactly 64 bytes.
func (h *IPCEventHandle) UnmarshalBinary(b []byte) error {
	return unmarshalHandle("IPCEventHandle", h[:], b)
}

// MarshalText encodes the handle as hex.
func (h IPCEventHandle) MarshalText() ([]byte, error) { return hexOf(h[:]), nil }

// UnmarshalText decodes MarshalText's output.
func (h *IPCEventHandle) UnmarshalText(b []byte) error { return unhex("IPCEventHandle", h[:], b) }

// String is the hex form.
func (h IPCEventHandle) String() string { return string(hexOf(h[:])) }

func unmarshalHandle(what string, dst, b []byte) error {
	if len(b) != IPCHandleSize {
		return invalid("Unmarshal"+what, "%d bytes, want %d", len(b), IPCHandleSize)
	}
	copy(dst, b)
	return nil
}

func hexOf(b []byte) []byte { return hex.AppendEncode(nil, b) }

func unhex(what string, dst, b []byte) error {
	if len(b) != 2*IPCHandleSize {
		return invalid("Unmarshal"+what, "%d hex digits, want %d", len(b), 2*IPCHandleSize)
	}
	if _, err := hex.Decode(dst, b); err != nil {
		return invalid("Unmarshal"+what, "%v", err)
	}
	return nil
}

// IPCMemHandle exports the allocation containing device address ptr
// (cuMemAlloc memory; not pinned host or managed memory).
func (c *Context) IPCMemHandle(ptr uintptr) (IPCMemHandle, error) {
	const op = "cuIpcGetMemHandle"
	var h IPCMemHandle
	if ptr == 0 {
		return h, invalid(op, "nil device address")
	}
	ch, err := c.raw(op)
	if err != nil {
		return h, err
	}
	err = check(op, C.ucpx_ipc_get_mem_handle(ch, unsafe.Pointer(&h[0]), C.CUdeviceptr(ptr)))
	return h, err
}

// IPCMemFlags are cuIpcOpenMemHandle flags.
type IPCMemFlags uint32

// IPCLazyEnablePeerAccess lets the driver enable peer access when the exporting
// device differs from this context's device.
const IPCLazyEnablePeerAccess IPCMemFlags = 0x1

// IPCMapping is another process's allocation mapped into this one.
type IPCMapping struct {
	ctx *Context

	mu  sync.Mutex
	ptr C.CUdeviceptr // 0 once closed
}

// OpenIPCMemHandle maps an allocation exported by another process. Opening the
// same handle again in one context returns the same address with a reference
// count (each open needs its Close). CUDA does not support opening a handle in
// the process that exported it.
func (c *Context) OpenIPCMemHandle(h IPCMemHandle, flags IPCMemFlags) (*IPCMapping, error) {
	const op = "cuIpcOpenMemHandle"
	if flags&^IPCLazyEnablePeerAccess != 0 {
		return nil, invalid(op, "unknown flags %#x", uint32(flags))
	}
	ch, err := c.raw(op)
	if err != nil {
		return nil, err
	}
	var p C.CUdeviceptr
	if err := check(op, C.ucpx_ipc_open_mem_handle(ch, &p, unsafe.Pointer(&h[0]), C.uint(flags))); err != nil {
		return nil, err
	}
	return &IPCMapping{ctx: c, ptr: p}, nil
}

// Ptr is the device address of the mapping in this process, 0 after Close.
func (m *IPCMapping) Ptr() uintptr {
	m.mu.Lock()
	defer m.mu.Unlock()
	return uintptr(m.ptr)
}

// Close unmaps the allocation (cuIpcCloseMemHandle). A second Close returns an
// error matching ErrInvalidHandle.
func (m *IPCMapping) Close() error {
	if m == nil {
		return closedErr("cuIpcCloseMemHandle", "IPC mapping")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ptr == 0 {
		return closedErr("cuIpcCloseMemHandle", "IPC mapping")
	}
	p := m.ptr
	m.ptr = 0
	return check("cuIpcCloseMemHandle", C.ucpx_ipc_close_mem_handle(m.ctx.h, p))
}

// IPCHandle exports an event created with EventInterprocess|EventDisableTiming.
func (e *Event) IPCHandle() (IPCEventHandle, error) {
	const op = "cuIpcGetEventHandle"
	var h IPCEventHandle
	if err := e.rlock(op); err != nil {
		return h, err
	}
	defer e.mu.RUnlock()
	err := check(op, C.ucpx_ipc_get_event_handle(e.ctx.h, unsafe.Pointer(&h[0]), e.h))
	return h, err
}

// OpenIPCEventHandle opens an event exported by another process. The returned
// Event is owned: Close destroys this process's reference.
func (c *Context) OpenIPCEventHandle(h IPCEventHandle) (*Event, error) {
	const op = "cuIpcOpenEventHandle"
	ch, err := c.raw(op)
	if err != nil {
		return nil, err
	}
	var e C.CUevent
	if err := check(op, C.ucpx_ipc_open_event_handle(ch, &e, unsafe.Pointer(&h[0]))); err != nil {
		return nil, err
	}
	return &Event{ctx: c, owned: true, h: e}, nil
}

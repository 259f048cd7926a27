package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"sync"
	"unsafe"
)

// Context is a CUDA context. Every object made from it (streams, events,
// memory, graphs, modules) runs its driver calls in it.
//
// Goroutines and contexts: CUDA binds a current context to each OS thread,
// while a goroutine may change threads between any two calls. So ucpx never
// relies on the thread's current context: every wrapper passes its Context to
// the C helper, which makes it current inside the same C call when it is not
// already (one cuCtxGetCurrent in the steady state). Callers need no
// runtime.LockOSThread. SetCurrent exists for code that mixes ucpx with other
// CUDA code on a locked thread.
type Context struct {
	h       C.CUcontext
	dev     Device
	primary bool // holds a primary-context reference released by Close

	mu     sync.Mutex
	closed bool
}

// RetainPrimaryContext retains the device's primary context (the one the CUDA
// runtime, PyTorch and NCCL share). Close releases the reference; close
// everything made from the context first.
func (d Device) RetainPrimaryContext() (*Context, error) {
	if err := loaded(); err != nil {
		return nil, err
	}
	var h C.CUcontext
	if err := check("cuDevicePrimaryCtxRetain", C.ucpx_primary_ctx_retain(&h, d.h)); err != nil {
		return nil, err
	}
	return &Context{h: h, dev: d, primary: true}, nil
}

// ContextFromHandle wraps a raw CUcontext made elsewhere. The Context borrows it:
// Close only marks the wrapper closed.
func ContextFromHandle(h uintptr) (*Context, error) {
	if err := loaded(); err != nil {
		return nil, err
	}
	if h == 0 {
		return nil, invalid("ContextFromHandle", "nil CUcontext")
	}
	c := &Context{h: C.ucpx_ctx_from(C.uintptr_t(h))}
	var d C.CUdevice
	if err := check("cuCtxGetDevice", C.ucpx_ctx_get_device(c.h, &d)); err != nil {
		return nil, err
	}
	c.dev = Device{ordinal: int(d), h: d}
	return c, nil
}

// Handle is the raw CUcontext.
func (c *Context) Handle() uintptr {
	if c == nil {
		return 0
	}
	return uintptr(unsafe.Pointer(c.h))
}

// Device is the device the context runs on.
func (c *Context) Device() Device { return c.dev }

// raw returns the handle for a driver call, or an error after Close.
func (c *Context) raw(op string) (C.CUcontext, error) {
	if c == nil {
		return nil, closedErr(op, "context")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.h == nil {
		return nil, closedErr(op, "context")
	}
	return c.h, nil
}

// SetCurrent binds the context to the calling OS thread (cuCtxSetCurrent). It is
// only meaningful on a thread held with runtime.LockOSThread; ucpx's own
// wrappers do not need it.
func (c *Context) SetCurrent() error {
	h, err := c.raw("cuCtxSetCurrent")
	if err != nil {
		return err
	}
	return check("cuCtxSetCurrent", C.ucpx_ctx_set_current(h))
}

// ClearCurrent unbinds any context from the calling OS thread.
func ClearCurrent() error {
	if err := loaded(); err != nil {
		return err
	}
	return check("cuCtxSetCurrent", C.ucpx_ctx_set_current(nil))
}

// CurrentContext returns the raw context bound to the calling OS thread, 0 if none.
func CurrentContext() (uintptr, error) {
	if err := loaded(); err != nil {
		return 0, err
	}
	var h C.CUcontext
	if err := check("cuCtxGetCurrent", C.ucpx_ctx_get_current(&h)); err != nil {
		return 0, err
	}
	return uintptr(unsafe.Pointer(h)), nil
}

// Synchronize waits for all work in the context.
func (c *Context) Synchronize() error {
	h, err := c.raw("cuCtxSynchronize")
	if err != nil {
		return err
	}
	return check("cuCtxSynchronize", C.ucpx_ctx_synchronize(h))
}

// EnablePeerAccess lets kernels and copies in c reach memory allocated in peer
// (cuCtxEnablePeerAccess). A second call returns an error matching
// ErrPeerAccessAlreadyOn.
func (c *Context) EnablePeerAccess(peer *Context) error {
	h, err := c.raw("cuCtxEnablePeerAccess")
	if err != nil {
		return err
	}
	p, err := peer.raw("cuCtxEnablePeerAccess")
	if err != nil {
		return err
	}
	return check("cuCtxEnablePeerAccess", C.ucpx_ctx_enable_peer_access(h, p))
}

// DisablePeerAccess undoes EnablePeerAccess.
func (c *Context) DisablePeerAccess(peer *Context) error {
	h, err := c.raw("cuCtxDisablePeerAccess")
	if err != nil {
		return err
	}
	p, err := peer.raw("cuCtxDisablePeerAccess")
	if err != nil {
		return err
	}
	return check("cuCtxDisablePeerAccess", C.ucpx_ctx_disable_peer_access(h, p))
}

// StreamPriorityRange returns the numerically least and greatest stream
// priorities; greatest is the highest priority (a negative number).
func (c *Context) StreamPriorityRange() (least, greatest int, err error) {
	h, err := c.raw("cuCtxGetStreamPriorityRange")
	if err != nil {
		return 0, 0, err
	}
	var l, g C.int
	if err := check("cuCtxGetStreamPriorityRange", C.ucpx_ctx_stream_priority_range(h, &l, &g)); err != nil {
		return 0, 0, err
	}
	return int(l), int(g), nil
}

// MemGetInfo returns the free and total device memory of the context's device.
func (c *Context) MemGetInfo() (free, total uint64, err error) {
	h, err := c.raw("cuMemGetInfo")
	if err != nil {
		return 0, 0, err
	}
	var f, t C.size_t
	if err := check("cuMemGetInfo", C.ucpx_mem_get_info(h, &f, &t)); err != nil {
		return 0, 0, err
	}
	return uint64(f), uint64(t), nil
}

// Close releases the primary-context reference (cuDevicePrimaryCtxRelease); for
// a borrowed context it only marks the wrapper closed. A second Close returns an
// error matching ErrInvalidHandle.
func (c *Context) Close() error {
	if c == nil {
		return closedErr("Context.Close", "context")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.h == nil {
		return closedErr("Context.Close", "context")
	}
	c.closed = true
	if !c.primary {
		return nil
	}
	return check("cuDevicePrimaryCtxRelease", C.ucpx_primary_ctx_release(c.dev.h))
}

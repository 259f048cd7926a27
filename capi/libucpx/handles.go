package main

/*
#include "internal.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/ucpx/ucpx/internal/errs"
)

// errInvalidHandle: 0, a handle never issued or already destroyed, or one of another kind.
var errInvalidHandle = errs.New("invalid handle", errs.InvalidParam)

// handles maps the integers C holds to the Go objects they stand for. Numbers are
// never reused, so a stale handle cannot reach a newer object. A sync.Map: every call
// looks its handles up, creating and destroying them is rare, and a lookup takes no
// lock that calls from other threads would contend for.
var (
	handles    sync.Map // uint64 -> object
	handleNext atomic.Uint64
)

// fastNext numbers the handles of workers and endpoints: UCPXC_FAST_BIT above an
// index of the C table that gives the blocking calls their records (fast.c).
var fastNext atomic.Uint64

// put stores o and returns its new handle.
func put(o any) C.ucpx_handle_t {
	h := handleNext.Add(1)
	handles.Store(h, o)
	return C.ucpx_handle_t(h)
}

// putFast is put for an object C callers reach through rec, a record of cgo/ucx/fast.h.
func putFast(o any, rec unsafe.Pointer) C.ucpx_handle_t {
	h := C.UCPXC_FAST_BIT | fastNext.Add(1)
	handles.Store(h, o)
	C.ucpxc_fast_set(C.uint64_t(h), rec)
	return C.ucpx_handle_t(h)
}

// get returns the object of handle h, which must be a T.
func get[T any](h C.ucpx_handle_t, kind string) (T, error) {
	o, _ := handles.Load(uint64(h))
	return as[T](o, h, kind)
}

// as is o as a T, or errInvalidHandle for handle h (absent: o is nil, never a T).
func as[T any](o any, h C.ucpx_handle_t, kind string) (T, error) {
	t, ok := o.(T)
	if !ok {
		return t, fmt.Errorf("%s handle %d: %w", kind, uint64(h), errInvalidHandle)
	}
	return t, nil
}

// optional is get for a handle that may be 0 (none).
func optional[T any](h C.ucpx_handle_t, kind string) (T, error) {
	if h == 0 {
		var zero T
		return zero, nil
	}
	return get[T](h, kind)
}

// take removes handle h, which must be a T, and returns its object: one of two
// concurrent destroys of the same handle gets it, the other errInvalidHandle.
func take[T any](h C.ucpx_handle_t, kind string) (T, error) {
	o, _ := handles.Load(uint64(h))
	t, err := as[T](o, h, kind)
	if err == nil {
		err = drop(h, o, kind)
	}
	if err != nil {
		var zero T
		return zero, err
	}
	return t, nil
}

// drop removes handle h if it still holds o: one of two concurrent removals gets it,
// the other errInvalidHandle.
func drop(h C.ucpx_handle_t, o any, kind string) error {
	if !handles.CompareAndDelete(uint64(h), o) {
		return fmt.Errorf("%s handle %d: %w", kind, uint64(h), errInvalidHandle)
	}
	if h&C.UCPXC_FAST_BIT != 0 {
		C.ucpxc_fast_set(C.uint64_t(h), nil)
	}
	return nil
}

// putBack restores a handle take removed, when the destroy it was for left the object
// in place (ErrBusy: still in use; ErrTimedOut: MemH.Close's revocation or an
// endpoint's flush did not finish). A worker's or endpoint's record for the blocking
// calls stays unset: they take the Go path, which finds the object by the handle.
func putBack(h C.ucpx_handle_t, o any) { handles.Store(uint64(h), o) }

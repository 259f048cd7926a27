package main

/*
#include "ucpx.h"
*/
import "C"

import (
	"fmt"
	"sync"

	"github.com/ucpx/ucpx/internal/errs"
)

// errInvalidHandle: 0, a handle never issued or already destroyed, or one of another kind.
var errInvalidHandle = errs.New("invalid handle", errs.InvalidParam)

// handles maps the integers C holds to the Go objects they stand for. Numbers are
// never reused, so a stale handle cannot reach a newer object.
var handles = struct {
	sync.RWMutex
	next uint64
	objs map[uint64]any
}{objs: map[uint64]any{}}

// put stores o and returns its new handle.
func put(o any) C.ucpx_handle_t {
	handles.Lock()
	defer handles.Unlock()
	handles.next++
	handles.objs[handles.next] = o
	return C.ucpx_handle_t(handles.next)
}

// get returns the object of handle h, which must be a T.
func get[T any](h C.ucpx_handle_t, kind string) (T, error) {
	handles.RLock()
	o := handles.objs[uint64(h)]
	handles.RUnlock()
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
	handles.Lock()
	defer handles.Unlock()
	t, err := as[T](handles.objs[uint64(h)], h, kind)
	if err == nil {
		delete(handles.objs, uint64(h))
	}
	return t, err
}

// putBack restores a handle take removed, when the destroy it was for failed
// (ErrBusy: the object is still in use).
func putBack(h C.ucpx_handle_t, o any) {
	handles.Lock()
	handles.objs[uint64(h)] = o
	handles.Unlock()
}

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"sync"
	"unsafe"
)

// StreamFlags are CUstream creation flags.
type StreamFlags uint32

const (
	// StreamDefault streams synchronize with the legacy default stream.
	StreamDefault StreamFlags = 0x0
	// StreamNonBlocking streams do not synchronize with the legacy default
	// stream; ucpx uses them everywhere.
	StreamNonBlocking StreamFlags = 0x1
)

// Stream is a CUstream. Its methods enqueue work and return; Synchronize and
// Query observe it. Methods are safe for concurrent use; Close waits for calls in
// progress on other goroutines and makes later calls fail with ErrInvalidHandle.
type Stream struct {
	ctx   *Context
	owned bool

	mu sync.RWMutex
	h  C.CUstream // nil once closed

	// capture holds the Go callbacks enqueued while the stream captures a graph;
	// they belong to the captured graph (see hostfunc.go).
	capMu   sync.Mutex
	capture *hostFnSet
}

// NewStream creates a stream. priority follows StreamPriorityRange (0 is the
// default; lower numbers are higher priority).
func (c *Context) NewStream(flags StreamFlags, priority int) (*Stream, error) {
	h, err := c.raw("cuStreamCreateWithPriority")
	if err != nil {
		return nil, err
	}
	if flags&^StreamNonBlocking != 0 {
		return nil, invalid("cuStreamCreateWithPriority", "unknown stream flags %#x", uint32(flags))
	}
	var s C.CUstream
	if err := check("cuStreamCreateWithPriority", C.ucpx_stream_create(h, &s, C.uint(flags), C.int(priority))); err != nil {
		return nil, err
	}
	return &Stream{ctx: c, owned: true, h: s}, nil
}

// StreamFromHandle wraps a raw CUstream made elsewhere (by the CUDA runtime,
// PyTorch, gorgonia.org/cu). The context is found with cuStreamGetCtx. The
// Stream borrows the handle: Close does not destroy it.
func StreamFromHandle(h uintptr) (*Stream, error) {
	if err := loaded(); err != nil {
		return nil, err
	}
	if h == 0 {
		// The legacy default stream has no context of its own to find.
		return nil, invalid("StreamFromHandle", "the default (NULL) stream cannot be wrapped")
	}
	s := C.ucpx_stream_from(C.uintptr_t(h))
	var ch C.CUcontext
	if err := check("cuStreamGetCtx", C.ucpx_stream_get_ctx(s, &ch)); err != nil {
		return nil, err
	}
	ctx, err := ContextFromHandle(uintptr(unsafe.Pointer(ch)))
	if err != nil {
		return nil, err
	}
	return &Stream{ctx: ctx, h: s}, nil
}

// Handle is the raw CUstream, 0 after Close.
func (s *Stream) Handle() uintptr {
	if s == nil {
		return 0
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	return uintptr(unsafe.Pointer(s.h))
}

// Context is the context the stream belongs to.
func (s *Stream) Context() *Context { return s.ctx }

// rlock read-locks the stream for one call; the caller unlocks with s.mu.RUnlock.
func (s *Stream) rlock(op string) error {
	if s == nil {
		return closedErr(op, "stream")
	}
	s.mu.RLock()
	if s.h == nil {
		s.mu.RUnlock()
		return closedErr(op, "stream")
	}
	return nil
}

// Synchronize blocks until all work enqueued so far is done and returns the
// first asynchronous error the stream met.
func (s *Stream) Synchronize() error {
	if err := s.rlock("cuStreamSynchronize"); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	return check("cuStreamSynchronize", C.ucpx_stream_synchronize(s.ctx.h, s.h))
}

// Query reports whether all enqueued work is done, without blocking.
func (s *Stream) Query() (bool, error) {
	if err := s.rlock("cuStreamQuery"); err != nil {
		return false, err
	}
	defer s.mu.RUnlock()
	return queryResult("cuStreamQuery", C.ucpx_stream_query(s.ctx.h, s.h))
}

// queryResult maps CUDA_SUCCESS to true and CUDA_ERROR_NOT_READY to false.
func queryResult(op string, r C.CUresult) (bool, error) {
	if Result(r) == ErrNotReady.Code {
		return false, nil
	}
	if err := check(op, r); err != nil {
		return false, err
	}
	return true, nil
}

// WaitEvent holds back later work on s until the work captured by e is done.
func (s *Stream) WaitEvent(e *Event) error {
	if err := s.rlock("cuStreamWaitEvent"); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	if err := e.rlock("cuStreamWaitEvent"); err != nil {
		return err
	}
	defer e.mu.RUnlock()
	return check("cuStreamWaitEvent", C.ucpx_stream_wait_event(s.ctx.h, s.h, e.h, 0))
}

// Close destroys the stream (cuStreamDestroy). Work already enqueued still runs
// to completion; call Synchronize first to wait for it. A borrowed stream
// (StreamFromHandle) is not destroyed. A second Close returns an error matching
// ErrInvalidHandle.
func (s *Stream) Close() error {
	if s == nil {
		return closedErr("Stream.Close", "stream")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.h == nil {
		return closedErr("Stream.Close", "stream")
	}
	h := s.h
	s.h = nil
	s.capMu.Lock()
	if s.capture != nil {
		// A capture never ended through this Stream: its graph, if any, is
		// the caller's; keep the callbacks alive with it (see hostfunc.go).
		s.capture = nil
	}
	s.capMu.Unlock()
	if !s.owned {
		return nil
	}
	return check("cuStreamDestroy", C.ucpx_stream_destroy(s.ctx.h, h))
}

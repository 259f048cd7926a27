package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"sync"
	"time"
	"unsafe"
)

// EventFlags are CUevent creation flags.
type EventFlags uint32

const (
	EventDefault EventFlags = 0x0
	// EventBlockingSync makes Synchronize sleep instead of spin.
	EventBlockingSync EventFlags = 0x1
	// EventDisableTiming drops timestamps; such events are cheaper to record
	// and query. ElapsedTime on them fails with ErrInvalidHandle.
	EventDisableTiming EventFlags = 0x2
	// EventInterprocess allows IPCHandle; requires EventDisableTiming.
	EventInterprocess EventFlags = 0x4
)

// Event is a CUevent.
type Event struct {
	ctx   *Context
	owned bool

	mu sync.RWMutex
	h  C.CUevent // nil once closed
}

// NewEvent creates an event.
func (c *Context) NewEvent(flags EventFlags) (*Event, error) {
	h, err := c.raw("cuEventCreate")
	if err != nil {
		return nil, err
	}
	if flags&^(EventBlockingSync|EventDisableTiming|EventInterprocess) != 0 {
		return nil, invalid("cuEventCreate", "unknown event flags %#x", uint32(flags))
	}
	if flags&EventInterprocess != 0 && flags&EventDisableTiming == 0 {
		return nil, invalid("cuEventCreate", "EventInterprocess requires EventDisableTiming")
	}
	var e C.CUevent
	if err := check("cuEventCreate", C.ucpx_event_create(h, &e, C.uint(flags))); err != nil {
		return nil, err
	}
	return &Event{ctx: c, owned: true, h: e}, nil
}

// EventFromHandle wraps a raw CUevent of ctx made elsewhere. The Event borrows
// it: Close does not destroy it.
func EventFromHandle(ctx *Context, h uintptr) (*Event, error) {
	if _, err := ctx.raw("EventFromHandle"); err != nil {
		return nil, err
	}
	if h == 0 {
		return nil, invalid("EventFromHandle", "nil CUevent")
	}
	return &Event{ctx: ctx, h: C.ucpx_event_from(C.uintptr_t(h))}, nil
}

// Handle is the raw CUevent, 0 after Close.
func (e *Event) Handle() uintptr {
	if e == nil {
		return 0
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	return uintptr(unsafe.Pointer(e.h))
}

func (e *Event) rlock(op string) error {
	if e == nil {
		return closedErr(op, "event")
	}
	e.mu.RLock()
	if e.h == nil {
		e.mu.RUnlock()
		return closedErr(op, "event")
	}
	return nil
}

// Record captures the current end of s into e.
func (e *Event) Record(s *Stream) error {
	// Lock order everywhere: stream before event.
	if err := s.rlock("cuEventRecord"); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	if err := e.rlock("cuEventRecord"); err != nil {
		return err
	}
	defer e.mu.RUnlock()
	return check("cuEventRecord", C.ucpx_event_record(e.ctx.h, e.h, s.h))
}

// Query reports whether the recorded work is done (true for an event never recorded).
func (e *Event) Query() (bool, error) {
	if err := e.rlock("cuEventQuery"); err != nil {
		return false, err
	}
	defer e.mu.RUnlock()
	return queryResult("cuEventQuery", C.ucpx_event_query(e.ctx.h, e.h))
}

// Synchronize blocks until the recorded work is done.
func (e *Event) Synchronize() error {
	if err := e.rlock("cuEventSynchronize"); err != nil {
		return err
	}
	defer e.mu.RUnlock()
	return check("cuEventSynchronize", C.ucpx_event_synchronize(e.ctx.h, e.h))
}

// ElapsedTime returns the time between two recorded, completed timing events
// (resolution about 0.5 µs).
func ElapsedTime(start, end *Event) (time.Duration, error) {
	const op = "cuEventElapsedTime"
	// Two events lock in address order, once if they are the same.
	first, second := start, end
	if uintptr(unsafe.Pointer(second)) < uintptr(unsafe.Pointer(first)) {
		first, second = second, first
	}
	if err := first.rlock(op); err != nil {
		return 0, err
	}
	defer first.mu.RUnlock()
	if second != first {
		if err := second.rlock(op); err != nil {
			return 0, err
		}
		defer second.mu.RUnlock()
	}
	var ms C.float
	if err := check(op, C.ucpx_event_elapsed(start.ctx.h, &ms, start.h, end.h)); err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// Close destroys the event (cuEventDestroy); a borrowed event is only marked
// closed. A second Close returns an error matching ErrInvalidHandle.
func (e *Event) Close() error {
	if e == nil {
		return closedErr("Event.Close", "event")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.h == nil {
		return closedErr("Event.Close", "event")
	}
	h := e.h
	e.h = nil
	if !e.owned {
		return nil
	}
	return check("cuEventDestroy", C.ucpx_event_destroy(e.ctx.h, h))
}

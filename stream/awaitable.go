package stream

/*
#include <stdint.h>
static void *ucpx_await_addr(uintptr_t a) { return (void *)a; }
*/
import "C"

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/ucpx/ucpx/cgo/cuda"
)

// Awaitable is a device-to-host copy in flight (CopyToHostAsync): TorchRec's
// device-to-host awaitable, which keeps the CPU free until the result is needed. Wait
// and Bytes synchronise only on the event recorded right after the copy, never on the
// stream (work enqueued later does not delay them). Safe for concurrent use.
type Awaitable struct {
	dst uintptr
	n   int

	mu    sync.Mutex
	ev    Event // nil once the copy was seen done (or the awaitable closed)
	done  bool
	err   error
	close func() error
}

// CopyToHostAsync enqueues a copy of n bytes from src (device memory on a CUDA stream,
// any memory on a host stream) to the host memory at dst, records an event after it
// and returns at once. dst must stay valid until the copy is done and must not be
// unpinned Go memory (as for Stream.Copy); on CUDA, page-locked dst (Pinned, or memory
// registered with cuMemHostRegister) keeps the call from waiting for the copy. Bad
// arguments are refused here (ErrInvalidArgument), a closed stream with ErrClosed.
func CopyToHostAsync(s Stream, dst, src uintptr, n int) (*Awaitable, error) {
	if s == nil {
		return nil, fmt.Errorf("stream: CopyToHostAsync: nil stream: %w", ErrInvalidArgument)
	}
	a := &Awaitable{dst: dst, n: n}
	switch st := s.(type) {
	case *hostStream:
		ev := &hostEvent{}
		if err := st.Copy(dst, src, n); err != nil {
			return nil, err
		}
		if err := st.Record(ev); err != nil {
			return nil, err
		}
		a.ev, a.close = ev, ev.Close
	case *cudaStream:
		if st.closed.Load() {
			return nil, st.errClosed("CopyToHostAsync")
		}
		// A plain CUevent of the stream's context: a stream adopted with
		// WrapCUDAStream has a backend that makes no events of its own.
		ce, err := st.s.Context().NewEvent(cuda.EventDisableTiming)
		if err != nil {
			return nil, cudaErr("CopyToHostAsync", err)
		}
		if err := st.Copy(dst, src, n); err != nil {
			return nil, joinClose(err, ce.Close)
		}
		if err := ce.Record(st.s); err != nil {
			return nil, joinClose(st.wrap("CopyToHostAsync", err), ce.Close)
		}
		ev := &cudaEvent{b: &cudaBackend{refs: 1, borrowed: true, closed: true}, e: ce}
		a.ev, a.close = ev, ce.Close
	default:
		return nil, fmt.Errorf("stream: CopyToHostAsync: a %T is not a stream of this package: %w", s, ErrWrongBackend)
	}
	return a, nil
}

func joinClose(err error, close func() error) error {
	if cerr := close(); cerr != nil {
		return fmt.Errorf("%w (closing the event: %v)", err, cerr)
	}
	return err
}

func errNilAwaitable(method string) error {
	return fmt.Errorf("stream: Awaitable.%s: nil Awaitable: %w", method, ErrInvalidArgument)
}

// Ready reports, without blocking, whether the copy is done (and its error).
func (a *Awaitable) Ready() (bool, error) {
	if a == nil {
		return false, errNilAwaitable("Ready")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pollLocked()
}

// pollLocked queries the event once; on completion it releases the event. Caller holds a.mu.
func (a *Awaitable) pollLocked() (bool, error) {
	if a.done || a.ev == nil {
		if !a.done {
			return false, fmt.Errorf("stream: Awaitable: %w", ErrClosed)
		}
		return true, a.err
	}
	ok, err := a.ev.Query()
	if !ok && err == nil {
		return false, nil
	}
	a.done, a.err = true, err
	a.ev = nil
	if cerr := a.close(); cerr != nil && a.err == nil {
		a.err = cerr
	}
	return true, a.err
}

// Wait blocks until the copy is done or ctx ends (then it returns ctx.Err() and the copy
// stays in flight). It polls the event: a spin first (a small copy is done within
// microseconds), then sleeps growing to a millisecond, so a long wait costs no core.
func (a *Awaitable) Wait(ctx context.Context) error {
	if a == nil {
		return errNilAwaitable("Wait")
	}
	if ctx == nil {
		return fmt.Errorf("stream: Awaitable.Wait: nil context: %w", ErrInvalidArgument)
	}
	pause := time.Duration(0)
	for spins := 0; ; spins++ {
		a.mu.Lock()
		ok, err := a.pollLocked()
		a.mu.Unlock()
		if ok || err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if spins < 64 {
			runtime.Gosched()
			continue
		}
		pause = min(max(2*pause, 10*time.Microsecond), time.Millisecond)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Bytes waits for the copy (as Wait with no deadline) and returns the n bytes at dst.
// The slice aliases dst: it is valid as long as dst is.
func (a *Awaitable) Bytes() ([]byte, error) {
	if a == nil {
		return nil, errNilAwaitable("Bytes")
	}
	if err := a.Wait(context.Background()); err != nil {
		return nil, err
	}
	if a.n <= 0 {
		return nil, nil
	}
	// dst is C or pinned memory, never Go's: the conversion goes through C.
	return unsafe.Slice((*byte)(C.ucpx_await_addr(C.uintptr_t(a.dst))), a.n), nil
}

// Close releases the event of a copy never waited for; the copy itself still runs.
// After Wait or Ready saw the copy done it does nothing. A second Close returns ErrClosed.
func (a *Awaitable) Close() error {
	if a == nil {
		return errNilAwaitable("Close")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.done {
		return nil
	}
	if a.ev == nil {
		return fmt.Errorf("stream: Awaitable.Close: %w", ErrClosed)
	}
	a.ev = nil
	return a.close()
}

// WrapCUDAEvent adopts a CUevent made elsewhere (the CUDA runtime, PyTorch's
// torch.cuda.Event().cuda_event) as an Event, so it can be recorded on a CUDA stream of
// this package (a condition's, for Request.RecordEvent) or waited on. s is a stream of
// the event's context; a raw CUevent does not name its context. The Event borrows the
// handle: Close does not destroy it.
func WrapCUDAEvent(s Stream, handle uintptr) (Event, error) {
	cs, ok := s.(*cudaStream)
	if !ok || cs == nil {
		return nil, fmt.Errorf("stream: WrapCUDAEvent: a CUDA stream of the event's context is needed, got %T: %w", s, ErrWrongBackend)
	}
	if handle == 0 {
		return nil, fmt.Errorf("stream: WrapCUDAEvent: nil CUevent: %w", ErrInvalidArgument)
	}
	if cs.closed.Load() {
		return nil, cs.errClosed("WrapCUDAEvent")
	}
	ce, err := cuda.EventFromHandle(cs.s.Context(), handle)
	if err != nil {
		return nil, cudaErr("WrapCUDAEvent", err)
	}
	// A private backend of no resources: the event's Close releases nothing else.
	return &cudaEvent{b: &cudaBackend{refs: 1, borrowed: true, closed: true}, e: ce}, nil
}

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"os"
	"runtime/cgo"
	"runtime/debug"
	"sync"
	"sync/atomic"
)

// Host functions (cuLaunchHostFunc, graph host nodes) call back into Go through a
// C trampoline: userData carries a cgo.Handle for a *hostCall, and the exported
// ucpxHostFnTrampoline resolves and runs it on the driver's callback thread.
//
// Cost: each callback is a cgo callback from a thread Go did not create. The
// first on a given driver thread binds an M to it; later ones add about a
// microsecond to the driver's own callback latency (docs/performance.md has the
// enqueue and per-callback costs). A handle is created per LaunchHostFunc (a map
// insert) and deleted after the callback runs.
//
// Lifetimes: a stream launch runs once, so its handle is deleted by the
// trampoline. A graph host node (and a LaunchHostFunc recorded while the stream
// captures a graph) runs on every launch, so its handle lives in a hostFnSet
// owned by the graph and by every GraphExec instantiated from it, and is deleted
// when the last of them is closed. Callbacks must not call CUDA (a driver rule)
// and should be short: they hold up the stream.

type hostCall struct {
	fn   func()
	once atomic.Bool // delete the handle after the first call
}

//export ucpxHostFnTrampoline
func ucpxHostFnTrampoline(h C.uintptr_t) { runHostCall(uintptr(h)) }

func runHostCall(h uintptr) {
	c, ok := lookupHostCall(cgo.Handle(h))
	if !ok {
		return // a graph launched after ucpx released its callbacks: nothing to run
	}
	if c.once.Load() {
		cgo.Handle(h).Delete()
	}
	// A panic escaping on a driver thread would kill the process: stop it here.
	// Callers that need the panic (package stream makes it the stream's sticky
	// error) recover inside fn; this is the last resort, which reports it on
	// stderr so that it is not lost silently.
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(os.Stderr, "cuda: host func panicked (recovered on the driver thread): %v\n%s", r, debug.Stack())
		}
	}()
	c.fn()
}

// lookupHostCall resolves a handle without panicking on a deleted one: a panic
// on a driver thread would kill the process.
func lookupHostCall(h cgo.Handle) (c *hostCall, ok bool) {
	defer func() {
		if recover() != nil {
			c, ok = nil, false
		}
	}()
	c, ok = h.Value().(*hostCall)
	return c, ok
}

// hostFnSet owns the handles of callbacks that may run many times (graph host
// nodes). It is reference counted: the graph holds one reference, each
// GraphExec one, and a parent graph one for each child graph embedded in it.
type hostFnSet struct {
	mu       sync.Mutex
	refs     int
	handles  []cgo.Handle
	children []*hostFnSet
}

func newHostFnSet() *hostFnSet { return &hostFnSet{refs: 1} }

func (s *hostFnSet) add(h cgo.Handle) {
	s.mu.Lock()
	s.handles = append(s.handles, h)
	s.mu.Unlock()
}

func (s *hostFnSet) addChild(c *hostFnSet) {
	s.mu.Lock()
	s.children = append(s.children, c.retain())
	s.mu.Unlock()
}

func (s *hostFnSet) retain() *hostFnSet {
	s.mu.Lock()
	s.refs++
	s.mu.Unlock()
	return s
}

func (s *hostFnSet) release() {
	s.mu.Lock()
	s.refs--
	if s.refs > 0 {
		s.mu.Unlock()
		return
	}
	hs, cs := s.handles, s.children
	s.handles, s.children = nil, nil
	s.mu.Unlock()
	for _, h := range hs {
		h.Delete()
	}
	for _, c := range cs {
		c.release()
	}
}

// LaunchHostFunc enqueues fn to run on a driver thread once all earlier work on
// s is done; later work waits for fn to return. fn must not call CUDA, nor
// runtime.Goexit (testing's FailNow does): Go ends the process on a Goexit on a
// thread it did not create. While s captures a graph, fn becomes a host node of that
// graph and runs on every launch.
func (s *Stream) LaunchHostFunc(fn func()) error {
	const op = "cuLaunchHostFunc"
	if fn == nil {
		return invalid(op, "nil function")
	}
	if err := s.rlock(op); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	c := &hostCall{fn: fn}
	c.once.Store(true)
	h := cgo.NewHandle(c)
	var capturing C.int
	if err := check(op, C.ucpx_launch_host_func(s.ctx.h, s.h, C.uintptr_t(h), &capturing)); err != nil {
		h.Delete()
		return err
	}
	if capturing != 0 {
		// Nothing runs before the captured graph is launched, so flipping the
		// flag now cannot race with the trampoline.
		c.once.Store(false)
		s.captureSet().add(h)
	}
	return nil
}

// captureSet returns the set that collects callbacks recorded during capture.
func (s *Stream) captureSet() *hostFnSet {
	s.capMu.Lock()
	defer s.capMu.Unlock()
	if s.capture == nil {
		s.capture = newHostFnSet()
	}
	return s.capture
}

// takeCaptureSet hands the capture's callbacks to the graph EndCapture returns.
func (s *Stream) takeCaptureSet() *hostFnSet {
	s.capMu.Lock()
	defer s.capMu.Unlock()
	c := s.capture
	s.capture = nil
	if c == nil {
		c = newHostFnSet()
	}
	return c
}

// launchHostNoop enqueues a C host function that does nothing: the driver's own
// cost of cuLaunchHostFunc, which the benchmarks compare LaunchHostFunc with.
func (s *Stream) launchHostNoop() error {
	const op = "cuLaunchHostFunc"
	if err := s.rlock(op); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	return check(op, C.ucpx_launch_host_noop(s.ctx.h, s.h))
}

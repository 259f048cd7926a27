package cuda

import (
	"runtime/cgo"
	"testing"
)

// The callback plumbing needs no GPU: the trampoline's Go half and the handle
// sets are exercised directly.

func TestHostCallOnceDeletesHandle(t *testing.T) {
	n := 0
	c := &hostCall{fn: func() { n++ }}
	c.once.Store(true)
	h := cgo.NewHandle(c)
	runHostCall(uintptr(h))
	if n != 1 {
		t.Fatalf("callback ran %d times, want 1", n)
	}
	if _, ok := lookupHostCall(h); ok {
		t.Fatal("one-shot handle still live after its callback")
	}
	// A stale handle (a late launch of a released graph) is ignored, not a panic.
	runHostCall(uintptr(h))
	if n != 1 {
		t.Fatalf("stale handle ran the callback again")
	}
}

func TestHostCallPersistent(t *testing.T) {
	n := 0
	h := cgo.NewHandle(&hostCall{fn: func() { n++ }})
	for range 3 {
		runHostCall(uintptr(h))
	}
	if n != 3 {
		t.Fatalf("callback ran %d times, want 3", n)
	}
	h.Delete()
}

func TestHostFnSetRefcount(t *testing.T) {
	graph := newHostFnSet()
	h := cgo.NewHandle(&hostCall{fn: func() {}})
	graph.add(h)
	child := newHostFnSet()
	ch := cgo.NewHandle(&hostCall{fn: func() {}})
	child.add(ch)
	graph.addChild(child)
	child.release() // the child graph closed; the parent still needs its callbacks
	if _, ok := lookupHostCall(ch); !ok {
		t.Fatal("child callback released while its parent graph lives")
	}
	exec := graph.retain() // instantiated
	graph.release()        // graph closed, exec still alive
	if _, ok := lookupHostCall(h); !ok {
		t.Fatal("callback released while an exec still uses it")
	}
	exec.release()
	if _, ok := lookupHostCall(h); ok {
		t.Fatal("callback not released with the last owner")
	}
	if _, ok := lookupHostCall(ch); ok {
		t.Fatal("child callback not released with the last owner")
	}
}

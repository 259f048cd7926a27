package cuda

import (
	"runtime/cgo"
	"testing"

	"github.com/stretchr/testify/require"
)

// The callback plumbing needs no GPU: the trampoline's Go half and the handle
// sets are exercised directly.

func TestHostCallOnceDeletesHandle(t *testing.T) {
	n := 0
	c := &hostCall{fn: func() { n++ }}
	c.once.Store(true)
	h := cgo.NewHandle(c)
	runHostCall(uintptr(h))
	require.Equal(t, 1, n, "callback runs")
	_, ok := lookupHostCall(h)
	require.False(t, ok, "one-shot handle still live after its callback")
	// A stale handle (a late launch of a released graph) is ignored, not a panic.
	runHostCall(uintptr(h))
	require.Equal(t, 1, n, "stale handle ran the callback again")
}

func TestHostCallPersistent(t *testing.T) {
	n := 0
	h := cgo.NewHandle(&hostCall{fn: func() { n++ }})
	for range 3 {
		runHostCall(uintptr(h))
	}
	require.Equal(t, 3, n, "callback runs")
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
	_, ok := lookupHostCall(ch)
	require.True(t, ok, "child callback released while its parent graph lives")
	exec := graph.retain() // instantiated
	graph.release()        // graph closed, exec still alive
	_, ok = lookupHostCall(h)
	require.True(t, ok, "callback released while an exec still uses it")
	exec.release()
	_, ok = lookupHostCall(h)
	require.False(t, ok, "callback not released with the last owner")
	_, ok = lookupHostCall(ch)
	require.False(t, ok, "child callback not released with the last owner")
}

// TestHostCallPanicRecovered: a panicking callback does not escape runHostCall
// (on a driver thread that would kill the process).
func TestHostCallPanicRecovered(t *testing.T) {
	c := &hostCall{fn: func() { panic("boom") }}
	c.once.Store(true)
	h := cgo.NewHandle(c)
	runHostCall(uintptr(h)) // must not panic
	if _, ok := lookupHostCall(h); ok {
		t.Fatal("handle not deleted")
	}
}

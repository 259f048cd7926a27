package ucp

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A failure hook taken back with its remover does not run when the peer fails; the
// others run once each, in the order they were added, and a hook added after the
// failure runs at once. A nil hook is refused without a panic at the failure.
func TestOnFailureRemove(t *testing.T) {
	p := newShmPair(t)
	var ran []int
	p.epA.OnFailure(func(*Endpoint, error) { ran = append(ran, 1) })
	remove := p.epA.OnFailure(func(*Endpoint, error) { ran = append(ran, 2) })
	p.epA.OnFailure(func(*Endpoint, error) { ran = append(ran, 3) })
	p.epA.OnFailure(nil)()
	for range 3 { // many objects come and go on one endpoint: none is kept
		p.epA.OnFailure(func(*Endpoint, error) { ran = append(ran, 9) })()
	}
	remove()
	remove()

	p.a.mu.Lock()
	p.epA.failLocked(ErrConnectionReset)
	p.a.mu.Unlock()
	p.a.Progress() // runs the deferred failure hooks
	require.Equal(t, []int{1, 3}, ran)

	var late error
	p.epA.OnFailure(func(_ *Endpoint, err error) { late = err })()
	require.ErrorIs(t, late, ErrConnectionReset, "a hook added after the failure runs at once")
}

// Close hooks run once the worker closed (Context.Close closes it too), except those
// taken back; one added after the close runs at once.
func TestWorkerOnClose(t *testing.T) {
	p := newShmPair(t)
	var ran []int
	p.a.OnClose(func() {
		require.True(t, p.a.closed.Load(), "the worker is closed when its hooks run")
		ran = append(ran, 1)
	})
	remove := p.a.OnClose(func() { ran = append(ran, 2) })
	p.a.OnClose(nil)()
	p.a.OnClose(func() { ran = append(ran, 3) })
	remove()
	require.NoError(t, p.ctxA.Close())
	p.ctxA = nil // closed: the pair's cleanup closes B
	require.Equal(t, []int{1, 3}, ran)
	p.a.OnClose(func() { ran = append(ran, 4) })
	require.Equal(t, []int{1, 3, 4}, ran)
}

package ucp

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The application closing an endpoint runs its failure hooks (those not taken back),
// once each, in order, on the closing goroutine before CloseNbx returns, with an error
// matching ErrClosed (not ErrPeerFailed). A hook added after the close runs at once with ErrClosed, as does one added
// to an endpoint its worker's Close closed.
func TestOnFailureRunsOnLocalClose(t *testing.T) {
	p := newShmPair(t)
	var ran []int
	var errs []error
	p.epA.OnFailure(func(_ *Endpoint, err error) { ran, errs = append(ran, 1), append(errs, err) })
	remove := p.epA.OnFailure(func(*Endpoint, error) { ran = append(ran, 2) })
	p.epA.OnFailure(func(_ *Endpoint, err error) { ran, errs = append(ran, 3), append(errs, err) })
	remove()
	_, err := p.epA.CloseNbx(false)
	require.NoError(t, err)
	require.Equal(t, []int{1, 3}, ran, "the hooks ran before CloseNbx returned")
	for _, err := range errs {
		require.ErrorIs(t, err, ErrClosed)
		require.NotErrorIs(t, err, ErrPeerFailed)
	}
	p.a.Progress()
	require.Equal(t, []int{1, 3}, ran, "once")

	var late error
	p.epA.OnFailure(func(_ *Endpoint, err error) { late = err })()
	require.ErrorIs(t, late, ErrClosed, "a hook added after the close runs at once")

	late = nil
	require.NoError(t, p.ctxB.Close())
	p.ctxB = nil
	p.epB.OnFailure(func(_ *Endpoint, err error) { late = err })
	require.ErrorIs(t, late, ErrClosed, "a hook added after the worker closed the endpoint runs at once")
}

package ucp

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/stream"
)

// The Request of a failed call is nil: its methods report that instead of crashing.
func TestNilRequest(t *testing.T) {
	var r *Request
	require.False(t, r.Done())
	require.ErrorIs(t, r.Err(), ErrInvalidParam)
	require.Zero(t, r.Length())
	require.Zero(t, r.SenderTag())
	require.Zero(t, r.Fetched())
	done, err := r.Test()
	require.False(t, done)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.ErrorIs(t, r.Wait(context.Background()), ErrInvalidParam)
	b := stream.NewHostBackend()
	defer b.Close()
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	require.ErrorIs(t, r.WaitOnStream(s), ErrInvalidParam)
	ev, err := b.NewEvent()
	require.NoError(t, err)
	require.ErrorIs(t, r.RecordEvent(ev), ErrInvalidParam)
	r.Cancel()
}

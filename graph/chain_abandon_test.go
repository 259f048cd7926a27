package graph_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// A chained launch abandoned while UCX still holds one of its operations (a large
// send whose receiver never came: UCX cannot cancel a send) keeps its chain until the
// chain can be closed: the next launch fails with ErrBusy rather than post the send's
// buffer again, and once the receiver took the message launches run again, one
// message each.
func TestGraphChainedLaunchAbandonedWithOperationHeld(t *testing.T) {
	const size = 4 << 20
	l := newLink(t)
	g := graph.NewHost()
	out := make([]byte, size)
	send := sendNode(t, l, g, nil, out, 31)
	x, err := g.Instantiate()
	require.NoError(t, err)
	quick := stream.NewHostBackend(stream.WithCloseGrace(50 * time.Millisecond))
	defer quick.Close()
	s, err := quick.NewStream()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := make([]byte, size)
	recvAtA := func(fill byte) {
		t.Helper()
		r, err := l.a.TagRecvNbx(got, 31, ^uint64(0), nil)
		require.NoError(t, err)
		require.NoError(t, r.Wait(ctx))
		require.Equal(t, fill, got[size-1])
	}
	launchOnce(t, ctx, x, s, func() { recvAtA(0) })

	out[size-1] = 1
	require.NoError(t, x.Launch(s)) // its send waits for a receive that does not come
	time.Sleep(20 * time.Millisecond)
	require.ErrorIs(t, s.Close(), stream.ErrAbandoned)

	s2, err := l.backend.NewStream()
	require.NoError(t, err)
	defer s2.Close()
	require.NoError(t, x.Launch(s2))
	require.ErrorIs(t, syncErr(t, ctx, s2), ucp.ErrBusy, "the abandoned launch's send is still UCX's")

	recvAtA(1) // the abandoned launch's message: its send completes
	s3, err := l.backend.NewStream()
	require.NoError(t, err)
	defer s3.Close()
	out[size-1] = 2
	require.NoError(t, x.Launch(s3))
	recvAtA(2)
	require.NoError(t, syncErr(t, ctx, s3))
	require.Equal(t, uint64(3), graph.ChainedLaunches(x), "the first, the abandoned one and the last")
	endGraph(t, x, send)
}

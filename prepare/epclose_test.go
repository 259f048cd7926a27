package prepare_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/prepare"
	"github.com/ucpx/ucpx/ucp"
)

// Closing a request's own endpoint while its iteration is in flight ends the
// iteration: a Wait already blocked returns ErrClosed (not at its deadline, nor when
// the worker closes), a later Start fails at once with it, and Free succeeds. The peer
// stays alive and never does its part: the receiver's sender makes nothing ready, the
// sender's receiver never starts. Before, the Wait blocked until its context ended
// and Free said ErrBusy until the worker closed.
func TestEndpointCloseEndsIteration(t *testing.T) {
	for _, tc := range []struct {
		name  string
		link  func(testing.TB) *link
		force bool // CloseNbx in force mode (needs peer error handling: tcp), else Close
	}{
		{"shm/flush", shmLink, false},
		{"tcp/flush", tcpLink, false},
		{"tcp/force", tcpLink, true},
	} {
		for _, role := range []string{"receiver", "sender"} {
			t.Run(tc.name+"/"+role, func(t *testing.T) {
				l := tc.link(t)
				send, recv, _, _ := pair(t, l, 4*64, 4, 4, 0x6c)
				r, ep, peer := recv, l.toS, l.s
				if role == "sender" {
					r, ep, peer = send, l.toR, l.r
				}
				// The peer is alive (it progresses, so a flush completes) but never does
				// its part of the iteration.
				stop := make(chan struct{})
				progressed := make(chan struct{})
				go func() {
					defer close(progressed)
					for {
						select {
						case <-stop:
							return
						default:
							if peer.Progress() == 0 {
								time.Sleep(50 * time.Microsecond)
							}
						}
					}
				}()
				defer func() { close(stop); <-progressed }()
				require.NoError(t, r.Start())
				if role == "sender" {
					require.NoError(t, send.Pready(0)) // waits for the receiver's readiness
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				waited := make(chan error, 1)
				go func() { waited <- r.Wait(ctx) }()
				time.Sleep(10 * time.Millisecond) // let the Wait block (either order must work)
				if tc.force {
					req, err := ep.CloseNbx(true)
					require.NoError(t, err)
					require.NoError(t, req.Wait(ctx))
				} else {
					require.NoError(t, ep.Close())
				}
				err := <-waited
				require.ErrorIs(t, err, ucp.ErrClosed, "Wait after the request's endpoint closed")
				require.False(t, errors.Is(err, context.DeadlineExceeded), "%v", err)

				start := time.Now()
				require.ErrorIs(t, r.Start(), ucp.ErrClosed, "Start after the endpoint closed")
				require.Less(t, time.Since(start), 5*time.Second, "Start hung")
				require.NoError(t, r.Free())
				require.ErrorIs(t, r.Free(), ucp.ErrClosed)
			})
		}
	}
}

// A request made on an endpoint already closed fails at its first Start (or
// PrepareAll) with ErrClosed, at once, and Free succeeds.
func TestRequestOnClosedEndpoint(t *testing.T) {
	l := shmLink(t)
	require.NoError(t, l.toR.Close())
	send, err := prepare.PsendInit(l.s, make([]byte, 64), prepare.Params{Peer: l.toR, Tag: 0x6d, Partitions: 2})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.ErrorIs(t, prepare.PrepareAll(ctx, send), ucp.ErrClosed)
	require.ErrorIs(t, send.Start(), ucp.ErrClosed)
	require.NoError(t, send.Free())
}

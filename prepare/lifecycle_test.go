package prepare_test

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/prepare"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// prepareBoth runs each side's PrepareAll on its own goroutine, as two processes would
// (each progressing only its own worker), and returns both results.
func prepareBoth(t *testing.T, send, recv *prepare.Request) (serr, rerr error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rdone := make(chan error, 1)
	go func() { rdone <- prepare.PrepareAll(ctx, recv) }()
	serr = prepare.PrepareAll(ctx, send)
	rerr = <-rdone
	return serr, rerr
}

// hostLink is shmLink with a host backend, closed when the test ends.
func hostLink(t *testing.T) (*link, stream.Backend) {
	t.Helper()
	b, err := stream.Open(stream.Host)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	return shmLink(t), b
}

// onBackend is pairWith's change for requests on backend b.
func onBackend(b stream.Backend) func(prepare.Params) prepare.Params {
	return func(p prepare.Params) prepare.Params { p.Backend = b; return p }
}

// Buffers of different lengths fail the match on both sides with ErrInvalidParam,
// well before any deadline: the receiver refuses the sender's handshake, and the
// sender learns it from the refusal instead of resending until its context ends.
func TestMismatchedRequestsFailBothSides(t *testing.T) {
	links(t, func(t *testing.T, l *link) {
		for _, tc := range []struct{ slen, rlen, sp, rp int }{{64, 128, 4, 4}, {128, 64, 2, 8}} {
			send, err := prepare.PsendInit(l.s, make([]byte, tc.slen), prepare.Params{Peer: l.toR, Tag: 0x51, Partitions: tc.sp})
			require.NoError(t, err)
			recv, err := prepare.PrecvInit(l.r, make([]byte, tc.rlen), prepare.Params{Peer: l.toS, Tag: 0x51, Partitions: tc.rp})
			require.NoError(t, err)
			start := time.Now()
			serr, rerr := prepareBoth(t, send, recv)
			require.ErrorIs(t, serr, ucp.ErrInvalidParam, "%+v: the sender", tc)
			require.ErrorIs(t, rerr, ucp.ErrInvalidParam, "%+v: the receiver", tc)
			require.False(t, errors.Is(serr, context.DeadlineExceeded), "%+v", tc)
			require.Less(t, time.Since(start), 10*time.Second, "%+v", tc)
			require.ErrorIs(t, send.Start(), ucp.ErrInvalidParam, "%+v: a later Start says why", tc)
			require.NoError(t, send.Free(), "%+v", tc)
			require.NoError(t, recv.Free(), "%+v", tc)
		}
	})
}

// Closing the workers (here through their contexts) fails the requests of an
// iteration in flight with ErrClosed: Wait returns, a stream waiting on the receiver's
// arrivals moves on, and both requests can be freed.
func TestWorkerCloseFailsRequests(t *testing.T) {
	l, b := hostLink(t)
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	send, recv, _, _ := pairWith(t, l, 256, 4, 4, 0x52, onBackend(b))
	require.NoError(t, recv.Start())
	require.NoError(t, send.Start())
	require.NoError(t, recv.WaitOnStream(s)) // no partition is made ready: it waits

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	waits := make(chan error, 2)
	go func() { waits <- send.Wait(ctx) }()
	go func() { waits <- recv.Wait(ctx) }()
	time.Sleep(50 * time.Millisecond)
	require.NoError(t, l.ctxR.Close())
	require.NoError(t, l.ctxS.Close())
	for range 2 {
		err := <-waits
		require.ErrorIs(t, err, ucp.ErrClosed)
		require.False(t, errors.Is(err, context.DeadlineExceeded))
	}
	// Released: the failure value satisfies the wait.
	_ = syncWithin(t, s, 10*time.Second, "the stream waiting on the closed worker's request stayed blocked")
	_, err = recv.Test()
	require.ErrorIs(t, err, ucp.ErrClosed)
	require.NoError(t, send.Free())
	require.NoError(t, recv.Free())

	// A request of a closed worker fails at its first Start instead of waiting for a
	// peer forever.
	l2 := shmLink(t)
	late, err := prepare.PrecvInit(l2.r, make([]byte, 64), prepare.Params{Peer: l2.toS, Tag: 0x53, Partitions: 1})
	require.NoError(t, err)
	require.NoError(t, l2.ctxR.Close())
	started := make(chan error, 1)
	go func() { started <- late.Start() }()
	select {
	case err := <-started:
		require.ErrorIs(t, err, ucp.ErrClosed)
	case <-time.After(10 * time.Second):
		t.Fatal("Start on a closed worker waited for the peer")
	}
	require.NoError(t, late.Free())
}

// A partition gets one PreadyNode in a graph: each takes one readiness a launch, and a
// second would take the next iteration's and leave the last launch waiting for good.
// Another graph may have its own.
func TestPreadyNodeOncePerGraph(t *testing.T) {
	l, b := hostLink(t)
	send, recv, _, _ := pairWith(t, l, 64, 2, 2, 0x55, onBackend(b))
	g := graph.NewHost()
	_, err := send.PreadyNode(g, nil, 0)
	require.NoError(t, err)
	_, err = send.PreadyNode(g, nil, 0)
	require.ErrorIs(t, err, ucp.ErrInvalidParam, "partition 0 twice in one graph")
	_, err = send.PreadyNode(g, nil, 1)
	require.NoError(t, err)
	_, err = send.PreadyNode(graph.NewHost(), nil, 0)
	require.NoError(t, err, "partition 0 in another graph")
	require.NoError(t, send.Free())
	require.NoError(t, recv.Free())
}

// Every method of a freed request says ErrClosed, the receiver's stream calls too.
func TestFreedReceiverStreamCallsAreClosed(t *testing.T) {
	l, b := hostLink(t)
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	recv, err := prepare.PrecvInit(l.r, make([]byte, 64), prepare.Params{Peer: l.toS, Tag: 0x56, Partitions: 2, Backend: b})
	require.NoError(t, err)
	require.NoError(t, recv.Free())
	require.ErrorIs(t, recv.ArrivedOnStream(s, 0), ucp.ErrClosed)
	require.ErrorIs(t, recv.WaitOnStream(s), ucp.ErrClosed)
}

// A freed request is not kept by its endpoint (a failure hook per request held each,
// buffer and all, for the endpoint's life).
func TestFreedRequestIsCollected(t *testing.T) {
	l := shmLink(t)
	var bufs []weak.Pointer[byte]
	for range 8 {
		buf := make([]byte, 1<<20)
		r, err := prepare.PsendInit(l.s, buf, prepare.Params{Peer: l.toR, Tag: 0x57, Partitions: 1})
		require.NoError(t, err)
		require.NoError(t, r.Free())
		bufs = append(bufs, weak.Make(&buf[0]))
	}
	kept := len(bufs)
	for deadline := time.Now().Add(10 * time.Second); kept > 0 && time.Now().Before(deadline); {
		runtime.GC()
		kept = 0
		for _, w := range bufs {
			if w.Value() != nil {
				kept++
			}
		}
	}
	require.Zero(t, kept, "freed requests' buffers still reachable")
}

// A sender made ready by PreadyNode iterates by its graph's launches: a host iteration
// after them is refused (it would store an older iteration into the receiver's arrival
// counters, and the receiver would wait for good), and the launches go on working.
func TestHostIterationsAfterGraphLaunchesRefused(t *testing.T) {
	l, b := hostLink(t)
	const parts, size = 2, 64
	send, recv, sbuf, rbuf := pairWith(t, l, parts*size, parts, parts, 0x69, onBackend(b))
	g := graph.NewHost()
	for p := range parts {
		_, err := send.PreadyNode(g, nil, p)
		require.NoError(t, err)
	}
	exec, s := instantiateOn(t, g, b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	launch := func(i int) {
		fill(sbuf, i)
		require.NoError(t, recv.Start())
		require.NoError(t, exec.Launch(s))
		require.NoError(t, recv.Wait(ctx))
		require.NoError(t, s.Synchronize())
		require.NoError(t, checkFilled(rbuf, i))
	}
	for i := 1; i <= 3; i++ {
		launch(i)
	}
	require.ErrorIs(t, send.Start(), prepare.ErrInvalidParam)
	launch(4)
}

package prepare_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/prepare"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// heldStream is a stream of b (closed with the test) held back by a host function, a
// stand-in for a long kernel, until release is called.
func heldStream(t *testing.T, b stream.Backend) (s stream.Stream, release func()) {
	t.Helper()
	s, err := b.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	gate := make(chan struct{})
	release = sync.OnceFunc(func() { close(gate) })
	t.Cleanup(release) // before Close, also when the test failed while holding it
	require.NoError(t, s.LaunchHostFunc(func() { <-gate }))
	return s, release
}

// syncWithin synchronizes s; the test fails with hung if that takes longer than d.
func syncWithin(t *testing.T, s stream.Stream, d time.Duration, hung string) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- s.Synchronize() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatal(hung)
		return nil
	}
}

// A receiver's WaitOnStream queued behind work the stream has not run yet (a host
// function standing in for a long kernel): the host Wait completes the iteration and
// Free succeeds, but the words stay until the stream passed its wait, so the stream
// neither fails nor drops the work behind it.
func TestFreeKeepsWordsUntilReceiverStreamPassedItsWait(t *testing.T) {
	l, b := hostLink(t)
	send, recv, sbuf, rbuf := pairWith(t, l, 4*64, 4, 4, 0x66, onBackend(b))
	s, release := heldStream(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, prepare.StartAll(recv, send))
	require.NoError(t, recv.WaitOnStream(s))
	var copied []byte
	require.NoError(t, s.LaunchHostFunc(func() { copied = append([]byte(nil), rbuf...) }))
	fill(sbuf, 1)
	require.NoError(t, send.PreadyRange(0, 3))
	require.NoError(t, send.Wait(ctx))
	require.NoError(t, recv.Wait(ctx))
	require.NoError(t, recv.Free())
	release()
	require.NoError(t, syncWithin(t, s, 10*time.Second, "stream hung"), "the stream's pending wait read freed words")
	require.NoError(t, checkFilled(copied, 1))
	require.ErrorIs(t, recv.Free(), ucp.ErrClosed)
}

// The same with a sender's WaitOnStream (it waits on the request's sent word).
func TestFreeKeepsWordsUntilSenderStreamPassedItsWait(t *testing.T) {
	l, b := hostLink(t)
	send, recv, sbuf, _ := pairWith(t, l, 4*64, 4, 4, 0x67, onBackend(b))
	s, release := heldStream(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, send.Start())
	fill(sbuf, 1)
	require.NoError(t, send.Pready(0))
	require.NoError(t, send.WaitOnStream(s)) // not every partition ready yet
	reused := false
	require.NoError(t, s.LaunchHostFunc(func() { reused = true }))
	require.NoError(t, recv.Start())
	require.NoError(t, send.PreadyRange(1, 3))
	require.NoError(t, send.Wait(ctx))
	require.NoError(t, recv.Wait(ctx))
	require.NoError(t, send.Free())
	release()
	require.NoError(t, syncWithin(t, s, 10*time.Second, "stream hung"), "the stream's pending wait read freed words")
	require.True(t, reused)
}

// After a peer failure, Free with a PreadyOnStream the stream has not reached yet
// returns ErrBusy at once and changes nothing: the stream later passes its work
// without error, and then Free succeeds (once).
func TestFreeAfterFailureWithHeldPreadyOnStreamIsBusy(t *testing.T) {
	l, b := hostLink(t)
	send, recv, sbuf, _ := pairWith(t, l, 4*64, 4, 4, 0x68, onBackend(b))
	s, release := heldStream(t, b)
	require.NoError(t, prepare.StartAll(recv, send))
	fill(sbuf, 1)
	require.NoError(t, send.PreadyOnStream(s, 0))
	prepare.Fail(send, ucp.ErrPeerFailed)
	start := time.Now()
	freeErr := send.Free()
	took := time.Since(start)
	release()
	err := syncWithin(t, s, 15*time.Second, "stream hung")
	require.Less(t, took, 2*time.Second, "Free blocked on a stream the caller holds back (err %v)", freeErr)
	require.ErrorIs(t, freeErr, ucp.ErrBusy, "Free with an operation the stream has not reached")
	require.NoError(t, err, "the stream failed on the request's words")
	require.Eventually(t, func() bool {
		err := send.Free()
		require.True(t, err == nil || errors.Is(err, ucp.ErrBusy), "%v", err)
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "Free once the stream passed its work")
	require.ErrorIs(t, send.Free(), ucp.ErrClosed)
}

// A request whose peer died in an iteration is freed by Free alone, with no Wait or
// Test first: Free looks for the failure (progressing the worker) before it answers
// ErrBusy, and the iteration ends with it. Here the receiver waits for partitions and
// the sender for the receiver's readiness (nothing made ready: no mover progresses its
// worker); the peer's context closes, which tcp reports as a peer failure.
func TestFreeAfterPeerDiedWithoutWait(t *testing.T) {
	for _, role := range []string{"receiver", "sender"} {
		t.Run(role, func(t *testing.T) {
			l := tcpLink(t)
			send, recv, _, _ := pair(t, l, 4*64, 4, 4, 0x6a)
			r, peer := recv, l.ctxS
			if role == "sender" {
				r, peer = send, l.ctxR
			}
			require.NoError(t, r.Start())
			require.NoError(t, peer.Close())
			require.Eventually(t, func() bool {
				err := r.Free()
				require.True(t, err == nil || errors.Is(err, ucp.ErrBusy), "%v", err)
				return err == nil
			}, 20*time.Second, time.Millisecond, "Free of a request whose peer died")
			require.ErrorIs(t, r.Free(), ucp.ErrClosed)
		})
	}
}

// Free of an iteration in flight whose peer is alive says ErrBusy and changes nothing:
// the iteration still completes, with the data.
func TestFreeInFlightIsBusyAndChangesNothing(t *testing.T) {
	l := shmLink(t)
	send, recv, sbuf, rbuf := pair(t, l, 4*64, 4, 4, 0x6b)
	require.NoError(t, prepare.StartAll(recv, send))
	require.ErrorIs(t, recv.Free(), ucp.ErrBusy)
	require.ErrorIs(t, send.Free(), ucp.ErrBusy)
	fill(sbuf, 1)
	require.NoError(t, send.PreadyRange(0, 3))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, send.Wait(ctx))
	require.NoError(t, recv.Wait(ctx))
	require.NoError(t, checkFilled(rbuf, 1))
	require.NoError(t, send.Free())
	require.NoError(t, recv.Free())
}

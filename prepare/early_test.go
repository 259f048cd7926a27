package prepare_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/prepare"
	"github.com/ucpx/ucpx/ucp"
)

// sendForged sends n handshakes no request asks for through ep, for tags from tag on,
// each sent once (a forger does not resend), progressing to (the peer's worker) too.
func sendForged(t *testing.T, ep *ucp.Endpoint, to *ucp.Worker, n int, tag uint64, keyBytes int) {
	t.Helper()
	param := &ucp.RequestParam{AmFlags: ucp.AmReply | ucp.AmEager}
	for i := 0; i < n; i++ {
		r, err := ep.AmSendNbx(prepare.HandshakeAM, nil, prepare.ForgedHandshake(tag+uint64(i), keyBytes), param)
		require.NoError(t, err)
		for done := false; !done; {
			done, err = r.Test()
			require.NoError(t, err)
			to.Progress()
		}
	}
}

// progressUntil progresses ws until cond holds; the test fails with what if that
// takes longer than the bound (which only catches a hang).
func progressUntil(t *testing.T, what string, cond func() bool, ws ...*ucp.Worker) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal(what)
		}
		progressed := 0
		for _, w := range ws {
			progressed += w.Progress()
		}
		if progressed == 0 {
			time.Sleep(100 * time.Microsecond)
		}
	}
}

// progressing progresses w on a goroutine of its own until the test ends, as the
// peer's process would.
func progressing(t *testing.T, w *ucp.Worker) {
	t.Helper()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if w.Progress() == 0 {
				time.Sleep(50 * time.Microsecond)
			}
		}
	}()
	t.Cleanup(func() { close(stop); wg.Wait() })
}

// One peer sending handshakes nobody asks for takes at most its share of the room for
// handshakes that come before their request: another peer's is still kept.
func TestEarlyHandshakesBoundedPerPeer(t *testing.T) {
	l := shmLink(t)
	pair(t, l, 64, 2, 2, 0x58) // the receiver's worker has its handshake handler now
	defer prepare.FreezeEarlyClock(l.r)()
	sendForged(t, l.toR, l.r, prepare.MaxEarly+10, 0x7100_0000, 64)
	progressUntil(t, "the flood was not delivered", func() bool {
		n, _ := prepare.EarlyHeld(l.r)
		return n >= prepare.MaxEarlyPerPeer
	}, l.s, l.r)

	// A second peer: another worker of the sender's context.
	w2, err := l.ctxS.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	ar, err := l.r.Address()
	require.NoError(t, err)
	toR2, err := w2.ConnectAddress(ar, &ucp.EndpointParams{NoPeerErrorHandling: true})
	require.NoError(t, err)
	sendForged(t, toR2, l.r, 1, 0x7200_0000, 64)
	progressUntil(t, "the second peer's handshake was dropped: the first peer took all the room", func() bool {
		return len(prepare.EarlyHeldPerPeer(l.r)) == 2
	}, w2, l.r)

	per := prepare.EarlyHeldPerPeer(l.r)
	require.Equal(t, prepare.MaxEarlyPerPeer, slices.Max(per), "the flooding peer's share")
	require.Equal(t, 1, slices.Min(per), "the other peer's handshake")
	n, bytes := prepare.EarlyHeld(l.r)
	require.LessOrEqual(t, n, prepare.MaxEarly)
	require.LessOrEqual(t, bytes, prepare.MaxEarlyBytes)
}

// A handshake kept for a request not made yet is forgotten once it is old, unless its
// sender goes on resending it; a sender that stopped (its PrepareAll's context ended)
// still matches once the receiver's request exists and it runs its prepare phase again.
func TestEarlyHandshakesExpire(t *testing.T) {
	l := shmLink(t)
	pair(t, l, 64, 2, 2, 0x59) // handshake handlers on both workers
	thaw := prepare.FreezeEarlyClock(l.r)
	const forged = 16
	sendForged(t, l.toR, l.r, forged, 0x7300_0000, 64)

	sbuf, rbuf := make([]byte, 256), make([]byte, 256)
	send, err := prepare.PsendInit(l.s, sbuf, prepare.Params{Peer: l.toR, Tag: 0x5a, Partitions: 2})
	require.NoError(t, err)
	defer send.Free()
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, prepare.PrepareAll(gone, send), context.Canceled) // sent once, then stopped
	progressUntil(t, "the handshakes were not delivered", func() bool {
		n, _ := prepare.EarlyHeld(l.r)
		return n == forged+1
	}, l.s, l.r)

	thaw()
	progressUntil(t, "handshakes for requests never made were kept for good", func() bool {
		n, bytes := prepare.EarlyHeld(l.r)
		return n == 0 && bytes == 0
	}, l.r)

	recv, err := prepare.PrecvInit(l.r, rbuf, prepare.Params{Peer: l.toS, Tag: 0x5a, Partitions: 2})
	require.NoError(t, err)
	defer recv.Free()
	serr, rerr := prepareBoth(t, send, recv)
	require.NoError(t, serr)
	require.NoError(t, rerr)
	iterate(t, send, recv, sbuf, rbuf, 2, inOrder(2))
}

// A sender whose receiver was freed before they matched is refused: its PrepareAll
// fails with ErrCanceled instead of resending until its context ends (Start: for
// good), and the receiver's worker keeps nothing for it.
func TestHandshakeForFreedReceiverFailsSender(t *testing.T) {
	l := shmLink(t)
	pair(t, l, 64, 2, 2, 0x5b) // handshake handlers on both workers
	recv, err := prepare.PrecvInit(l.r, make([]byte, 64), prepare.Params{Peer: l.toS, Tag: 0x5c, Partitions: 2})
	require.NoError(t, err)
	require.NoError(t, recv.Free())
	send, err := prepare.PsendInit(l.s, make([]byte, 64), prepare.Params{Peer: l.toR, Tag: 0x5c, Partitions: 2})
	require.NoError(t, err)
	progressing(t, l.r)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = prepare.PrepareAll(ctx, send)
	require.ErrorIs(t, err, ucp.ErrCanceled)
	require.False(t, errors.Is(err, context.DeadlineExceeded))
	require.ErrorIs(t, send.Start(), ucp.ErrCanceled, "a later Start says why")
	n, _ := prepare.EarlyHeld(l.r)
	require.Zero(t, n, "a handshake for a freed request was kept")
	require.NoError(t, send.Free())
}

// A receiver that took its sender's handshake and whose answer reaches the sender
// only after it was freed fails with ErrCanceled instead of waiting for iterations
// nobody moves, and can be freed.
func TestAnswerForFreedSenderFailsReceiver(t *testing.T) {
	l := shmLink(t)
	pair(t, l, 64, 2, 2, 0x5d) // handshake handlers on both workers
	defer prepare.FreezeEarlyClock(l.r)()
	send, err := prepare.PsendInit(l.s, make([]byte, 64), prepare.Params{Peer: l.toR, Tag: 0x5e, Partitions: 2})
	require.NoError(t, err)
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, prepare.PrepareAll(gone, send), context.Canceled) // its handshake went out
	progressUntil(t, "the sender's handshake was not delivered", func() bool {
		n, _ := prepare.EarlyHeld(l.r)
		return n == 1
	}, l.s, l.r)
	recv, err := prepare.PrecvInit(l.r, make([]byte, 64), prepare.Params{Peer: l.toS, Tag: 0x5e, Partitions: 2})
	require.NoError(t, err) // it took the sender's handshake
	require.NoError(t, send.Free())

	ctx, cancelPrepare := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancelPrepare()
	require.NoError(t, prepare.PrepareAll(ctx, recv)) // prepared once its answer went out
	progressUntil(t, "the receiver of a freed sender was not told", func() bool {
		return prepare.Failed(recv) != nil
	}, l.s, l.r)
	require.ErrorIs(t, prepare.Failed(recv), ucp.ErrCanceled)
	require.ErrorIs(t, recv.Start(), ucp.ErrCanceled)
	require.NoError(t, recv.Free())
}

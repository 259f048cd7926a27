package ucp

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A TagSendRecv whose reply arrived while its send was still in flight as ctx ended
// returns the reply (length, sender tag, rbuf) with an error matching ErrSendIncomplete
// and ctx's error. It returned 0, 0 and ctx's error, and the reply, taken from UCX, was
// lost for good. The send goes on: the peer receives it whole afterwards.
func TestTagSendRecvReturnsReplyWhileSendPending(t *testing.T) {
	pairs(t, func(t *testing.T, p *pair) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stopB := background(p.b)
		require.NoError(t, p.epB.TagSend(ctx, []byte("REPLY-11"), 11))
		time.Sleep(20 * time.Millisecond) // the reply waits at a, unexpected
		// A rendezvous nobody at b receives yet: pending until ctx ends.
		sbuf := pattern(4<<20, 5)
		rbuf := make([]byte, 8)
		short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
		n, tag, err := p.epA.TagSendRecv(short, sbuf, 9, rbuf, 11, ^uint64(0))
		cancelShort()
		stopB()
		require.ErrorIs(t, err, ErrSendIncomplete)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.NotErrorIs(t, err, ErrMessageTruncated)
		require.Equal(t, 8, n)
		require.Equal(t, uint64(11), tag)
		require.Equal(t, "REPLY-11", string(rbuf))

		// The send was in flight: b gets it whole once it receives.
		stopA := background(p.a)
		got := make([]byte, len(sbuf))
		gn, _, err := p.b.TagRecv(ctx, got, 9, ^uint64(0))
		stopA()
		require.NoError(t, err)
		require.Equal(t, len(sbuf), gn)
		require.Equal(t, checksum(sbuf), checksum(got))

		// The reply was the call's: no later receive gets it again.
		later, cancelLater := context.WithTimeout(ctx, 100*time.Millisecond)
		_, _, err = p.a.TagRecv(later, make([]byte, 8), 11, ^uint64(0))
		cancelLater()
		require.ErrorIs(t, err, context.DeadlineExceeded)
	})
}

// A reply longer than rbuf while the send is pending: its length and tag are returned
// with both ErrMessageTruncated and ErrSendIncomplete.
func TestTagSendRecvTruncatedReplyWhileSendPending(t *testing.T) {
	p := newShmPair(t)
	defer p.close(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stopB := background(p.b)
	require.NoError(t, p.epB.TagSend(ctx, []byte("A-LONGER-REPLY"), 12))
	time.Sleep(20 * time.Millisecond)
	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	n, tag, err := p.epA.TagSendRecv(short, pattern(4<<20, 6), 9, make([]byte, 4), 12, ^uint64(0))
	cancelShort()
	stopB()
	require.ErrorIs(t, err, ErrSendIncomplete)
	require.ErrorIs(t, err, ErrMessageTruncated)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, len("A-LONGER-REPLY"), n)
	require.Equal(t, uint64(12), tag)
	// Let the pending send finish before the pair closes.
	stopA := background(p.a)
	_, _, err = p.b.TagRecv(ctx, make([]byte, 4<<20), 9, ^uint64(0))
	stopA()
	require.NoError(t, err)
}

// A TagSendRecv whose send fails (here: to a peer that closed) reports a reply only
// when one arrived: the result an earlier receive on the worker left behind is not
// taken for one. (A send that ucp_tag_send_nbx fails at once posts no receive; the glue
// reports that receive canceled, not completed, for this reason.)
func TestTagSendRecvFailedSendReportsNoStaleReply(t *testing.T) {
	p := newPair(t, map[string]string{"TLS": "tcp"})
	self, err := p.a.ConnectAddress(mustAddress(t, p.a), &EndpointParams{NoPeerErrorHandling: true})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, p.ctxB.Close())
	p.ctxB = nil
	for i := 0; i < 50; i++ {
		// An earlier receive completed in its call: its result stays with the worker.
		require.NoError(t, self.TagSend(ctx, []byte("STALE"), 5))
		n, _, err := p.a.TagRecv(ctx, make([]byte, 8), 5, ^uint64(0))
		require.NoError(t, err)
		require.Equal(t, 5, n)
		rbuf := make([]byte, 8)
		short, cancelShort := context.WithTimeout(ctx, time.Second)
		n, tag, err := p.epA.TagSendRecv(short, make([]byte, 64), 1, rbuf, 77, ^uint64(0))
		cancelShort()
		require.Error(t, err)
		require.NotErrorIs(t, err, ErrSendIncomplete, "no reply came: n %d tag %#x", n, tag)
		require.Zero(t, n)
		require.Zero(t, tag)
		require.Equal(t, make([]byte, 8), rbuf)
	}
	require.NoError(t, self.Close())
}

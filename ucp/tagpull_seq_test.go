package ucp

import (
	"cmp"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// truncAnswerFrom is a truncation answer as b's worker seals it: tag, number, the
// source ids of the sender it goes to and of b.
func truncAnswerFrom(b *Worker, to, tag, seq uint64) []byte {
	c := b.ctx
	return c.trust.seal.seal(controlMagic, c.trust.id, encodeControlMsg(control{typ: ctlPullTrunc, value: tag, count: truncSources(to, b.source), seq: seq}))
}

// A truncation answer completes the send it names only where that is the oldest send
// of its tag to the answering worker still waiting, and only at the worker it names:
// one numbered ahead, one for another worker, one from an unknown worker and the same
// one again complete nothing and are counted.
func TestTagPullTruncNamesOldestWaiting(t *testing.T) {
	const n = 64 << 10
	p, ctx, src, _, data := pullSource(t, n, 24)
	marks := amInbox(t, p.a, 24)
	sbuf := DeviceBuffer(src.Ptr(), n)
	s1, err := p.epA.TagSendNbx(sbuf, 9, devParam)
	require.NoError(t, err)
	s2, err := p.epA.TagSendNbx(sbuf, 9, devParam)
	require.NoError(t, err)
	answer := func(h []byte) {
		sendRaw(t, ctx, p.epB, h)
		markEndpoints(t, ctx, marks, 24, p.epB)
	}
	stale := staleControls.Load()
	answer(truncAnswerFrom(p.b, p.a.source, 9, 2))   // ahead of the first send
	answer(truncAnswerFrom(p.b, p.a.source^1, 9, 1)) // for another worker
	answer(truncAnswerFrom(p.b, p.a.source, 10, 1))  // of another tag
	unknown := control{typ: ctlPullTrunc, value: 9, count: truncSources(p.a.source, p.b.source^1), seq: 1}
	answer(p.ctxB.trust.seal.seal(controlMagic, p.ctxB.trust.id, encodeControlMsg(unknown))) // from a worker A sent nothing to
	require.False(t, s1.Done())
	require.False(t, s2.Done())
	require.Equal(t, stale+4, staleControls.Load())

	answer(truncAnswerFrom(p.b, p.a.source, 9, 1))
	require.NoError(t, s1.Wait(ctx), "the answer naming the first send completes it")
	answer(truncAnswerFrom(p.b, p.a.source, 9, 1))
	require.False(t, s2.Done(), "the same answer again completes nothing")
	require.Equal(t, stale+5, staleControls.Load())

	// Both messages are still there to receive; the second send completes once its
	// own was pulled.
	for i := range 2 {
		host := make([]byte, n)
		r, err := p.b.TagRecvNbx(host, 9, MaxTag, nil)
		require.NoError(t, err)
		require.NoError(t, r.Wait(ctx))
		require.Equal(t, checksum(data), checksum(host), "message %d", i+1)
	}
	require.NoError(t, s2.Wait(ctx))
}

// The numbers kept for truncation answers are bounded on both sides (tags need not
// repeat); a sender never forgets the numbers of a tag with a send waiting, whose
// truncated receive still completes it.
func TestTagPullSeqsBounded(t *testing.T) {
	old := maxPullSeqs
	maxPullSeqs = 4
	t.Cleanup(func() { maxPullSeqs = old })
	const n = 64 << 10
	p, ctx, src, _, data := pullSource(t, n, 26)
	sbuf := DeviceBuffer(src.Ptr(), n)
	truncated := func(tag uint64) {
		t.Helper()
		r, err := p.b.TagRecvNbx(make([]byte, 16), tag, MaxTag, nil)
		if err == nil {
			err = r.Wait(ctx)
		}
		require.ErrorIs(t, err, ErrMessageTruncated)
	}
	waiting, err := p.epA.TagSendNbx(sbuf, 100, devParam)
	require.NoError(t, err)
	for i := range 12 {
		tag := uint64(200 + i)
		s, err := p.epA.TagSendNbx(sbuf, tag, devParam)
		require.NoError(t, err)
		if i%2 == 0 {
			truncated(tag)
		} else {
			host := make([]byte, n)
			r, err := p.b.TagRecvNbx(host, tag, MaxTag, nil)
			require.NoError(t, err)
			require.NoError(t, r.Wait(ctx))
			require.Equal(t, checksum(data), checksum(host))
		}
		require.NoError(t, s.Wait(ctx), "tag %d", tag)
	}
	p.a.mu.Lock()
	sent := len(p.a.pullsSent.m)
	_, kept := p.a.pullsSent.m[pullSeqKey{peer: p.epA.peer.id, src: p.epA.source, tag: 100}]
	p.a.mu.Unlock()
	p.b.mu.Lock()
	seen := len(p.b.pullsSeen.m)
	p.b.mu.Unlock()
	require.LessOrEqual(t, sent, 4)
	require.LessOrEqual(t, seen, 4)
	require.True(t, kept, "the numbers of a tag with a send waiting are kept")
	require.False(t, waiting.Done())
	truncated(100)
	require.NoError(t, waiting.Wait(ctx))

	// A tag used again after both sides forgot it: counted afresh from its descriptor,
	// a truncated receive of its next message still completes that send.
	for _, short := range []bool{false, true} {
		s, err := p.epA.TagSendNbx(sbuf, 200, devParam)
		require.NoError(t, err)
		if short {
			truncated(200)
		} else {
			host := make([]byte, n)
			r, err := p.b.TagRecvNbx(host, 200, MaxTag, nil)
			require.NoError(t, err)
			require.NoError(t, r.Wait(ctx))
			require.Equal(t, checksum(data), checksum(host))
		}
		require.NoError(t, s.Wait(ctx))
	}
}

// A receiver accounts for the numbers of a sender's messages of a tag as their
// descriptors come, in any order: a truncated message takes the first number not
// accounted for (its receive may be seen before one that matched ahead of it), a
// number at or below those accounted for starts the count again (the sender forgot the
// tag, or the descriptor came again), and the ranges kept are bounded.
func TestPullSeqAccounting(t *testing.T) {
	var e pullSeq
	e.saw(1)
	e.saw(3)
	require.Equal(t, uint64(1), e.n)
	require.Equal(t, uint64(2), e.unseen())
	require.Equal(t, uint64(3), e.n, "3 was seen: settled")
	e.saw(6)
	e.saw(5)
	e.saw(9)
	e.saw(5) // again, ahead of the count: nothing changes
	require.Equal(t, []seqRange{{5, 6}, {9, 9}}, e.seen)
	require.Equal(t, uint64(4), e.unseen())
	require.Equal(t, uint64(7), e.unseen())
	e.saw(8)
	require.Equal(t, uint64(9), e.n)
	require.Empty(t, e.seen)
	require.Equal(t, uint64(10), e.unseen())

	e.saw(2) // numbered afresh
	require.Equal(t, uint64(2), e.n)
	require.Equal(t, uint64(3), e.unseen())

	for s := uint64(5); s < 5+2*(maxSeqRanges+10); s += 2 {
		e.saw(s)
	}
	require.LessOrEqual(t, len(e.seen), maxSeqRanges)
	require.True(t, slices.IsSortedFunc(e.seen, func(a, b seqRange) int { return cmp.Compare(a.lo, b.lo) }))
	for i := 1; i < len(e.seen); i++ {
		require.Greater(t, e.seen[i].lo, e.seen[i-1].hi+1, "ranges apart")
	}
	require.Greater(t, e.seen[0].lo, e.n+1)

	// A key made after keys were forgotten may be one of them: it counts from the first
	// descriptor it reads, not from 0.
	f := pullSeq{forgot: true}
	f.saw(7)
	require.Equal(t, uint64(7), f.n)
	require.Empty(t, f.seen)
	f.saw(9)
	require.Equal(t, uint64(8), f.unseen())
	require.Equal(t, uint64(9), f.n)
}

// The workers of one context number their pulled sends apart: a receiver's "pulled"
// answer names the number, and one carried to another worker of the context (replayed,
// or sent on a second endpoint) must not complete that worker's send of the same
// number. Before, every worker counted from 1.
func TestPulledSendNumbersDifferAcrossWorkers(t *testing.T) {
	p := newShmPair(t)
	defer p.close(t)
	w2, err := p.ctxA.NewWorker(WorkerParams{})
	require.NoError(t, err)
	defer w2.Close()
	a, b := p.a.pullSeq.Load(), w2.pullSeq.Load()
	require.NotZero(t, a)
	require.NotZero(t, b)
	require.NotEqual(t, a, b, "two workers of one context start their pulled-send numbers at the same base")
	require.Less(t, a, uint64(1)<<62)
}

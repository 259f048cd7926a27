package ucp

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/testenv/fakeipc"
)

// markEndpoints sends a one-byte active message of id on each of eps and waits until
// the worker that handles inbox got them all: active messages of one endpoint arrive
// in order, so whatever control messages went on those endpoints before were handled
// by then.
func markEndpoints(t *testing.T, ctx context.Context, inbox <-chan *AmMessage, id uint, eps ...*Endpoint) {
	t.Helper()
	for _, ep := range eps {
		r, err := ep.AmSendNbx(id, nil, []byte{1}, nil)
		require.NoError(t, err)
		require.NoError(t, r.Wait(ctx))
	}
	for range eps {
		nextMessage(t, inbox).Release()
	}
}

// A receiver with two endpoints to a sender's worker answers a truncation on both
// (answerTruncLocked): the sender gets the same answer twice. The second copy must
// not complete the next pulled send of the tag, whose message nobody received yet:
// that send stays pending until its own receive pulled it, and the data arrive intact.
// Before, each copy completed the oldest pending send of the tag, so the second
// completed the newer send early and its buffer could be reused while the receiver
// still had to copy from it.
func TestTagPullTruncDuplicateCompletesNothingElse(t *testing.T) {
	const n = 64 << 10
	p, ctx, src, _, data := pullSource(t, n, 21)
	addrA, err := p.a.Address()
	require.NoError(t, err)
	ep2, err := p.b.ConnectAddress(addrA, nil) // B's second endpoint to A's worker
	require.NoError(t, err)
	marks := amInbox(t, p.a, 21)
	sbuf := DeviceBuffer(src.Ptr(), n)

	stale := staleControls.Load()
	s1, err := p.epA.TagSendNbx(sbuf, 9, devParam)
	require.NoError(t, err)
	s2, err := p.epA.TagSendNbx(sbuf, 9, devParam)
	require.NoError(t, err)
	r1, err := p.b.TagRecvNbx(make([]byte, 16), 9, MaxTag, nil) // too short for the descriptor
	if err == nil {
		err = r1.Wait(ctx)
	}
	require.ErrorIs(t, err, ErrMessageTruncated)
	require.NoError(t, s1.Wait(ctx), "the truncated send completes")
	markEndpoints(t, ctx, marks, 21, p.epB, ep2) // both copies of the answer were handled
	require.False(t, s2.Done(), "a copy of the first send's answer completed the second send, whose message nobody received")
	require.Greater(t, staleControls.Load(), stale, "the copy was refused and counted")

	host := make([]byte, n)
	r2, err := p.b.TagRecvNbx(host, 9, MaxTag, nil)
	require.NoError(t, err)
	require.NoError(t, r2.Wait(ctx))
	require.NoError(t, s2.Wait(ctx), "the second send completes once its receive pulled it")
	require.Equal(t, n, r2.Length())
	require.Equal(t, checksum(data), checksum(host))
}

// truncSpy gives b an endpoint to a worker of a context of its own whose source id it
// takes for src's: b's truncation answers to src go there too (answerTruncLocked
// answers on every endpoint with that source id), and the spy, which cannot open them
// (its seal is another), hands them to its RevokeAM handler, whose log keeps the
// bytes as they came. The spy progresses in the background; cleanup closes it.
func truncSpy(t *testing.T, b *Worker, src uint64) *controlLog {
	t.Helper()
	cs, err := NewContext(ContextParams{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	ws, err := cs.NewWorker(WorkerParams{})
	require.NoError(t, err)
	addr, err := ws.Address()
	require.NoError(t, err)
	ep, err := b.ConnectAddress(addr, nil)
	require.NoError(t, err)
	b.mu.Lock()
	ep.source = src
	b.mu.Unlock()
	cs.trust.seal = newSealer([]byte("the spy's own key"), "spy")
	log := logControl(ws)
	t.Cleanup(background(ws))
	return log
}

// truncAnswers are the truncation answers l logged, opened with c's seal.
func truncAnswers(l *controlLog, c *Context) [][]byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out [][]byte
	for _, h := range l.headers {
		if _, typ, _, err := decodeControl(c.trust.seal, h); err == nil && typ == ctlPullTrunc {
			out = append(out, h)
		}
	}
	return out
}

// sendRaw posts h on RevokeAM on ep as it is, as a forwarder that repeats what it saw
// would.
func sendRaw(t *testing.T, ctx context.Context, ep *Endpoint, h []byte) {
	t.Helper()
	w := ep.w
	h = bytes.Clone(h)
	w.mu.Lock()
	ptr := w.raw.AmSend(ep.raw, RevokeAM, bufPtr(h), len(h), nil, 0, 0, 0, -1, nil)
	r, err := w.postLocked("am_send_nbx", ptr, &defaultParam, nil, bufPtr(h))
	w.mu.Unlock()
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
}

// The truncation answer of an earlier send, sent again later (a forwarder or a buggy
// peer repeating the same bytes) while the receiver pulls a newer send of the same
// tag, completes nothing: the newer send completes only once its pull is done, with
// the data intact. Before, the repeated answer completed the oldest pending send of
// the tag, the one being pulled, and its sender could reuse the buffer under the copy.
func TestTagPullTruncReplayWhilePulling(t *testing.T) {
	const n = 64 << 10
	dev := fakeipc.New(hostBackend(t), fakeUUID)
	p, l, err := listenPair(t, ContextParams{Device: dev}, ContextParams{Device: dev})
	require.NoError(t, err)
	require.NoError(t, l.Close())
	t.Cleanup(background(p.a))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	src := fakeipc.Malloc(n)
	defer src.Free()
	data := pattern(n, 22)
	copy(src.Bytes(), data)
	sbuf := DeviceBuffer(src.Ptr(), n)
	spy := truncSpy(t, p.b, p.a.source)
	marks := amInbox(t, p.a, 22)

	// The first send's receive is too short for its descriptor: answered by tag.
	stopB := background(p.b)
	s1, err := p.epA.TagSendNbx(sbuf, 9, devParam)
	require.NoError(t, err)
	r1, err := p.b.TagRecvNbx(make([]byte, 16), 9, MaxTag, nil)
	if err == nil {
		err = r1.Wait(ctx)
	}
	require.ErrorIs(t, err, ErrMessageTruncated)
	require.NoError(t, s1.Wait(ctx))
	require.Eventually(t, func() bool { return len(truncAnswers(spy, p.ctxA)) == 1 }, 10*time.Second, time.Millisecond)
	answer := truncAnswers(spy, p.ctxA)[0]
	stopB()

	// The second send's receive matches its descriptor; B's pull of it is under way
	// (deferred: B has not run it yet).
	host := make([]byte, n)
	r2, err := p.b.TagRecvNbx(host, 9, MaxTag, nil)
	require.NoError(t, err)
	s2, err := p.epA.TagSendNbx(sbuf, 9, devParam)
	require.NoError(t, err)
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.b.mu.Lock()
		matched := len(p.b.pullsIn) > 0
		if !matched {
			p.b.progressLocked(nil, 1) // completions only: the deferred pull does not start
		}
		p.b.mu.Unlock()
		if matched {
			break
		}
		require.False(t, time.Now().After(deadline), "the second descriptor never matched")
	}
	require.False(t, r2.Done())

	// The first answer again, then a mark behind it on the same endpoint.
	stale := staleControls.Load()
	sendRaw(t, ctx, p.epB, answer)
	markEndpoints(t, ctx, marks, 22, p.epB)
	require.False(t, s2.Done(), "a repeated truncation answer completed a send whose data the receiver was still pulling")
	require.Greater(t, staleControls.Load(), stale, "the repeated answer was refused and counted")

	t.Cleanup(background(p.b))
	require.NoError(t, r2.Wait(ctx))
	require.NoError(t, s2.Wait(ctx), "the second send completes once its pull is done")
	require.Equal(t, n, r2.Length())
	require.Equal(t, checksum(data), checksum(host))
}

// The truncation answer to one worker of a context, forwarded to another worker of
// the same context that has a send of the same tag and number waiting, completes
// nothing there: the answer names the worker it is for (by source id), where op ids
// and numbers are per worker.
func TestTagPullTruncForwardedToOtherWorker(t *testing.T) {
	const n = 64 << 10
	p, ctx, src, _, data := pullSource(t, n, 25)
	a2, err := p.ctxA.NewWorker(WorkerParams{})
	require.NoError(t, err)
	t.Cleanup(background(a2))
	if a2.source == p.a.source {
		t.Skip("the two workers' 15-bit source ids collide")
	}
	addrB, err := p.b.Address()
	require.NoError(t, err)
	ep2, err := a2.ConnectAddress(addrB, nil)
	require.NoError(t, err)
	spy := truncSpy(t, p.b, p.a.source)
	sbuf := DeviceBuffer(src.Ptr(), n)

	s1, err := p.epA.TagSendNbx(sbuf, 9, devParam)
	require.NoError(t, err)
	r1, err := p.b.TagRecvNbx(make([]byte, 16), 9, MaxTag, nil)
	if err == nil {
		err = r1.Wait(ctx)
	}
	require.ErrorIs(t, err, ErrMessageTruncated)
	require.NoError(t, s1.Wait(ctx))
	require.Eventually(t, func() bool { return len(truncAnswers(spy, p.ctxA)) == 1 }, 10*time.Second, time.Millisecond)

	s2, err := ep2.TagSendNbx(sbuf, 9, devParam) // a2's first send of the tag to B: number 1 too
	require.NoError(t, err)
	addrA2, err := a2.Address()
	require.NoError(t, err)
	fwd, err := p.b.ConnectAddress(addrA2, nil)
	require.NoError(t, err)
	marks := amInbox(t, a2, 25)
	stale := staleControls.Load()
	sendRaw(t, ctx, fwd, truncAnswers(spy, p.ctxA)[0])
	markEndpoints(t, ctx, marks, 25, fwd)
	require.False(t, s2.Done(), "another worker's truncation answer completed a2's send")
	require.Greater(t, staleControls.Load(), stale)

	host := make([]byte, n)
	r2, err := p.b.TagRecvNbx(host, 9, MaxTag, nil)
	require.NoError(t, err)
	require.NoError(t, r2.Wait(ctx))
	require.NoError(t, s2.Wait(ctx))
	require.Equal(t, checksum(data), checksum(host))
}

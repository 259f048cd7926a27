package ucp

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/ucx"
)

// A worker shared with C callers (the C ABI, cgo/ucx/fast.h): its blocking tag calls
// run in C while they complete inside the call, and hand what they cannot finish to
// Go with the worker still held. These tests make those calls from Go, as the C ABI
// makes them from C (capi/libucpx/fast.c), and check them against the Go API on the
// same worker.

// sharedPair is a shared-memory pair whose worker a is shared with C, with the records
// of a and of epA.
func sharedPair(t *testing.T) (p *pair, wrec, eprec *ucx.Fast) {
	t.Helper()
	p = newShmPair(t)
	wp, err := p.a.shareWithC()
	require.NoError(t, err)
	ep, err := p.epA.shareWithC()
	require.NoError(t, err)
	return p, ucx.FastAt(wp), ucx.FastAt(ep)
}

// fastCodes counts what the fast calls returned, by code.
type fastCodes struct {
	mu sync.Mutex
	n  [3]int
}

func (c *fastCodes) add(code int) {
	c.mu.Lock()
	c.n[code]++
	c.mu.Unlock()
}

// cSendRecv is the C ABI's ucpx_tag_sendrecv: the fast call, its resume, or the Go
// API where the record cannot be used.
func cSendRecv(ctx context.Context, rec *ucx.Fast, ep *Endpoint, sbuf []byte, stag uint64, rbuf []byte, rtag uint64, codes *fastCodes) (int, uint64, error) {
	code, n, tag, ret := rec.TagSendRecv(bufPtr(sbuf), len(sbuf), stag, bufPtr(rbuf), len(rbuf), rtag, ^uint64(0))
	codes.add(code)
	switch code {
	case ucx.FastDone:
		return n, tag, nil
	case ucx.FastGo:
		return resumeTagSendRecv(ctx, rec.Ptr(), ret, sbuf, stag, rbuf, rtag, ^uint64(0))
	}
	return ep.TagSendRecv(ctx, sbuf, stag, rbuf, rtag, ^uint64(0))
}

// cRecv is ucpx_tag_recv_wait.
func cRecv(ctx context.Context, rec *ucx.Fast, w *Worker, buf []byte, tag uint64, codes *fastCodes) (int, uint64, error) {
	code, n, stag, ret := rec.TagRecv(bufPtr(buf), len(buf), tag, ^uint64(0))
	codes.add(code)
	switch code {
	case ucx.FastDone:
		return n, stag, nil
	case ucx.FastGo:
		return resumeTagRecv(ctx, rec.Ptr(), ret, buf, tag, ^uint64(0))
	}
	return w.TagRecv(ctx, buf, tag, ^uint64(0))
}

// cSend is ucpx_tag_send_wait.
func cSend(ctx context.Context, rec *ucx.Fast, ep *Endpoint, buf []byte, tag uint64, codes *fastCodes) error {
	code, ret := rec.TagSend(bufPtr(buf), len(buf), tag)
	codes.add(code)
	switch code {
	case ucx.FastDone:
		return nil
	case ucx.FastGo:
		return resumeTagSend(ctx, rec.Ptr(), ret, buf, tag)
	}
	return ep.TagSend(ctx, buf, tag)
}

// The fast calls carry a ping-pong against a peer on the Go API: every reply is the
// ping's bytes, small messages complete in C, rendezvous sizes finish in Go.
func TestSharedWorkerPingPong(t *testing.T) {
	p, wrec, eprec := sharedPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, tc := range []struct{ size, rounds int }{{8, 2000}, {4096, 200}, {1 << 20, 20}} {
		t.Run(sizeName(tc.size), func(t *testing.T) {
			ready := make(chan struct{})
			done := pong(t, p, tc.size, tc.rounds, ready)
			<-ready
			var codes fastCodes
			rbuf := make([]byte, tc.size)
			for i := 0; i < tc.rounds; i++ {
				ping := pattern(tc.size, int64(i))
				n, tag, err := cSendRecv(ctx, eprec, p.epA, ping, 1, rbuf, 2, &codes)
				require.NoError(t, err, "round %d", i)
				require.Equal(t, tc.size, n)
				require.Equal(t, uint64(2), tag)
				require.True(t, bytes.Equal(ping, rbuf[:n]), "round %d: reply differs", i)
			}
			require.NoError(t, <-done)
			require.Zero(t, codes.n[ucx.FastNone], "nothing else held the worker")
			if tc.size == 1<<20 {
				require.Positive(t, codes.n[ucx.FastGo], "rendezvous sizes finish in Go")
			}
		})
	}

	// A reply already there when the call is made: the round trip completes inside it,
	// in C (how often it does in the live ping-pong above depends on the machine).
	t.Run("in C", func(t *testing.T) {
		var codes fastCodes
		rbuf, got := make([]byte, 8), make([]byte, 8)
		for i := 0; i < 100; i++ {
			reply := pattern(8, int64(1000+i))
			require.NoError(t, p.epB.TagSend(ctx, reply, 2))
			ping := pattern(8, int64(i))
			code, n, tag, ret := eprec.TagSendRecv(bufPtr(ping), 8, 1, bufPtr(rbuf), 8, 2, ^uint64(0))
			codes.add(code)
			if code == ucx.FastGo {
				n, tag, err := resumeTagSendRecv(ctx, eprec.Ptr(), ret, ping, 1, rbuf, 2, ^uint64(0))
				require.NoError(t, err)
				require.Equal(t, 8, n)
				require.Equal(t, uint64(2), tag)
			} else {
				require.Equal(t, ucx.FastDone, code)
				require.Equal(t, 8, n)
				require.Equal(t, uint64(2), tag)
			}
			require.Equal(t, reply, rbuf)
			_, _, err := p.b.TagRecv(ctx, got, 1, ^uint64(0))
			require.NoError(t, err)
			require.Equal(t, ping, got)
		}
		require.Greater(t, codes.n[ucx.FastDone], 50, "round trips whose reply was there completed in C: %v", codes.n)
	})

	// The worker's record: receives, and sends on the endpoint's, the other way round.
	var codes fastCodes
	go func() {
		for i := 0; i < 100; i++ {
			if err := p.epB.TagSend(ctx, pattern(64, int64(i)), 5); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64)
	for i := 0; i < 100; i++ {
		n, tag, err := cRecv(ctx, wrec, p.a, buf, 5, &codes)
		require.NoError(t, err)
		require.Equal(t, 64, n)
		require.Equal(t, uint64(5), tag)
		require.Equal(t, pattern(64, int64(i)), buf)
		require.NoError(t, cSend(ctx, eprec, p.epA, buf, 6, &codes))
		n, _, err = p.b.TagRecv(ctx, buf, 6, ^uint64(0))
		require.NoError(t, err)
		require.Equal(t, pattern(64, int64(i)), buf[:n])
	}
	require.Zero(t, codes.n[ucx.FastNone])
}

// C callers and goroutines share the worker: fast ping-pongs, nbx operations waited
// for in Go and a goroutine that only progresses, all at once on worker a. Every
// message arrives intact (UCX's worker is serialised across both languages: a Go
// caller that ignored the owner word would call UCX while a C caller is inside).
func TestSharedWorkerMixedCallers(t *testing.T) {
	p, _, eprec := sharedPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const rounds = 3000
	ready := make(chan struct{})
	pongs := pong(t, p, 8, rounds, ready)
	<-ready
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	stop := make(chan struct{})
	var codes fastCodes
	wg.Add(1)
	go func() { // C: the ping-pong
		defer wg.Done()
		rbuf := make([]byte, 8)
		for i := 0; i < rounds; i++ {
			ping := pattern(8, int64(i))
			n, _, err := cSendRecv(ctx, eprec, p.epA, ping, 1, rbuf, 2, &codes)
			if err == nil && !bytes.Equal(ping, rbuf[:n]) {
				err = fmt.Errorf("round %d: reply differs", i)
			}
			if err != nil {
				errc <- err
				return
			}
		}
	}()
	wg.Add(1)
	go func() { // Go: nbx sends on tag 10, answered on 11 by b
		defer wg.Done()
		buf := make([]byte, 256)
		for i := 0; i < rounds/10; i++ {
			msg := pattern(256, int64(1000+i))
			sr, err := p.epA.TagSendNbx(msg, 10, nil)
			if err != nil {
				errc <- err
				return
			}
			rr, err := p.a.TagRecvNbx(buf, 11, ^uint64(0), nil)
			if err != nil {
				errc <- err
				return
			}
			if err := sr.Wait(ctx); err != nil {
				errc <- err
				return
			}
			if err := rr.Wait(ctx); err != nil {
				errc <- err
				return
			}
			if !bytes.Equal(buf, msg) {
				errc <- fmt.Errorf("nbx round %d: reply differs", i)
				return
			}
		}
	}()
	wg.Add(1)
	go func() { // b's echo of tag 10
		defer wg.Done()
		if err := echoTag(ctx, p.b, p.epB, 256, 10, 11, rounds/10); err != nil {
			errc <- err
		}
	}()
	progressed := make(chan struct{})
	go func() { // Go: progress only
		defer close(progressed)
		untilClosed(stop, func() { p.a.Progress() })
	}()
	wg.Wait()
	close(stop)
	<-progressed
	close(errc)
	for err := range errc {
		require.NoError(t, err)
	}
	require.NoError(t, <-pongs)
	t.Logf("fast calls: %d done in C, %d resumed in Go, %d on the Go path", codes.n[0], codes.n[1], codes.n[2])
}

// What a fast call cannot finish goes to Go with the worker held: a late reply, a
// receive that times out (and is canceled: the next message goes to the next
// receive), a truncated message, a tag outside the user's bits (the Go path's error).
func TestSharedWorkerResume(t *testing.T) {
	p, wrec, eprec := sharedPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var codes fastCodes

	go func() {
		buf := make([]byte, 8)
		if _, _, err := p.b.TagRecv(ctx, buf, 1, ^uint64(0)); err == nil {
			time.Sleep(20 * time.Millisecond)
			_ = p.epB.TagSend(ctx, []byte("late....")[:8], 2)
		}
	}()
	rbuf := make([]byte, 8)
	code, _, _, ret := eprec.TagSendRecv(bufPtr([]byte("ping")), 4, 1, bufPtr(rbuf), 8, 2, ^uint64(0))
	require.Equal(t, ucx.FastGo, code, "the reply comes 20 ms later")
	n, tag, err := resumeTagSendRecv(ctx, eprec.Ptr(), ret, []byte("ping"), 1, rbuf, 2, ^uint64(0))
	require.NoError(t, err)
	require.Equal(t, 8, n)
	require.Equal(t, uint64(2), tag)
	require.Equal(t, "late....", string(rbuf))

	short, cancelShort := context.WithTimeout(ctx, 20*time.Millisecond)
	_, _, err = cRecv(short, wrec, p.a, rbuf, 7, &codes)
	cancelShort()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, p.epB.TagSend(ctx, []byte("12345678"), 7))
	n, tag, err = cRecv(ctx, wrec, p.a, rbuf, 7, &codes)
	require.NoError(t, err, "the canceled receive must not have taken the message")
	require.Equal(t, 8, n)
	require.Equal(t, uint64(7), tag)
	require.Equal(t, "12345678", string(rbuf))

	require.NoError(t, p.epB.TagSend(ctx, make([]byte, 64), 8))
	_, _, err = cRecv(ctx, wrec, p.a, rbuf, 8, &codes)
	require.ErrorIs(t, err, ErrMessageTruncated)

	code, _, _, _ = eprec.TagSendRecv(bufPtr(rbuf), 8, MaxTag+1, bufPtr(rbuf), 8, 2, ^uint64(0))
	require.Equal(t, ucx.FastNone, code)
	_, _, err = p.epA.TagSendRecv(ctx, rbuf, MaxTag+1, rbuf, 2, ^uint64(0))
	require.ErrorIs(t, err, ErrInvalidParam)
	code, _ = eprec.TagSend(nil, 8, 1)
	require.Equal(t, ucx.FastNone, code, "a NULL buffer of 8 bytes")
	code, _, _, _ = wrec.TagRecv(nil, 8, 1, ^uint64(0))
	require.Equal(t, ucx.FastNone, code)
	code, _ = wrec.TagSend(bufPtr(rbuf), 8, 1)
	require.Equal(t, ucx.FastNone, code, "a worker's record has no endpoint to send on")
	code, _, _, _ = eprec.TagRecv(bufPtr(rbuf), 8, 1, ^uint64(0))
	require.Equal(t, ucx.FastNone, code, "receives are the worker's: an endpoint's record is the wrong kind")
}

// Records are retired with what they stand for: after the endpoint or the worker
// closes a fast call takes the Go path (which reports ErrClosed) and touches neither.
// Only a shared worker's endpoints get records.
func TestSharedWorkerRetired(t *testing.T) {
	p, wrec, eprec := sharedPair(t)
	_, err := p.epB.shareWithC()
	require.ErrorIs(t, err, ErrInvalidParam, "b is not shared with C")

	buf := make([]byte, 8)
	require.NoError(t, p.epA.Close())
	code, _, _, _ := eprec.TagSendRecv(bufPtr(buf), 8, 1, bufPtr(buf), 8, 2, ^uint64(0))
	require.Equal(t, ucx.FastNone, code)
	_, err = p.epA.shareWithC()
	require.ErrorIs(t, err, ErrClosed)

	ep, err := p.a.ConnectAddress(mustAddress(t, p.b), &EndpointParams{NoPeerErrorHandling: true})
	require.NoError(t, err)
	rp, err := ep.shareWithC()
	require.NoError(t, err)
	rec := ucx.FastAt(rp)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var codes fastCodes
	require.NoError(t, cSend(ctx, rec, ep, []byte("12345678"), 3, &codes))
	n, _, err := p.b.TagRecv(ctx, buf, 3, ^uint64(0))
	require.NoError(t, err)
	require.Equal(t, "12345678", string(buf[:n]))

	require.NoError(t, p.a.Close())
	code, _ = rec.TagSend(bufPtr(buf), 8, 3)
	require.Equal(t, ucx.FastNone, code, "the endpoint's worker closed")
	code, _, _, _ = wrec.TagRecv(bufPtr(buf), 8, 3, ^uint64(0))
	require.Equal(t, ucx.FastNone, code, "the worker closed")
	require.ErrorIs(t, ep.TagSend(ctx, buf, 3), ErrClosed)
	_, err = p.a.shareWithC()
	require.ErrorIs(t, err, ErrClosed)
}

func mustAddress(t *testing.T, w *Worker) []byte {
	t.Helper()
	a, err := w.Address()
	require.NoError(t, err)
	return a
}

// The owner word of a shared worker: a goroutine that finds a C caller holding it
// waits without holding mu (the C caller may enter Go and need mu), and gets the
// worker once the C caller lets go.
func TestWorkerLockWaitsForC(t *testing.T) {
	p, _, _ := sharedPair(t)
	l := &p.a.mu
	// Play a C caller: take the owner word, then enter "Go" and take mu.
	require.True(t, atomic.CompareAndSwapUint32(l.owner, 0, 1))
	require.False(t, l.TryLock(), "TryLock while a C caller holds the worker")
	got, released := make(chan struct{}), make(chan struct{})
	go func() {
		l.Lock()
		close(got)
		l.Unlock()
		close(released)
	}()
	time.Sleep(10 * time.Millisecond)
	select {
	case <-got:
		t.Fatal("a goroutine took the worker while a C caller held it")
	default:
	}
	entered := make(chan struct{})
	go func() {
		l.lockFromC() // must not wait for the goroutine above
		close(entered)
	}()
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("a C caller entering Go waited for mu held by a goroutine waiting for it")
	}
	l.Unlock()
	select {
	case <-released:
	case <-time.After(5 * time.Second):
		t.Fatal("the goroutine never got the worker")
	}
	require.True(t, l.TryLock())
	l.Unlock()
}

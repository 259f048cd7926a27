package ucp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// pong answers n pings on p.b: it receives into a buffer of size bytes and sends back
// what it got, with the fused calls. The first receive is posted before ready is closed.
func pong(t *testing.T, p *pair, size, n int, ready chan<- struct{}) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		buf := make([]byte, size)
		close(ready)
		for i := 0; i < n; i++ {
			got, tag, err := p.b.TagRecv(ctx, buf, 1, ^uint64(0))
			if err == nil && tag != 1 {
				err = errors.New("wrong sender tag")
			}
			if err == nil {
				err = p.epB.TagSend(ctx, buf[:got], 2)
			}
			if err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	return done
}

// The fused calls carry a ping-pong: every reply is the ping's bytes, at eager and
// rendezvous sizes (where the operations outlive the first cgo call and wait in the
// worker's own requests).
func TestFusedPingPong(t *testing.T) {
	for _, size := range []int{0, 8, 4096, 1 << 20} {
		t.Run(sizeName(size), func(t *testing.T) {
			p := newShmPair(t)
			const rounds = 20
			ready := make(chan struct{})
			done := pong(t, p, size, rounds, ready)
			<-ready
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			rbuf := make([]byte, size)
			for i := 0; i < rounds; i++ {
				ping := pattern(size, int64(i))
				n, tag, err := p.epA.TagSendRecv(ctx, ping, 1, rbuf, 2, ^uint64(0))
				require.NoError(t, err)
				require.Equal(t, size, n)
				require.Equal(t, uint64(2), tag)
				require.True(t, bytes.Equal(ping, rbuf[:n]), "round %d: reply differs", i)
			}
			require.NoError(t, <-done)
		})
	}
}

// Bad input and ends: a nil context, a closed worker or endpoint, a message longer
// than the buffer, a context that ends while nothing arrives (the receive is canceled:
// a later message goes to the next receive).
func TestFusedErrors(t *testing.T) {
	p := newShmPair(t)
	//nolint:staticcheck // a nil context is the bad input under test
	require.ErrorIs(t, p.epA.TagSend(nil, []byte("x"), 1), ErrInvalidParam)
	//nolint:staticcheck
	_, _, err := p.b.TagRecv(nil, make([]byte, 1), 1, 0)
	require.ErrorIs(t, err, ErrInvalidParam)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, _, err = p.b.TagRecv(ctx, make([]byte, 8), 7, ^uint64(0))
	require.ErrorIs(t, err, context.DeadlineExceeded)

	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	require.NoError(t, p.epA.TagSend(ctx2, []byte("12345678"), 7))
	buf := make([]byte, 8)
	n, tag, err := p.b.TagRecv(ctx2, buf, 7, ^uint64(0))
	require.NoError(t, err, "the canceled receive must not have taken the message")
	require.Equal(t, 8, n)
	require.Equal(t, uint64(7), tag)
	require.Equal(t, "12345678", string(buf))

	require.NoError(t, p.epA.TagSend(ctx2, make([]byte, 64), 8))
	n, tag, err = p.b.TagRecv(ctx2, make([]byte, 8), 8, ^uint64(0))
	require.ErrorIs(t, err, ErrMessageTruncated)
	require.Equal(t, 64, n, "a truncated message's length")
	require.Equal(t, uint64(8), tag)
	// The same with the receive posted before the message comes, and as a reply.
	got := make(chan error, 1)
	go func() {
		n, tag, err := p.b.TagRecv(ctx2, make([]byte, 8), 9, ^uint64(0))
		if err == nil || n != 64 || tag != 9 {
			got <- fmt.Errorf("posted receive: n %d tag %d err %v", n, tag, err)
			return
		}
		got <- p.epB.TagSend(ctx2, make([]byte, 32), 11)
	}()
	time.Sleep(10 * time.Millisecond)
	n, tag, err = p.epA.TagSendRecv(ctx2, make([]byte, 64), 9, make([]byte, 4), 11, ^uint64(0))
	require.ErrorIs(t, err, ErrMessageTruncated)
	require.Equal(t, 32, n)
	require.Equal(t, uint64(11), tag)
	require.NoError(t, <-got)

	require.NoError(t, p.epA.Close())
	require.ErrorIs(t, p.epA.TagSend(ctx2, []byte("x"), 1), ErrClosed)
	_, _, err = p.epA.TagSendRecv(ctx2, []byte("x"), 1, buf, 2, ^uint64(0))
	require.ErrorIs(t, err, ErrClosed)
	require.NoError(t, p.b.Close())
	_, _, err = p.b.TagRecv(ctx2, buf, 1, 0)
	require.ErrorIs(t, err, ErrClosed)
}

// The fused calls and caller-owned requests allocate nothing per iteration (both
// sides of the ping-pong run in this process, so both are counted).
func TestZeroAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	ctx := context.Background()
	t.Run("fused", func(t *testing.T) {
		p := newShmPair(t)
		const runs = 2000
		ready := make(chan struct{})
		done := pong(t, p, 8, runs+1, ready) // AllocsPerRun runs once more to warm up
		<-ready
		sbuf, rbuf := make([]byte, 8), make([]byte, 8)
		var err error
		allocs := testing.AllocsPerRun(runs, func() {
			if _, _, e := p.epA.TagSendRecv(ctx, sbuf, 1, rbuf, 2, ^uint64(0)); e != nil {
				err = e
			}
		})
		require.NoError(t, err)
		require.NoError(t, <-done)
		require.Zero(t, allocs, "allocations per fused round trip")
	})
	t.Run("caller-owned", func(t *testing.T) {
		p := newShmPair(t)
		const runs = 2000
		ready := make(chan struct{})
		done := make(chan error, 1)
		go func() { // the responder reuses its requests too
			buf := make([]byte, 8)
			rp, sp := &RequestParam{Request: new(Request)}, &RequestParam{Request: new(Request)}
			close(ready)
			for i := 0; i < runs+1; i++ {
				r, err := p.b.TagRecvNbx(buf, 1, ^uint64(0), rp)
				if err == nil {
					err = r.Wait(ctx)
				}
				if err == nil {
					var s *Request
					if s, err = p.epB.TagSendNbx(buf, 2, sp); err == nil {
						err = s.Wait(ctx)
					}
				}
				if err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		<-ready
		sbuf, rbuf := make([]byte, 8), make([]byte, 8)
		rp, sp := &RequestParam{Request: new(Request)}, &RequestParam{Request: new(Request)}
		var err error
		allocs := testing.AllocsPerRun(runs, func() {
			r, e := p.a.TagRecvNbx(rbuf, 2, ^uint64(0), rp)
			if e == nil {
				var s *Request
				if s, e = p.epA.TagSendNbx(sbuf, 1, sp); e == nil {
					e = s.Wait(ctx)
				}
			}
			if e == nil {
				e = r.Wait(ctx)
			}
			if e == nil && r.Length() != 8 {
				e = errors.New("short reply")
			}
			if e != nil {
				err = e
			}
		})
		require.NoError(t, err)
		require.NoError(t, <-done)
		require.Zero(t, allocs, "allocations per round trip with caller-owned requests")
	})
}

// A caller-owned Request is returned by the call and carries the results; reusing one
// that is pending, the shared completed one, or one with a Condition is refused.
func TestCallerOwnedRequest(t *testing.T) {
	p := newShmPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	own := new(Request)
	rp := &RequestParam{Request: own}
	buf := make([]byte, 16)
	r, err := p.b.TagRecvNbx(buf, 3, ^uint64(0), rp)
	require.NoError(t, err)
	require.Same(t, own, r)
	require.False(t, own.Done())

	_, err = p.b.TagRecvNbx(buf, 3, ^uint64(0), rp)
	require.ErrorIs(t, err, ErrInvalidParam, "reusing a pending request")

	s, err := p.epA.TagSendNbx([]byte("first"), 3, nil)
	require.NoError(t, err)
	require.NoError(t, s.Wait(ctx))
	require.NoError(t, own.Wait(ctx))
	require.Equal(t, 5, own.Length())
	require.Equal(t, "first", string(buf[:5]))

	// Reused, now for a message that is already there (immediate completion).
	s, err = p.epA.TagSendNbx([]byte("second!"), 4, nil)
	require.NoError(t, err)
	require.NoError(t, s.Wait(ctx))
	for i := 0; i < 100; i++ {
		p.b.Progress() // let the message arrive before the receive is posted
	}
	r, err = p.b.TagRecvNbx(buf, 4, ^uint64(0), rp)
	require.NoError(t, err)
	require.Same(t, own, r)
	require.NoError(t, r.Wait(ctx))
	require.Equal(t, 7, own.Length())
	require.Equal(t, uint64(4), own.SenderTag())

	// A send completing in place fills the caller's request, not the shared one.
	sown := new(Request)
	s, err = p.epA.TagSendNbx([]byte("x"), 5, &RequestParam{Request: sown})
	require.NoError(t, err)
	require.Same(t, sown, s)
	require.NoError(t, s.Wait(ctx))
	_, _, err = p.b.TagRecv(ctx, buf, 5, ^uint64(0))
	require.NoError(t, err)

	shared, err := p.epA.TagSendNbx([]byte("y"), 6, nil)
	require.NoError(t, err)
	if shared == completedRequest {
		_, err = p.epA.TagSendNbx([]byte("z"), 6, &RequestParam{Request: shared})
		require.ErrorIs(t, err, ErrInvalidParam, "reusing the shared completed request")
	}
	_, c := streamCondition(t, hostBackend(t))
	_, err = p.epA.TagSendNbx([]byte("z"), 6, &RequestParam{Request: new(Request), Condition: c})
	require.ErrorIs(t, err, ErrInvalidParam, "a caller-owned request with a condition")
}

// A caller-owned Request that is done but whose Callback has not returned yet is not
// reused (ErrBusy): the Callback sees its own operation's results, not the next one's.
func TestRequestReuseWaitsForCallback(t *testing.T) {
	p := newShmPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The callback of an earlier receive holds the goroutine that completed both, so
	// R is done and its Callback queued behind it.
	release, ranR := make(chan struct{}), make(chan struct{})
	var lenR atomic.Int64
	r0, err := p.b.TagRecvNbx(make([]byte, 8), 10, ^uint64(0), &RequestParam{Callback: func(*Request) { <-release }})
	require.NoError(t, err)
	var R Request
	_, err = p.b.TagRecvNbx(make([]byte, 8), 11, ^uint64(0), &RequestParam{Request: &R,
		Callback: func(q *Request) { lenR.Store(int64(q.Length())); close(ranR) }})
	require.NoError(t, err)
	_, err = p.epA.TagSendNbx([]byte("aaaa"), 10, nil)
	require.NoError(t, err)
	_, err = p.epA.TagSendNbx([]byte("bbbbbbb"), 11, nil)
	require.NoError(t, err)
	progressed := make(chan struct{})
	go func() {
		defer close(progressed)
		for !(r0.Done() && R.Done()) {
			p.b.Progress()
		}
	}()
	for !R.Done() {
		p.a.Progress()
		require.NoError(t, ctx.Err())
	}
	_, err = p.b.TagRecvNbx(make([]byte, 8), 12, ^uint64(0), &RequestParam{Request: &R})
	require.ErrorIs(t, err, ErrBusy, "reused before its Callback ran")
	close(release)
	<-ranR
	<-progressed
	require.EqualValues(t, 7, lenR.Load(), "the Callback sees its own operation")

	// While the Callback runs, from another goroutine or from the Callback itself.
	inCb, reusedInCb := make(chan struct{}), make(chan error, 1)
	release = make(chan struct{})
	_, err = p.b.TagRecvNbx(make([]byte, 8), 13, ^uint64(0), &RequestParam{Request: &R, Callback: func(q *Request) {
		close(inCb)
		<-release
		_, err := p.b.TagRecvNbx(make([]byte, 8), 14, ^uint64(0), &RequestParam{Request: q})
		reusedInCb <- err
	}})
	require.NoError(t, err)
	_, err = p.epA.TagSendNbx([]byte("c"), 13, nil)
	require.NoError(t, err)
	progressed = make(chan struct{})
	go func() {
		defer close(progressed)
		for !R.Done() {
			p.b.Progress()
		}
	}()
	<-inCb
	_, err = p.b.TagRecvNbx(make([]byte, 8), 14, ^uint64(0), &RequestParam{Request: &R})
	require.ErrorIs(t, err, ErrBusy, "reused while its Callback runs")
	close(release)
	require.ErrorIs(t, <-reusedInCb, ErrBusy, "reused from its own Callback")

	<-progressed // the Progress that ran the Callback returned

	// Once the Callback returned, it may be reused.
	_, err = p.b.TagRecvNbx(make([]byte, 8), 15, ^uint64(0), &RequestParam{Request: &R})
	require.NoError(t, err)
	_, err = p.epA.TagSendNbx([]byte("dd"), 15, nil)
	require.NoError(t, err)
	p.wait(t, &R)
	require.Equal(t, 2, R.Length())
}

// A request completed by another request's wait is done as soon as that wait returns:
// the wait reaps every completion, not only its own, and counts it.
func TestCompletionsReapedByAnotherWait(t *testing.T) {
	p := newShmPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before := p.b.completions.Load()
	r1, err := p.b.TagRecvNbx(make([]byte, 8), 1, ^uint64(0), nil)
	require.NoError(t, err)
	r2, err := p.b.TagRecvNbx(make([]byte, 8), 2, ^uint64(0), nil)
	require.NoError(t, err)
	require.NoError(t, p.epA.TagSend(ctx, []byte("one"), 1))
	require.NoError(t, p.epA.TagSend(ctx, []byte("two"), 2))
	require.NoError(t, r2.Wait(ctx))
	// Messages of one endpoint match in order: r1's completed no later than r2's.
	require.True(t, r1.Done(), "r1 completed in r2's wait but is not done")
	require.NoError(t, r1.Err())
	require.Equal(t, 3, r1.Length())
	require.Equal(t, before+2, p.b.completions.Load())
}

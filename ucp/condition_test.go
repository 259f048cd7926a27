package ucp

import (
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/stream"
)

func hostBackend(t testing.TB) stream.Backend {
	t.Helper()
	b := stream.NewHostBackend()
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func streamCondition(t *testing.T, b stream.Backend) (stream.Stream, *condition.Condition) {
	t.Helper()
	s, err := b.NewStream()
	require.NoError(t, err)
	c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: s})
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, s.Synchronize())
		require.NoError(t, c.Destroy())
	})
	return s, c
}

// bareStreamCondition is a host stream (closed when the test ends) and a Stream
// condition on it that the test itself ends: for tests whose stream fails or whose
// condition keeps operations pending on purpose.
func bareStreamCondition(t *testing.T, b stream.Backend) (stream.Stream, *condition.Condition) {
	t.Helper()
	s, err := b.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: s})
	require.NoError(t, err)
	return s, c
}

// kernelCondition is a KernelTriggered condition on host streams (destroyed when the
// test ends) and the host-side trigger a kernel would store.
func kernelCondition(t *testing.T) (*condition.Condition, func()) {
	t.Helper()
	kc, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: hostBackend(t)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, kc.Destroy()) })
	return kc, func() {
		t.Helper()
		h, err := kc.DeviceHandle()
		require.NoError(t, err)
		require.NoError(t, condition.Trigger(h))
	}
}

// A receive enqueued on a stream completes in stream order: a host function enqueued
// after it sees the data, and an event recorded after it is not done until the data
// arrived, even while the sender is held back.
func TestStreamConditionOrderedCompletion(t *testing.T) {
	pairs(t, func(t *testing.T, p *pair) {
		b := hostBackend(t)
		s, c := streamCondition(t, b)
		stopB := background(p.b) // the sender side answers rendezvous and flushes
		defer stopB()
		for _, n := range []int{4, 4096, 1 << 20} {
			src := pattern(n, int64(n))
			dst := make([]byte, n)
			rr, err := p.a.TagRecvNbx(dst, 11, ^uint64(0), &RequestParam{Condition: c})
			require.NoError(t, err)
			var seen atomic.Uint32
			require.NoError(t, s.LaunchHostFunc(func() { seen.Store(checksum(dst)) }))
			ev, err := b.NewEvent()
			require.NoError(t, err)
			require.NoError(t, s.Record(ev))

			time.Sleep(20 * time.Millisecond) // the sender is held back
			done, err := ev.Query()
			require.NoError(t, err)
			require.False(t, done, "event after an enqueued receive is ready before the data arrived")
			require.False(t, rr.Done())

			sr, err := p.epB.TagSendNbx(src, 11, nil)
			require.NoError(t, err)
			require.NoError(t, ev.Synchronize())
			require.Equal(t, checksum(src), seen.Load(), "size %d", n)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			require.NoError(t, rr.Wait(ctx))
			require.NoError(t, sr.Wait(ctx))
			cancel()
			require.Equal(t, n, rr.Length())
			require.NoError(t, ev.Close())
		}
	})
}

// Every operation kind runs under a Stream condition and under a KernelTriggered one.
func TestConditionedOperationKinds(t *testing.T) {
	p := newPair(t, map[string]string{"TLS": "tcp"})
	stopB := background(p.b)
	defer stopB()
	b := hostBackend(t)
	s, sc := streamCondition(t, b)
	kc, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: b})
	require.NoError(t, err)
	defer func() { require.NoError(t, kc.Destroy()) }()

	remote, err := p.ctxB.MemAlloc(1 << 20)
	require.NoError(t, err)
	defer remote.Close()
	packed, err := remote.PackRkey()
	require.NoError(t, err)
	rkey, err := p.epA.UnpackRkey(packed)
	require.NoError(t, err)
	got := make(chan []byte, 4)
	require.NoError(t, p.b.SetAmHandler(4, func(m *AmMessage) { got <- append([]byte(nil), m.Data()...) }))

	for _, cond := range []*condition.Condition{sc, kc} {
		t.Run(cond.Category().String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			prm := &RequestParam{Condition: cond}
			var reqs []*Request
			add := func(r *Request, err error) *Request {
				t.Helper()
				require.NoError(t, err)
				reqs = append(reqs, r)
				return r
			}
			// Tag receive on a (answered by b after the trigger), tag send a->b.
			in := make([]byte, 64)
			rr := add(p.a.TagRecvNbx(in, 21, ^uint64(0), prm))
			out := pattern(64, 5)
			recvAtB := make([]byte, 64)
			rb, err := p.b.TagRecvNbx(recvAtB, 22, ^uint64(0), nil)
			require.NoError(t, err)
			add(p.epA.TagSendNbx(out, 22, prm))
			add(p.epA.AmSendNbx(4, nil, []byte("am!"), prm))
			src := pattern(4096, 6)
			add(p.epA.PutNbx(src, rkey.Base(), rkey, prm))
			add(p.epA.FlushNbx(prm))
			back := make([]byte, 4096)
			add(p.epA.GetNbx(back, rkey.Base(), rkey, prm))
			binary.NativeEndian.PutUint64(remote.Bytes()[8192:], 5)
			at := add(p.epA.AtomicNbx(AtomicParam{Op: AtomicAdd, Operand: 3, Fetch: true}, rkey.Base()+8192, rkey, prm))
			add(p.a.FlushNbx(prm))

			// Nothing may start before the trigger.
			time.Sleep(20 * time.Millisecond)
			for _, r := range reqs {
				require.False(t, r.Done(), "%s ran before its trigger", r.op)
			}
			if cond.Category() == condition.KernelTriggered {
				h, err := cond.DeviceHandle()
				require.NoError(t, err)
				require.False(t, condition.Test(h))
				require.NoError(t, condition.Trigger(h))
			} // the stream condition triggers as the host stream reaches each call

			sb, err := p.epB.TagSendNbx(pattern(64, 7), 21, nil)
			require.NoError(t, err)
			for _, r := range reqs {
				require.NoError(t, r.Wait(ctx), r.op)
			}
			require.NoError(t, sb.Wait(ctx))
			require.NoError(t, rb.Wait(ctx))
			require.Equal(t, pattern(64, 7), in)
			require.Equal(t, 64, rr.Length())
			require.Equal(t, out, recvAtB)
			require.Equal(t, src, remote.Bytes()[:4096])
			require.Equal(t, src, back)
			require.Equal(t, uint64(5), at.Fetched())
			require.Equal(t, uint64(8), binary.NativeEndian.Uint64(remote.Bytes()[8192:]))
			select {
			case m := <-got:
				require.Equal(t, "am!", string(m))
			case <-ctx.Done():
				t.Fatal("active message not delivered")
			}
			if cond.Category() == condition.KernelTriggered {
				h, err := cond.DeviceHandle()
				require.NoError(t, err)
				require.True(t, condition.Test(h))
			} else {
				require.NoError(t, s.Synchronize())
			}
			require.NoError(t, cond.Err())
		})
	}
}

// Stream order holds across 10,000 mixed operations on one stream: each receive's host
// function sees exactly its own message, in order.
func TestStreamConditionOrderOf10000Operations(t *testing.T) {
	p := newShmPair(t)
	b := hostBackend(t)
	s, c := streamCondition(t, b)
	const n = 10000
	var order []uint64
	var mu sync.Mutex
	bufs := make([][]byte, n/2)
	reqs := make([]*Request, 0, n)
	for i := 0; i < n/2; i++ {
		bufs[i] = make([]byte, 8)
		buf := bufs[i]
		// A send to b and a receive of b's echo, alternating, all on one stream.
		msg := make([]byte, 8)
		binary.LittleEndian.PutUint64(msg, uint64(i))
		r1, err := p.epA.TagSendNbx(msg, uint64(i), &RequestParam{Condition: c})
		require.NoError(t, err)
		r2, err := p.a.TagRecvNbx(buf, 1<<40, 1<<40, &RequestParam{Condition: c})
		require.NoError(t, err)
		require.NoError(t, s.LaunchHostFunc(func() {
			mu.Lock()
			order = append(order, binary.LittleEndian.Uint64(buf))
			mu.Unlock()
		}))
		reqs = append(reqs, r1, r2)
	}
	// b echoes every message back with the high tag bit.
	echoErr := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		buf := make([]byte, 8)
		for i := 0; i < n/2; i++ {
			r, err := p.b.TagRecvNbx(buf, uint64(i), ^uint64(0), nil)
			if err == nil {
				err = r.Wait(ctx)
			}
			if err == nil {
				var s *Request
				s, err = p.epB.TagSendNbx(buf, 1<<40|uint64(i), nil)
				if err == nil {
					err = s.Wait(ctx)
				}
			}
			if err != nil {
				echoErr <- err
				return
			}
		}
		echoErr <- nil
	}()
	require.NoError(t, <-echoErr)
	require.NoError(t, s.Synchronize())
	require.Len(t, order, n/2)
	for i, v := range order {
		require.Equal(t, uint64(i), v, "operation %d out of order", i)
	}
	for _, r := range reqs {
		require.True(t, r.Done())
		require.NoError(t, r.Err())
	}
}

// 64 streams progress independently at once.
func TestSixtyFourStreams(t *testing.T) {
	p := newShmPair(t)
	b := hostBackend(t)
	const streams, perStream = 64, 20
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	stopB := background(p.b)
	defer stopB()
	for i := 0; i < streams; i++ {
		s, c := streamCondition(t, b)
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for j := 0; j < perStream; j++ {
				tag := uint64(i)<<32 | uint64(j)
				out := make([]byte, 128)
				binary.LittleEndian.PutUint64(out, tag)
				in := make([]byte, 128)
				rb, err := p.b.TagRecvNbx(in, tag, ^uint64(0), nil)
				if err != nil {
					errs <- err
					return
				}
				if _, err := p.epA.TagSendNbx(out, tag, &RequestParam{Condition: c}); err != nil {
					errs <- err
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				err = rb.Wait(ctx)
				cancel()
				if err == nil && binary.LittleEndian.Uint64(in) != tag {
					err = errors.New("payload mismatch")
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- s.Synchronize()
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// The non-blocking form returns at once; a second stream orders itself after it.
func TestNonBlockingEnqueueWithCrossStreamWait(t *testing.T) {
	p := newShmPair(t)
	b := hostBackend(t)
	s, c := streamCondition(t, b)
	other, err := b.NewStream()
	require.NoError(t, err)
	defer other.Close()

	dst := make([]byte, 32)
	rr, err := p.a.TagRecvNbx(dst, 3, ^uint64(0), &RequestParam{Condition: c, Flags: NonBlockingEnqueue})
	require.NoError(t, err)
	var onS, onOther atomic.Bool
	require.NoError(t, s.LaunchHostFunc(func() { onS.Store(true) }))
	require.NoError(t, rr.WaitOnStream(other))
	var seen atomic.Uint32
	require.NoError(t, other.LaunchHostFunc(func() { seen.Store(checksum(dst)); onOther.Store(true) }))

	// s is not held back by the pending receive; other is.
	require.NoError(t, s.Synchronize())
	require.True(t, onS.Load())
	time.Sleep(10 * time.Millisecond)
	require.False(t, onOther.Load())

	src := pattern(32, 1)
	sr, err := p.epB.TagSendNbx(src, 3, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, sr.Wait(ctx))
	require.NoError(t, rr.Wait(ctx))
	require.NoError(t, other.Synchronize())
	require.Equal(t, checksum(src), seen.Load())

	// A stream of another backend is refused.
	require.ErrorIs(t, rr.WaitOnStream(nil), condition.ErrInvalidParam)
}

// Destroying a condition with an operation pending gives ErrBusy and loses nothing.
func TestDestroyConditionWithPendingOperation(t *testing.T) {
	p := newShmPair(t)
	s, c := bareStreamCondition(t, hostBackend(t))
	dst := make([]byte, 16)
	rr, err := p.a.TagRecvNbx(dst, 8, ^uint64(0), &RequestParam{Condition: c})
	require.NoError(t, err)
	require.ErrorIs(t, c.Destroy(), condition.ErrBusy)
	require.Equal(t, 1, c.Pending())

	sr, err := p.epB.TagSendNbx([]byte("still delivered!"), 8, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, sr.Wait(ctx))
	require.NoError(t, rr.Wait(ctx))
	require.Equal(t, "still delivered!", string(dst))
	require.NoError(t, s.Synchronize())
	require.NoError(t, c.Destroy())
	require.ErrorIs(t, c.Destroy(), condition.ErrDestroyed)
	_, err = p.a.TagRecvNbx(dst, 8, ^uint64(0), &RequestParam{Condition: c})
	require.ErrorIs(t, err, condition.ErrDestroyed)
}

// One kernel-triggered condition re-armed 500 times, triggered from the host.
func TestKernelTriggeredRearm500(t *testing.T) {
	p := newShmPair(t)
	b := hostBackend(t)
	c, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: b})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Destroy()) }()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	buf := make([]byte, 8)
	for i := 0; i < 500; i++ {
		binary.LittleEndian.PutUint64(buf, uint64(i))
		sr, err := p.epA.TagSendNbx(buf, uint64(i), &RequestParam{Condition: c})
		require.NoError(t, err)
		h, err := c.DeviceHandle()
		require.NoError(t, err)
		require.Equal(t, uint64(i+1), h.Value)
		in := make([]byte, 8)
		rr, err := p.b.TagRecvNbx(in, uint64(i), ^uint64(0), nil)
		require.NoError(t, err)
		require.False(t, sr.Done())
		require.NoError(t, condition.Trigger(h))
		require.NoError(t, sr.Wait(ctx))
		require.NoError(t, rr.Wait(ctx))
		require.Equal(t, uint64(i), binary.LittleEndian.Uint64(in))
		require.True(t, condition.Test(h))
	}
}

// A canceled conditioned operation retires without running and releases its stream.
func TestCancelConditionedOperation(t *testing.T) {
	p := newShmPair(t)
	b := hostBackend(t)
	s, c := streamCondition(t, b)
	blocker, err := b.AllocWords(1)
	require.NoError(t, err)
	defer blocker.Close()
	require.NoError(t, s.WaitValue(blocker.Word(0), 1, stream.EQ)) // hold the stream
	rr, err := p.a.TagRecvNbx(make([]byte, 8), 99, ^uint64(0), &RequestParam{Condition: c})
	require.NoError(t, err)
	rr.Cancel()
	blocker.Word(0).Store(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.ErrorIs(t, rr.Wait(ctx), ErrCanceled)
	require.NoError(t, s.Synchronize())
	require.ErrorIs(t, c.Err(), ErrCanceled)
}

// Closing the worker fails operations whose trigger never came and releases the stream.
func TestWorkerCloseReleasesStreams(t *testing.T) {
	p := newShmPair(t)
	b := hostBackend(t)
	s, c := streamCondition(t, b)
	rr, err := p.a.TagRecvNbx(make([]byte, 8), 5, ^uint64(0), &RequestParam{Condition: c})
	require.NoError(t, err)
	var after atomic.Bool
	require.NoError(t, s.LaunchHostFunc(func() { after.Store(true) }))
	time.Sleep(10 * time.Millisecond)
	require.False(t, after.Load())
	require.NoError(t, p.a.Close())
	require.True(t, rr.Done())
	require.ErrorIs(t, rr.Err(), ErrCanceled)
	require.NoError(t, s.Synchronize())
	require.True(t, after.Load())
	_, err = p.a.TagRecvNbx(make([]byte, 8), 5, ^uint64(0), &RequestParam{Condition: c})
	require.ErrorIs(t, err, ErrClosed)
}

// An idle proxy parks: with nothing pending it uses no CPU.
func TestIdleProxyParks(t *testing.T) {
	p := newShmPair(t)
	b := hostBackend(t)
	_, c := streamCondition(t, b)
	sr, err := p.epA.TagSendNbx([]byte("x"), 1, &RequestParam{Condition: c})
	require.NoError(t, err)
	rr, err := p.b.TagRecvNbx(make([]byte, 1), 1, ^uint64(0), nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, sr.Wait(ctx))
	require.NoError(t, rr.Wait(ctx))
	// The proxy goroutine must now be blocked on its wake channel.
	deadline := time.Now().Add(5 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		if containsParkedProxy(stacks) {
			break
		}
		require.True(t, time.Now().Before(deadline), "proxy still running after its work was done:\n%s", stacks)
		time.Sleep(10 * time.Millisecond)
	}
}

func containsParkedProxy(stacks string) bool {
	for _, g := range strings.Split(stacks, "\n\n") {
		if !strings.Contains(g, "condition.(*Engine).run") {
			continue
		}
		// Blocked on its wake channel, or asleep on the worker's event fd (in the
		// netpoller, or as a follower of another goroutine sleeping there).
		if strings.Contains(g, "[select") || (strings.Contains(g, "[IO wait") && strings.Contains(g, "WaitProgress")) {
			return true
		}
	}
	return false
}

// stallingStream models a CUDA stream whose queue is full: enqueueing the completion
// wait of operation k blocks until operation k-1 has retired.
type stallingStream struct{ stream.Stream }

func (s stallingStream) WaitValue(w *stream.Word, v uint64, cmp stream.Compare) error {
	stall(w, v)
	return s.Stream.WaitValue(w, v, cmp)
}

func (s stallingStream) PollValue(w *stream.Word, v uint64) error {
	stall(w, v)
	return s.Stream.PollValue(w, v)
}

func (s stallingStream) WriteThenWait(w *stream.Word, v uint64, waitOn *stream.Word, waitValue uint64, cmp stream.Compare) error {
	stall(waitOn, waitValue)
	return s.Stream.WriteThenWait(w, v, waitOn, waitValue, cmp)
}

// stall blocks until the completion word w reached v-1 (bounded, so a bug fails the
// test instead of hanging it).
func stall(w *stream.Word, v uint64) {
	deadline := time.Now().Add(10 * time.Second)
	for int64(w.Load()-(v-1)) < 0 && time.Now().Before(deadline) {
		runtime.Gosched()
	}
}

// The proxy must retire operations while an enqueue on the condition's stream blocks
// (found on an H200: the GPU benchmark deadlocked when Retire needed the lock Arm held).
func TestRetireWhileEnqueueBlocks(t *testing.T) {
	p := newShmPair(t)
	b := hostBackend(t)
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: stallingStream{s}})
	require.NoError(t, err)
	stop := background(p.b)
	defer stop()
	rb1, err := p.b.TagRecvNbx(make([]byte, 8), 1, ^uint64(0), nil)
	require.NoError(t, err)
	rb2, err := p.b.TagRecvNbx(make([]byte, 8), 2, ^uint64(0), nil)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		if _, err := p.epA.TagSendNbx([]byte("12345678"), 1, &RequestParam{Condition: c}); err != nil {
			done <- err
			return
		}
		_, err := p.epA.TagSendNbx([]byte("12345678"), 2, &RequestParam{Condition: c})
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("enqueue and retirement deadlocked")
	}
	require.LessOrEqual(t, c.Pending(), 1) // the first operation retired while the second enqueue blocked
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, rb1.Wait(ctx))
	require.NoError(t, rb2.Wait(ctx))
	require.NoError(t, s.Synchronize())
	require.NoError(t, c.Destroy())
}

// A group: a receive and a send armed between BeginGroup and EndGroup share one
// trigger and one completion wait. Nothing starts before EndGroup reaches the stream;
// then both run, and work after the group sees the received data.
func TestStreamConditionGroup(t *testing.T) {
	p := newPair(t, nil)
	stopB := background(p.b)
	defer stopB()
	b := hostBackend(t)
	s, c := streamCondition(t, b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	require.ErrorIs(t, c.EndGroup(), condition.ErrInvalidParam)
	for round := 0; round < 50; round++ {
		src, dst := pattern(4096, int64(round)), make([]byte, 4096)
		out := pattern(64, int64(round+1000))
		back := make([]byte, 64)
		peerRecv, err := p.b.TagRecvNbx(back, 22, ^uint64(0), nil)
		require.NoError(t, err)

		require.NoError(t, c.BeginGroup())
		require.ErrorIs(t, c.BeginGroup(), condition.ErrInvalidParam)
		rr, err := p.a.TagRecvNbx(dst, 21, ^uint64(0), &RequestParam{Condition: c})
		require.NoError(t, err)
		sr, err := p.epA.TagSendNbx(out, 22, &RequestParam{Condition: c})
		require.NoError(t, err)
		require.ErrorIs(t, rr.WaitOnStream(s), condition.ErrInvalidParam, "a wait ahead of the group's trigger")
		if round == 0 {
			time.Sleep(10 * time.Millisecond)
			require.False(t, sr.Done(), "a grouped send started before EndGroup")
			require.Equal(t, 2, c.Pending())
		}
		require.NoError(t, c.EndGroup())
		var seen atomic.Uint32
		require.NoError(t, s.LaunchHostFunc(func() { seen.Store(checksum(dst)) }))

		ps, err := p.epB.TagSendNbx(src, 21, nil)
		require.NoError(t, err)
		require.NoError(t, s.Synchronize())
		require.Equal(t, checksum(src), seen.Load(), "round %d: work after the group ran before the receive completed", round)
		require.NoError(t, rr.Wait(ctx))
		require.NoError(t, sr.Wait(ctx))
		require.NoError(t, ps.Wait(ctx))
		require.NoError(t, peerRecv.Wait(ctx))
		require.Equal(t, out, back)
	}
	require.NoError(t, c.Err())
	require.NoError(t, c.BeginGroup())
	require.NoError(t, c.EndGroup(), "an empty group")
	kc, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: b})
	require.NoError(t, err)
	require.ErrorIs(t, kc.BeginGroup(), condition.ErrInvalidParam)
	require.NoError(t, kc.Destroy())
}

// A group whose stream refuses the trigger (closed) starts its operations from the host
// and reports the error; their callbacks run and may use the condition (EndGroup kicks
// the engine, which may run the round on the caller, after letting the condition go).
func TestStreamConditionGroupRefusedTrigger(t *testing.T) {
	p := newPair(t, nil)
	stopB := background(p.b)
	defer stopB()
	b := hostBackend(t)
	s, err := b.NewStream()
	require.NoError(t, err)
	c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: s})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	out, back := pattern(64, 7), make([]byte, 64)
	peerRecv, err := p.b.TagRecvNbx(back, 23, ^uint64(0), nil)
	require.NoError(t, err)
	require.NoError(t, c.BeginGroup())
	pending := make(chan int, 1)
	sr, err := p.epA.TagSendNbx(out, 23, &RequestParam{Condition: c, Callback: func(*Request) { pending <- c.Pending() }})
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.ErrorIs(t, c.EndGroup(), stream.ErrClosed, "the closed stream refuses the trigger")
	require.NoError(t, sr.Wait(ctx), "the refused group's send starts from the host")
	require.NoError(t, peerRecv.Wait(ctx))
	require.Equal(t, out, back)
	select {
	case n := <-pending:
		require.LessOrEqual(t, n, 1)
	case <-ctx.Done():
		require.FailNow(t, "the send's callback did not run")
	}
	require.ErrorIs(t, c.Err(), stream.ErrClosed)
	require.NoError(t, c.Destroy())
}

// A host stream that stops on an error (a host function panicked) drops the work behind
// it, so the operations whose triggers were behind it never run: they fail (matching
// ErrCanceled and the stream's error) instead of leaving their Requests pending and
// the condition impossible to destroy. An operation triggered before the failure runs.
func TestStreamStoppedFailsOperationsBehindIt(t *testing.T) {
	p := newShmPair(t)
	s, c := bareStreamCondition(t, hostBackend(t))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	before, err := p.epA.TagSendNbx([]byte("before the panic"), 5, &RequestParam{Condition: c})
	require.NoError(t, err)
	gate := make(chan struct{})
	require.NoError(t, s.LaunchHostFunc(func() { <-gate; panic("boom") }))
	dst := make([]byte, 16)
	behindRecv, err := p.a.TagRecvNbx(dst, 6, ^uint64(0), &RequestParam{Condition: c})
	require.NoError(t, err)
	behindSend, err := p.epA.TagSendNbx([]byte("behind the panic"), 7, &RequestParam{Condition: c})
	require.NoError(t, err)
	close(gate)

	var panicked *stream.PanicError
	require.ErrorAs(t, s.Synchronize(), &panicked)
	got := make([]byte, 16)
	r, err := p.b.TagRecvNbx(got, 5, ^uint64(0), nil)
	require.NoError(t, err)
	waitAll(t, 10*time.Second, r)
	require.Equal(t, "before the panic", string(got))
	require.NoError(t, before.Wait(ctx))
	for _, q := range []*Request{behindRecv, behindSend} {
		err := q.Wait(ctx)
		require.ErrorIs(t, err, ErrCanceled)
		require.ErrorAs(t, err, &panicked)
	}
	require.Equal(t, 0, c.Pending())
	require.NoError(t, c.Destroy())
	// Nothing was sent behind the panic.
	probe, err := p.b.TagRecvNbx(got, 7, ^uint64(0), nil)
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond)
	done, _ := probe.Test()
	require.False(t, done, "an operation behind the failure was issued")
	probe.Cancel()
}

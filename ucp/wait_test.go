package ucp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// goroutineStacks returns every goroutine's stack, one string each.
func goroutineStacks() []string {
	buf := make([]byte, 1<<20)
	return strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n")
}

// parkedWaiters counts the goroutines in a Request wait (or containing fn) that sleep
// in the netpoller (IO wait) and those parked on their follower channel (select).
func parkedWaiters(fn string) (netpoll, followers int) {
	for _, g := range goroutineStacks() {
		if !strings.Contains(g, fn) {
			continue
		}
		switch {
		case strings.Contains(g, "[IO wait") && strings.Contains(g, "ucp.(*parker).poll"):
			netpoll++
		case strings.Contains(g, "[select") && strings.Contains(g, "ucp.(*Worker).sleepUnlock"):
			followers++
		}
	}
	return netpoll, followers
}

// waitParked waits until the goroutines in fn are parked as wanted.
func waitParked(t testing.TB, fn string, netpoll, followers int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, f := parkedWaiters(fn)
		if n == netpoll && f == followers {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("want %d goroutine(s) in the netpoller and %d follower(s) in %s, have %d and %d:\n%s",
				netpoll, followers, fn, n, f, strings.Join(goroutineStacks(), "\n\n"))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func processCPU(t testing.TB) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// A goroutine waiting forever sleeps in Go's netpoller on the worker's event fd (no OS
// thread of its own, no timed wake-ups) and costs no CPU; a message wakes it.
func TestParkedWaitSleepsInNetpoller(t *testing.T) {
	p := newShmPair(t)
	buf := make([]byte, 8)
	r, err := p.b.TagRecvNbx(buf, 9, ^uint64(0), nil)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Wait(context.Background()) }()
	waitParked(t, "ucp.(*Worker).waitRequest", 1, 0)

	cpu0, wall0 := processCPU(t), time.Now()
	time.Sleep(time.Second)
	cpu, wall := processCPU(t)-cpu0, time.Since(wall0)
	t.Logf("process CPU while a goroutine waits forever: %v in %v (%.3f%% of one CPU)", cpu, wall.Round(time.Millisecond), 100*cpu.Seconds()/wall.Seconds())
	n, _ := parkedWaiters("ucp.(*Worker).waitRequest")
	require.Equal(t, 1, n, "the waiter left the netpoller while nothing happened")
	select {
	case err := <-done:
		t.Fatalf("wait returned with nothing sent: %v", err)
	default:
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, p.epA.TagSend(ctx, []byte("wake up!"), 9))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("the event fd did not wake the parked waiter")
	}
	require.Equal(t, "wake up!", string(buf))
}

// One waiter leads (in the netpoller), the others follow; when the leader's context
// ends it returns at once and a follower takes over; every follower gets its message.
func TestParkedLeaderHandsOver(t *testing.T) {
	p := newShmPair(t)
	bufs := [3][]byte{make([]byte, 8), make([]byte, 8), make([]byte, 8)}
	var reqs [3]*Request
	for i := range reqs {
		var err error
		reqs[i], err = p.b.TagRecvNbx(bufs[i], uint64(i+1), ^uint64(0), nil)
		require.NoError(t, err)
	}
	leaderCtx, cancelLeader := context.WithCancel(context.Background())
	defer cancelLeader()
	errs := make([]chan error, 3)
	for i := range errs {
		errs[i] = make(chan error, 1)
	}
	go func() { errs[0] <- reqs[0].Wait(leaderCtx) }()
	waitParked(t, "ucp.(*Worker).waitRequest", 1, 0)
	for i := 1; i < 3; i++ {
		go func() { errs[i] <- reqs[i].Wait(context.Background()) }()
	}
	waitParked(t, "ucp.(*Worker).waitRequest", 1, 2)

	cancelLeader()
	select {
	case err := <-errs[0]:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("canceling its context did not wake the leader")
	}
	// A follower leads now.
	waitParked(t, "ucp.(*Worker).waitRequest", 1, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, i := range []int{2, 1} {
		require.NoError(t, p.epA.TagSend(ctx, []byte{byte('0' + i), 7, 7, 7, 7, 7, 7, 7}, uint64(i+1)))
		select {
		case err := <-errs[i]:
			require.NoError(t, err)
			require.Equal(t, byte('0'+i), bufs[i][0])
		case <-ctx.Done():
			t.Fatalf("waiter %d not woken by its message", i)
		}
	}
	require.False(t, reqs[0].Done(), "the first receive was never matched")
}

// A request completed by another goroutine (here Cancel, which makes no event on the
// fd) wakes the goroutine parked on it.
func TestCompletionWakesParkedWaiter(t *testing.T) {
	cancelParked(t, newShmPair(t), false)
}

// A goroutine that arms the worker right after a request of the parked leader
// completed does not leave the leader asleep. Signalling the worker to wake the leader
// was not enough: ucp_worker_arm drains the signal, and when it does so before the
// netpoller reports it, the leader slept on with its request done (concurrent blocking
// calls on one worker hung that way).
func TestArmDoesNotSwallowLeaderWake(t *testing.T) {
	p := newShmPair(t)
	for range 50 {
		cancelParked(t, p, true)
	}
}

// cancelParked parks a goroutine on a receive of p.b, cancels the receive from here
// (then arms the worker, as a waiter about to park does, if arm), and requires the
// goroutine to wake with ErrCanceled.
func cancelParked(t *testing.T, p *pair, arm bool) {
	t.Helper()
	r, err := p.b.TagRecvNbx(make([]byte, 8), 1, ^uint64(0), nil)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Wait(context.Background()) }()
	waitParked(t, "ucp.(*Worker).waitRequest", 1, 0)
	r.Cancel()
	if arm {
		_ = p.b.Arm()
	}
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrCanceled)
	case <-time.After(10 * time.Second):
		t.Fatal("the parked waiter was not woken by its request's completion")
	}
}

// Concurrent blocking and nbx calls of several goroutines on both workers of a pair:
// every waiter is woken when its request completes, whoever completes it.
func TestConcurrentWaitersAllWake(t *testing.T) {
	for run := 0; run < 3; run++ {
		p := newShmPair(t)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		const rounds = 1000
		errc := make(chan error, 4)
		go func() { errc <- echoTag(ctx, p.b, p.epB, 8, 1, 2, rounds) }()       // b: tag 1 back on 2
		go func() { errc <- echoTag(ctx, p.b, p.epB, 256, 10, 11, rounds/4) }() // b: tag 10 back on 11
		go func() {                                                             // a: nbx exchanges on tags 10/11
			buf := make([]byte, 256)
			for i := 0; i < rounds/4; i++ {
				msg := pattern(256, int64(i))
				sr, err := p.epA.TagSendNbx(msg, 10, nil)
				if err == nil {
					var rr *Request
					if rr, err = p.a.TagRecvNbx(buf, 11, ^uint64(0), nil); err == nil {
						if err = sr.Wait(ctx); err == nil {
							err = rr.Wait(ctx)
						}
					}
				}
				if err == nil && !bytes.Equal(buf, msg) {
					err = errors.New("reply differs")
				}
				if err != nil {
					errc <- fmt.Errorf("a nbx, round %d: %w", i, err)
					return
				}
			}
			errc <- nil
		}()
		go func() { // a: fused ping-pong on tags 1/2
			rbuf := make([]byte, 8)
			for i := 0; i < rounds; i++ {
				ping := pattern(8, int64(i))
				n, _, err := p.epA.TagSendRecv(ctx, ping, 1, rbuf, 2, ^uint64(0))
				if err == nil && !bytes.Equal(ping, rbuf[:n]) {
					err = errors.New("reply differs")
				}
				if err != nil {
					errc <- fmt.Errorf("a fused, round %d: %w", i, err)
					return
				}
			}
			errc <- nil
		}()
		for k := 0; k < 4; k++ {
			require.NoError(t, <-errc, "run %d", run)
		}
		cancel()
	}
}

// Closing the worker wakes a parked waiter, which returns the operation's failure.
func TestCloseWakesParkedWaiter(t *testing.T) {
	p := newShmPair(t)
	r, err := p.b.TagRecvNbx(make([]byte, 8), 1, ^uint64(0), nil)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Wait(context.Background()) }()
	waitParked(t, "ucp.(*Worker).waitRequest", 1, 0)
	require.NoError(t, p.b.Close())
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrCanceled)
	case <-time.After(10 * time.Second):
		t.Fatal("closing the worker did not wake the parked waiter")
	}
	n, f := parkedWaiters("ucp.")
	require.Zero(t, n+f, "goroutines still parked on a closed worker")
}

// WaitForEvents sleeps in the netpoller until Signal, its timeout or its context.
func TestWaitForEvents(t *testing.T) {
	p := newShmPair(t)
	done := make(chan error, 1)
	go func() { done <- p.b.WaitForEvents(context.Background(), time.Hour) }()
	waitParked(t, "WaitForEvents", 1, 0)
	require.NoError(t, p.b.Signal())
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Signal did not wake WaitForEvents")
	}
	require.NoError(t, p.b.WaitForEvents(context.Background(), 10*time.Millisecond), "a timeout is no error")
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- p.b.WaitForEvents(ctx, time.Hour) }()
	waitParked(t, "WaitForEvents", 1, 0)
	cancel()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("canceling the context did not wake WaitForEvents")
	}
}

// EventFD and Arm let a program wait on the worker itself: armed, the fd becomes
// readable when a message arrives. Without wakeup both are unsupported.
func TestEventFDAndArm(t *testing.T) {
	p := newShmPair(t)
	fd, err := p.b.EventFD()
	require.NoError(t, err)
	require.GreaterOrEqual(t, fd, 0)
	for {
		p.b.Progress()
		err := p.b.Arm()
		if err == nil {
			break
		}
		require.ErrorIs(t, err, ErrBusy)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, p.epA.TagSend(ctx, []byte("ping"), 1))
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 10000)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the armed event fd did not become readable")
	got, _, err := p.b.TagRecv(ctx, make([]byte, 8), 1, ^uint64(0))
	require.NoError(t, err)
	require.Equal(t, 4, got)

	c, err := NewContext(ContextParams{})
	require.NoError(t, err)
	defer c.Close()
	w, err := c.NewWorker(WorkerParams{NoWakeup: true})
	require.NoError(t, err)
	_, err = w.EventFD()
	require.ErrorIs(t, err, ErrUnsupported)
	require.ErrorIs(t, w.Arm(), ErrUnsupported)
	require.NoError(t, w.WaitForEvents(context.Background(), time.Hour), "without wakeup it returns at once")
	require.NoError(t, w.Close())
	_, err = w.EventFD()
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, w.Arm(), ErrClosed)
}

// While the worker's yield word is set (the engine waits for the lock to issue), a
// spinning wait lets go after one progress call instead of finishing its spins.
func TestSpinEndsWhileIssuerWaits(t *testing.T) {
	p := newShmPair(t)
	w := p.b
	r, err := w.TagRecvNbx(make([]byte, 8), 77, ^uint64(0), nil) // nothing ever matches
	require.NoError(t, err)
	defer func() {
		r.Cancel()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.ErrorIs(t, r.Wait(ctx), ErrCanceled)
	}()
	spin := func() time.Duration {
		w.mu.Lock()
		defer w.mu.Unlock()
		start := time.Now()
		require.False(t, w.raw.Wait(r.req, 1<<30, false), "the receive cannot have completed")
		return time.Since(start)
	}
	atomic.StoreUint32(w.mu.yield, 1)
	took := spin()
	atomic.StoreUint32(w.mu.yield, 0)
	// 2^30 progress calls take minutes; one takes microseconds.
	require.Less(t, took, time.Second, "the spin ignored the yield word")
}

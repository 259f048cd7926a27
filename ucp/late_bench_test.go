package ucp

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkLateMessage measures issue 18's "a late message (1 ms, 20 ms) is noticed
// within 10 µs on a worker with wakeup": a goroutine waits on a receive (Request.Wait,
// which spins for the worker's SpinTime and then sleeps on its event fd) while the
// peer, another worker of the process over shared memory, sends 8 bytes after a delay.
// Reported: the time from the send call to the wait's return (median and p99 over
// b.N messages). The 20 µs delay, where the waiter still spins, is the reference of
// the same run: what a message costs a waiter that never slept.
func BenchmarkLateMessage(b *testing.B) {
	for _, d := range []time.Duration{20 * time.Microsecond, time.Millisecond, 20 * time.Millisecond} {
		b.Run(fmt.Sprintf("after=%v", d), func(b *testing.B) { benchLateMessage(b, d) })
		b.Run(fmt.Sprintf("after=%v/thread-floor", d), func(b *testing.B) { benchLateFloor(b, d, false) })
		b.Run(fmt.Sprintf("after=%v/netpoller-floor", d), func(b *testing.B) { benchLateFloor(b, d, true) })
	}
}

// benchLateFloor is the wake-up of a sleeper with no UCX: a byte written into a pipe
// after the delay, read by a thread blocked in read(2) (thread-floor: what the kernel
// gives) or by a goroutine reading through Go's netpoller (netpoller-floor: what a Go
// program gets), timed from the write to the read's return.
func benchLateFloor(b *testing.B, delay time.Duration, netpoller bool) {
	fds := make([]int, 2)
	if err := unix.Pipe2(fds, unix.O_CLOEXEC); err != nil {
		b.Fatal(err)
	}
	r, w := os.NewFile(uintptr(fds[0]), "late-r"), os.NewFile(uintptr(fds[1]), "late-w")
	defer r.Close()
	defer w.Close()
	if netpoller {
		if err := unix.SetNonblock(fds[0], true); err != nil {
			b.Fatal(err)
		}
		r = os.NewFile(uintptr(fds[0]), "late-r") // now polled
	}
	woke := make(chan time.Duration, 1)
	noticed := make([]time.Duration, 0, b.N)
	one := []byte{1}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := monotonic()
		go func() {
			buf := make([]byte, 1)
			if !netpoller {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				_, _ = unix.Read(fds[0], buf)
			} else {
				_, _ = r.Read(buf)
			}
			woke <- monotonic()
		}()
		sleepUntil(start, delay)
		sent := monotonic()
		if _, err := unix.Write(fds[1], one); err != nil {
			b.Fatal(err)
		}
		noticed = append(noticed, <-woke-sent)
	}
	b.StopTimer()
	reportNoticed(b, noticed)
}

// BenchmarkWaitForever measures issue 18's "a goroutine waiting forever: ≤ 0.5 % of a
// core": the process's CPU time (user and system, getrusage) over each second in which
// one goroutine waits on a receive that nothing answers, as a percentage of one core.
func BenchmarkWaitForever(b *testing.B) {
	p := newShmPair(b)
	r, err := p.b.TagRecvNbx(make([]byte, 8), 9, ^uint64(0), nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Wait(ctx) }()
	waitParked(b, "ucp.(*Worker).waitRequest", 1, 0)
	reportIdleCPU(b)
	cancel()
	if err := <-done; err != context.Canceled {
		b.Fatalf("the wait ended with %v, want its context's cancellation", err)
	}
}

// sleepUntil returns delay after start: a short delay spins (a timer would sleep far
// longer), a long one sleeps.
func sleepUntil(start, delay time.Duration) {
	if delay >= time.Millisecond {
		time.Sleep(delay - (monotonic() - start))
		return
	}
	for monotonic()-start < delay {
	}
}

// reportNoticed reports the median and p99 of the wake-ups.
func reportNoticed(b *testing.B, noticed []time.Duration) {
	slices.Sort(noticed)
	b.ReportMetric(float64(noticed[len(noticed)/2].Nanoseconds()), "noticed-p50-ns")
	b.ReportMetric(float64(noticed[len(noticed)*99/100].Nanoseconds()), "noticed-p99-ns")
}

func benchLateMessage(b *testing.B, delay time.Duration) {
	p := newShmPair(b)
	in, out := make([]byte, 8), []byte("8 bytes!")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	woke := make(chan time.Duration, 1)
	failed := make(chan error, 1)
	noticed := make([]time.Duration, 0, b.N)
	sendCalls := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r, err := p.b.TagRecvNbx(in, 7, ^uint64(0), nil)
		if err != nil {
			b.Fatal(err)
		}
		start := monotonic()
		go func() {
			if err := r.Wait(ctx); err != nil {
				failed <- err
				return
			}
			woke <- monotonic()
		}()
		sleepUntil(start, delay)
		sent := monotonic()
		s, err := p.epA.TagSendNbx(out, 7, nil)
		if err != nil {
			b.Fatal(err)
		}
		sendCalls = append(sendCalls, monotonic()-sent)
		select {
		case t := <-woke:
			noticed = append(noticed, t-sent)
		case err := <-failed:
			b.Fatal(err)
		}
		if err := s.Wait(ctx); err != nil {
			b.Fatal(err)
		}
		if string(in) != string(out) {
			b.Fatalf("message %d: received %q", i, in)
		}
		clear(in)
	}
	b.StopTimer()
	reportNoticed(b, noticed)
	slices.Sort(sendCalls)
	// The send call itself: signalling the sleeping peer (UCX's wakeup socket) is
	// most of a late message's cost on an idle machine.
	b.ReportMetric(float64(sendCalls[len(sendCalls)/2].Nanoseconds()), "send-call-p50-ns")
}

// BenchmarkProgressThreadIdle measures issue 13's "idle, it parks on the worker's
// event fd: ~0 % CPU with nothing in flight": a target-only worker with
// ProgressThread, connected (shm, tcp) and served one remote atomic, then idle for b.N
// seconds. Reported: the process's CPU over that time, as % of one core. An atomic
// from the peer after the idle time must still land: the thread serves it.
func BenchmarkProgressThreadIdle(b *testing.B) {
	for _, shm := range []bool{true, false} {
		name := "tcp"
		if shm {
			name = "shm"
		}
		b.Run(name, func(b *testing.B) {
			p := addressPair(b, WorkerParams{ProgressThread: true}, shm)
			tg := newTarget(b, p, hostBackend(b), 8, 1)
			targetAdd(b, p, tg)
			time.Sleep(200 * time.Millisecond) // the connection settles (tcp's takes milliseconds more)
			reportIdleCPU(b)
			if got := targetAdd(b, p, tg); got != 1 {
				b.Fatalf("the add after the idle time replaced %d, want 1", got)
			}
		})
	}
}

// reportIdleCPU sleeps b.N seconds on the clock and reports the process's CPU over
// them, as % of one core (cpu-%).
func reportIdleCPU(b *testing.B) {
	b.ResetTimer()
	cpu0, t0 := processCPU(b), time.Now()
	for i := 0; i < b.N; i++ {
		time.Sleep(time.Second)
	}
	cpu, wall := processCPU(b)-cpu0, time.Since(t0)
	b.StopTimer()
	b.ReportMetric(100*cpu.Seconds()/wall.Seconds(), "cpu-%")
}

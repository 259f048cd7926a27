package ucp

import (
	"context"
	"runtime"
	"testing"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/internal/runahead"
	"github.com/ucpx/ucpx/stream"
)

// BenchmarkConditionModes compares, on host streams, four ways for a stream to take part
// in a tag ping-pong (one round trip per op; half-rt-ns is the one-way latency). The
// patterns are those of tests.BenchmarkGPUModes and `ucpx perf --modes`:
//
//	sync      (a) synchronize the stream, post the operations, wait on the host
//	hostfunc  (b) a stream host function performs the blocking round trip (MPIX_*_enqueue style)
//	stream    (c) a Stream condition: the send and the receive in one group
//	              (BeginGroup/EndGroup: one trigger, one completion wait)
//	stream-preenqueued
//	          (c) with every iteration enqueued behind a gate before the clock starts:
//	          the stream's own cost, with no enqueuing thread running beside it
//	kernel    (d) a KernelTriggered condition: one "kernel" goroutine triggers and tests
//	              every iteration (handle values + 2k) while the host arms ahead
func BenchmarkConditionModes(b *testing.B) {
	for _, size := range []int{8, 4096, 65536} {
		for _, mode := range []string{"sync", "hostfunc", "stream", "stream-preenqueued", "kernel"} {
			b.Run(mode+"/"+sizeName(size), func(b *testing.B) { benchMode(b, mode, size) })
		}
	}
}

// benchSetup is what the host-stream benchmarks share: two workers over shared memory
// and a host stream, closed when the benchmark ends.
func benchSetup(b *testing.B) (*pair, stream.Backend, stream.Stream) {
	t := &testing.T{}
	p := newShmPair(t)
	if benchTrace != nil {
		_ = p.a.Trace(benchTrace)
		_ = p.b.Trace(benchTrace)
	}
	backend := stream.NewHostBackend()
	s, err := backend.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = s.Close()
		_ = backend.Close()
		p.close(t)
	})
	return p, backend, s
}

// gateStream holds s back until the returned word is stored 1.
func gateStream(b *testing.B, backend stream.Backend, s stream.Stream) *stream.Word {
	gate, err := backend.AllocWords(1)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = gate.Close() })
	if err := s.WaitValue(gate.Word(0), 1, stream.GEQ); err != nil {
		b.Fatal(err)
	}
	return gate.Word(0)
}

func benchMode(b *testing.B, mode string, size int) {
	p, backend, s := benchSetup(b)
	ctx := context.Background()
	n := b.N
	echoDone := make(chan error, 1)
	go func() { echoDone <- echo(ctx, p, n, size) }()

	out := make([]byte, size)
	in := make([]byte, size)
	b.ResetTimer()
	switch mode {
	case "sync":
		for i := 0; i < n; i++ {
			if err := s.Synchronize(); err != nil {
				b.Fatal(err)
			}
			if err := roundTrip(ctx, p, out, in); err != nil {
				b.Fatal(err)
			}
		}
	case "hostfunc":
		var failed error
		ahead := runahead.New(runahead.StreamWindow) // as stream
		for i := 0; i < n; i++ {
			if err := ahead.Ahead(ctx, i, n); err != nil {
				b.Fatal(err)
			}
			if err := s.LaunchHostFunc(func() {
				if err := roundTrip(ctx, p, out, in); err != nil && failed == nil {
					failed = err
				}
				ahead.Done()
			}); err != nil {
				b.Fatal(err)
			}
		}
		if err := s.Synchronize(); err != nil || failed != nil {
			b.Fatal(err, failed)
		}
	case "stream":
		c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: backend, Stream: s})
		if err != nil {
			b.Fatal(err)
		}
		ahead := runahead.New(runahead.StreamWindow)
		prm := &RequestParam{Condition: c}
		sprm := &RequestParam{Condition: c, Callback: func(*Request) { ahead.Done() }}
		for i := 0; i < n; i++ {
			if err := ahead.Ahead(ctx, i, n); err != nil {
				b.Fatal(err)
			}
			enqueueGroup(b, p, c, out, in, 2, sprm, prm)
		}
		if err := s.Synchronize(); err != nil {
			b.Fatal(err)
		}
		if err := c.Err(); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		_ = c.Destroy()
	case "stream-preenqueued":
		b.StopTimer()
		c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: backend, Stream: s})
		if err != nil {
			b.Fatal(err)
		}
		gate := gateStream(b, backend, s)
		prm := &RequestParam{Condition: c}
		for i := 0; i < n; i++ {
			enqueueGroup(b, p, c, out, in, 2, prm, prm)
		}
		b.StartTimer()
		gate.Store(1)
		if err := s.Synchronize(); err != nil {
			b.Fatal(err)
		}
		if err := c.Err(); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		_ = c.Destroy()
	case "kernel":
		c, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: backend})
		if err != nil {
			b.Fatal(err)
		}
		ahead := runahead.New(runahead.KernelWindow)
		prm := &RequestParam{Condition: c}
		sprm := &RequestParam{Condition: c, Callback: func(*Request) { ahead.Done() }}
		arm := func() error {
			if _, err := p.epA.TagSendNbx(out, 1, sprm); err != nil {
				return err
			}
			_, err := p.a.TagRecvNbx(in, 2, ^uint64(0), prm)
			return err
		}
		if err := arm(); err != nil {
			b.Fatal(err)
		}
		h, err := c.DeviceHandle()
		if err != nil {
			b.Fatal(err)
		}
		kernel := make(chan error, 1)
		go func() { // what ucpx_test_pingpong does on a GPU
			for k := uint64(0); k < uint64(n); k++ {
				it := h
				it.Value += 2 * k
				it.CompletionValue += 2 * k
				if err := condition.Trigger(it); err != nil {
					kernel <- err
					return
				}
				// Yield now and then: on a GPU the kernel takes no CPU from the host
				// goroutine that arms ahead.
				for spins := 1; !condition.Test(it); spins++ {
					if spins%16 == 0 {
						runtime.Gosched()
					}
				}
			}
			kernel <- nil
		}()
		if err := ahead.ArmAhead(ctx, n, arm); err != nil {
			b.Fatal(err)
		}
		if err := <-kernel; err != nil {
			b.Fatal(err)
		}
		if err := c.Err(); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		_ = c.Destroy()
	}
	b.StopTimer()
	if err := <-echoDone; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2, "half-rt-ns")
}

func roundTrip(ctx context.Context, p *pair, out, in []byte) error {
	s, err := p.epA.TagSendNbx(out, 1, nil)
	if err != nil {
		return err
	}
	if err := s.Wait(ctx); err != nil {
		return err
	}
	r, err := p.a.TagRecvNbx(in, 2, ^uint64(0), nil)
	if err != nil {
		return err
	}
	return r.Wait(ctx)
}

// enqueueGroup enqueues one (c) iteration on c: a group of a send of out (tag 1) and a
// receive into in (tag recvTag).
func enqueueGroup(b *testing.B, p *pair, c *condition.Condition, out, in []byte, recvTag uint64, send, recv *RequestParam) {
	if err := c.BeginGroup(); err != nil {
		b.Fatal(err)
	}
	if _, err := p.epA.TagSendNbx(out, 1, send); err != nil {
		b.Fatal(err)
	}
	if _, err := p.a.TagRecvNbx(in, recvTag, ^uint64(0), recv); err != nil {
		b.Fatal(err)
	}
	if err := c.EndGroup(); err != nil {
		b.Fatal(err)
	}
}

// echo answers n messages of tag 1 with tag 2 on p.b.
func echo(ctx context.Context, p *pair, n, size int) error {
	buf := make([]byte, size)
	for i := 0; i < n; i++ {
		r, err := p.b.TagRecvNbx(buf, 1, ^uint64(0), nil)
		if err != nil {
			return err
		}
		if err := r.Wait(ctx); err != nil {
			return err
		}
		s, err := p.epB.TagSendNbx(buf, 2, nil)
		if err != nil {
			return err
		}
		if err := s.Wait(ctx); err != nil {
			return err
		}
	}
	return nil
}

// BenchmarkConditionedEnqueue is the host's cost of one (c) iteration — a group of a
// send and a receive on a Stream condition — with the stream held behind a gate, so
// only the enqueue is timed (allocs/op is per iteration).
func BenchmarkConditionedEnqueue(b *testing.B) {
	p, backend, s := benchSetup(b)
	gate := gateStream(b, backend, s)
	c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: backend, Stream: s})
	if err != nil {
		b.Fatal(err)
	}
	out, in := make([]byte, 8), make([]byte, 8)
	prm := &RequestParam{Condition: c}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		enqueueGroup(b, p, c, out, in, 1, prm, prm)
	}
	b.StopTimer()
	gate.Store(1) // the worker's Close fails what the gate held back
}

package ucp

import (
	"context"
	"testing"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/stream"
)

// BenchmarkConditionModes compares, on host streams, four ways for a stream to take part
// in a tag ping-pong (one round trip per op; half-rt-ns is the one-way latency):
//
//	sync      (a) synchronise the stream, post the operation, wait on the host
//	hostfunc  (b) a stream host function performs the blocking operation (MPIX_*_enqueue style)
//	stream    (c) a Stream condition: stream-ordered trigger and completion through the proxy
//	kernel    (d) a KernelTriggered condition, triggered and tested by the "device" (a goroutine)
func BenchmarkConditionModes(b *testing.B) {
	for _, size := range []int{8, 4096, 65536} {
		for _, mode := range []string{"sync", "hostfunc", "stream", "kernel"} {
			b.Run(mode+"/"+sizeName(size), func(b *testing.B) { benchMode(b, mode, size) })
		}
	}
}

func benchMode(b *testing.B, mode string, size int) {
	t := &testing.T{}
	p := newShmPair(t)
	defer p.close(t)
	backend := stream.NewHostBackend()
	defer backend.Close()
	s, err := backend.NewStream()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
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
		for i := 0; i < n; i++ {
			if err := s.LaunchHostFunc(func() {
				if err := roundTrip(ctx, p, out, in); err != nil && failed == nil {
					failed = err
				}
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
		prm := &RequestParam{Condition: c}
		for i := 0; i < n; i++ {
			if _, err := p.epA.TagSendNbx(out, 1, prm); err != nil {
				b.Fatal(err)
			}
			if _, err := p.a.TagRecvNbx(in, 2, ^uint64(0), prm); err != nil {
				b.Fatal(err)
			}
		}
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
		prm := &RequestParam{Condition: c}
		for i := 0; i < n; i++ {
			// The "kernel" arms a send and a receive, triggers both, and polls completion.
			if _, err := p.epA.TagSendNbx(out, 1, prm); err != nil {
				b.Fatal(err)
			}
			if _, err := p.a.TagRecvNbx(in, 2, ^uint64(0), prm); err != nil {
				b.Fatal(err)
			}
			h, _ := c.DeviceHandle()
			_ = condition.Trigger(h)
			for !condition.Test(h) {
			}
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

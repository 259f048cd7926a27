package tests

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// BenchmarkGPUModes: tag ping-pong between this process and a peer process over shared
// memory, driven from a CUDA stream in four ways, with the floors measured in the same
// run. Every result reports half-rt-us (one-way latency).
//
//	floor-ucx      host ping-pong with Request.Wait (the UCX latency through ucpx)
//	floor-memop    stream memop round trip: the stream writes T, a host goroutine echoes
//	               D, the stream waits D (pre-enqueued)
//	floor-kflag    kernel flag round trip: a kernel writes T, a host goroutine echoes D
//	sync     (a)   synchronise the stream, post the operation, wait on the host
//	hostfunc (b)   a stream host function performs the blocking operation (MPIX_*_enqueue)
//	stream   (c)   Stream condition
//	kernel   (d)   KernelTriggered condition: pre-launched kernels trigger and wait
func BenchmarkGPUModes(b *testing.B) {
	g := requireGPU(b)
	p := spawnPeer(b, "shm")
	for _, size := range []int{8, 4096, 65536, 1 << 20, 64 << 20} {
		for _, mode := range []string{"floor-ucx", "floor-memop", "floor-kflag", "sync", "hostfunc", "stream", "kernel"} {
			if size > 8 && (mode == "floor-memop" || mode == "floor-kflag") {
				continue // size-independent
			}
			b.Run(fmt.Sprintf("%s/%d", mode, size), func(b *testing.B) { gpuMode(b, g, p, mode, size) })
		}
	}
}

// preEnqueue is how much work a benchmark queues behind a closed gate.
const preEnqueue = 256

func gpuMode(b *testing.B, g *gpu, p *peer, mode string, size int) {
	s, err := g.backend.NewStream()
	must(b, err)
	defer s.Close()
	out, err := g.ctx.MemHostAlloc(max(size, 8), cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
	must(b, err)
	defer out.Close()
	in, err := g.ctx.MemHostAlloc(max(size, 8), cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
	must(b, err)
	defer in.Close()
	ob, ib := out.Bytes()[:size], in.Bytes()[:size]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const tag = 77
	roundTrip := func() error {
		r, err := p.w.TagRecvNbx(ib, tag|tagReply, ^uint64(0), nil)
		if err != nil {
			return err
		}
		sr, err := p.ep.TagSendNbx(ob, tag, nil)
		if err == nil {
			err = sr.Wait(ctx)
		}
		if err != nil {
			return err
		}
		return r.Wait(ctx)
	}
	n := b.N
	b.ResetTimer()
	switch mode {
	case "floor-ucx":
		for i := 0; i < n; i++ {
			must(b, roundTrip())
		}
	case "floor-memop", "floor-kflag":
		words, err := g.backend.AllocWords(2)
		must(b, err)
		defer words.Close()
		trig, done := words.Word(0), words.Word(1)
		echoStop := make(chan struct{})
		go func() { // the host side of the flag round trip
			var seen uint64
			for {
				if v := trig.Load(); v != seen {
					seen = v
					done.Store(v)
					continue
				}
				select {
				case <-echoStop:
					return
				default:
				}
			}
		}()
		defer close(echoStop)
		if mode == "floor-memop" {
			b.StopTimer()
			gate, err := g.backend.AllocWords(1)
			must(b, err)
			defer gate.Close()
			// Pre-enqueue a head start behind a gate, then keep enqueueing while the
			// stream runs: a blocked stream accepts only so many memops before the
			// enqueuing call itself blocks (DESIGN §4), so never gate all of them.
			must(b, s.WaitValue(gate.Word(0), 1, stream.GEQ))
			head := min(n, preEnqueue)
			for i := 1; i <= head; i++ {
				must(b, s.WriteValue(trig, uint64(i)))
				must(b, s.WaitValue(done, uint64(i), stream.GEQ))
			}
			b.StartTimer()
			gate.Word(0).Store(1)
			for i := head + 1; i <= n; i++ {
				must(b, s.WriteValue(trig, uint64(i)))
				must(b, s.WaitValue(done, uint64(i), stream.GEQ))
			}
			must(b, s.Synchronize())
		} else {
			cs, _ := stream.CUDAStream(s)
			res, err := g.ctx.MemHostAlloc(16, cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
			must(b, err)
			defer res.Close()
			must(b, cs.LaunchKernel(g.echo, cuda.Linear(1, 1), trig.DevicePtr(), done.DevicePtr(), uint64(0), uint64(n), res.DevicePtr()))
			must(b, s.Synchronize())
		}
	case "sync":
		for i := 0; i < n; i++ {
			must(b, s.Synchronize())
			must(b, roundTrip())
		}
	case "hostfunc":
		var failed error
		for i := 0; i < n; i++ {
			must(b, s.LaunchHostFunc(func() {
				if err := roundTrip(); err != nil && failed == nil {
					failed = err
				}
			}))
		}
		must(b, s.Synchronize())
		must(b, failed)
	case "stream":
		c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: g.backend, Stream: s})
		must(b, err)
		prm := &ucp.RequestParam{Condition: c}
		for i := 0; i < n; i++ {
			_, err := p.ep.TagSendNbx(ob, tag, prm)
			must(b, err)
			_, err = p.w.TagRecvNbx(ib, tag|tagReply, ^uint64(0), prm)
			must(b, err)
		}
		must(b, s.Synchronize())
		b.StopTimer()
		must(b, c.Err())
		must(b, c.Destroy())
	case "kernel":
		b.StopTimer()
		c, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: g.backend})
		must(b, err)
		cs, _ := stream.CUDAStream(s)
		res, err := g.ctx.MemHostAlloc(16, cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
		must(b, err)
		defer res.Close()
		gate, err := g.backend.AllocWords(1)
		must(b, err)
		defer gate.Close()
		must(b, s.WaitValue(gate.Word(0), 1, stream.GEQ))
		prm := &ucp.RequestParam{Condition: c}
		launch := func() {
			_, err := p.ep.TagSendNbx(ob, tag, prm)
			must(b, err)
			_, err = p.w.TagRecvNbx(ib, tag|tagReply, ^uint64(0), prm)
			must(b, err)
			h, err := c.DeviceHandle()
			must(b, err)
			must(b, cs.LaunchKernel(g.handle, cuda.Linear(1, 1), h.Kernel(), res.DevicePtr()))
		}
		head := min(n, preEnqueue)
		for i := 0; i < head; i++ {
			launch()
		}
		b.StartTimer()
		gate.Word(0).Store(1)
		for i := head; i < n; i++ {
			launch()
		}
		must(b, s.Synchronize())
		b.StopTimer()
		must(b, c.Err())
		must(b, c.Destroy())
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n)/2/1000, "half-rt-us")
}

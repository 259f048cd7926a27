package tests

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/device"
	"github.com/ucpx/ucpx/internal/pingpong"
	"github.com/ucpx/ucpx/internal/runahead"
	"github.com/ucpx/ucpx/stream"
)

// BenchmarkGPUModes: tag ping-pong between this process and a peer process over shared
// memory (the peer echoes each message), driven from a CUDA stream in four ways, with
// the floors measured in the same run. Buffers are pinned host memory mapped for the
// device. Every result reports half-rt-us (one-way latency: total time over 2n).
//
//	floor-ucx      host ping-pong with Request.Wait (the UCX latency through ucpx)
//	floor-memop    stream memop round trip: the stream writes T, a host goroutine echoes
//	               D, the stream waits D (pre-enqueued)
//	floor-kflag    kernel flag round trip: a kernel writes T, a host goroutine echoes D
//	sync     (a)   synchronize the stream, post the send and the receive, wait for both
//	               on the host
//	hostfunc (b)   a stream host function posts both and waits for them (the blocking
//	               round trip of MPIX_*_enqueue); the host enqueues at most
//	               runahead.StreamWindow iterations ahead, as in stream
//	stream   (c)   Stream condition: the send and the receive in one group
//	               (BeginGroup/EndGroup: one trigger and one completion wait, enqueued
//	               as one batch memop; MPIX Irecv/Isend/Waitall_enqueue): one
//	               stream-to-proxy round trip per iteration
//	kernel   (d)   KernelTriggered condition: one persistent ucpx_test_pingpong kernel
//	               triggers and waits for every iteration (handle values + 2k) while the
//	               host arms iterations at most runahead.KernelWindow ahead of completion; it also
//	               reports kernel-half-rt-us, the kernel's own %globaltimer measure
//
// mode+work (sizes up to 64 KiB, the range of the targets): each iteration first runs a
// producer on the stream, ucpx_test_fill over the message with one block of 256 threads per 4 KiB
// writing the send buffer, as when kernels produce the data; sync then really waits for
// the GPU. The echo of the last message is checked against the last producer's data.
// kernel has no +work variant: its persistent kernel occupies the stream, so no
// producer kernel can run between its iterations.
func BenchmarkGPUModes(b *testing.B) {
	g := requireGPU(b)
	pingpongKernel, err := g.module.Function(device.KernelPingPong)
	require.NoError(b, err)
	p := spawnPeer(b, "shm")
	// Up to 1 MiB: the echo peer receives at most maxMsg (16 MiB); `ucpx perf --modes
	// --backend cuda` covers 64 MiB.
	for _, size := range []int{8, 4096, 65536, 1 << 20} {
		for _, mode := range []string{"floor-ucx", "floor-memop", "floor-kflag", "sync", "sync+work", "hostfunc", "hostfunc+work", "stream", "stream+work", "kernel"} {
			if size > 8 && (mode == "floor-memop" || mode == "floor-kflag") {
				continue // size-independent
			}
			if size > 65536 && strings.HasSuffix(mode, "+work") {
				continue // a one-block producer over MiBs would measure only itself
			}
			b.Run(fmt.Sprintf("%s/%d", mode, size), func(b *testing.B) { gpuMode(b, g, pingpongKernel, p, mode, size) })
		}
	}
}

// preEnqueue is how much work a benchmark queues behind a closed gate.
const preEnqueue = 256

func gpuMode(b *testing.B, g *gpu, pingpongKernel *cuda.Function, p *peer, mode string, size int) {
	s := g.stream(b)
	cs, _ := stream.CUDAStream(s)
	out := g.mapped(b, max(size, 8))
	in := g.mapped(b, max(size, 8))
	ob, ib := out.Bytes()[:size], in.Bytes()[:size]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const tag = 77
	mode, work := strings.CutSuffix(mode, "+work")
	produce := func(int) {}
	if work {
		produce = func(i int) {
			require.NoError(b, cs.LaunchKernel(g.fill, cuda.Linear(pingpong.ProducerBlocks(size), 256), out.DevicePtr(), uint64(size), pingpong.WorkSeed(i)))
		}
	}
	roundTrip := func() error { // the send first, then the receive, in every mode
		sr, err := p.ep.TagSendNbx(ob, tag, nil)
		if err != nil {
			return err
		}
		r, err := p.w.TagRecvNbx(ib, tag|tagReply, ^uint64(0), nil)
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
			require.NoError(b, roundTrip())
		}
	case "floor-memop", "floor-kflag":
		words, err := g.backend.AllocWords(2)
		require.NoError(b, err)
		defer words.Close()
		trig, done := words.Word(0), words.Word(1)
		defer echoFlag(trig, done)()
		if mode == "floor-memop" {
			b.StopTimer()
			gate, err := g.backend.AllocWords(1)
			require.NoError(b, err)
			defer gate.Close()
			// Pre-enqueue a head start behind a gate, then keep enqueueing while the
			// stream runs: a blocked stream accepts only so many memops before the
			// enqueuing call itself blocks (DESIGN §4), so never gate all of them.
			require.NoError(b, s.WaitValue(gate.Word(0), 1, stream.GEQ))
			head := min(n, preEnqueue)
			for i := 1; i <= head; i++ {
				require.NoError(b, s.WriteValue(trig, uint64(i)))
				require.NoError(b, s.WaitValue(done, uint64(i), stream.GEQ))
			}
			b.StartTimer()
			gate.Word(0).Store(1)
			for i := head + 1; i <= n; i++ {
				require.NoError(b, s.WriteValue(trig, uint64(i)))
				require.NoError(b, s.WaitValue(done, uint64(i), stream.GEQ))
			}
			require.NoError(b, s.Synchronize())
		} else {
			res := g.mapped(b, 16)
			require.NoError(b, cs.LaunchKernel(g.echo, cuda.Linear(1, 1), trig.DevicePtr(), done.DevicePtr(), uint64(0), uint64(n), res.DevicePtr()))
			require.NoError(b, s.Synchronize())
		}
	case "sync":
		for i := 0; i < n; i++ {
			produce(i)
			require.NoError(b, s.Synchronize())
			require.NoError(b, roundTrip())
		}
	case "hostfunc":
		var failed error
		ahead := runahead.New(runahead.StreamWindow) // as stream
		for i := 0; i < n; i++ {
			require.NoError(b, ahead.Ahead(ctx, i, n))
			produce(i)
			require.NoError(b, s.LaunchHostFunc(func() {
				if err := roundTrip(); err != nil && failed == nil {
					failed = err
				}
				ahead.Done()
			}))
		}
		require.NoError(b, s.Synchronize())
		require.NoError(b, failed)
	case "stream":
		c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: g.backend, Stream: s})
		require.NoError(b, err)
		chk := pingpong.NewCheck(size, runahead.StreamWindow)
		sp, rp := chk.Params(c, nil, nil, nil)
		for i := 0; i < n; i++ {
			require.NoError(b, chk.Ahead(ctx, i, n))
			produce(i)
			require.NoError(b, c.BeginGroup())
			_, err := p.ep.TagSendNbx(ob, tag, sp)
			require.NoError(b, err)
			_, err = p.w.TagRecvNbx(ib, tag|tagReply, ^uint64(0), rp)
			require.NoError(b, err)
			require.NoError(b, c.EndGroup())
		}
		require.NoError(b, s.Synchronize())
		b.StopTimer()
		require.NoError(b, chk.Verify(c, n))
		require.NoError(b, c.Destroy())
	case "kernel":
		b.StopTimer()
		c, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: g.backend})
		require.NoError(b, err)
		res := g.mapped(b, 16)
		chk := pingpong.NewCheck(size, runahead.KernelWindow)
		sp, rp := chk.Params(c, nil, nil, nil)
		arm := func() error { // one iteration, two sequence numbers: the send first
			if _, err := p.ep.TagSendNbx(ob, tag, sp); err != nil {
				return err
			}
			_, err := p.w.TagRecvNbx(ib, tag|tagReply, ^uint64(0), rp)
			return err
		}
		require.NoError(b, arm())
		h, err := c.DeviceHandle() // iteration k triggers h.Value+2k, waits h.CompletionValue+2k
		require.NoError(b, err)
		b.StartTimer()
		require.NoError(b, cs.LaunchKernel(pingpongKernel, cuda.Linear(1, 1), h.Kernel(), uint64(n), uint64(2), res.DevicePtr()))
		require.NoError(b, chk.ArmAhead(ctx, n, arm))
		require.NoError(b, s.Synchronize())
		b.StopTimer()
		iters, ns := binary.LittleEndian.Uint64(res.Bytes()), binary.LittleEndian.Uint64(res.Bytes()[8:])
		require.Equal(b, uint64(n), iters, "iterations the ping-pong kernel ran")
		require.NoError(b, chk.Verify(c, n))
		require.NoError(b, c.Destroy())
		b.ReportMetric(float64(ns)/float64(n)/2/1000, "kernel-half-rt-us")
	}
	b.StopTimer()
	if work {
		// The peer echoed the last message: it carries the last producer's data.
		for i, x := range ib {
			if want := device.Pattern(uint64(i), pingpong.WorkSeed(n-1)); x != want { // asserted only where it differs: the buffer is large
				require.Equalf(b, want, x, "echo of the last message: byte %d (the send overtook its producer)", i)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n)/2/1000, "half-rt-us")
}

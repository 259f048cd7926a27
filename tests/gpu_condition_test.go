package tests

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// shmWorkers returns two workers of one process connected over shared memory.
func shmWorkers(t *testing.T) (recvW, sendW *ucp.Worker, toRecv, toSend *ucp.Endpoint) {
	return shmWorkersWith(t, ucp.WorkerParams{})
}

// shmWorkersWith is shmWorkers with the sending worker made with sendParams.
func shmWorkersWith(t *testing.T, sendParams ucp.WorkerParams) (recvW, sendW *ucp.Worker, toRecv, toSend *ucp.Endpoint) {
	t.Helper()
	uctx, err := ucp.NewContext(ucp.ContextParams{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = uctx.Close() })
	recvW, err = uctx.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	sendW, err = uctx.NewWorker(sendParams)
	require.NoError(t, err)
	ra, err := recvW.Address()
	require.NoError(t, err)
	sa, err := sendW.Address()
	require.NoError(t, err)
	toRecv, err = sendW.ConnectAddress(ra, &ucp.EndpointParams{NoPeerErrorHandling: true})
	require.NoError(t, err)
	toSend, err = recvW.ConnectAddress(sa, &ucp.EndpointParams{NoPeerErrorHandling: true})
	require.NoError(t, err)
	return recvW, sendW, toRecv, toSend
}

// The completion scenario MPIX streams get wrong: a receive into device memory enqueued
// on stream S, an event E recorded right after, a second stream waiting on E and
// checksumming on the device. Every checksum must match, and E must not be ready while
// the sender is held back.
func TestGPUStreamOrderedReceiveIntoDeviceMemory(t *testing.T) {
	g := requireGPU(t)
	recvW, _, toRecv, _ := shmWorkers(t)
	s := g.stream(t)
	s2 := g.stream(t)
	ev, err := g.backend.NewEvent()
	require.NoError(t, err)
	defer ev.Close()
	cond, err := condition.Create(condition.Param{Category: condition.Stream, Backend: g.backend, Stream: s})
	require.NoError(t, err)
	defer func() { require.NoError(t, cond.Destroy()) }()

	iters := 100
	sizes := []int{4, 4096, 1 << 20, 16 << 20, 256 << 20}
	if testing.Short() {
		iters, sizes = 10, []int{4, 4096, 1 << 20}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, n := range sizes {
		dev, err := g.ctx.MemAlloc(n)
		require.NoError(t, err)
		// Three host patterns in turn: consecutive iterations always differ.
		var patterns [3][]byte
		var sums [3]uint64
		for i := range patterns {
			patterns[i] = pattern(n, byte(i+n))
			sums[i] = byteSum(patterns[i])
		}
		start := time.Now()
		for it := 0; it < iters; it++ {
			tag := uint64(n)<<8 | uint64(it%256)
			rr, err := recvW.TagRecvNbx(ucp.DeviceBuffer(dev.Ptr(), n), tag, ^uint64(0),
				&ucp.RequestParam{Condition: cond, MemoryType: ucp.MemoryCUDA})
			require.NoError(t, err)
			require.NoError(t, s.Record(ev))
			require.NoError(t, s2.WaitEvent(ev))
			read := g.deviceSum(t, s2, dev.Ptr(), n)
			if it == 0 {
				// Hold the sender back: the event must not be ready meanwhile.
				time.Sleep(200 * time.Millisecond)
				done, err := ev.Query()
				require.NoError(t, err, "size %d: event after the enqueued receive", n)
				require.False(t, done, "size %d: event after the enqueued receive is ready before the data was sent", n)
			}
			sr, err := toRecv.TagSendNbx(patterns[it%3], tag, nil)
			require.NoError(t, err)
			require.NoError(t, sr.Wait(ctx))
			require.NoError(t, s2.Synchronize())
			require.Equal(t, sums[it%3], read(), "size %d iteration %d: device checksum", n, it)
			require.NoError(t, rr.Wait(ctx))
		}
		t.Logf("size %d: %d iterations in %v", n, iters, time.Since(start))
		require.NoError(t, s.Synchronize())
		require.NoError(t, dev.Close())
	}
	require.NoError(t, cond.Err())
}

// An allreduce-like exchange built from sends and receives: two ranks, each with its
// own stream, send their device vector and receive the other's, then checksum it.
func TestGPUExchangeBetweenStreams(t *testing.T) {
	g := requireGPU(t)
	w0, w1, ep01, ep10 := shmWorkers(t)
	const n = 8 << 20
	type rank struct {
		s        stream.Stream
		cond     *condition.Condition
		own, got *cuda.DeviceMemory
		w        *ucp.Worker
		ep       *ucp.Endpoint
		seed     uint32
	}
	ranks := []*rank{{w: w0, seed: 11}, {w: w1, seed: 22}}
	for _, r := range ranks {
		var err error
		r.s, err = g.backend.NewStream()
		require.NoError(t, err)
		defer r.s.Close()
		r.cond, err = condition.Create(condition.Param{Category: condition.Stream, Backend: g.backend, Stream: r.s})
		require.NoError(t, err)
		defer r.cond.Destroy()
		r.own, err = g.ctx.MemAlloc(n)
		require.NoError(t, err)
		defer r.own.Close()
		r.got, err = g.ctx.MemAlloc(n)
		require.NoError(t, err)
		defer r.got.Close()
	}
	// shmWorkers returns (w0, w1, endpoint w1->w0, endpoint w0->w1).
	ranks[0].ep, ranks[1].ep = ep10, ep01
	for it := 0; it < 20; it++ {
		for i, r := range ranks {
			cs, _ := stream.CUDAStream(r.s)
			require.NoError(t, cs.LaunchKernel(g.fill, cuda.Linear(256, 256), r.own.Ptr(), uint64(n), r.seed+uint32(it)))
			prm := &ucp.RequestParam{Condition: r.cond}
			tag := uint64(it)<<1 | uint64(i)
			peerTag := uint64(it)<<1 | uint64(1-i)
			// Rank 0 sends first, rank 1 receives first: no send-send deadlock.
			if i == 0 {
				_, err := r.ep.TagSendNbx(ucp.DeviceBuffer(r.own.Ptr(), n), tag, prm)
				require.NoError(t, err)
				_, err = r.w.TagRecvNbx(ucp.DeviceBuffer(r.got.Ptr(), n), peerTag, ^uint64(0), prm)
				require.NoError(t, err)
			} else {
				_, err := r.w.TagRecvNbx(ucp.DeviceBuffer(r.got.Ptr(), n), peerTag, ^uint64(0), prm)
				require.NoError(t, err)
				_, err = r.ep.TagSendNbx(ucp.DeviceBuffer(r.own.Ptr(), n), tag, prm)
				require.NoError(t, err)
			}
		}
		reads := make([]func() uint64, 2)
		for i, r := range ranks {
			reads[i] = g.deviceSum(t, r.s, r.got.Ptr(), n)
		}
		for i, r := range ranks {
			require.NoError(t, r.s.Synchronize())
			want := fillSum(n, ranks[1-i].seed+uint32(it))
			require.Equal(t, want, reads[i](), "iteration %d rank %d: received checksum", it, i)
			require.NoError(t, r.cond.Err())
		}
	}
}

func fillSum(n int, seed uint32) uint64 {
	var s uint64
	for i := uint64(0); i < uint64(n); i++ {
		s += uint64(byte((i*2654435761 + uint64(seed)) >> 7))
	}
	return s
}

// A kernel triggers a send through its device handle and waits for completion on the
// device; one condition re-armed 500 times.
func TestGPUKernelTriggeredSend500Rearms(t *testing.T) {
	g := requireGPU(t)
	recvW, _, toRecv, _ := shmWorkers(t)
	ks, cs, cond, result := g.kernelTriggered(t)
	resultDev := result.DevicePtr()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	msg := make([]byte, 64)
	in := make([]byte, 64)
	for i := 0; i < 500; i++ {
		binary.LittleEndian.PutUint64(msg, uint64(i))
		sr, err := toRecv.TagSendNbx(msg, uint64(i), &ucp.RequestParam{Condition: cond})
		require.NoError(t, err)
		h, err := cond.DeviceHandle()
		require.NoError(t, err)
		rr, err := recvW.TagRecvNbx(in, uint64(i), ^uint64(0), nil)
		require.NoError(t, err)
		require.NoError(t, cs.LaunchKernel(g.handle, cuda.Linear(1, 1), h.Kernel(), resultDev))
		require.NoError(t, sr.Wait(ctx))
		require.NoError(t, rr.Wait(ctx))
		require.NoError(t, ks.Synchronize())
		r := result.Bytes()
		require.Zero(t, binary.LittleEndian.Uint64(r[0:]), "re-arm %d: ucpx_test saw completion before the trigger", i)
		got := binary.LittleEndian.Uint64(r[8:])
		require.GreaterOrEqualf(t, int64(got-h.CompletionValue), int64(0), // wrap-aware
			"re-arm %d: kernel saw completion word %d, want >= %d", i, got, h.CompletionValue)
		require.Equal(t, uint64(i), binary.LittleEndian.Uint64(in), "re-arm %d: received", i)
	}
	require.NoError(t, cond.Err())
}

// A kernel-triggered receive: the kernel triggers, the data lands in host memory, the
// kernel's wait returns only after it did.
func TestGPUKernelTriggeredReceive(t *testing.T) {
	g := requireGPU(t)
	recvW, _, toRecv, _ := shmWorkers(t)
	ks, cs, cond, result := g.kernelTriggered(t)
	in := make([]byte, 1<<20)
	rr, err := recvW.TagRecvNbx(in, 42, ^uint64(0), &ucp.RequestParam{Condition: cond})
	require.NoError(t, err)
	h, err := cond.DeviceHandle()
	require.NoError(t, err)
	require.NoError(t, cs.LaunchKernel(g.handle, cuda.Linear(1, 1), h.Kernel(), result.DevicePtr()))
	time.Sleep(50 * time.Millisecond)
	done, _ := ks.Query()
	require.False(t, done, "kernel's wait returned before the message was sent")
	src := pattern(len(in), 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sr, err := toRecv.TagSendNbx(src, 42, nil)
	require.NoError(t, err)
	require.NoError(t, sr.Wait(ctx))
	require.NoError(t, rr.Wait(ctx))
	require.NoError(t, ks.Synchronize())
	require.Equal(t, byteSum(src), byteSum(in), "kernel-triggered receive: data differs")
}

// A peer that dies while a CUDA stream waits on one of its receives releases the
// stream: the receive completes with the peer's error, and later stream work runs.
func TestGPUDeadPeerReleasesStream(t *testing.T) {
	g := requireGPU(t)
	p := spawnPeer(t, "tcp")
	s := g.stream(t)
	cond, err := condition.Create(condition.Param{Category: condition.Stream, Backend: g.backend, Stream: s})
	require.NoError(t, err)
	defer cond.Destroy()
	dev, err := g.ctx.MemAlloc(1 << 20)
	require.NoError(t, err)
	defer dev.Close()
	rr, err := p.w.TagRecvNbx(ucp.DeviceBuffer(dev.Ptr(), 1<<20), 0xdead, ^uint64(0), &ucp.RequestParam{Condition: cond, Peer: p.ep})
	require.NoError(t, err)
	ev, err := g.backend.NewEvent()
	require.NoError(t, err)
	defer ev.Close()
	require.NoError(t, s.Record(ev))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	killPeerAndAwait(ctx, t, p, ev, "CUDA stream")
	require.ErrorIs(t, rr.Wait(ctx), ucp.ErrPeerFailed, "request")
	require.ErrorIs(t, cond.Err(), ucp.ErrPeerFailed, "condition")
	_ = p.exit()
}

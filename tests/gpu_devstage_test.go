package tests

import (
	"context"
	"encoding/binary"
	"hash/crc32"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/device"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// TestGPUDeviceStagingWithoutStream: device buffers with ContextParams.Device and no
// stream to stage on — no condition, a KernelTriggered condition fired by a kernel,
// a Graph condition of a CUDA graph — between two contexts of this process over
// shared memory (UCX here cannot touch device memory); 4 B to 8 MiB, crc32 checked.
func TestGPUDeviceStagingWithoutStream(t *testing.T) {
	g := requireGPU(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wa, wb, ep := workerPair(t, ucp.ContextParams{Device: g.backend}, ucp.ContextParams{})

	const max = 8 << 20
	dm, err := g.ctx.MemAlloc(max)
	require.NoError(t, err)
	defer dm.Close()
	host, err := g.ctx.MemHostAlloc(max, cuda.HostAllocPortable)
	require.NoError(t, err)
	defer host.Close()
	s := g.stream(t)
	cs, _ := stream.CUDAStream(s)
	kc, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: g.backend})
	require.NoError(t, err)
	defer func() { require.NoError(t, kc.Destroy()) }()
	result := g.mapped(t, 16)

	devSum := func(n int) uint32 {
		require.NoError(t, cs.MemcpyDtoH(host.Addr(), dm.Ptr(), n))
		require.NoError(t, cs.Synchronize())
		return crc32.ChecksumIEEE(host.Bytes()[:n])
	}
	for _, n := range []int{4, 4096, 1 << 20, max} {
		for _, mode := range []string{"plain", "kernel-triggered"} {
			prm := &ucp.RequestParam{MemoryType: ucp.MemoryCUDA}
			if mode == "kernel-triggered" {
				prm.Condition = kc
			}
			fire := func() {
				if mode == "kernel-triggered" {
					// The test kernel triggers the operation just armed from the GPU.
					h, err := kc.DeviceHandle()
					require.NoError(t, err)
					require.NoError(t, cs.LaunchKernel(g.handle, cuda.Linear(1, 1), h.Kernel(), result.DevicePtr()))
				}
			}
			// Receive into device memory.
			want := pattern(n, byte(n+len(mode)))
			rr, err := wa.TagRecvNbx(ucp.DeviceBuffer(dm.Ptr(), n), 9, ^uint64(0), prm)
			require.NoError(t, err, "%s recv %d", mode, n)
			epB := replyEndpoint(t, wb, wa)
			sr, err := epB.TagSendNbx(want, 9, nil)
			require.NoError(t, err)
			fire()
			require.NoError(t, rr.Wait(ctx), "%s recv %d", mode, n)
			require.NoError(t, sr.Wait(ctx))
			require.Equal(t, crc32.ChecksumIEEE(want), devSum(n), "%s recv of %d bytes into device memory", mode, n)

			// Send from device memory.
			in := make([]byte, n)
			rb, err := wb.TagRecvNbx(in, 10, ^uint64(0), nil)
			require.NoError(t, err)
			sd, err := ep.TagSendNbx(ucp.DeviceBuffer(dm.Ptr(), n), 10, prm)
			require.NoError(t, err, "%s send %d", mode, n)
			fire()
			require.NoError(t, sd.Wait(ctx), "%s send %d", mode, n)
			require.NoError(t, rb.Wait(ctx))
			require.Equal(t, want, in, "%s send of %d bytes from device memory", mode, n)
		}
	}
	require.NotZero(t, wa.StagingStats().Bytes)
}

// replyEndpoint connects b back to a by worker address (cached per pair).
func replyEndpoint(t *testing.T, b, a *ucp.Worker) *ucp.Endpoint {
	t.Helper()
	if ep, ok := replyEPs[b]; ok {
		return ep
	}
	addr, err := a.Address()
	require.NoError(t, err)
	ep, err := b.ConnectAddress(addr, &ucp.EndpointParams{NoPeerErrorHandling: true})
	require.NoError(t, err)
	replyEPs[b] = ep
	return ep
}

var replyEPs = map[*ucp.Worker]*ucp.Endpoint{}

// TestGPUDeviceStagingCaptured: tag send and receive of device buffers captured into
// CUDA graphs (a fill kernel, then the send; the receive, then a checksum kernel),
// relaunched 50 times: each launch's operation is issued by the engine, the receive
// staged through the context's device and the message pulled into its device buffer
// (the receiver has no endpoint to the sender: it makes one from the descriptor), and
// the receiver's running checksum equals the sum of every launch's data.
func TestGPUDeviceStagingCaptured(t *testing.T) {
	g := requireGPU(t)
	wa, wb, ep := workerPair(t, ucp.ContextParams{Device: g.backend}, ucp.ContextParams{Device: g.backend})
	var err error

	const n, launches = 64 << 10, 50
	src, err := g.ctx.MemAlloc(n)
	require.NoError(t, err)
	defer src.Close()
	dst, err := g.ctx.MemAlloc(n)
	require.NoError(t, err)
	defer dst.Close()
	words, err := g.ctx.MemAlloc(16) // [0]: the launch count (seed), [1]: the running checksum
	require.NoError(t, err)
	defer words.Close()
	tick, err := g.module.Function(device.KernelTick)
	require.NoError(t, err)
	fill, err := g.module.Function(device.KernelFillAt)
	require.NoError(t, err)

	capture := func(build func(s stream.Stream, cs *cuda.Stream)) *cuda.GraphExec {
		s := g.stream(t)
		cs, _ := stream.CUDAStream(s)
		require.NoError(t, cs.MemsetD8(words.Ptr(), 0, 16))
		require.NoError(t, cs.Synchronize())
		require.NoError(t, cs.BeginCapture(cuda.CaptureRelaxed))
		build(s, cs)
		gr, err := cs.EndCapture()
		require.NoError(t, err)
		t.Cleanup(func() { _ = gr.Close() })
		gx, err := gr.Instantiate(0)
		require.NoError(t, err)
		t.Cleanup(func() { _ = gx.Close() })
		return gx
	}
	var sendCond, recvCond *condition.Condition
	sendX := capture(func(s stream.Stream, cs *cuda.Stream) {
		sendCond, err = condition.Create(condition.Param{Category: condition.Stream, Backend: g.backend, Stream: s})
		require.NoError(t, err)
		require.NoError(t, cs.LaunchKernel(tick, cuda.Linear(1, 1), words.Ptr()))
		require.NoError(t, cs.LaunchKernel(fill, cuda.Linear(64, 256), src.Ptr(), uint64(n), uint64(0), words.Ptr()))
		_, err := ep.TagSendNbx(ucp.DeviceBuffer(src.Ptr(), n), 12, &ucp.RequestParam{Condition: sendCond, MemoryType: ucp.MemoryCUDA})
		require.NoError(t, err, "a captured send of device memory")
	})
	defer func() { _ = sendCond.Destroy() }()
	recvX := capture(func(s stream.Stream, cs *cuda.Stream) {
		recvCond, err = condition.Create(condition.Param{Category: condition.Stream, Backend: g.backend, Stream: s})
		require.NoError(t, err)
		_, err := wb.TagRecvNbx(ucp.DeviceBuffer(dst.Ptr(), n), 12, ^uint64(0), &ucp.RequestParam{Condition: recvCond, MemoryType: ucp.MemoryCUDA})
		require.NoError(t, err, "a captured receive into device memory")
		require.NoError(t, cs.LaunchKernel(g.checksum, cuda.Linear(64, 256), dst.Ptr(), uint64(n), words.Ptr()+8))
	})
	defer func() { _ = recvCond.Destroy() }()

	ls, err := g.ctx.NewStream(cuda.StreamNonBlocking, 0)
	require.NoError(t, err)
	defer ls.Close()
	lr, err := g.ctx.NewStream(cuda.StreamNonBlocking, 0)
	require.NoError(t, err)
	defer lr.Close()
	for range launches {
		// Sender first: CUDA does not see the order a memop wait in the receiver's
		// graph creates between graphs of one context (ARCHITECTURE, graph conditions).
		require.NoError(t, sendX.Launch(ls))
		require.NoError(t, recvX.Launch(lr))
		require.NoError(t, ls.Synchronize())
		require.NoError(t, lr.Synchronize())
	}
	host, err := g.ctx.MemHostAlloc(16, cuda.HostAllocPortable)
	require.NoError(t, err)
	defer host.Close()
	require.NoError(t, ls.MemcpyDtoH(host.Addr(), words.Ptr(), 16))
	require.NoError(t, ls.Synchronize())
	require.EqualValues(t, launches, binary.LittleEndian.Uint64(host.Bytes()), "launches of the sender graph")
	var want uint64
	for seed := 1; seed <= launches; seed++ {
		for i := range n {
			want += uint64(device.Pattern(uint64(i), uint32(seed)))
		}
	}
	require.Equal(t, want, binary.LittleEndian.Uint64(host.Bytes()[8:]), "the receiver's checksum over every launch")
	require.Zero(t, wa.StagingStats().Bytes, "pulled: the sender staged nothing")
}

// workerPair makes two contexts of this process (a and b) with a worker each that a
// progress thread drives, and a's endpoint to b over shared memory.
func workerPair(t *testing.T, a, b ucp.ContextParams) (wa, wb *ucp.Worker, ep *ucp.Endpoint) {
	t.Helper()
	ua, err := ucp.NewContext(a)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ua.Close() })
	ub, err := ucp.NewContext(b)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ub.Close() })
	wa, err = ua.NewWorker(ucp.WorkerParams{ProgressThread: true})
	require.NoError(t, err)
	wb, err = ub.NewWorker(ucp.WorkerParams{ProgressThread: true})
	require.NoError(t, err)
	addrB, err := wb.Address()
	require.NoError(t, err)
	ep, err = wa.ConnectAddress(addrB, &ucp.EndpointParams{NoPeerErrorHandling: true})
	require.NoError(t, err)
	return wa, wb, ep
}

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

const kernelStatus = "ucpx_test_status" // (h Handle, result *u64): trigger, wait, result = {ucpx_status(h), completion}

// A peer killed over shared memory while a kernel waits on a receive from it and CUDA
// streams wait on stream-ordered receives from it: the kernel is released and reads the
// failure in the status word (ucpx_status), and every stream is released within 100 ms.
func TestGPUTrustKilledPeerStatusReachesKernel(t *testing.T) {
	g := requireGPU(t)
	status := g.kernel(t, kernelStatus)
	w, ep, cmd := spawnSleeper(t)
	ks, cs, cond, result := g.kernelTriggered(t)
	rr, err := w.TagRecvNbx(make([]byte, 4096), 0xbad, ^uint64(0), &ucp.RequestParam{Condition: cond, Peer: ep})
	require.NoError(t, err)
	h, err := cond.DeviceHandle()
	require.NoError(t, err)
	require.NoError(t, cs.LaunchKernel(status, cuda.Linear(1, 1), h.Kernel(), result.DevicePtr()))

	var streams []stream.Stream
	for i := 0; i < 3; i++ {
		s := g.stream(t)
		c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: g.backend, Stream: s})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Destroy() })
		dev, err := g.ctx.MemAlloc(1 << 16)
		require.NoError(t, err)
		t.Cleanup(func() { _ = dev.Close() })
		_, err = w.TagRecvNbx(ucp.DeviceBuffer(dev.Ptr(), 1<<16), uint64(0xb00+i), ^uint64(0), &ucp.RequestParam{Condition: c, Peer: ep})
		require.NoError(t, err)
		streams = append(streams, s)
	}
	streams = append(streams, ks)
	time.Sleep(50 * time.Millisecond)
	done, _ := ks.Query()
	require.False(t, done, "the kernel's wait returned before the peer died")

	killed := time.Now()
	require.NoError(t, cmd.Process.Kill())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var worst time.Duration
	for _, s := range streams {
		for {
			done, err := s.Query()
			require.NoError(t, err)
			if done {
				break
			}
			require.NoError(t, ctx.Err(), "a CUDA stream stayed blocked after the peer died")
			w.Progress()
		}
		worst = max(worst, time.Since(killed))
	}
	t.Logf("every CUDA stream released %v after the peer was killed", worst)
	require.Less(t, worst, 100*time.Millisecond)
	require.ErrorIs(t, rr.Wait(ctx), ucp.ErrPeerFailed)
	words := result.Bytes()
	require.Equal(t, h.CompletionValue, binary.LittleEndian.Uint64(words[0:]), "ucpx_status in the kernel")
	require.Equal(t, h.CompletionValue, binary.LittleEndian.Uint64(words[8:]), "completion word")
	done, opErr := cond.StatusAt(h.CompletionValue)
	require.True(t, done)
	require.ErrorIs(t, opErr, ucp.ErrPeerFailed)
}

// condition.Param.Timeout on a kernel-triggered receive nobody answers: the kernel is
// released and ucpx_status reports the failure; a later operation that succeeds reads 0.
func TestGPUTrustTimeoutStatus(t *testing.T) {
	g := requireGPU(t)
	status := g.kernel(t, kernelStatus)
	recvW, _, toRecv, _ := shmWorkers(t)
	result := g.mapped(t, 16)
	s := g.stream(t)
	cs, _ := stream.CUDAStream(s)
	cond, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: g.backend, Timeout: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, cond.Destroy()) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	rr, err := recvW.TagRecvNbx(make([]byte, 64), 0x71, ^uint64(0), &ucp.RequestParam{Condition: cond})
	require.NoError(t, err)
	h, err := cond.DeviceHandle()
	require.NoError(t, err)
	require.NoError(t, cs.LaunchKernel(status, cuda.Linear(1, 1), h.Kernel(), result.DevicePtr()))
	require.ErrorIs(t, rr.Wait(ctx), condition.ErrTimedOut)
	require.NoError(t, s.Synchronize())
	require.Equal(t, h.CompletionValue, binary.LittleEndian.Uint64(result.Bytes()), "ucpx_status after a timeout")

	in := make([]byte, 64)
	rr, err = recvW.TagRecvNbx(in, 0x72, ^uint64(0), &ucp.RequestParam{Condition: cond})
	require.NoError(t, err)
	h, err = cond.DeviceHandle()
	require.NoError(t, err)
	require.NoError(t, cs.LaunchKernel(status, cuda.Linear(1, 1), h.Kernel(), result.DevicePtr()))
	sr, err := toRecv.TagSendNbx(pattern(64, 1), 0x72, nil)
	require.NoError(t, err)
	require.NoError(t, sr.Wait(ctx))
	require.NoError(t, rr.Wait(ctx))
	require.NoError(t, s.Synchronize())
	got := binary.LittleEndian.Uint64(result.Bytes())
	require.True(t, got == 0 || got < h.CompletionValue, "ucpx_status %d for a clean operation %d", got, h.CompletionValue)
}

package tests

import (
	"context"
	"hash/crc32"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
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
	ua, err := ucp.NewContext(ucp.ContextParams{Device: g.backend})
	require.NoError(t, err)
	defer ua.Close()
	ub, err := ucp.NewContext(ucp.ContextParams{})
	require.NoError(t, err)
	defer ub.Close()
	wa, err := ua.NewWorker(ucp.WorkerParams{ProgressThread: true})
	require.NoError(t, err)
	wb, err := ub.NewWorker(ucp.WorkerParams{ProgressThread: true})
	require.NoError(t, err)
	addrB, err := wb.Address()
	require.NoError(t, err)
	ep, err := wa.ConnectAddress(addrB, &ucp.EndpointParams{NoPeerErrorHandling: true})
	require.NoError(t, err)

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

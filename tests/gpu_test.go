package tests

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/device"
	"github.com/ucpx/ucpx/internal/testenv/streamenv"
	"github.com/ucpx/ucpx/stream"
)

// gpu is what a GPU test needs: the CUDA backend, its context and the test kernels.
type gpu struct {
	backend  stream.Backend
	ctx      *cuda.Context
	module   *cuda.Module
	checksum *cuda.Function
	fill     *cuda.Function
	handle   *cuda.Function
	echo     *cuda.Function
}

// requireGPU opens the CUDA backend and loads the test kernels, skipping or failing
// as testenv.RequireGPU does (UCPX_REQUIRE_GPU=1, set by the GPU bundle's run.sh, turns
// skips into failures); it also fails where the PTX was never generated.
func requireGPU(t testing.TB) *gpu {
	t.Helper()
	b := streamenv.CUDABackend(t)
	ctx, _, _ := stream.CUDAContext(b)
	ptx := device.TestKernelsPTX()
	require.False(t, device.IsPlaceholder(ptx), "device/ptx/test_kernels.ptx is the placeholder: run scripts/ptx.sh where nvcc exists")
	g := &gpu{backend: b, ctx: ctx}
	var err error
	g.module, err = ctx.LoadModule(ptx)
	require.NoError(t, err, "load PTX")
	t.Cleanup(func() { _ = g.module.Close() })
	for name, f := range map[string]**cuda.Function{device.KernelChecksum: &g.checksum, device.KernelFill: &g.fill, device.KernelHandle: &g.handle, device.KernelEcho: &g.echo} {
		*f, err = g.module.Function(name)
		require.NoError(t, err, "kernel %s", name)
	}
	return g
}

// deviceSum checksums n bytes of device memory on s (after whatever s waits for) into
// pinned host memory, and returns a function that reads it once s is synchronized.
func (g *gpu) deviceSum(t testing.TB, s stream.Stream, buf uintptr, n int) func() uint64 {
	t.Helper()
	cs, ok := stream.CUDAStream(s)
	require.True(t, ok, "not a CUDA stream")
	out, err := g.ctx.MemAlloc(8)
	require.NoError(t, err)
	host, err := g.ctx.MemHostAlloc(8, cuda.HostAllocPortable)
	require.NoError(t, err)
	require.NoError(t, cs.MemsetD8(out.Ptr(), 0, 8))
	blocks := uint32(min(1024, (n+255)/256))
	require.NoError(t, cs.LaunchKernel(g.checksum, cuda.Linear(max(blocks, 1), 256), buf, uint64(n), out.Ptr()))
	require.NoError(t, cs.MemcpyDtoH(host.Addr(), out.Ptr(), 8))
	return func() uint64 {
		v := binary.LittleEndian.Uint64(host.Bytes())
		_ = out.Close()
		_ = host.Close()
		return v
	}
}

func byteSum(b []byte) uint64 {
	var s uint64
	for _, x := range b {
		s += uint64(x)
	}
	return s
}

// mapped allocates n bytes of pinned host memory mapped into the device (the GPU tests'
// message buffers and result words), freed when the test ends.
func (g *gpu) mapped(t testing.TB, n int) *cuda.HostMemory {
	t.Helper()
	m, err := g.ctx.MemHostAlloc(n, cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// stream makes a stream of the CUDA backend, closed when the test ends.
func (g *gpu) stream(t testing.TB) stream.Stream {
	t.Helper()
	s, err := g.backend.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// kernelTriggered makes what the kernel-triggered tests share: a stream (and its
// CUstream), a KernelTriggered condition and 16 bytes of mapped memory for the test
// kernel's result, all released when the test ends (the condition first).
func (g *gpu) kernelTriggered(t testing.TB) (stream.Stream, *cuda.Stream, *condition.Condition, *cuda.HostMemory) {
	t.Helper()
	result := g.mapped(t, 16)
	s := g.stream(t)
	cs, _ := stream.CUDAStream(s)
	cond, err := condition.Create(condition.Param{Category: condition.KernelTriggered, Backend: g.backend})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, cond.Destroy()) })
	return s, cs, cond, result
}

// killPeerAndAwait tells p to die and waits, until ctx ends, for the work recorded in
// ev: a stream blocked on one of the peer's operations must be released. what names
// the blocked work in the messages.
func killPeerAndAwait(ctx context.Context, t testing.TB, p *peer, ev stream.Event, what string) {
	t.Helper()
	require.NoError(t, send(ctx, p.ep, nil, tagDie))
	start := time.Now()
	for {
		done, err := ev.Query()
		require.NoError(t, err)
		if done {
			break
		}
		require.NoErrorf(t, ctx.Err(), "%s still blocked %v after the peer was told to die", what, time.Since(start))
		time.Sleep(time.Millisecond)
	}
	t.Logf("%s released %v after the peer was told to die", what, time.Since(start))
}

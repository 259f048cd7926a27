package tests

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/device"
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

// requireGPU skips where there is no CUDA driver or device, and fails where a driver is
// present but unusable, lacks a feature ucpx needs, or the PTX was never generated.
// UCPX_REQUIRE_GPU=1 (set by the GPU bundle's run.sh) turns skips into failures.
func requireGPU(t testing.TB) *gpu {
	t.Helper()
	skip := t.Skipf
	if os.Getenv("UCPX_REQUIRE_GPU") == "1" {
		skip = t.Fatalf
	}
	if err := cuda.Load(); err != nil {
		if errors.Is(err, cuda.ErrNoDriver) {
			skip("no GPU: %v", err)
		}
		t.Fatalf("CUDA driver present but unusable: %v", err)
	}
	b, err := stream.Open(stream.CUDA)
	if err != nil {
		t.Fatalf("CUDA backend: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	ctx, caps, _ := stream.CUDAContext(b)
	if !caps.StreamMemOps64 || !caps.MapHostMemory {
		t.Fatalf("device lacks 64-bit stream memops or host-mapped memory: %+v", caps)
	}
	ptx := device.TestKernelsPTX()
	if device.IsPlaceholder(ptx) {
		t.Fatal("device/ptx/test_kernels.ptx is the placeholder: run scripts/ptx.sh where nvcc exists")
	}
	g := &gpu{backend: b, ctx: ctx}
	if g.module, err = ctx.LoadModule(ptx); err != nil {
		t.Fatalf("load PTX: %v", err)
	}
	t.Cleanup(func() { _ = g.module.Close() })
	for name, f := range map[string]**cuda.Function{device.KernelChecksum: &g.checksum, device.KernelFill: &g.fill, device.KernelHandle: &g.handle, device.KernelEcho: &g.echo} {
		if *f, err = g.module.Function(name); err != nil {
			t.Fatalf("kernel %s: %v", name, err)
		}
	}
	return g
}

// deviceSum checksums n bytes of device memory on s (after whatever s waits for) into
// pinned host memory, and returns a function that reads it once s is synchronized.
func (g *gpu) deviceSum(t testing.TB, s stream.Stream, buf uintptr, n int) func() uint64 {
	t.Helper()
	cs, ok := stream.CUDAStream(s)
	if !ok {
		t.Fatal("not a CUDA stream")
	}
	out, err := g.ctx.MemAlloc(8)
	must(t, err)
	host, err := g.ctx.MemHostAlloc(8, cuda.HostAllocPortable)
	must(t, err)
	must(t, cs.MemsetD8(out.Ptr(), 0, 8))
	blocks := uint32(min(1024, (n+255)/256))
	must(t, cs.LaunchKernel(g.checksum, cuda.Linear(max(blocks, 1), 256), buf, uint64(n), out.Ptr()))
	must(t, cs.MemcpyDtoH(host.Addr(), out.Ptr(), 8))
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
	must(t, err)
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// stream makes a stream of the CUDA backend, closed when the test ends.
func (g *gpu) stream(t testing.TB) stream.Stream {
	t.Helper()
	s, err := g.backend.NewStream()
	must(t, err)
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
	must(t, err)
	t.Cleanup(func() { must(t, cond.Destroy()) })
	return s, cs, cond, result
}

// killPeerAndAwait tells p to die and waits, until ctx ends, for the work recorded in
// ev: a stream blocked on one of the peer's operations must be released. what names
// the blocked work in the messages.
func killPeerAndAwait(ctx context.Context, t testing.TB, p *peer, ev stream.Event, what string) {
	t.Helper()
	must(t, send(ctx, p.ep, nil, tagDie))
	start := time.Now()
	for {
		done, err := ev.Query()
		must(t, err)
		if done {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%s still blocked %v after the peer was told to die", what, time.Since(start))
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("%s released %v after the peer was told to die", what, time.Since(start))
}

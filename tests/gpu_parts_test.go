package tests

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/ucp"
)

// RMA on device buffers larger than protocol.DefaultStagingPart is staged and moved in parts that
// pipeline with the staging copies. A put from device memory must land whole in the
// peer's region, and a get into device memory must be complete for the kernel enqueued
// right after it on the same stream (no host synchronisation in between), for sizes
// that split evenly and unevenly.
func TestGPUStagedRMAInParts(t *testing.T) {
	g := requireGPU(t)
	const maxSize = 3*protocol.DefaultStagingPart + 12345
	ep, region, rkey := rmaTarget(t, maxSize)

	s := g.stream(t)
	cond, err := condition.Create(condition.Param{Category: condition.Stream, Backend: g.backend, Stream: s})
	require.NoError(t, err)
	defer func() { require.NoError(t, cond.Destroy()) }()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	for _, n := range []int{protocol.DefaultStagingPart + 1, 2 * protocol.DefaultStagingPart, maxSize} {
		want := pattern(n, byte(n))
		src, err := g.ctx.MemAlloc(n)
		require.NoError(t, err)
		dst, err := g.ctx.MemAlloc(n)
		require.NoError(t, err)
		staging := g.mapped(t, n)
		copy(staging.Bytes(), want)
		require.NoError(t, s.Copy(src.Ptr(), staging.Addr(), n))
		require.NoError(t, s.Synchronize())
		clear(region.Bytes())

		start := time.Now()
		prm := &ucp.RequestParam{Condition: cond, MemoryType: ucp.MemoryCUDA}
		pr, err := ep.PutNbx(ucp.DeviceBuffer(src.Ptr(), n), rkey.Base(), rkey, prm)
		require.NoError(t, err)
		fr, err := ep.FlushNbx(&ucp.RequestParam{Condition: cond})
		require.NoError(t, err)
		gr, err := ep.GetNbx(ucp.DeviceBuffer(dst.Ptr(), n), rkey.Base(), rkey, prm)
		require.NoError(t, err)
		read := g.deviceSum(t, s, dst.Ptr(), n) // after the get, in stream order only
		require.NoError(t, s.Synchronize())
		elapsed := time.Since(start)
		for _, r := range []*ucp.Request{pr, fr, gr} {
			require.NoError(t, r.Wait(ctx))
		}
		require.True(t, bytes.Equal(region.Bytes()[:n], want), "%d bytes: the peer's region differs from what was put", n) // not Equal: no multi-MiB diff
		require.Equal(t, byteSum(want), read(), "%d bytes: device checksum after the get", n)
		t.Logf("%d bytes in %d parts: put, flush and get in %v", n, (n+protocol.DefaultStagingPart-1)/protocol.DefaultStagingPart, elapsed)
		require.NoError(t, src.Close())
		require.NoError(t, dst.Close())
	}
	require.NoError(t, cond.Err())
}

// BenchmarkGPUStagedPut: a stream-ordered put of 64 MiB from device memory (staged, in
// parts of protocol.DefaultStagingPart) against its two stages measured alone in the same run: the
// device-to-host copy into pinned memory, and the put of pinned host memory. Moved
// whole, the staged put would take their sum; the parts overlap them.
func BenchmarkGPUStagedPut(b *testing.B) {
	g := requireGPU(b)
	const n = 64 << 20
	ep, _, rkey := rmaTarget(b, n)
	uctx := ep.Worker().Context()
	src, err := g.ctx.MemAlloc(n)
	require.NoError(b, err)
	defer src.Close()
	pinned := g.mapped(b, n)
	hostSrc, err := uctx.MemMapPtr(pinned.Addr(), n, ucp.MemoryHost)
	require.NoError(b, err)
	defer hostSrc.Close()
	s, err := g.backend.NewStream()
	require.NoError(b, err)
	defer s.Close()
	ctx := context.Background()

	b.Run("copy-dtoh", func(b *testing.B) {
		b.SetBytes(n)
		for i := 0; i < b.N; i++ {
			require.NoError(b, s.Copy(pinned.Addr(), src.Ptr(), n))
			require.NoError(b, s.Synchronize())
		}
	})
	b.Run("put-pinned", func(b *testing.B) {
		b.SetBytes(n)
		for i := 0; i < b.N; i++ {
			r, err := ep.PutNbx(pinned.Bytes(), rkey.Base(), rkey, &ucp.RequestParam{MemH: hostSrc})
			require.NoError(b, err)
			f, err := ep.FlushNbx(nil)
			require.NoError(b, err)
			require.NoError(b, r.Wait(ctx))
			require.NoError(b, f.Wait(ctx))
		}
	})
	b.Run("put-device-parts", func(b *testing.B) {
		cond, err := condition.Create(condition.Param{Category: condition.Stream, Backend: g.backend, Stream: s})
		require.NoError(b, err)
		b.SetBytes(n)
		for i := 0; i < b.N; i++ {
			r, err := ep.PutNbx(ucp.DeviceBuffer(src.Ptr(), n), rkey.Base(), rkey, &ucp.RequestParam{Condition: cond, MemoryType: ucp.MemoryCUDA})
			require.NoError(b, err)
			f, err := ep.FlushNbx(&ucp.RequestParam{Condition: cond})
			require.NoError(b, err)
			require.NoError(b, s.Synchronize())
			require.NoError(b, r.Wait(ctx))
			require.NoError(b, f.Wait(ctx))
		}
		b.StopTimer()
		require.NoError(b, cond.Destroy())
	})
}

// rmaTarget connects two workers of one context over shared memory and returns the
// origin's endpoint, a registered region of n bytes on the target and its rkey, all
// closed when the test ends.
func rmaTarget(t testing.TB, n int) (*ucp.Endpoint, *ucp.MemH, *ucp.Rkey) {
	t.Helper()
	uctx, err := ucp.NewContext(ucp.ContextParams{})
	require.NoError(t, err)
	target, err := uctx.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	origin, err := uctx.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	addr, err := target.Address()
	require.NoError(t, err)
	ep, err := origin.ConnectAddress(addr, &ucp.EndpointParams{NoPeerErrorHandling: true})
	require.NoError(t, err)
	region, err := uctx.MemAlloc(n)
	require.NoError(t, err)
	packed, err := region.PackRkey()
	require.NoError(t, err)
	rkey, err := ep.UnpackRkey(packed)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = rkey.Close()
		_ = region.Close()
		_ = ep.Close()
		_ = origin.Close()
		_ = target.Close()
		_ = uctx.Close()
	})
	return ep, region, rkey
}

package tests

import (
	"hash/crc32"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/internal/testenv"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/ucp"
)

// Device buffers under the workspace policy on a CUDA stream: a put and a get of
// 4 MiB through a 1 MiB workspace stream through it in parts (stats: parts, waits, the
// high-water mark within the workspace) with the bytes intact; StageNever on a device
// buffer fails at the call where UCX has no CUDA transport; StageAlways stages pinned
// host memory that would move as is.
func TestGPUStagingPolicy(t *testing.T) {
	g := requireGPU(t)
	ws, err := protocol.NewWorkspace(g.backend, 1<<20)
	require.NoError(t, err)
	p := newStagingPair(t, protocol.Config{Workspace: ws})
	t.Cleanup(func() { require.NoError(t, ws.Close()) }) // after the context (cleanups run last first)
	s := g.stream(t)
	cond, err := condition.Create(condition.Param{Category: condition.Stream, Backend: g.backend, Stream: s})
	require.NoError(t, err)
	defer func() { require.NoError(t, cond.Destroy()) }()
	cs, err := g.ctx.NewStream(cuda.StreamNonBlocking, 0)
	require.NoError(t, err)
	defer cs.Close()

	const n = 4 << 20
	host, err := g.ctx.MemHostAlloc(n, 0)
	require.NoError(t, err)
	defer host.Close()
	src, err := g.ctx.MemAlloc(n)
	require.NoError(t, err)
	defer src.Close()
	dst, err := g.ctx.MemAlloc(n)
	require.NoError(t, err)
	defer dst.Close()
	copy(host.Bytes(), randomBytes(n))
	want := crc32.ChecksumIEEE(host.Bytes())
	require.NoError(t, cs.MemcpyHtoD(src.Ptr(), host.Addr(), n))
	require.NoError(t, cs.Synchronize())

	remote, rkey := p.remoteRegion(t, n)

	direct := p.ctx.SupportsMemoryType(ucp.MemoryCUDA)
	dev := &ucp.RequestParam{Condition: cond, MemoryType: ucp.MemoryCUDA}
	pr, err := p.ab.PutNbx(ucp.DeviceBuffer(src.Ptr(), n), rkey.Base(), rkey, dev)
	require.NoError(t, err)
	p.waitReqs(t, pr)
	fr, err := p.ab.FlushNbx(nil)
	require.NoError(t, err)
	p.waitReqs(t, fr)
	require.Equal(t, want, crc32.ChecksumIEEE(remote.Bytes()[:n]), "put")
	gr, err := p.ab.GetNbx(ucp.DeviceBuffer(dst.Ptr(), n), rkey.Base(), rkey, dev)
	require.NoError(t, err)
	p.waitReqs(t, gr)
	require.NoError(t, s.Synchronize()) // the copies in run in stream order
	clear(host.Bytes())
	require.NoError(t, cs.MemcpyDtoH(host.Addr(), dst.Ptr(), n))
	require.NoError(t, cs.Synchronize())
	require.Equal(t, want, crc32.ChecksumIEEE(host.Bytes()), "get")
	st := p.a.StagingStats()
	t.Logf("stats %+v (UCX CUDA transport: %v)", st, direct)
	if !direct {
		parts := uint64(n / ws.SlotSize())
		require.Equal(t, 2*parts, st.Parts, "both directions in slot-sized parts")
		require.EqualValues(t, 2*n, st.Bytes)
		require.NotZero(t, st.Waits, "4 MiB through 512 KiB halves")
		require.LessOrEqual(t, st.HighWater, uint64(ws.Size()))
	}

	// StageNever on a device buffer: refused at the call without a direct path.
	never := &ucp.RequestParam{Condition: cond, MemoryType: ucp.MemoryCUDA, Staging: protocol.StageNever}
	r, err := p.ab.PutNbx(ucp.DeviceBuffer(src.Ptr(), n), rkey.Base(), rkey, never)
	if direct {
		require.NoError(t, err)
		p.waitReqs(t, r)
	} else {
		require.ErrorIs(t, err, ucp.ErrUnsupported)
		require.Nil(t, r)
		require.Equal(t, st, p.a.StagingStats(), "nothing staged")
	}

	// StageAlways stages pinned host memory (a direct path) too.
	pinned, err := g.ctx.MemHostAlloc(1<<16, cuda.HostAllocPortable)
	require.NoError(t, err)
	defer pinned.Close()
	copy(pinned.Bytes(), randomBytes(1<<16))
	before := p.a.StagingStats().Bytes
	r, err = p.ab.PutNbx(pinned.Bytes(), rkey.Base(), rkey, &ucp.RequestParam{Condition: cond, Staging: protocol.StageAlways})
	require.NoError(t, err)
	p.waitReqs(t, r)
	fr, err = p.ab.FlushNbx(nil)
	require.NoError(t, err)
	p.waitReqs(t, fr)
	require.Equal(t, crc32.ChecksumIEEE(pinned.Bytes()), crc32.ChecksumIEEE(remote.Bytes()[:1<<16]))
	require.EqualValues(t, 1<<16, p.a.StagingStats().Bytes-before)
}

// TestStagingUnderFakeDriver runs TestGPUStagingPolicy against the fake driver (a CPU
// emulation of libcuda), so CI exercises device staging through a workspace.
func TestStagingUnderFakeDriver(t *testing.T) {
	testenv.RunUnderFakeDriver(t, []string{"TestGPUStagingPolicy"})
}

package condition

import (
	"bytes"
	"os"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/internal/testenv"
	"github.com/ucpx/ucpx/internal/testenv/streamenv"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream"
)

// envFaultChild marks the child process TestStagingFaultsUnderFakeDriver runs: only
// there is the fake driver told to refuse host functions (FAKECUDA_HOSTFUNC_ERROR).
const envFaultChild = "UCPX_TEST_CONDITION_FAULT_CHILD"

// TestStagingFaultsUnderFakeDriver runs the staging fault tests against the fake driver,
// which can be made to refuse cuLaunchHostFunc.
func TestStagingFaultsUnderFakeDriver(t *testing.T) {
	testenv.RunUnderFakeDriver(t, []string{"TestFakeDriverStagingGiveBackRefused"}, envFaultChild+"=1")
}

// A staged device receive on a CUDA stream whose driver refuses the host function that
// gives the staging buffer back after the copy in: the data lands, and the buffer goes
// back when Destroy has synchronized the stream (it leaked, one buffer per refusal).
func TestFakeDriverStagingGiveBackRefused(t *testing.T) {
	if os.Getenv(envFaultChild) == "" {
		t.Skip("run by TestStagingFaultsUnderFakeDriver against the fake driver")
	}
	b := streamenv.CUDABackend(t)
	ctx, _, ok := stream.CUDAContext(b)
	require.True(t, ok)
	s, err := b.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	c, err := Create(Param{Category: Stream, Backend: b, Stream: s})
	require.NoError(t, err)
	e, err := NewEngine(idleTransport{}, protocol.Config{}, false)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })

	const n = 8 << 10
	dev, err := ctx.MemAlloc(n)
	require.NoError(t, err)
	defer dev.Close()
	host, err := ctx.MemHostAlloc(n, 0)
	require.NoError(t, err)
	defer host.Close()
	want := bytes.Repeat([]byte{0x5a}, n)

	t.Setenv("FAKECUDA_HOSTFUNC_ERROR", "801") // CUDA_ERROR_NOT_SUPPORTED
	var o Op
	buf := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(nil), dev.Ptr())), n)
	err = e.Submit(&o, c, &instant{data: want}, Submission{What: "recv", Transfer: protocol.Transfer{Buf: buf, Dir: protocol.In}})
	require.ErrorIs(t, err, cuda.ErrNotSupported)
	require.True(t, o.Submitted(), "the receive is armed: only the give-back was refused")
	require.True(t, o.plan.Staged(), "a device buffer is staged")
	waitOp(t, &o)
	require.NoError(t, s.Synchronize())
	require.Equal(t, 1, e.planner.Lent(), "nothing has told the condition that the stream passed the copy in")
	require.NoError(t, os.Unsetenv("FAKECUDA_HOSTFUNC_ERROR"))

	cs, ok := stream.CUDAStream(s)
	require.True(t, ok)
	require.NoError(t, cs.MemcpyDtoH(host.Addr(), dev.Ptr(), n))
	require.NoError(t, cs.Synchronize())
	require.Equal(t, want, host.Bytes()[:n], "the copy in")
	require.NoError(t, c.Destroy())
	require.Equal(t, 0, e.planner.Lent(), "the staging buffer never came back")
}

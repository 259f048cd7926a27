package cuda_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/device"
)

func TestModuleKernels(t *testing.T) {
	ctx := newContext(t)
	s := newStream(t, ctx)
	m := testModule(t, ctx)
	fill := function(t, m, device.KernelFill)
	sum := function(t, m, device.KernelChecksum)
	assert.Equal(t, device.KernelFill, fill.Name(), "function name")
	assert.NotZero(t, fill.Handle(), "function handle")
	_, err := m.Function("ucpx_no_such_kernel")
	require.ErrorIs(t, err, cuda.ErrNotFound)

	const n = 1<<20 + 13
	const seed = 7
	buf := devMem(t, ctx, n)
	out := devMem(t, ctx, 8)
	host := hostMem(t, ctx, n, 0)

	require.NoError(t, s.LaunchKernel(fill, cuda.Linear(64, 256), buf.Ptr(), uint64(n), uint32(seed)))
	require.NoError(t, s.MemsetD32(out.Ptr(), 0, 2))
	require.NoError(t, s.LaunchKernel(sum, cuda.Linear(32, 128), buf.Ptr(), uint64(n), out.Ptr()))
	require.NoError(t, s.MemcpyDtoH(host.Addr(), buf.Ptr(), n))
	require.NoError(t, s.MemcpyDtoH(host.Addr(), out.Ptr(), 8)) // overwrites the first 8 bytes with the sum
	syncWithin(t, s, 10*time.Second)
	var want uint64
	b := host.Bytes()
	for i := uint64(0); i < n; i++ {
		want += uint64(device.Pattern(i, seed))
	}
	// The first 8 bytes hold the checksum.
	requireEach(t, n-8, func(i int) byte { return device.Pattern(uint64(i+8), seed) }, func(i int) byte { return b[i+8] }, "filled byte 8+")
	require.Equal(t, want, *(*uint64)(host.Ptr()), "checksum")

	// Bad launches fail at the call.
	require.ErrorIs(t, s.LaunchKernel(fill, cuda.LaunchConfig{Grid: cuda.Dim3{1, 1, 1}}), cuda.ErrInvalidValue)
	assert.Error(t, s.LaunchKernel(fill, cuda.Linear(1, 4096), buf.Ptr(), uint64(n), uint32(1)), "a block of 4096 threads was accepted")
	require.NoError(t, s.Synchronize())

	require.NoError(t, m.Close())
	require.ErrorIs(t, m.Close(), cuda.ErrInvalidHandle)
	require.ErrorIs(t, s.LaunchKernel(fill, cuda.Linear(1, 1), buf.Ptr(), uint64(1), uint32(1)), cuda.ErrInvalidHandle)
	_, err = m.Function(device.KernelFill)
	require.ErrorIs(t, err, cuda.ErrInvalidHandle)
}

func TestModuleBadImage(t *testing.T) {
	ctx := newContext(t)
	_, err := ctx.LoadModule([]byte("this is not PTX, nor a cubin"))
	require.Error(t, err, "garbage image loaded")
	assert.Truef(t, errorsIsAny(err, cuda.ErrInvalidPTX, cuda.ErrInvalidImage, cuda.ErrInvalidValue),
		"garbage image: %v, want ErrInvalidPTX, ErrInvalidImage or ErrInvalidValue", err)
	bad := []byte(`.version 7.0
.target sm_75
.address_size 64
.visible .entry ucpx_bad()
{
	.reg .b32 %r<2>;
	mov.u32 %r1, this_is_not_an_instruction;
	ret;
}
`)
	_, err = ctx.LoadModule(bad)
	require.ErrorIs(t, err, cuda.ErrInvalidPTX)
	assert.Contains(t, err.Error(), "JIT log", "error lacks the JIT log")
	assert.Contains(t, strings.ToLower(err.Error()), "error", "error lacks the JIT log")
	t.Logf("bad PTX: %v", err)
	_, err = ctx.LoadModule(nil)
	require.ErrorIs(t, err, cuda.ErrInvalidValue)
	_, err = ctx.LoadModule([]byte{0, 0})
	require.ErrorIs(t, err, cuda.ErrInvalidValue)
}

func errorsIsAny(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// TestKernelEcho: a kernel triggers a host-mapped word and waits for the host's
// echo, 1000 times; then again from a nonzero base.
func TestKernelEcho(t *testing.T) {
	ctx := newContext(t)
	s := newStream(t, ctx)
	m := testModule(t, ctx)
	k := function(t, m, device.KernelEcho)
	const T, D, R0, R1 = 0, 1, 2, 3
	w := newWords(t, ctx, 4)
	e := startEcho(w, T, D)
	defer e.Stop()

	const n = 1000
	require.NoError(t, s.LaunchKernel(k, cuda.Linear(1, 1), w.dev(T), w.dev(D), uint64(0), uint64(n), w.dev(R0)))
	syncWithin(t, s, 20*time.Second)
	require.Equal(t, [3]uint64{n, n, n}, [3]uint64{w.load(T), w.load(D), w.load(R0)}, "T, D, iterations")
	t.Logf("kernel-measured round trip: %.2f µs", float64(w.load(R1))/n/1000)

	require.NoError(t, s.LaunchKernel(k, cuda.Linear(1, 1), w.dev(T), w.dev(D), uint64(n), uint64(10), w.dev(R0)))
	syncWithin(t, s, 5*time.Second)
	require.Equal(t, [2]uint64{n + 10, 10}, [2]uint64{w.load(T), w.load(R0)}, "second launch: T, iterations")
}

// TestKernelDeviceHandle passes ucpx_device_handle by value and drives
// ucpx_trigger / ucpx_test / ucpx_wait from the host side.
func TestKernelDeviceHandle(t *testing.T) {
	ctx := newContext(t)
	s := newStream(t, ctx)
	m := testModule(t, ctx)
	k := function(t, m, device.KernelHandle)
	const T, D, R0, R1 = 0, 1, 2, 3
	w := newWords(t, ctx, 4)
	w.store(R0, 99)
	h := device.Handle{Trigger: uint64(w.dev(T)), Value: 5, Completion: uint64(w.dev(D)), CompletionValue: 7}
	require.EqualValues(t, 32, unsafe.Sizeof(h), "device.Handle's size")
	require.NoError(t, s.LaunchKernel(k, cuda.Linear(1, 1), h, w.dev(R0)))
	defer w.store(D, 7)
	eventually(t, 5*time.Second, "the kernel's trigger", func() bool { return w.load(T) == 5 })
	require.Zero(t, w.load(R0), "ucpx_test before completion returned")
	time.Sleep(blockedFor)
	done, _ := s.Query()
	require.False(t, done, "ucpx_wait returned before completion")
	w.store(D, 6) // not yet
	time.Sleep(blockedFor)
	done, _ = s.Query()
	require.False(t, done, "ucpx_wait returned below the completion value")
	w.store(D, 7)
	syncWithin(t, s, 5*time.Second)
	require.Equal(t, uint64(7), w.load(R1), "completion the kernel saw")
}

func TestGraphKernelNode(t *testing.T) {
	ctx := newContext(t)
	s := newStream(t, ctx)
	m := testModule(t, ctx)
	fill := function(t, m, device.KernelFill)
	const n = 65536
	buf := devMem(t, ctx, n)
	host := hostMem(t, ctx, n, 0)
	g, err := ctx.NewGraph()
	require.NoError(t, err)
	defer g.Close()
	kn, err := g.AddKernelNode(nil, fill, cuda.Linear(16, 256), buf.Ptr(), uint64(n), uint32(3))
	require.NoError(t, err)
	_, err = g.AddMemcpyNode([]cuda.Node{kn}, host.Addr(), buf.Ptr(), n)
	require.NoError(t, err)
	x, err := g.Instantiate(0)
	require.NoError(t, err)
	defer x.Close()
	for i := 0; i < 2; i++ {
		clear(host.Bytes())
		require.NoError(t, x.Launch(s))
		syncWithin(t, s, 5*time.Second)
		got := host.Bytes()
		requireEach(t, n, func(j int) byte { return device.Pattern(uint64(j), 3) }, func(j int) byte { return got[j] },
			fmt.Sprintf("launch %d: byte", i))
	}
	// Functions of a closed module cannot be added to graphs.
	require.NoError(t, x.Close())
	require.NoError(t, m.Close())
	_, err = g.AddKernelNode(nil, fill, cuda.Linear(1, 1), buf.Ptr(), uint64(1), uint32(1))
	require.ErrorIs(t, err, cuda.ErrInvalidHandle)
}

// TestLaunchCopy: the signal module's copy kernel through LaunchCopy moves a head, a
// 16-byte body and a tail; bad arguments fail at the call; under capture
// LaunchCopyUncaptured enqueues nothing.
func TestLaunchCopy(t *testing.T) {
	ctx := newContext(t)
	s := newStream(t, ctx)
	m, err := ctx.LoadModule(device.SignalKernelsPTX())
	require.NoError(t, err)
	defer m.Close()
	k := function(t, m, device.KernelCopy)
	const n = 1<<20 + 7
	src := devMem(t, ctx, n+64)
	dst := devMem(t, ctx, n+64)
	host := hostMem(t, ctx, n+64, 0)
	b := host.Bytes()
	for i := range b {
		b[i] = byte(i*13 + i>>10)
	}
	want := append([]byte(nil), b...)
	require.NoError(t, s.MemcpyHtoD(src.Ptr(), host.Addr(), n+64))
	require.NoError(t, s.MemsetD8(dst.Ptr(), 0, n+64))
	// Offsets 3 and 19: equal modulo 16, neither aligned.
	require.NoError(t, s.LaunchCopy(k, 64, 256, dst.Ptr()+19, src.Ptr()+3, n))
	require.NoError(t, s.MemcpyDtoH(host.Addr(), dst.Ptr(), n+64))
	syncWithin(t, s, 10*time.Second)
	requireEach(t, 19, func(int) byte { return 0 }, func(i int) byte { return b[i] }, "before the copy")
	requireEach(t, n, func(i int) byte { return want[3+i] }, func(i int) byte { return b[19+i] }, "copied byte")
	requireEach(t, 64-19, func(int) byte { return 0 }, func(i int) byte { return b[19+n+i] }, "after the copy")

	require.ErrorIs(t, s.LaunchCopy(k, 0, 256, dst.Ptr(), src.Ptr(), 8), cuda.ErrInvalidValue, "grid 0")
	require.ErrorIs(t, s.LaunchCopy(k, 1, 0, dst.Ptr(), src.Ptr(), 8), cuda.ErrInvalidValue, "block 0")
	require.ErrorIs(t, s.LaunchCopy(k, 1, 32, dst.Ptr(), src.Ptr(), 0), cuda.ErrInvalidValue, "0 bytes")
	require.ErrorIs(t, s.LaunchCopy(k, 1, 32, 0, src.Ptr(), 8), cuda.ErrInvalidValue, "nil dst")

	require.NoError(t, s.BeginCapture(cuda.CaptureThreadLocal))
	st, err := s.LaunchCopyUncaptured(k, 1, 32, dst.Ptr(), src.Ptr(), 8)
	require.NoError(t, err)
	require.Equal(t, cuda.CaptureActive, st)
	g, err := s.EndCapture()
	require.NoError(t, err)
	defer g.Close()
	nodes, err := g.Nodes()
	require.NoError(t, err)
	require.Empty(t, nodes, "nothing captured")
	st, err = s.LaunchCopyUncaptured(k, 1, 32, dst.Ptr(), src.Ptr(), 8)
	require.NoError(t, err)
	require.Equal(t, cuda.CaptureNone, st)
	require.NoError(t, s.Synchronize())
}

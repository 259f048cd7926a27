package cuda_test

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/device"
)

func TestModuleKernels(t *testing.T) {
	ctx := newContext(t)
	s := newStream(t, ctx)
	m := testModule(t, ctx)
	fill := function(t, m, device.KernelFill)
	sum := function(t, m, device.KernelChecksum)
	if fill.Name() != device.KernelFill || fill.Handle() == 0 {
		t.Error("function name or handle")
	}
	_, err := m.Function("ucpx_no_such_kernel")
	mustIs(t, err, cuda.ErrNotFound)

	const n = 1<<20 + 13
	const seed = 7
	buf := devMem(t, ctx, n)
	out := devMem(t, ctx, 8)
	host := hostMem(t, ctx, n, 0)

	must(t, s.LaunchKernel(fill, cuda.Linear(64, 256), buf.Ptr(), uint64(n), uint32(seed)))
	must(t, s.MemsetD32(out.Ptr(), 0, 2))
	must(t, s.LaunchKernel(sum, cuda.Linear(32, 128), buf.Ptr(), uint64(n), out.Ptr()))
	must(t, s.MemcpyDtoH(host.Addr(), buf.Ptr(), n))
	must(t, s.MemcpyDtoH(host.Addr(), out.Ptr(), 8)) // overwrites the first 8 bytes with the sum
	syncWithin(t, s, 10*time.Second)
	var want uint64
	b := host.Bytes()
	for i := uint64(0); i < n; i++ {
		p := device.Pattern(i, seed)
		want += uint64(p)
		if i >= 8 && b[i] != p {
			t.Fatalf("byte %d = %#x, want %#x", i, b[i], p)
		}
	}
	if got := *(*uint64)(host.Ptr()); got != want {
		t.Fatalf("checksum %d, want %d", got, want)
	}

	// Bad launches fail at the call.
	mustIs(t, s.LaunchKernel(fill, cuda.LaunchConfig{Grid: cuda.Dim3{1, 1, 1}}), cuda.ErrInvalidValue)
	if err := s.LaunchKernel(fill, cuda.Linear(1, 4096), buf.Ptr(), uint64(n), uint32(1)); err == nil {
		t.Error("a block of 4096 threads was accepted")
	}
	must(t, s.Synchronize())

	must(t, m.Close())
	mustIs(t, m.Close(), cuda.ErrInvalidHandle)
	mustIs(t, s.LaunchKernel(fill, cuda.Linear(1, 1), buf.Ptr(), uint64(1), uint32(1)), cuda.ErrInvalidHandle)
	_, err = m.Function(device.KernelFill)
	mustIs(t, err, cuda.ErrInvalidHandle)
}

func TestModuleBadImage(t *testing.T) {
	ctx := newContext(t)
	_, err := ctx.LoadModule([]byte("this is not PTX, nor a cubin"))
	if err == nil {
		t.Fatal("garbage image loaded")
	}
	if !errorsIsAny(err, cuda.ErrInvalidPTX, cuda.ErrInvalidImage, cuda.ErrInvalidValue) {
		t.Errorf("garbage image: %v", err)
	}
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
	mustIs(t, err, cuda.ErrInvalidPTX)
	if !strings.Contains(err.Error(), "JIT log") || !strings.Contains(strings.ToLower(err.Error()), "error") {
		t.Errorf("error lacks the JIT log: %v", err)
	}
	t.Logf("bad PTX: %v", err)
	_, err = ctx.LoadModule(nil)
	mustIs(t, err, cuda.ErrInvalidValue)
	_, err = ctx.LoadModule([]byte{0, 0})
	mustIs(t, err, cuda.ErrInvalidValue)
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
	must(t, s.LaunchKernel(k, cuda.Linear(1, 1), w.dev(T), w.dev(D), uint64(0), uint64(n), w.dev(R0)))
	syncWithin(t, s, 20*time.Second)
	if w.load(T) != n || w.load(D) != n || w.load(R0) != n {
		t.Fatalf("T=%d D=%d iterations=%d", w.load(T), w.load(D), w.load(R0))
	}
	t.Logf("kernel-measured round trip: %.2f µs", float64(w.load(R1))/n/1000)

	must(t, s.LaunchKernel(k, cuda.Linear(1, 1), w.dev(T), w.dev(D), uint64(n), uint64(10), w.dev(R0)))
	syncWithin(t, s, 5*time.Second)
	if w.load(T) != n+10 || w.load(R0) != 10 {
		t.Fatalf("second launch: T=%d iterations=%d", w.load(T), w.load(R0))
	}
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
	if unsafe.Sizeof(h) != 32 {
		t.Fatalf("device.Handle is %d bytes", unsafe.Sizeof(h))
	}
	must(t, s.LaunchKernel(k, cuda.Linear(1, 1), h, w.dev(R0)))
	defer w.store(D, 7)
	eventually(t, 5*time.Second, "the kernel's trigger", func() bool { return w.load(T) == 5 })
	if w.load(R0) != 0 {
		t.Fatalf("ucpx_test before completion returned %d", w.load(R0))
	}
	time.Sleep(blockedFor)
	if done, _ := s.Query(); done {
		t.Fatal("ucpx_wait returned before completion")
	}
	w.store(D, 6) // not yet
	time.Sleep(blockedFor)
	if done, _ := s.Query(); done {
		t.Fatal("ucpx_wait returned below the completion value")
	}
	w.store(D, 7)
	syncWithin(t, s, 5*time.Second)
	if w.load(R1) != 7 {
		t.Fatalf("kernel saw completion %d", w.load(R1))
	}
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
	must(t, err)
	defer g.Close()
	kn, err := g.AddKernelNode(nil, fill, cuda.Linear(16, 256), buf.Ptr(), uint64(n), uint32(3))
	must(t, err)
	_, err = g.AddMemcpyNode([]cuda.Node{kn}, host.Addr(), buf.Ptr(), n)
	must(t, err)
	x, err := g.Instantiate(0)
	must(t, err)
	defer x.Close()
	for i := 0; i < 2; i++ {
		clear(host.Bytes())
		must(t, x.Launch(s))
		syncWithin(t, s, 5*time.Second)
		for j, b := range host.Bytes() {
			if b != device.Pattern(uint64(j), 3) {
				t.Fatalf("launch %d byte %d = %#x", i, j, b)
			}
		}
	}
	// Functions of a closed module cannot be added to graphs.
	must(t, x.Close())
	must(t, m.Close())
	_, err = g.AddKernelNode(nil, fill, cuda.Linear(1, 1), buf.Ptr(), uint64(1), uint32(1))
	mustIs(t, err, cuda.ErrInvalidHandle)
}

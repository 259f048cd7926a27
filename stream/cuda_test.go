package stream

// Tests of the CUDA backend. They skip where the machine has no GPU (set
// UCPX_REQUIRE_GPU=1 to make that a failure) and fail where a driver is present but
// the backend cannot open: testenv.RequireGPU decides.

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/internal/testenv"
)

// newCUDABackend opens the CUDA backend of device 0 for the test (closed at its end),
// after testenv.RequireGPU.
func newCUDABackend(t testing.TB) Backend {
	t.Helper()
	testenv.RequireGPU(t)
	b, err := openCUDA(0)
	require.NoError(t, err, "openCUDA")
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func newCUDAStream(t testing.TB, b Backend) Stream {
	t.Helper()
	s, err := b.NewStream()
	require.NoError(t, err)
	require.Equal(t, KindCUDA, s.Kind())
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func syncSoon(t testing.TB, s Stream) { syncWithin(t, s, soon) }

// syncWithin fails the test if s is still busy after d: a hang detector, generous
// where the work is long (the fake driver emulates memop waits on a loaded machine).
func syncWithin(t testing.TB, s Stream, d time.Duration) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- s.Synchronize() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(d):
		require.FailNow(t, "stream still busy")
	}
}

// TestCUDAOpenWithoutDriver runs where there is no driver: every way in reports
// cuda.ErrNoDriver and Auto falls back to the host backend.
func TestCUDAOpenWithoutDriver(t *testing.T) {
	if cuda.Load() == nil {
		t.Skip("a CUDA driver is present")
	}
	_, err := openCUDA(0)
	require.ErrorIs(t, err, cuda.ErrNoDriver)
	_, err = Open(CUDA)
	require.ErrorIs(t, err, cuda.ErrNoDriver)
	require.ErrorIs(t, err, ErrNotSupported)
	b, err := Open(Auto)
	require.NoError(t, err)
	require.Equal(t, KindHost, b.Kind())
	require.NoError(t, b.Close())
	_, err = WrapCUDAStream(0x1234)
	require.ErrorIs(t, err, cuda.ErrNoDriver)
}

func TestCUDABackendBasics(t *testing.T) {
	b := newCUDABackend(t)
	require.Equal(t, KindCUDA, b.Kind())
	_, _, ok := CUDAContext(b)
	require.True(t, ok)
	s := newCUDAStream(t, b)
	require.NotZero(t, s.Handle())
	cs, ok := CUDAStream(s)
	require.True(t, ok)
	require.Equal(t, s.Handle(), cs.Handle())

	wb, err := b.AllocWords(4)
	require.NoError(t, err)
	defer wb.Close()
	for i := 0; i < wb.Len(); i++ {
		w := wb.Word(i)
		require.Equal(t, KindCUDA, w.Kind())
		require.NotZero(t, w.DevicePtr())
		require.Zero(t, w.Load())
	}
	require.NoError(t, s.WriteValue(wb.Word(0), 7))
	require.NoError(t, s.WriteValue(wb.Word(1), math.MaxUint64-1))
	syncSoon(t, s)
	require.Equal(t, uint64(7), wb.Word(0).Load())
	require.Equal(t, uint64(math.MaxUint64-1), wb.Word(1).Load())
	done, err := s.Query()
	require.NoError(t, err)
	require.True(t, done)
	_, err = b.AllocWords(0)
	require.ErrorIs(t, err, ErrInvalidArgument)
}

func TestCUDAWaitValueCompare(t *testing.T) {
	b := newCUDABackend(t)
	_, caps, _ := CUDAContext(b)
	s := newCUDAStream(t, b)
	wb, err := b.AllocWords(2)
	require.NoError(t, err)
	defer wb.Close()
	w, marker := wb.Word(0), wb.Word(1)
	cases := []struct {
		cmp                      Compare
		value, blocked, released uint64
	}{
		{GEQ, 10, 9, 10},
		{GEQ, 2, math.MaxUint64, 2}, // wrap-aware
		{GEQ, 1 << 40, 1<<40 - 1, 1 << 41},
		{EQ, 7, 8, 7},
		{AND, 0b100, 0b011, 0b110},
		{NOR, ^uint64(0xf), 0xf, 0x7},
	}
	for _, c := range cases {
		if c.cmp == NOR && !caps.WaitValueNOR {
			require.ErrorIs(t, s.WaitValue(w, c.value, NOR), ErrNotSupported)
			continue
		}
		require.False(t, c.cmp.Holds(c.blocked, c.value), "%v", c)
		require.True(t, c.cmp.Holds(c.released, c.value), "%v", c)
		requireWaitBlocks(t, s, w, marker, c.blocked, c.released, func() error { return s.WaitValue(w, c.value, c.cmp) },
			fmt.Sprintf("%v %d", c.cmp, c.value))
	}
	require.ErrorIs(t, s.WaitValue(w, 1, Compare(4)), ErrInvalidArgument)
}

// requireWaitBlocks stores blocked into w, enqueues the wait (wait) and a write of 1 to
// marker after it, checks that the stream holds back the write, then stores released
// and checks that the stream runs on.
func requireWaitBlocks(t *testing.T, s Stream, w, marker *Word, blocked, released uint64, wait func() error, what string) {
	t.Helper()
	w.Store(blocked)
	marker.Store(0)
	require.NoError(t, wait())
	require.NoError(t, s.WriteValue(marker, 1))
	time.Sleep(never)
	done, err := s.Query()
	require.NoError(t, err)
	held := !done && marker.Load() == 0
	w.Store(released) // before failing too: the stream must not stay blocked
	require.Truef(t, held, "%s did not block on %d", what, blocked)
	syncSoon(t, s)
	require.Equal(t, uint64(1), marker.Load())
}

// PollValue holds back later work until the word reaches the value (wrap-aware GEQ),
// through the signal kernel: the kernels must load where there is a GPU.
func TestCUDAPollValue(t *testing.T) {
	b := newCUDABackend(t)
	s := newCUDAStream(t, b)
	wb, err := b.AllocWords(2)
	require.NoError(t, err)
	defer wb.Close()
	w, marker := wb.Word(0), wb.Word(1)
	for _, c := range []struct{ value, blocked, released uint64 }{
		{10, 9, 10},
		{2, math.MaxUint64, 3}, // wrap-aware
		{1 << 40, 1<<40 - 1, 1 << 41},
	} {
		requireWaitBlocks(t, s, w, marker, c.blocked, c.released, func() error { return s.PollValue(w, c.value) },
			fmt.Sprintf("PollValue(%d)", c.value))
	}
	_, err = b.(*cudaBackend).pollKernel()
	require.NoError(t, err, "the signal kernels did not load: PollValue fell back to memop waits")
}

// Ring makes the GPU look again at pending waits; it must never release a wait whose
// value is not reached, and may be called from any goroutine.
func TestCUDARing(t *testing.T) {
	b := newCUDABackend(t)
	s := newCUDAStream(t, b)
	wb, err := b.AllocWords(2)
	require.NoError(t, err)
	w, marker := wb.Word(0), wb.Word(1)
	requireWaitBlocks(t, s, w, marker, 0, 1, func() error {
		if err := s.WaitValue(w, 1, GEQ); err != nil {
			return err
		}
		return wb.Ring() // rung while the value is not there: the wait holds
	}, "WaitValue rung early")

	// Stores each rung from one of several goroutines at once: the stream sees every
	// value, in order.
	const n, ringers = 200, 4
	for i := uint64(2); i <= n; i++ {
		require.NoError(t, s.WaitValue(w, i, GEQ))
		require.NoError(t, s.WriteValue(marker, i))
	}
	errs := make(chan error, ringers)
	var next atomic.Uint64
	next.Store(1)
	for range ringers {
		go func() {
			for {
				v := next.Add(1)
				if v > n {
					errs <- nil
					return
				}
				for w.Load() != v-1 { // one store at a time, in order
					runtime.Gosched()
				}
				w.Store(v)
				if err := wb.Ring(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for range ringers {
		require.NoError(t, <-errs)
	}
	syncSoon(t, s)
	require.Equal(t, uint64(n), marker.Load())

	require.NoError(t, wb.Close())
	require.NoError(t, wb.Ring(), "a freed block has nothing to ring")
}

func TestCUDAWordArguments(t *testing.T) {
	b := newCUDABackend(t)
	s := newCUDAStream(t, b)
	require.ErrorIs(t, s.WriteValue(nil, 1), ErrInvalidArgument)
	require.ErrorIs(t, s.WaitValue(nil, 1, GEQ), ErrInvalidArgument)
	require.ErrorIs(t, s.WriteValue(&Word{}, 1), ErrInvalidArgument)
	require.ErrorIs(t, s.WaitValue(&Word{}, 1, EQ), ErrInvalidArgument)
	require.ErrorIs(t, s.LaunchHostFunc(nil), ErrInvalidArgument)

	host := NewHostBackend()
	defer host.Close()
	hw, err := host.AllocWords(1)
	require.NoError(t, err)
	defer hw.Close()
	require.ErrorIs(t, s.WriteValue(hw.Word(0), 1), ErrWrongBackend)
	require.ErrorIs(t, s.WaitValue(hw.Word(0), 1, GEQ), ErrWrongBackend)

	closed, err := b.AllocWords(1)
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	require.ErrorIs(t, closed.Close(), ErrClosed)
	require.ErrorIs(t, s.WriteValue(closed.Word(0), 1), ErrClosed)
	require.ErrorIs(t, s.WaitValue(closed.Word(0), 1, GEQ), ErrClosed)

	// A CUDA word also works on a host stream (it is ordinary host memory too).
	ok, err := b.AllocWords(1)
	require.NoError(t, err)
	defer ok.Close()
	hs, err := host.NewStream()
	require.NoError(t, err)
	defer hs.Close()
	require.NoError(t, hs.WriteValue(ok.Word(0), 5))
	require.NoError(t, hs.Synchronize())
	require.Equal(t, uint64(5), ok.Word(0).Load())
}

func TestCUDAHostFuncOrder(t *testing.T) {
	b := newCUDABackend(t)
	s := newCUDAStream(t, b)
	wb, err := b.AllocWords(1)
	require.NoError(t, err)
	defer wb.Close()
	w := wb.Word(0)
	var mu sync.Mutex
	var seen []uint64
	for k := uint64(1); k <= 200; k++ {
		require.NoError(t, s.WriteValue(w, k))
		require.NoError(t, s.LaunchHostFunc(func() {
			mu.Lock()
			seen = append(seen, w.Load())
			mu.Unlock()
		}))
	}
	syncSoon(t, s)
	require.Len(t, seen, 200)
	for i, v := range seen {
		require.Equal(t, uint64(i+1), v, "callback %d saw the word at %d", i+1, v)
	}
}

// TestCUDAChannelRoundTrip is DESIGN.md §4's stream channel on a GPU stream: the
// stream writes T=k, a proxy goroutine answers D=k, the stream waits D>=k.
func TestCUDAChannelRoundTrip(t *testing.T) {
	b := newCUDABackend(t)
	s := newCUDAStream(t, b)
	wb, err := b.AllocWords(2)
	require.NoError(t, err)
	defer wb.Close()
	T, D := wb.Word(0), wb.Word(1)
	const n = 1000
	var stop atomic.Bool
	defer stop.Store(true)
	go func() {
		for k := uint64(1); k <= n && !stop.Load(); {
			if T.Load() >= k {
				D.Store(k)
				k++
			} else {
				runtime.Gosched() // the stream's host funcs need a P too
			}
		}
	}()
	var completed atomic.Uint64
	for k := uint64(1); k <= n; k++ {
		if k%2 == 0 { // both forms of a condition's trigger and completion wait
			require.NoError(t, s.WriteValue(T, k))
			require.NoError(t, s.WaitValue(D, k, GEQ))
		} else {
			require.NoError(t, s.WriteThenWait(T, k, D, k, GEQ))
		}
		require.NoError(t, s.LaunchHostFunc(func() { completed.Store(k) }))
	}
	syncWithin(t, s, time.Minute) // 1000 round trips: long under the fake driver on a busy machine
	require.Equal(t, uint64(n), D.Load())
	require.Equal(t, uint64(n), completed.Load())
}

func TestCUDACopy(t *testing.T) {
	b := newCUDABackend(t)
	s := newCUDAStream(t, b)
	wb, err := b.AllocWords(64)
	require.NoError(t, err)
	defer wb.Close()
	for i := 0; i < 32; i++ {
		wb.Word(i).Store(uint64(i * 3))
	}
	p, q := wb.Word(0).HostPtr(), wb.Word(32).HostPtr()
	require.NoError(t, s.Copy(q, p, 256))
	syncSoon(t, s)
	for i := 0; i < 32; i++ {
		require.Equal(t, uint64(i*3), wb.Word(32+i).Load())
	}
	bad := []struct {
		name     string
		dst, src uintptr
		n        int
	}{
		{"negative length", q, p, -1},
		{"zero length", q, p, 0},
		{"nil dst", 0, p, 8},
		{"nil src", q, 0, 8},
		{"overlap forward", p + 8, p, 16},
		{"overlap backward", p, p + 8, 16},
		{"wraps", math.MaxUint64 - 4, p, 8},
	}
	for _, c := range bad {
		require.ErrorIs(t, s.Copy(c.dst, c.src, c.n), ErrInvalidArgument, c.name)
	}
}

type otherEvent struct{}

func (otherEvent) Query() (bool, error) { return true, nil }
func (otherEvent) Synchronize() error   { return nil }
func (otherEvent) Handle() uintptr      { return 0 }
func (otherEvent) Close() error         { return nil }

func TestCUDAEvents(t *testing.T) {
	b := newCUDABackend(t)
	s1, s2 := newCUDAStream(t, b), newCUDAStream(t, b)
	wb, err := b.AllocWords(2)
	require.NoError(t, err)
	defer wb.Close()
	gateW, flag := wb.Word(0), wb.Word(1)
	e, err := b.NewEvent()
	require.NoError(t, err)
	require.NotZero(t, e.Handle())
	done, err := e.Query()
	require.NoError(t, err)
	require.True(t, done, "never-recorded event")

	require.NoError(t, s1.WaitValue(gateW, 1, GEQ))
	defer gateW.Store(1)
	require.NoError(t, s1.Record(e))
	require.NoError(t, s2.WaitEvent(e))
	require.NoError(t, s2.WriteValue(flag, 1))
	time.Sleep(never)
	done, err = e.Query()
	require.NoError(t, err)
	require.False(t, done)
	require.Zero(t, flag.Load())
	gateW.Store(1)
	require.NoError(t, e.Synchronize())
	syncSoon(t, s2)
	require.Equal(t, uint64(1), flag.Load())

	host := NewHostBackend()
	defer host.Close()
	he, err := host.NewEvent()
	require.NoError(t, err)
	defer he.Close()
	require.ErrorIs(t, s1.Record(he), ErrWrongBackend)
	require.ErrorIs(t, s1.WaitEvent(he), ErrWrongBackend)
	require.ErrorIs(t, s1.Record(otherEvent{}), ErrWrongBackend)
	require.ErrorIs(t, s1.Record(nil), ErrInvalidArgument)
	require.ErrorIs(t, s1.WaitEvent(nil), ErrInvalidArgument)
	ce, ok := CUDAEvent(e)
	require.True(t, ok)
	require.Equal(t, e.Handle(), ce.Handle())

	require.NoError(t, e.Close())
	require.ErrorIs(t, e.Close(), ErrClosed)
	require.ErrorIs(t, s1.Record(e), ErrClosed)
	require.ErrorIs(t, s1.WaitEvent(e), ErrClosed)
	_, err = e.Query()
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, e.Synchronize(), ErrClosed)
}

func TestCUDACloseSemantics(t *testing.T) {
	testenv.RequireGPU(t)
	b, err := openCUDA(0) // closed by the test itself
	require.NoError(t, err, "openCUDA")
	s, err := b.NewStream()
	require.NoError(t, err)
	wb, err := b.AllocWords(1)
	require.NoError(t, err)
	w := wb.Word(0)

	// Close waits for the enqueued work.
	require.NoError(t, s.LaunchHostFunc(func() { time.Sleep(never) }))
	require.NoError(t, s.WriteValue(w, 9))
	require.NoError(t, s.Close())
	require.Equal(t, uint64(9), w.Load())
	require.ErrorIs(t, s.Close(), ErrClosed)
	require.ErrorIs(t, s.WriteValue(w, 1), ErrClosed)
	require.ErrorIs(t, s.WaitValue(w, 1, GEQ), ErrClosed)
	require.ErrorIs(t, s.LaunchHostFunc(func() {}), ErrClosed)
	require.ErrorIs(t, s.Copy(w.HostPtr(), w.HostPtr()+64, 8), ErrClosed)
	require.ErrorIs(t, s.Synchronize(), ErrClosed)
	_, err = s.Query()
	require.ErrorIs(t, err, ErrClosed)

	// Closing the backend first keeps its children working until they close.
	s2, err := b.NewStream()
	require.NoError(t, err)
	require.NoError(t, b.Close())
	require.ErrorIs(t, b.Close(), ErrClosed)
	_, err = b.NewStream()
	require.ErrorIs(t, err, ErrClosed)
	_, err = b.AllocWords(1)
	require.ErrorIs(t, err, ErrClosed)
	require.NoError(t, s2.WriteValue(w, 10))
	require.NoError(t, s2.Synchronize())
	require.Equal(t, uint64(10), w.Load())
	require.NoError(t, s2.Close())
	require.NoError(t, wb.Close()) // the last child: the context goes with it
}

func TestWrapCUDAStream(t *testing.T) {
	b := newCUDABackend(t)
	s := newCUDAStream(t, b)
	wb, err := b.AllocWords(1)
	require.NoError(t, err)
	defer wb.Close()
	ws, err := WrapCUDAStream(s.Handle())
	require.NoError(t, err)
	require.Equal(t, s.Handle(), ws.Handle())
	require.NoError(t, ws.WriteValue(wb.Word(0), 3))
	require.NoError(t, ws.Synchronize())
	require.Equal(t, uint64(3), wb.Word(0).Load())
	require.NoError(t, ws.Close())
	require.ErrorIs(t, ws.Close(), ErrClosed)
	// The borrowed CUstream lives on.
	require.NoError(t, s.WriteValue(wb.Word(0), 4))
	syncSoon(t, s)
	require.Equal(t, uint64(4), wb.Word(0).Load())
	_, err = WrapCUDAStream(0)
	require.ErrorIs(t, err, ErrInvalidArgument)
}

// TestCUDACloseBlockedWait: Close does not hang on a wait nobody satisfies.
func TestCUDACloseBlockedWait(t *testing.T) {
	b := newCUDABackend(t)
	ctx, _, _ := CUDAContext(b)
	s, err := b.NewStream()
	require.NoError(t, err)
	wb, err := b.AllocWords(2)
	require.NoError(t, err)
	defer wb.Close()
	require.NoError(t, s.WaitValue(wb.Word(0), 1, GEQ))
	require.NoError(t, s.WriteValue(wb.Word(1), 1))
	start := time.Now()
	err = s.Close()
	require.ErrorIs(t, err, ErrAbandoned)
	require.ErrorIs(t, err, ErrClosed)
	require.Less(t, time.Since(start), cudaCloseGrace+time.Second)
	// The GPU still holds the work; satisfying the wait lets it finish.
	wb.Word(0).Store(1)
	require.Eventually(t, func() bool { return wb.Word(1).Load() == 1 }, soon, time.Millisecond)
	require.NoError(t, ctx.Synchronize())
}

// TestCUDAFakeDriver runs this file's GPU tests in a child process against the
// CPU emulation of the driver in cgo/cuda/testdata/fakecuda, so the backend's
// logic runs where there is no GPU. It proves nothing about real GPUs.
func TestCUDAFakeDriver(t *testing.T) {
	testenv.RunUnderFakeDriver(t, []string{"TestCUDABackendBasics", "TestCUDAWaitValueCompare", "TestCUDAWordArguments",
		"TestCUDAHostFuncOrder", "TestCUDAChannelRoundTrip", "TestCUDACopy", "TestCUDAEvents", "TestCUDACloseSemantics",
		"TestCUDACloseBlockedWait", "TestWrapCUDAStream", "TestCUDACopyDevice", "TestCUDAHandlesTakeBadArguments",
		"TestCUDAHostFuncPanic", "TestCUDAWordBlockCloseQuiescesHostExecutors"})
}

// The CUDA backend's handles answer zero arguments and extreme integers (lengths,
// values, counts) with errors: no panic, no hang, and nothing handed to the driver
// that it would fault on. The driver objects under them (cgo/cuda's raw layer) get
// the zero arguments only: a raw device address goes to the driver as given, as in C
// (nil and misaligned ones are refused; an aligned one the driver does not know is
// the caller's to answer for).
func TestCUDAHandlesTakeBadArguments(t *testing.T) {
	b := newCUDABackend(t)
	s := newCUDAStream(t, b)
	wb, err := b.AllocWords(2)
	require.NoError(t, err)
	defer wb.Close()
	ev, err := b.NewEvent()
	require.NoError(t, err)
	defer ev.Close()
	ctx, _, ok := CUDAContext(b)
	require.True(t, ok)
	cs, ok := CUDAStream(s)
	require.True(t, ok)
	skip := map[string]bool{"Close": true, "Destroy": true, "BeginCapture": true, "EndCapture": true}
	testenv.ZeroArgs(t, skip, b, s, wb, ev, ctx, cs)
	testenv.ExtremeArgs(t, skip, b, s, wb, ev)
	require.NoError(t, s.WriteValue(wb.Word(0), 5))
	syncSoon(t, s)
	require.Equal(t, uint64(5), wb.Word(0).Load(), "the stream still works")
}

// TestCUDACopyDevice: CopyDevice and CopyDeviceUncaptured move the right bytes by
// either path: same-device copies up to copyKernelMax between addresses equal modulo
// 16 by the copy kernel (head, 16-byte body and tail), all others by the copy engine;
// under capture the uncaptured form enqueues nothing.
func TestCUDACopyDevice(t *testing.T) {
	b := newCUDABackend(t).(*cudaBackend)
	require.NotNil(t, b.copyKernel, "the copy kernel did not load")
	s := newCUDAStream(t, b)
	cs, _ := CUDAStream(s)
	const region = copyKernelMax + 4096
	src, err := b.ctx.MemAlloc(region)
	require.NoError(t, err)
	defer src.Close()
	dst, err := b.ctx.MemAlloc(region)
	require.NoError(t, err)
	defer dst.Close()
	host, err := b.ctx.MemHostAlloc(region, cuda.HostAllocPortable)
	require.NoError(t, err)
	defer host.Close()
	pat := host.Bytes()
	for i := range pat {
		pat[i] = byte(i*7 + i>>11)
	}
	want := append([]byte(nil), pat...)
	require.NoError(t, cs.MemcpyHtoD(src.Ptr(), host.Addr(), region))
	cases := []struct {
		n                int
		srcOff, dstOff   int
		sameDevice, kern bool
	}{
		{1, 0, 0, true, true},
		{15, 3, 3, true, true},
		{16, 0, 0, true, true},
		{17, 1, 17, true, true},
		{4095, 5, 21, true, true},
		{1<<20 + 13, 8, 24, true, true},
		{4 << 20, 0, 0, true, true},
		{copyKernelMax, 16, 32, true, true},
		{copyKernelMax + 16, 0, 0, true, false}, // too large
		{4096, 1, 2, true, false},               // addresses differ modulo 16
		{4096, 0, 0, false, false},              // another device's memory
	}
	for i, c := range cases {
		for _, uncaptured := range []bool{false, true} {
			name := fmt.Sprintf("case %d (%d bytes, offsets %d/%d, uncaptured %v)", i, c.n, c.srcOff, c.dstOff, uncaptured)
			d, sp := dst.Ptr()+uintptr(c.dstOff), src.Ptr()+uintptr(c.srcOff)
			require.Equal(t, c.kern, b.copyGrid(s.(*cudaStream), d, sp, c.n, c.sameDevice) > 0, name)
			// Bytes around the destination stay as set: a guard of 0xEE each side.
			require.NoError(t, cs.MemsetD8(dst.Ptr(), 0xEE, region))
			if uncaptured {
				captured, err := b.CopyDeviceUncaptured(s, d, sp, c.n, c.sameDevice)
				require.NoError(t, err, name)
				require.False(t, captured, name)
			} else {
				require.NoError(t, b.CopyDevice(s, d, sp, c.n, c.sameDevice), name)
			}
			require.NoError(t, cs.MemcpyDtoH(host.Addr(), dst.Ptr(), c.dstOff+c.n+16))
			syncSoon(t, s)
			got := host.Bytes()
			require.Equal(t, want[c.srcOff:c.srcOff+c.n], got[c.dstOff:c.dstOff+c.n], name)
			for _, g := range [][]byte{got[:c.dstOff], got[c.dstOff+c.n : c.dstOff+c.n+16]} {
				for _, v := range g {
					require.Equal(t, byte(0xEE), v, "%s: a byte outside the copy changed", name)
				}
			}
		}
	}

	// A wrapped stream of the backend's context copies by kernel too.
	ws, err := WrapCUDAStream(cs.Handle())
	require.NoError(t, err)
	defer ws.Close()
	require.NotZero(t, b.copyGrid(ws.(*cudaStream), dst.Ptr(), src.Ptr(), 4096, true), "a wrapped stream of the same context")
	require.NoError(t, cs.MemsetD8(dst.Ptr(), 0, 4096))
	require.NoError(t, b.CopyDevice(ws, dst.Ptr(), src.Ptr(), 4096, true))
	require.NoError(t, ws.Synchronize())
	require.NoError(t, cs.MemcpyDtoH(host.Addr(), dst.Ptr(), 4096))
	syncSoon(t, s)
	require.Equal(t, want[:4096], host.Bytes()[:4096], "the wrapped stream's copy")

	// Under capture the uncaptured form enqueues nothing by either path, and
	// CopyDevice records a memcpy node, also where it would launch the kernel.
	require.NoError(t, cs.BeginCapture(cuda.CaptureThreadLocal))
	for _, n := range []int{64, copyKernelMax + 16} {
		captured, err := b.CopyDeviceUncaptured(s, dst.Ptr(), src.Ptr(), n, true)
		require.NoError(t, err)
		require.True(t, captured, "%d bytes", n)
	}
	require.NoError(t, b.CopyDevice(s, dst.Ptr()+16, src.Ptr(), 4096, true))
	g, err := cs.EndCapture()
	require.NoError(t, err)
	defer g.Close()
	nodes, err := g.Nodes()
	require.NoError(t, err)
	require.Len(t, nodes, 1, "the captured CopyDevice alone")
	kind, err := g.NodeType(nodes[0])
	require.NoError(t, err)
	require.Equal(t, cuda.NodeMemcpy, kind)
	require.NoError(t, cs.MemsetD8(dst.Ptr(), 0, 8192))
	x, err := g.Instantiate(0)
	require.NoError(t, err)
	defer x.Close()
	require.NoError(t, x.Launch(cs))
	require.NoError(t, cs.MemcpyDtoH(host.Addr(), dst.Ptr(), 8192))
	syncSoon(t, s)
	require.Equal(t, want[:4096], host.Bytes()[16:16+4096], "the graph's copy")
}

// TestCUDAHostFuncPanic: a panic in a CUDA host func is recovered on the driver's
// thread (it used to kill the process) and becomes the stream's sticky error, a
// *PanicError, as on host streams.
func TestCUDAHostFuncPanic(t *testing.T) {
	b := newCUDABackend(t)
	s := newCUDAStream(t, b)
	require.NoError(t, s.LaunchHostFunc(func() { panic("cuda host func boom") }))
	err := s.Synchronize()
	var pe *PanicError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "cuda host func boom", pe.Value)
	_, qerr := s.Query()
	require.ErrorAs(t, qerr, &pe)
	require.ErrorAs(t, s.LaunchHostFunc(func() {}), &pe)
	require.ErrorAs(t, s.(Failer).Failed(), &pe)
}

// Closing a CUDA word block waits for a host executor inside its access bracket (a
// host stream may wait on CUDA words), as closing a host block does: the pinned memory
// is not freed under a load or store it has begun. Before, it was freed at once.
func TestCUDAWordBlockCloseQuiescesHostExecutors(t *testing.T) {
	b := newCUDABackend(t)
	words, err := b.AllocWords(1)
	require.NoError(t, err)
	hb := NewHostBackend()
	t.Cleanup(func() { _ = hb.Close() })
	hs, err := hb.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() { _ = hs.Close() })
	require.NoError(t, hs.Synchronize()) // its executor runs, registered as an accessor
	s := hs.(*hostStream)
	s.wordAccess.Add(1) // as if the executor had checked the block open and not yet loaded
	closed := make(chan error, 1)
	go func() { closed <- words.Close() }()
	select {
	case err := <-closed:
		s.wordAccess.Add(1)
		require.FailNow(t, "the block was freed inside an executor's access bracket", "Close: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	s.wordAccess.Add(1) // the access ends
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		require.FailNow(t, "Close still waits after the access ended")
	}
}

package cuda_test

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/device"
	"github.com/ucpx/ucpx/internal/testenv"
)

// gpuCount returns the number of devices (after testenv.RequireGPU).
func gpuCount(t testing.TB) int {
	n, err := cuda.DeviceCount()
	require.NoError(t, err)
	return n
}

// newContext retains device 0's primary context for the test.
func newContext(t testing.TB) *cuda.Context {
	t.Helper()
	dev := testenv.RequireGPU(t)
	ctx, err := dev.RetainPrimaryContext()
	require.NoError(t, err)
	t.Cleanup(func() { ctx.Close() })
	return ctx
}

func newStream(t testing.TB, ctx *cuda.Context) *cuda.Stream {
	t.Helper()
	s, err := ctx.NewStream(cuda.StreamNonBlocking, 0)
	require.NoError(t, err)
	t.Cleanup(func() {
		done := make(chan struct{})
		go func() {
			s.Synchronize()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Log("stream still busy at cleanup")
		}
		s.Close() // a busy stream is released once its work is done
	})
	return s
}

// words is a run of 64-bit signal words in host-mapped pinned memory.
type words struct {
	m    *cuda.HostMemory
	base unsafe.Pointer // m.Ptr(), cached: HostMemory.Ptr takes a lock
}

func newWords(t testing.TB, ctx *cuda.Context, n int) words {
	t.Helper()
	m := hostMem(t, ctx, 8*n, cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
	require.NotZero(t, m.DevicePtr(), "mapped host memory has no device pointer")
	return words{m: m, base: m.Ptr()}
}

// settled waits (boundedly) until the context has no work left. Memory is freed
// only once settled: freeing memory that queued or blocked GPU work still uses
// would fault the context. When a failed test left work blocked, the memory is
// leaked instead.
func settled(t testing.TB, ctx *cuda.Context) bool {
	done := make(chan error, 1)
	go func() { done <- ctx.Synchronize() }()
	select {
	case err := <-done:
		if err != nil {
			t.Logf("context synchronize at cleanup: %v", err)
		}
		return true
	case <-time.After(5 * time.Second):
		t.Log("work still pending at cleanup: leaking its memory")
		return false
	}
}

// devMem, hostMem and managedMem allocate memory freed at cleanup, after the
// context settled.
func devMem(t testing.TB, ctx *cuda.Context, n int) *cuda.DeviceMemory {
	t.Helper()
	m, err := ctx.MemAlloc(n)
	require.NoError(t, err)
	t.Cleanup(func() {
		if settled(t, ctx) {
			m.Close()
		}
	})
	return m
}

func managedMem(t testing.TB, ctx *cuda.Context, n int) *cuda.DeviceMemory {
	t.Helper()
	m, err := ctx.MemAllocManaged(n)
	require.NoError(t, err)
	t.Cleanup(func() {
		if settled(t, ctx) {
			m.Close()
		}
	})
	return m
}

func hostMem(t testing.TB, ctx *cuda.Context, n int, flags cuda.HostAllocFlags) *cuda.HostMemory {
	t.Helper()
	m, err := ctx.MemHostAlloc(n, flags)
	require.NoError(t, err)
	t.Cleanup(func() {
		if settled(t, ctx) {
			m.Close()
		}
	})
	return m
}

func (w words) ptr(i int) *uint64     { return (*uint64)(unsafe.Add(w.base, 8*i)) }
func (w words) load(i int) uint64     { return atomic.LoadUint64(w.ptr(i)) }
func (w words) store(i int, v uint64) { atomic.StoreUint64(w.ptr(i), v) }
func (w words) dev(i int) uintptr     { return w.m.DevicePtr() + uintptr(8*i) }
func (w words) host(i int) uintptr    { return w.m.Addr() + uintptr(8*i) }

// eventually polls cond for up to d.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		require.Falsef(t, time.Now().After(deadline), "timed out after %v waiting for %s", d, what)
		time.Sleep(50 * time.Microsecond)
	}
}

// syncWithin synchronizes s but fails the test, instead of hanging it, when the
// stream is still blocked after d (a wait nobody released).
func syncWithin(t testing.TB, s *cuda.Stream, d time.Duration) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- s.Synchronize() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(d):
		require.FailNowf(t, "stream blocked", "stream did not finish within %v", d)
	}
}

// testModule loads the embedded test kernels; it fails (does not skip) when a
// GPU is present and the PTX is still the placeholder.
//
// $UCPX_TEST_PTX names a PTX file to load instead of the embedded one (to try
// freshly generated PTX without rebuilding).
func testModule(t testing.TB, ctx *cuda.Context) *cuda.Module {
	t.Helper()
	ptx := device.TestKernelsPTX()
	if f := os.Getenv("UCPX_TEST_PTX"); f != "" {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		ptx = b
	}
	require.False(t, device.IsPlaceholder(ptx), "device/ptx/test_kernels.ptx is the placeholder: run scripts/ptx.sh (make ptx) and commit the PTX")
	m, err := ctx.LoadModule(ptx)
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	return m
}

func function(t testing.TB, m *cuda.Module, name string) *cuda.Function {
	t.Helper()
	f, err := m.Function(name)
	require.NoError(t, err)
	return f
}

// gatedRoundTrips runs b.N round trips in chunks of at most chunk, each chunk
// enqueued behind a closed gate (stream wait on word G >= gate): enqueue(k, c)
// enqueues round trips k..k+c-1 (k counts from 1 across chunks), whose echoes store
// each value into word D. The benchmark clock runs only from opening the gate to the
// chunk's last echo: it returns that time, and the time enqueue took (the CPU cost of
// the launches). A chunk must be small enough not to fill the stream's queue.
func gatedRoundTrips(b *testing.B, s *cuda.Stream, w words, G, D, chunk int, enqueue func(k uint64, c int)) (elapsed, enqueued time.Duration) {
	var gate, k uint64
	b.ResetTimer()
	b.StopTimer()
	for done := 0; done < b.N; {
		c := min(chunk, b.N-done)
		gate++
		require.NoError(b, s.WaitValue64(w.dev(G), gate, cuda.WaitGEQ))
		te := time.Now()
		enqueue(k+1, c)
		enqueued += time.Since(te)
		k += uint64(c)
		b.StartTimer()
		t0 := time.Now()
		w.store(G, gate)
		for w.load(D) != k {
		}
		elapsed += time.Since(t0)
		b.StopTimer()
		done += c
	}
	syncWithin(b, s, 10*time.Second)
	return elapsed, enqueued
}

// echoer is a host "proxy" on its own OS thread: whenever word trigger differs
// from word done it copies trigger into done.
type echoer struct {
	stop atomic.Bool
	quit chan struct{}
}

func startEcho(w words, trigger, done int) *echoer { return startDelayedEcho(w, trigger, done, 0) }

// startDelayedEcho is startEcho answering delay after it sees each new trigger value.
func startDelayedEcho(w words, trigger, done int, delay time.Duration) *echoer {
	return startDelayedEchoThen(w, trigger, done, delay, nil)
}

// startDelayedEchoThen is startDelayedEcho calling then (if not nil) after each store.
func startDelayedEchoThen(w words, trigger, done int, delay time.Duration, then func()) *echoer {
	return startPoller(func() {
		if v := w.load(trigger); v != w.load(done) {
			for t0 := time.Now(); delay > 0 && time.Since(t0) < delay; {
			}
			w.store(done, v)
			if then != nil {
				then()
			}
		}
	})
}

func (e *echoer) Stop() {
	e.stop.Store(true)
	<-e.quit
}

// startProxy emulates ucpx's proxy for graph memop nodes [write T=1, wait D==1,
// write D=0]: it waits for T==1, resets T to 0, counts, and sets D=1.
func startProxy(w words, trigger, done int, count *atomic.Int64) *echoer {
	return startPoller(func() {
		if w.load(trigger) == 1 {
			w.store(trigger, 0)
			count.Add(1)
			w.store(done, 1)
		}
	})
}

// startPoller runs poll in a loop on its own goroutine until Stop.
func startPoller(poll func()) *echoer {
	e := &echoer{quit: make(chan struct{})}
	go func() {
		defer close(e.quit)
		// Not locked to its thread: Gosched on a locked goroutine costs a thread
		// handoff (25-30 us measured), which made the round trips 2-4x too slow.
		for i := 0; ; i++ {
			poll()
			if i&1023 == 0 {
				if e.stop.Load() {
					return
				}
				runtime.Gosched() // let the test progress even with GOMAXPROCS=1
			}
		}
	}()
	return e
}

// isolated runs the calling test again in a child process and reports whether
// the caller is that child. Tests that might poison the CUDA context (a device
// fault is sticky for the whole process) run their body only in the child:
//
//	if !isolated(t) {
//		return
//	}
func isolated(t *testing.T) bool {
	t.Helper()
	if os.Getenv(envIsolated) == t.Name() {
		return true
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), envIsolated+"="+t.Name())
	out, err := cmd.CombinedOutput()
	t.Logf("isolated child:\n%s", out)
	require.NoError(t, err, "isolated child failed")
	if strings.Contains(string(out), "--- SKIP: "+t.Name()) {
		t.Skip("skipped in the isolated child")
	}
	require.Contains(t, string(out), "--- PASS: "+t.Name(), "isolated child did not pass")
	return false
}

const envIsolated = "UCPX_TEST_ISOLATED"

// requireEach checks that got(i) == want(i) for every i in [0, n) and fails at the
// first index that differs. It asserts only there, so checking a large buffer
// element by element stays fast.
func requireEach[T comparable](t testing.TB, n int, want, got func(i int) T, what string) {
	t.Helper()
	for i := 0; i < n; i++ {
		if w, g := want(i), got(i); w != g {
			require.Equalf(t, w, g, "%s %d of %d", what, i, n)
		}
	}
}

package cuda_test

// GPU tests of devices, contexts, streams, memops, events, memory and host
// functions. They skip where there is no driver and fail where a driver is
// present but lacks what ucpx needs (see testenv.RequireGPU).

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/internal/testenv"
)

const blockedFor = 20 * time.Millisecond // how long a wait must stay blocked to count as blocked

func TestDeviceInfo(t *testing.T) {
	testenv.RequireGPU(t)
	v, err := cuda.DriverVersion()
	require.NoError(t, err)
	t.Logf("driver supports CUDA %d.%d", v/1000, v%1000/10)
	assert.GreaterOrEqualf(t, v, 12030, "driver CUDA %d: ucpx needs 12.3 or newer (cuStreamGetCaptureInfo_v3, cuGraphAddDependencies_v2)", v)
	for _, s := range cuda.Symbols() {
		assert.Truef(t, s.Loaded, "driver lacks %s (%s)", s.Name, s.API)
	}
	n := gpuCount(t)
	for i := 0; i < n; i++ {
		d, err := cuda.GetDevice(i)
		require.NoError(t, err)
		assert.Equal(t, i, d.Ordinal(), "ordinal")
		name, err := d.Name()
		require.NoError(t, err)
		bus, err := d.PCIBusID()
		require.NoError(t, err)
		major, minor, err := d.ComputeCapability()
		require.NoError(t, err)
		mem, err := d.TotalMem()
		require.NoError(t, err)
		caps, err := d.Caps()
		require.NoError(t, err)
		caps2, err := d.Caps()
		require.NoError(t, err)
		assert.Equal(t, caps, caps2, "cached caps changed")
		t.Logf("device %d: %s pci %s sm_%d%d %d MiB caps %+v", i, name, bus, major, minor, mem>>20, caps)
		assert.NotEmpty(t, name, "device %d: name", i)
		assert.NotEmpty(t, bus, "device %d: bus id", i)
		assert.NotZero(t, mem, "device %d: memory", i)
		assert.GreaterOrEqualf(t, major*10+minor, 75, "device %d is sm_%d%d; the test PTX targets compute_75", i, major, minor)
		assert.Equal(t, [2]int{major, minor}, [2]int{caps.ComputeMajor, caps.ComputeMinor}, "caps' compute capability")
		warp, err := d.Attribute(cuda.AttrWarpSize)
		require.NoError(t, err)
		assert.Equal(t, 32, warp, "warp size")
		for j := 0; j < n; j++ {
			if i == j {
				continue
			}
			p, _ := cuda.GetDevice(j)
			can, err := d.CanAccessPeer(p)
			require.NoError(t, err)
			t.Logf("device %d -> %d peer access: %v", i, j, can)
		}
	}
	_, err = cuda.GetDevice(n)
	require.ErrorIs(t, err, cuda.ErrInvalidDevice)
	_, err = cuda.GetDevice(-1)
	require.ErrorIs(t, err, cuda.ErrInvalidValue)
	_, err = (cuda.Device{}).Attribute(99999)
	require.ErrorIs(t, err, cuda.ErrInvalidValue)
}

func TestPrimaryContext(t *testing.T) {
	dev := testenv.RequireGPU(t)
	ctx, err := dev.RetainPrimaryContext()
	require.NoError(t, err)
	ctx2, err := dev.RetainPrimaryContext()
	require.NoError(t, err)
	require.NotZero(t, ctx.Handle(), "primary context handle")
	require.Equal(t, ctx.Handle(), ctx2.Handle(), "primary context handles")
	assert.Zero(t, ctx.Device().Ordinal(), "device")
	least, greatest, err := ctx.StreamPriorityRange()
	require.NoError(t, err)
	assert.LessOrEqualf(t, greatest, least, "priority range %d..%d", least, greatest)
	free, total, err := ctx.MemGetInfo()
	require.NoError(t, err)
	assert.NotZero(t, total, "mem info total")
	assert.LessOrEqualf(t, free, total, "mem info free %d total %d", free, total)
	require.NoError(t, ctx.Synchronize())

	borrowed, err := cuda.ContextFromHandle(ctx.Handle())
	require.NoError(t, err)
	assert.Equal(t, ctx.Handle(), borrowed.Handle(), "borrowed context")
	assert.Zero(t, borrowed.Device().Ordinal(), "borrowed context's device")
	require.NoError(t, borrowed.Close())
	require.ErrorIs(t, borrowed.Close(), cuda.ErrInvalidHandle)
	require.NoError(t, ctx.Synchronize()) // closing a borrowed wrapper released nothing

	require.NoError(t, ctx2.Close())
	require.NoError(t, ctx.Close())
	require.ErrorIs(t, ctx.Close(), cuda.ErrInvalidHandle)
	_, err = ctx.NewStream(cuda.StreamNonBlocking, 0)
	require.ErrorIs(t, err, cuda.ErrInvalidHandle)
	require.ErrorIs(t, ctx.Synchronize(), cuda.ErrInvalidHandle)
	_, err = cuda.ContextFromHandle(0)
	require.ErrorIs(t, err, cuda.ErrInvalidValue)
}

// TestContextPerCall: wrappers work from goroutines on any OS thread, whatever
// context that thread has current, and put a displaced context back.
func TestContextPerCall(t *testing.T) {
	ctx := newContext(t)
	w := newWords(t, ctx, 64)

	runtime.LockOSThread()
	require.NoError(t, cuda.ClearCurrent())
	s := newStream(t, ctx) // made on a thread with no current context
	cur, err := cuda.CurrentContext()
	require.NoError(t, err)
	assert.Equal(t, ctx.Handle(), cur, "a thread with no context should keep the wrapper's")
	if gpuCount(t) > 1 {
		d1, err := cuda.GetDevice(1)
		require.NoError(t, err)
		ctx1, err := d1.RetainPrimaryContext()
		require.NoError(t, err)
		defer ctx1.Close()
		require.NoError(t, ctx1.SetCurrent())
		require.NoError(t, s.WriteValue64(w.dev(0), 1, cuda.WriteDefault)) // runs in ctx, not ctx1
		cur, err := cuda.CurrentContext()
		require.NoError(t, err)
		assert.Equal(t, ctx1.Handle(), cur, "the caller's context was not restored")
		syncWithin(t, s, 5*time.Second)
		assert.Equal(t, uint64(1), w.load(0), "write from a thread bound to another device's context did not land")
	}
	runtime.UnlockOSThread()

	// Many goroutines, hopping threads, enqueue on one stream and their own streams.
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			own, err := ctx.NewStream(cuda.StreamNonBlocking, 0)
			if !assert.NoError(t, err) {
				return
			}
			defer own.Close()
			for i := 1; i <= 200; i++ {
				if !assert.NoError(t, own.WriteValue64(w.dev(8+g), uint64(i), cuda.WriteDefault)) ||
					!assert.NoError(t, s.WriteValue64(w.dev(32+g), uint64(i), cuda.WriteDefault)) {
					return
				}
				if i%16 == 0 {
					runtime.Gosched()
				}
			}
			assert.NoError(t, own.Synchronize())
		}(g)
	}
	wg.Wait()
	syncWithin(t, s, 5*time.Second)
	for g := 0; g < 8; g++ {
		assert.Equal(t, uint64(200), w.load(8+g), "goroutine %d: its own stream's word", g)
		assert.Equal(t, uint64(200), w.load(32+g), "goroutine %d: the shared stream's word", g)
	}
}

func TestStreamLifecycle(t *testing.T) {
	ctx := newContext(t)
	w := newWords(t, ctx, 4)
	least, greatest, err := ctx.StreamPriorityRange()
	require.NoError(t, err)
	for _, flags := range []cuda.StreamFlags{cuda.StreamDefault, cuda.StreamNonBlocking} {
		for _, prio := range []int{least, greatest} {
			s, err := ctx.NewStream(flags, prio)
			require.NoError(t, err)
			require.NoError(t, s.WriteValue64(w.dev(0), uint64(prio+100), cuda.WriteDefault))
			syncWithin(t, s, 5*time.Second)
			done, err := s.Query()
			require.NoError(t, err)
			assert.True(t, done, "idle stream not done")
			require.NoError(t, s.Close())
		}
	}
	_, err = ctx.NewStream(0x80, 0)
	require.ErrorIs(t, err, cuda.ErrInvalidValue)

	s, err := ctx.NewStream(cuda.StreamNonBlocking, 0)
	require.NoError(t, err)
	h := s.Handle()
	require.NotZero(t, h, "stream handle")
	require.Same(t, ctx, s.Context(), "stream context")
	// A borrowed wrapper works and does not destroy the stream on Close.
	b, err := cuda.StreamFromHandle(h)
	require.NoError(t, err)
	assert.Equal(t, ctx.Handle(), b.Context().Handle(), "StreamFromHandle found another context")
	require.NoError(t, b.WriteValue64(w.dev(1), 5, cuda.WriteDefault))
	require.NoError(t, b.Synchronize())
	require.NoError(t, b.Close())
	require.ErrorIs(t, b.Close(), cuda.ErrInvalidHandle)
	require.NoError(t, s.WriteValue64(w.dev(1), 6, cuda.WriteDefault))
	require.NoError(t, s.Synchronize())
	assert.Equal(t, uint64(6), w.load(1), "word after borrowed Close")
	_, err = cuda.StreamFromHandle(0)
	require.ErrorIs(t, err, cuda.ErrInvalidValue)

	require.NoError(t, s.Close())
	assert.Zero(t, s.Handle(), "closed stream still has a handle")
	require.ErrorIs(t, s.Close(), cuda.ErrInvalidHandle)
	require.ErrorIs(t, s.WriteValue64(w.dev(0), 1, 0), cuda.ErrInvalidHandle)
	require.ErrorIs(t, s.WaitValue64(w.dev(0), 1, cuda.WaitGEQ), cuda.ErrInvalidHandle)
	require.ErrorIs(t, s.Synchronize(), cuda.ErrInvalidHandle)
	_, err = s.Query()
	require.ErrorIs(t, err, cuda.ErrInvalidHandle)
	require.ErrorIs(t, s.LaunchHostFunc(func() {}), cuda.ErrInvalidHandle)
}

// checkWait enqueues a wait that must hold with the word at blocked and release
// once it becomes release, followed by a marker write.
func checkWait(t *testing.T, s *cuda.Stream, w words, wide bool, flags cuda.WaitFlags, target, blocked, release uint64) {
	t.Helper()
	const word, marker = 0, 1
	w.store(word, blocked)
	w.store(marker, 0)
	var err error
	if wide {
		err = s.WaitValue64(w.dev(word), target, flags)
	} else {
		err = s.WaitValue32(w.dev(word), uint32(target), flags)
	}
	require.NoError(t, err)
	require.NoError(t, s.WriteValue64(w.dev(marker), 1, cuda.WriteDefault))
	defer w.store(word, release) // never leave the stream blocked
	time.Sleep(blockedFor)
	done, err := s.Query()
	require.NoError(t, err)
	require.Falsef(t, done || w.load(marker) != 0, "wait %#x (64-bit %v) on %#x for %#x did not block", flags, wide, blocked, target)
	w.store(word, release)
	eventually(t, 5*time.Second, "the wait to release", func() bool { return w.load(marker) == 1 })
	syncWithin(t, s, 5*time.Second)
}

func TestMemops64(t *testing.T) {
	dev := testenv.RequireGPU(t)
	caps, _ := dev.Caps()
	ctx := newContext(t)
	s := newStream(t, ctx)
	w := newWords(t, ctx, 8)

	require.NoError(t, s.WriteValue64(w.dev(2), 0x1122334455667788, cuda.WriteDefault))
	// The v2 memop API has no NO_MEMORY_BARRIER (driver 580 said INVALID_VALUE).
	require.ErrorIs(t, s.WriteValue64(w.dev(3), 42, cuda.WriteNoMemoryBarrier), cuda.ErrNotSupported, "WriteNoMemoryBarrier")
	require.NoError(t, s.WriteValue64(w.dev(3), 42, cuda.WriteDefault))
	syncWithin(t, s, 5*time.Second)
	require.Equal(t, uint64(0x1122334455667788), w.load(2), "64-bit write")
	require.Equal(t, uint64(42), w.load(3), "64-bit write")

	checkWait(t, s, w, true, cuda.WaitGEQ, 10, 9, 10)
	checkWait(t, s, w, true, cuda.WaitGEQ, 1<<40, 1<<40-1, 1<<41)
	checkWait(t, s, w, true, cuda.WaitGEQ, 2, ^uint64(0), 2) // wrap-aware: -1 is before 2
	checkWait(t, s, w, true, cuda.WaitEQ, 7, 8, 7)
	checkWait(t, s, w, true, cuda.WaitAND, 0b100, 0b011, 0b110)
	if caps.WaitValueNOR {
		checkWait(t, s, w, true, cuda.WaitNOR, ^uint64(0xf), 0xf, 0x7)
	} else {
		t.Log("device lacks WaitValueNOR")
	}
	if caps.FlushRemoteWrites {
		checkWait(t, s, w, true, cuda.WaitGEQ|cuda.WaitFlush, 3, 2, 3)
	}

	// Waits already satisfied do not block.
	w.store(4, 100)
	require.NoError(t, s.WaitValue64(w.dev(4), 50, cuda.WaitGEQ))
	require.NoError(t, s.WaitValue64(w.dev(4), 100, cuda.WaitEQ))
	syncWithin(t, s, 5*time.Second)

	// Bad addresses are refused before the driver and leave the stream usable.
	require.ErrorIs(t, s.WaitValue64(w.dev(0)+4, 1, cuda.WaitGEQ), cuda.ErrInvalidValue)
	require.ErrorIs(t, s.WriteValue64(w.dev(0)+2, 1, 0), cuda.ErrInvalidValue)
	require.ErrorIs(t, s.WaitValue64(0, 1, cuda.WaitGEQ), cuda.ErrInvalidValue)
	require.NoError(t, s.WriteValue64(w.dev(5), 9, 0))
	syncWithin(t, s, 5*time.Second)
	require.Equal(t, uint64(9), w.load(5), "stream unusable after refused calls")
}

func TestMemops32(t *testing.T) {
	dev := testenv.RequireGPU(t)
	caps, _ := dev.Caps()
	ctx := newContext(t)
	s := newStream(t, ctx)
	w := newWords(t, ctx, 8)

	// 32-bit ops touch the low half of a 64-bit word (little-endian).
	w.store(2, 0xaaaaaaaa_00000000)
	require.NoError(t, s.WriteValue32(w.dev(2), 0x12345678, cuda.WriteDefault))
	require.NoError(t, s.WriteValue32(w.dev(3)+4, 0x9abcdef0, cuda.WriteDefault))
	syncWithin(t, s, 5*time.Second)
	require.Equal(t, uint64(0xaaaaaaaa_12345678), w.load(2), "32-bit write to the low half")
	require.Equal(t, uint64(0x9abcdef0_00000000), w.load(3), "32-bit write to the high half")

	checkWait(t, s, w, false, cuda.WaitGEQ, 10, 9, 10)
	checkWait(t, s, w, false, cuda.WaitGEQ, 2, 0xffffffff, 2) // wrap-aware on 32 bits
	checkWait(t, s, w, false, cuda.WaitEQ, 7, 8, 7)
	checkWait(t, s, w, false, cuda.WaitAND, 0b100, 0b011, 0b100)
	if caps.WaitValueNOR {
		checkWait(t, s, w, false, cuda.WaitNOR, 0xfffffff0, 0xf, 0x7)
	}
	require.ErrorIs(t, s.WaitValue32(w.dev(0)+2, 1, cuda.WaitGEQ), cuda.ErrInvalidValue)
	require.ErrorIs(t, s.BatchMemOp([]cuda.MemOp{{Kind: cuda.MemOpWriteValue32, Addr: w.dev(0), Value: 1 << 33}}), cuda.ErrInvalidValue)
}

func TestBatchMemOp(t *testing.T) {
	dev := testenv.RequireGPU(t)
	caps, _ := dev.Caps()
	ctx := newContext(t)
	s := newStream(t, ctx)
	const T, D, X = 0, 1, 2
	w := newWords(t, ctx, 300)

	// A round trip in one batch: write T, wait for the host's echo in D, then mark X.
	e := startEcho(w, T, D)
	defer e.Stop()
	ops := []cuda.MemOp{
		cuda.WriteValue64Op(w.dev(T), 77, cuda.WriteDefault),
		cuda.WaitValue64Op(w.dev(D), 77, cuda.WaitGEQ),
		cuda.WriteValue32Op(w.dev(X), 5, cuda.WriteDefault),
		cuda.BarrierOp(cuda.BarrierSystem),
	}
	if caps.FlushRemoteWrites {
		ops = append(ops, cuda.FlushRemoteWritesOp())
	}
	require.NoError(t, s.BatchMemOp(ops))
	syncWithin(t, s, 5*time.Second)
	require.Equal(t, [3]uint64{77, 77, 5}, [3]uint64{w.load(T), w.load(D), w.load(X)}, "round trip batch: T, D, X")

	// The largest batch: one write to each of MaxBatch words.
	big := make([]cuda.MemOp, cuda.MaxBatch)
	for i := range big {
		big[i] = cuda.WriteValue64Op(w.dev(10+i), uint64(1000+i), cuda.WriteDefault)
	}
	require.NoError(t, s.BatchMemOp(big))
	syncWithin(t, s, 5*time.Second)
	for i := range big {
		require.Equal(t, uint64(1000+i), w.load(10+i), "word %d after the full batch", 10+i)
	}
	require.ErrorIs(t, s.BatchMemOp(append(big, big[0])), cuda.ErrInvalidValue)
}

func TestStreamWaitEvent(t *testing.T) {
	ctx := newContext(t)
	s1 := newStream(t, ctx)
	s2 := newStream(t, ctx)
	w := newWords(t, ctx, 4)
	e, err := ctx.NewEvent(cuda.EventDisableTiming)
	require.NoError(t, err)
	defer e.Close()

	done, err := e.Query()
	require.NoError(t, err)
	assert.True(t, done, "a never-recorded event is not done")
	require.NoError(t, s1.WaitValue64(w.dev(0), 1, cuda.WaitGEQ)) // gate
	defer w.store(0, 1)
	require.NoError(t, e.Record(s1))
	require.NoError(t, s2.WaitEvent(e))
	require.NoError(t, s2.WriteValue64(w.dev(1), 1, cuda.WriteDefault))
	time.Sleep(blockedFor)
	done, _ = e.Query()
	require.False(t, done || w.load(1) != 0, "s2 ran ahead of the event")
	w.store(0, 1)
	require.NoError(t, e.Synchronize())
	syncWithin(t, s2, 5*time.Second)
	require.Equal(t, uint64(1), w.load(1), "s2 did not run after the event")
}

func TestEvents(t *testing.T) {
	ctx := newContext(t)
	s := newStream(t, ctx)
	dm := devMem(t, ctx, 64<<20)

	start, err := ctx.NewEvent(cuda.EventDefault)
	require.NoError(t, err)
	end, err := ctx.NewEvent(cuda.EventBlockingSync)
	require.NoError(t, err)
	require.NoError(t, start.Record(s))
	for i := 0; i < 4; i++ {
		require.NoError(t, s.MemsetD32(dm.Ptr(), uint32(i), dm.Size()/4))
	}
	require.NoError(t, end.Record(s))
	require.NoError(t, end.Synchronize())
	d, err := cuda.ElapsedTime(start, end)
	require.NoError(t, err)
	assert.Positive(t, d, "elapsed")
	assert.LessOrEqual(t, d, 10*time.Second, "elapsed")
	t.Logf("4 x memset 64 MiB: %v", d)
	_, err = cuda.ElapsedTime(start, start)
	require.NoError(t, err)

	nt, err := ctx.NewEvent(cuda.EventDisableTiming)
	require.NoError(t, err)
	require.NoError(t, nt.Record(s))
	require.NoError(t, nt.Synchronize())
	_, err = cuda.ElapsedTime(start, nt)
	assert.Error(t, err, "ElapsedTime accepted an event without timing")
	_, err = ctx.NewEvent(cuda.EventInterprocess)
	require.ErrorIs(t, err, cuda.ErrInvalidValue)
	_, err = ctx.NewEvent(0x100)
	require.ErrorIs(t, err, cuda.ErrInvalidValue)

	b, err := cuda.EventFromHandle(ctx, nt.Handle())
	require.NoError(t, err)
	done, err := b.Query()
	require.NoError(t, err)
	assert.True(t, done, "borrowed event not done")
	require.NoError(t, b.Close())
	require.NoError(t, nt.Synchronize()) // still alive

	for _, e := range []*cuda.Event{start, end, nt} {
		require.NoError(t, e.Close())
		require.ErrorIs(t, e.Close(), cuda.ErrInvalidHandle)
		require.ErrorIs(t, e.Record(s), cuda.ErrInvalidHandle)
		require.ErrorIs(t, e.Synchronize(), cuda.ErrInvalidHandle)
		require.ErrorIs(t, s.WaitEvent(e), cuda.ErrInvalidHandle)
		assert.Zero(t, e.Handle(), "closed event has a handle")
	}
	_, err = cuda.ElapsedTime(start, end)
	require.ErrorIs(t, err, cuda.ErrInvalidHandle)
}

// mmapHost returns n bytes of anonymous mmap memory: host memory CUDA does not
// know (pageable, unregistered), and not Go heap memory.
func mmapHost(t testing.TB, n int) []byte {
	t.Helper()
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { syscall.Munmap(b) })
	return b
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

func TestMemory(t *testing.T) {
	dev := testenv.RequireGPU(t)
	caps, _ := dev.Caps()
	ctx := newContext(t)
	s := newStream(t, ctx)
	const n = 1 << 20

	dm := devMem(t, ctx, n)
	dm2 := devMem(t, ctx, n)
	src := hostMem(t, ctx, n, cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
	dst := hostMem(t, ctx, n, 0)
	assert.Zero(t, dst.DevicePtr(), "unmapped pinned memory has a device pointer")
	for i, b := 0, src.Bytes(); i < n; i++ {
		b[i] = byte(i * 31)
	}

	// H2D, memset, D2D, generic copy, D2H.
	require.NoError(t, s.MemcpyHtoD(dm.Ptr(), src.Addr(), n))
	require.NoError(t, s.MemsetD8(dm.Ptr()+100, 0xab, 50))
	require.NoError(t, s.MemcpyDtoD(dm2.Ptr(), dm.Ptr(), n))
	require.NoError(t, s.Memcpy(dst.Addr(), dm2.Ptr(), n))
	syncWithin(t, s, 5*time.Second)
	want := func(i int) byte {
		if i >= 100 && i < 150 {
			return 0xab
		}
		return byte(i * 31)
	}
	got := dst.Bytes()
	requireEach(t, n, want, func(i int) byte { return got[i] }, "byte")
	require.NoError(t, s.MemsetD32(dm.Ptr(), 0xdeadbeef, n/4))
	require.NoError(t, s.MemcpyDtoH(dst.Addr(), dm.Ptr(), n))
	syncWithin(t, s, 5*time.Second)
	requireEach(t, n/4, func(int) uint32 { return 0xdeadbeef },
		func(i int) uint32 { return *(*uint32)(unsafe.Add(dst.Ptr(), 4*i)) }, "MemsetD32: word")

	// Registered mmap memory, mapped for the device.
	region := mmapHost(t, n)
	reg, err := ctx.MemHostRegister(addr(region), n, cuda.HostRegisterPortable|cuda.HostRegisterDeviceMap)
	require.NoError(t, err)
	require.NotZero(t, reg.DevicePtr(), "registered memory has no device pointer")
	require.NoError(t, s.Memcpy(reg.DevicePtr(), src.DevicePtr(), n))
	syncWithin(t, s, 5*time.Second)
	for _, i := range []int{77, n - 1} {
		require.Equal(t, byte(i*31), region[i], "copy into registered memory: byte %d", i)
	}
	_, err = ctx.MemHostRegister(addr(region), n, 0)
	require.ErrorIs(t, err, cuda.ErrHostMemoryRegistered)

	// Pointer attributes tell the kinds apart.
	managed := managedMem(t, ctx, 4096)
	goMem := make([]byte, 64)
	kinds := []struct {
		name    string
		p       uintptr
		typ     cuda.MemoryType
		managed bool
	}{
		{"device", dm.Ptr() + 10, cuda.MemoryDevice, false},
		{"pinned", src.Addr(), cuda.MemoryHost, false},
		{"pinned device view", src.DevicePtr(), cuda.MemoryHost, false},
		{"registered", addr(region) + 5, cuda.MemoryHost, false},
		{"managed", managed.Ptr(), cuda.MemoryDevice, true},
		{"mmap", addr(mmapHost(t, 4096)), cuda.MemoryUnregistered, false},
		{"go heap", addr(goMem), cuda.MemoryUnregistered, false},
	}
	for _, k := range kinds {
		a, err := ctx.PointerAttributes(k.p)
		require.NoError(t, err)
		t.Logf("%s: %+v", k.name, a)
		typ := a.Type
		if k.managed && typ == cuda.MemoryUnified {
			typ = cuda.MemoryDevice
		}
		if k.typ == cuda.MemoryUnregistered && typ != k.typ && caps.PageableMemoryAccess {
			t.Logf("%s: reported as %v on a device that reaches pageable memory", k.name, typ)
			continue
		}
		assert.Equalf(t, k.typ, typ, "%s: type (reported %v)", k.name, a.Type)
		assert.Equal(t, k.managed, a.Managed, "%s: managed", k.name)
		if k.typ == cuda.MemoryDevice && !k.managed {
			assert.Zero(t, a.DeviceOrdinal, "%s: device ordinal", k.name)
		}
		if k.typ == cuda.MemoryUnregistered {
			assert.Equal(t, -1, a.DeviceOrdinal, "%s: device ordinal", k.name)
		}
	}
	a, err := ctx.PointerAttributes(dm.Ptr() + 10)
	require.NoError(t, err)
	assert.Equal(t, dm.Ptr(), a.RangeStart, "device range start: %+v", a)
	assert.EqualValues(t, n, a.RangeSize, "device range size: %+v", a)
	assert.Equal(t, ctx.Handle(), a.Context, "device range context: %+v", a)
	v, err := ctx.PointerGetAttribute(cuda.PointerAttrMemoryType, dm.Ptr())
	require.NoError(t, err)
	assert.Equal(t, cuda.MemoryDevice, cuda.MemoryType(v), "single attribute memory type")
	if _, err = ctx.PointerGetAttribute(cuda.PointerAttrMemoryType, addr(goMem)); !caps.PageableMemoryAccess {
		require.ErrorIs(t, err, cuda.ErrInvalidValue)
	}
	dp, err := ctx.HostGetDevicePointer(src.Addr())
	require.NoError(t, err)
	assert.Equal(t, src.DevicePtr(), dp, "HostGetDevicePointer")
	if caps.UnifiedAddressing && dp != src.Addr() {
		t.Logf("note: mapped pinned memory has different host and device addresses (%#x, %#x)", src.Addr(), dp)
	}

	// Frees: twice is an error, and a freed block reports a zero address.
	require.NoError(t, reg.Close())
	require.ErrorIs(t, reg.Close(), cuda.ErrInvalidHandle)
	_, err = ctx.MemAlloc(0)
	require.ErrorIs(t, err, cuda.ErrInvalidValue)
	_, err = ctx.MemAlloc(1 << 52)
	assert.Truef(t, errors.Is(err, cuda.ErrOutOfMemory) || errors.Is(err, cuda.ErrInvalidValue),
		"allocating 4 PiB: %v, want ErrOutOfMemory or ErrInvalidValue", err)
	_, err = ctx.MemHostAlloc(8, 0x40)
	require.ErrorIs(t, err, cuda.ErrInvalidValue)
	extra, err := ctx.MemAlloc(8)
	require.NoError(t, err)
	require.NoError(t, extra.Close())
	require.ErrorIs(t, extra.Close(), cuda.ErrInvalidHandle)
	assert.Zero(t, extra.Ptr(), "freed memory has an address")
}

// TestCopyWrongKinds: copies and memsets naming memory of the wrong kind fail at
// the call instead of crashing. Run in a child process: were the driver to
// accept one and fault later, the fault would poison only that process.
func TestCopyWrongKinds(t *testing.T) {
	dev := testenv.RequireGPU(t)
	if !isolated(t) {
		return
	}
	caps, _ := dev.Caps()
	if caps.PageableMemoryAccess {
		t.Skip("the device can access pageable host memory (HMM/ATS): plain host memory is not the wrong kind here")
	}
	ctx := newContext(t)
	s := newStream(t, ctx)
	a := mmapHost(t, 4096)
	b := mmapHost(t, 4096)
	dm := devMem(t, ctx, 4096)

	assert.Error(t, s.MemcpyDtoD(addr(a), addr(b), 4096), "DtoD between unregistered host buffers was accepted")
	assert.Error(t, s.MemcpyHtoD(addr(a), dm.Ptr(), 4096), "HtoD into unregistered host memory was accepted")
	assert.Error(t, s.MemcpyDtoH(addr(a), addr(b), 4096), "DtoH from unregistered host memory was accepted")
	assert.Error(t, s.MemsetD8(addr(a), 1, 4096), "memset of unregistered host memory was accepted")
	// The unified copy treats unknown memory as pageable host memory: a
	// host-to-host copy is fine.
	a[10] = 42
	require.NoError(t, s.Memcpy(addr(b), addr(a), 4096))
	syncWithin(t, s, 5*time.Second)
	assert.Equal(t, byte(42), b[10], "pageable host-to-host copy")
	// And the stream is still healthy.
	require.NoError(t, s.MemsetD8(dm.Ptr(), 7, 4096))
	syncWithin(t, s, 5*time.Second)
}

func TestPeerAccess(t *testing.T) {
	testenv.RequireGPU(t)
	if gpuCount(t) < 2 {
		t.Skip("one GPU: no peer to access")
	}
	d0, _ := cuda.GetDevice(0)
	d1, _ := cuda.GetDevice(1)
	can, err := d0.CanAccessPeer(d1)
	require.NoError(t, err)
	c0, err := d0.RetainPrimaryContext()
	require.NoError(t, err)
	defer c0.Close()
	c1, err := d1.RetainPrimaryContext()
	require.NoError(t, err)
	defer c1.Close()
	if !can {
		err := c0.EnablePeerAccess(c1)
		require.ErrorIs(t, err, cuda.ErrPeerAccessUnsupported)
		t.Skip("devices 0 and 1 cannot access each other")
	}
	if err = c0.EnablePeerAccess(c1); !errors.Is(err, cuda.ErrPeerAccessAlreadyOn) {
		require.NoError(t, err)
	}
	require.ErrorIs(t, c0.EnablePeerAccess(c1), cuda.ErrPeerAccessAlreadyOn)

	const n = 8 << 20
	m0 := devMem(t, c0, n)
	m1 := devMem(t, c1, n)
	h := hostMem(t, c0, n, 0)
	s := newStream(t, c0)
	require.NoError(t, s.MemsetD8(m0.Ptr(), 0x3c, n))
	require.NoError(t, s.MemcpyPeer(m1.Ptr(), c1, m0.Ptr(), c0, n))
	require.NoError(t, s.Memcpy(h.Addr(), m1.Ptr(), n))
	syncWithin(t, s, 5*time.Second)
	b := h.Bytes()
	require.Equal(t, byte(0x3c), b[0], "peer copy: first byte")
	require.Equal(t, byte(0x3c), b[n-1], "peer copy: last byte")
	require.NoError(t, c0.DisablePeerAccess(c1))
	require.ErrorIs(t, c0.DisablePeerAccess(c1), cuda.ErrPeerAccessNotEnabled)
}

func TestLaunchHostFunc(t *testing.T) {
	ctx := newContext(t)
	s := newStream(t, ctx)
	w := newWords(t, ctx, 2)

	// Callbacks run in stream order, after the work enqueued before them.
	var mu sync.Mutex
	var order []int
	var misordered atomic.Int32
	for i := 1; i <= 100; i++ {
		require.NoError(t, s.WriteValue64(w.dev(0), uint64(i), cuda.WriteDefault))
		require.NoError(t, s.LaunchHostFunc(func() {
			if w.load(0) != uint64(i) {
				misordered.Add(1)
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
		}))
	}
	syncWithin(t, s, 5*time.Second)
	require.Len(t, order, 100, "callbacks")
	require.Zero(t, misordered.Load(), "callbacks that saw a later word")
	for i, v := range order {
		require.Equal(t, i+1, v, "callback at position %d", i)
	}

	// A callback holds back the stream until it returns.
	gate := make(chan struct{})
	require.NoError(t, s.LaunchHostFunc(func() { <-gate }))
	require.NoError(t, s.WriteValue64(w.dev(1), 1, cuda.WriteDefault))
	time.Sleep(blockedFor)
	done, _ := s.Query()
	ranPast := done || w.load(1) != 0
	close(gate) // before failing too: the stream must not stay blocked
	require.False(t, ranPast, "the stream ran past a blocked callback")
	syncWithin(t, s, 5*time.Second)
	require.Equal(t, uint64(1), w.load(1), "work after the callback did not run")
}

package cuda_test

// GPU tests of devices, contexts, streams, memops, events, memory and host
// functions. They skip where there is no driver and fail where a driver is
// present but lacks what ucpx needs (see requireGPU).

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/ucpx/ucpx/cgo/cuda"
)

const blockedFor = 20 * time.Millisecond // how long a wait must stay blocked to count as blocked

func TestDeviceInfo(t *testing.T) {
	requireGPU(t)
	v, err := cuda.DriverVersion()
	must(t, err)
	t.Logf("driver supports CUDA %d.%d", v/1000, v%1000/10)
	if v < 12030 {
		t.Errorf("driver CUDA %d: ucpx needs 12.3 or newer (cuStreamGetCaptureInfo_v3, cuGraphAddDependencies_v2)", v)
	}
	for _, s := range cuda.Symbols() {
		if !s.Loaded {
			t.Errorf("driver lacks %s (%s)", s.Name, s.API)
		}
	}
	n := gpuCount(t)
	for i := 0; i < n; i++ {
		d, err := cuda.GetDevice(i)
		must(t, err)
		if d.Ordinal() != i {
			t.Errorf("ordinal %d, want %d", d.Ordinal(), i)
		}
		name, err := d.Name()
		must(t, err)
		bus, err := d.PCIBusID()
		must(t, err)
		major, minor, err := d.ComputeCapability()
		must(t, err)
		mem, err := d.TotalMem()
		must(t, err)
		caps, err := d.Caps()
		must(t, err)
		caps2, err := d.Caps()
		must(t, err)
		if caps != caps2 {
			t.Error("cached caps changed")
		}
		t.Logf("device %d: %s pci %s sm_%d%d %d MiB caps %+v", i, name, bus, major, minor, mem>>20, caps)
		if name == "" || bus == "" || mem == 0 {
			t.Errorf("device %d: empty name, bus id or memory", i)
		}
		if major*10+minor < 75 {
			t.Errorf("device %d is sm_%d%d; the test PTX targets compute_75", i, major, minor)
		}
		if caps.ComputeMajor != major || caps.ComputeMinor != minor {
			t.Errorf("caps CC %d.%d vs %d.%d", caps.ComputeMajor, caps.ComputeMinor, major, minor)
		}
		warp, err := d.Attribute(cuda.AttrWarpSize)
		must(t, err)
		if warp != 32 {
			t.Errorf("warp size %d", warp)
		}
		for j := 0; j < n; j++ {
			if i == j {
				continue
			}
			p, _ := cuda.GetDevice(j)
			can, err := d.CanAccessPeer(p)
			must(t, err)
			t.Logf("device %d -> %d peer access: %v", i, j, can)
		}
	}
	_, err = cuda.GetDevice(n)
	mustIs(t, err, cuda.ErrInvalidDevice)
	_, err = cuda.GetDevice(-1)
	mustIs(t, err, cuda.ErrInvalidValue)
	_, err = (cuda.Device{}).Attribute(99999)
	mustIs(t, err, cuda.ErrInvalidValue)
}

func TestPrimaryContext(t *testing.T) {
	dev := requireGPU(t)
	ctx, err := dev.RetainPrimaryContext()
	must(t, err)
	ctx2, err := dev.RetainPrimaryContext()
	must(t, err)
	if ctx.Handle() == 0 || ctx.Handle() != ctx2.Handle() {
		t.Fatalf("primary context handles %#x and %#x", ctx.Handle(), ctx2.Handle())
	}
	if ctx.Device().Ordinal() != 0 {
		t.Errorf("device %d", ctx.Device().Ordinal())
	}
	least, greatest, err := ctx.StreamPriorityRange()
	must(t, err)
	if greatest > least {
		t.Errorf("priority range %d..%d", least, greatest)
	}
	free, total, err := ctx.MemGetInfo()
	must(t, err)
	if total == 0 || free > total {
		t.Errorf("mem info free %d total %d", free, total)
	}
	must(t, ctx.Synchronize())

	borrowed, err := cuda.ContextFromHandle(ctx.Handle())
	must(t, err)
	if borrowed.Handle() != ctx.Handle() || borrowed.Device().Ordinal() != 0 {
		t.Errorf("borrowed context %#x on device %d", borrowed.Handle(), borrowed.Device().Ordinal())
	}
	must(t, borrowed.Close())
	mustIs(t, borrowed.Close(), cuda.ErrInvalidHandle)
	must(t, ctx.Synchronize()) // closing a borrowed wrapper released nothing

	must(t, ctx2.Close())
	must(t, ctx.Close())
	mustIs(t, ctx.Close(), cuda.ErrInvalidHandle)
	_, err = ctx.NewStream(cuda.StreamNonBlocking, 0)
	mustIs(t, err, cuda.ErrInvalidHandle)
	mustIs(t, ctx.Synchronize(), cuda.ErrInvalidHandle)
	_, err = cuda.ContextFromHandle(0)
	mustIs(t, err, cuda.ErrInvalidValue)
}

// TestContextPerCall: wrappers work from goroutines on any OS thread, whatever
// context that thread has current, and put a displaced context back.
func TestContextPerCall(t *testing.T) {
	ctx := newContext(t)
	w := newWords(t, ctx, 64)

	runtime.LockOSThread()
	must(t, cuda.ClearCurrent())
	s := newStream(t, ctx) // made on a thread with no current context
	cur, err := cuda.CurrentContext()
	must(t, err)
	if cur != ctx.Handle() {
		t.Errorf("a thread with no context should keep the wrapper's: got %#x", cur)
	}
	if gpuCount(t) > 1 {
		d1, err := cuda.GetDevice(1)
		must(t, err)
		ctx1, err := d1.RetainPrimaryContext()
		must(t, err)
		defer ctx1.Close()
		must(t, ctx1.SetCurrent())
		must(t, s.WriteValue64(w.dev(0), 1, cuda.WriteDefault)) // runs in ctx, not ctx1
		cur, err := cuda.CurrentContext()
		must(t, err)
		if cur != ctx1.Handle() {
			t.Errorf("the caller's context was not restored: %#x, want %#x", cur, ctx1.Handle())
		}
		syncWithin(t, s, 5*time.Second)
		if w.load(0) != 1 {
			t.Error("write from a thread bound to another device's context did not land")
		}
	}
	runtime.UnlockOSThread()

	// Many goroutines, hopping threads, enqueue on one stream and their own streams.
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			own, err := ctx.NewStream(cuda.StreamNonBlocking, 0)
			if err != nil {
				t.Error(err)
				return
			}
			defer own.Close()
			for i := 1; i <= 200; i++ {
				if err := own.WriteValue64(w.dev(8+g), uint64(i), cuda.WriteDefault); err != nil {
					t.Error(err)
					return
				}
				if err := s.WriteValue64(w.dev(32+g), uint64(i), cuda.WriteDefault); err != nil {
					t.Error(err)
					return
				}
				if i%16 == 0 {
					runtime.Gosched()
				}
			}
			if err := own.Synchronize(); err != nil {
				t.Error(err)
			}
		}(g)
	}
	wg.Wait()
	syncWithin(t, s, 5*time.Second)
	for g := 0; g < 8; g++ {
		if w.load(8+g) != 200 || w.load(32+g) != 200 {
			t.Errorf("goroutine %d: words %d %d, want 200", g, w.load(8+g), w.load(32+g))
		}
	}
}

func TestStreamLifecycle(t *testing.T) {
	ctx := newContext(t)
	w := newWords(t, ctx, 4)
	least, greatest, err := ctx.StreamPriorityRange()
	must(t, err)
	for _, flags := range []cuda.StreamFlags{cuda.StreamDefault, cuda.StreamNonBlocking} {
		for _, prio := range []int{least, greatest} {
			s, err := ctx.NewStream(flags, prio)
			must(t, err)
			must(t, s.WriteValue64(w.dev(0), uint64(prio+100), cuda.WriteDefault))
			syncWithin(t, s, 5*time.Second)
			done, err := s.Query()
			must(t, err)
			if !done {
				t.Error("idle stream not done")
			}
			must(t, s.Close())
		}
	}
	_, err = ctx.NewStream(0x80, 0)
	mustIs(t, err, cuda.ErrInvalidValue)

	s, err := ctx.NewStream(cuda.StreamNonBlocking, 0)
	must(t, err)
	h := s.Handle()
	if h == 0 || s.Context() != ctx {
		t.Fatal("stream handle or context")
	}
	// A borrowed wrapper works and does not destroy the stream on Close.
	b, err := cuda.StreamFromHandle(h)
	must(t, err)
	if b.Context().Handle() != ctx.Handle() {
		t.Error("StreamFromHandle found another context")
	}
	must(t, b.WriteValue64(w.dev(1), 5, cuda.WriteDefault))
	must(t, b.Synchronize())
	must(t, b.Close())
	mustIs(t, b.Close(), cuda.ErrInvalidHandle)
	must(t, s.WriteValue64(w.dev(1), 6, cuda.WriteDefault))
	must(t, s.Synchronize())
	if w.load(1) != 6 {
		t.Errorf("word %d after borrowed Close", w.load(1))
	}
	_, err = cuda.StreamFromHandle(0)
	mustIs(t, err, cuda.ErrInvalidValue)

	must(t, s.Close())
	if s.Handle() != 0 {
		t.Error("closed stream still has a handle")
	}
	mustIs(t, s.Close(), cuda.ErrInvalidHandle)
	mustIs(t, s.WriteValue64(w.dev(0), 1, 0), cuda.ErrInvalidHandle)
	mustIs(t, s.WaitValue64(w.dev(0), 1, cuda.WaitGEQ), cuda.ErrInvalidHandle)
	mustIs(t, s.Synchronize(), cuda.ErrInvalidHandle)
	_, err = s.Query()
	mustIs(t, err, cuda.ErrInvalidHandle)
	mustIs(t, s.LaunchHostFunc(func() {}), cuda.ErrInvalidHandle)
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
	must(t, err)
	must(t, s.WriteValue64(w.dev(marker), 1, cuda.WriteDefault))
	defer w.store(word, release) // never leave the stream blocked
	time.Sleep(blockedFor)
	done, err := s.Query()
	must(t, err)
	if done || w.load(marker) != 0 {
		t.Fatalf("wait %#x (64-bit %v) on %#x for %#x did not block", flags, wide, blocked, target)
	}
	w.store(word, release)
	eventually(t, 5*time.Second, "the wait to release", func() bool { return w.load(marker) == 1 })
	syncWithin(t, s, 5*time.Second)
}

func TestMemops64(t *testing.T) {
	dev := requireGPU(t)
	caps, _ := dev.Caps()
	ctx := newContext(t)
	s := newStream(t, ctx)
	w := newWords(t, ctx, 8)

	must(t, s.WriteValue64(w.dev(2), 0x1122334455667788, cuda.WriteDefault))
	// The v2 memop API has no NO_MEMORY_BARRIER (driver 580 said INVALID_VALUE).
	if err := s.WriteValue64(w.dev(3), 42, cuda.WriteNoMemoryBarrier); !errors.Is(err, cuda.ErrNotSupported) {
		t.Fatalf("WriteNoMemoryBarrier: %v, want ErrNotSupported", err)
	}
	must(t, s.WriteValue64(w.dev(3), 42, cuda.WriteDefault))
	syncWithin(t, s, 5*time.Second)
	if w.load(2) != 0x1122334455667788 || w.load(3) != 42 {
		t.Fatalf("writes: %#x %d", w.load(2), w.load(3))
	}

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
	must(t, s.WaitValue64(w.dev(4), 50, cuda.WaitGEQ))
	must(t, s.WaitValue64(w.dev(4), 100, cuda.WaitEQ))
	syncWithin(t, s, 5*time.Second)

	// Bad addresses are refused before the driver and leave the stream usable.
	mustIs(t, s.WaitValue64(w.dev(0)+4, 1, cuda.WaitGEQ), cuda.ErrInvalidValue)
	mustIs(t, s.WriteValue64(w.dev(0)+2, 1, 0), cuda.ErrInvalidValue)
	mustIs(t, s.WaitValue64(0, 1, cuda.WaitGEQ), cuda.ErrInvalidValue)
	must(t, s.WriteValue64(w.dev(5), 9, 0))
	syncWithin(t, s, 5*time.Second)
	if w.load(5) != 9 {
		t.Fatal("stream unusable after refused calls")
	}
}

func TestMemops32(t *testing.T) {
	dev := requireGPU(t)
	caps, _ := dev.Caps()
	ctx := newContext(t)
	s := newStream(t, ctx)
	w := newWords(t, ctx, 8)

	// 32-bit ops touch the low half of a 64-bit word (little-endian).
	w.store(2, 0xaaaaaaaa_00000000)
	must(t, s.WriteValue32(w.dev(2), 0x12345678, cuda.WriteDefault))
	must(t, s.WriteValue32(w.dev(3)+4, 0x9abcdef0, cuda.WriteDefault))
	syncWithin(t, s, 5*time.Second)
	if w.load(2) != 0xaaaaaaaa_12345678 || w.load(3) != 0x9abcdef0_00000000 {
		t.Fatalf("32-bit writes: %#x %#x", w.load(2), w.load(3))
	}

	checkWait(t, s, w, false, cuda.WaitGEQ, 10, 9, 10)
	checkWait(t, s, w, false, cuda.WaitGEQ, 2, 0xffffffff, 2) // wrap-aware on 32 bits
	checkWait(t, s, w, false, cuda.WaitEQ, 7, 8, 7)
	checkWait(t, s, w, false, cuda.WaitAND, 0b100, 0b011, 0b100)
	if caps.WaitValueNOR {
		checkWait(t, s, w, false, cuda.WaitNOR, 0xfffffff0, 0xf, 0x7)
	}
	mustIs(t, s.WaitValue32(w.dev(0)+2, 1, cuda.WaitGEQ), cuda.ErrInvalidValue)
	mustIs(t, s.BatchMemOp([]cuda.MemOp{{Kind: cuda.MemOpWriteValue32, Addr: w.dev(0), Value: 1 << 33}}), cuda.ErrInvalidValue)
}

func TestBatchMemOp(t *testing.T) {
	dev := requireGPU(t)
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
	must(t, s.BatchMemOp(ops))
	syncWithin(t, s, 5*time.Second)
	if w.load(T) != 77 || w.load(D) != 77 || w.load(X) != 5 {
		t.Fatalf("round trip batch: T=%d D=%d X=%d", w.load(T), w.load(D), w.load(X))
	}

	// The largest batch: one write to each of MaxBatch words.
	big := make([]cuda.MemOp, cuda.MaxBatch)
	for i := range big {
		big[i] = cuda.WriteValue64Op(w.dev(10+i), uint64(1000+i), cuda.WriteDefault)
	}
	must(t, s.BatchMemOp(big))
	syncWithin(t, s, 5*time.Second)
	for i := range big {
		if got := w.load(10 + i); got != uint64(1000+i) {
			t.Fatalf("word %d = %d after the full batch", 10+i, got)
		}
	}
	mustIs(t, s.BatchMemOp(append(big, big[0])), cuda.ErrInvalidValue)
}

func TestStreamWaitEvent(t *testing.T) {
	ctx := newContext(t)
	s1 := newStream(t, ctx)
	s2 := newStream(t, ctx)
	w := newWords(t, ctx, 4)
	e, err := ctx.NewEvent(cuda.EventDisableTiming)
	must(t, err)
	defer e.Close()

	done, err := e.Query()
	must(t, err)
	if !done {
		t.Error("a never-recorded event is not done")
	}
	must(t, s1.WaitValue64(w.dev(0), 1, cuda.WaitGEQ)) // gate
	defer w.store(0, 1)
	must(t, e.Record(s1))
	must(t, s2.WaitEvent(e))
	must(t, s2.WriteValue64(w.dev(1), 1, cuda.WriteDefault))
	time.Sleep(blockedFor)
	if done, _ := e.Query(); done || w.load(1) != 0 {
		t.Fatal("s2 ran ahead of the event")
	}
	w.store(0, 1)
	must(t, e.Synchronize())
	syncWithin(t, s2, 5*time.Second)
	if w.load(1) != 1 {
		t.Fatal("s2 did not run after the event")
	}
}

func TestEvents(t *testing.T) {
	ctx := newContext(t)
	s := newStream(t, ctx)
	dm := devMem(t, ctx, 64<<20)

	start, err := ctx.NewEvent(cuda.EventDefault)
	must(t, err)
	end, err := ctx.NewEvent(cuda.EventBlockingSync)
	must(t, err)
	must(t, start.Record(s))
	for i := 0; i < 4; i++ {
		must(t, s.MemsetD32(dm.Ptr(), uint32(i), dm.Size()/4))
	}
	must(t, end.Record(s))
	must(t, end.Synchronize())
	d, err := cuda.ElapsedTime(start, end)
	must(t, err)
	if d <= 0 || d > 10*time.Second {
		t.Errorf("elapsed %v", d)
	}
	t.Logf("4 x memset 64 MiB: %v", d)
	_, err = cuda.ElapsedTime(start, start)
	must(t, err)

	nt, err := ctx.NewEvent(cuda.EventDisableTiming)
	must(t, err)
	must(t, nt.Record(s))
	must(t, nt.Synchronize())
	_, err = cuda.ElapsedTime(start, nt)
	if err == nil {
		t.Error("ElapsedTime accepted an event without timing")
	}
	_, err = ctx.NewEvent(cuda.EventInterprocess)
	mustIs(t, err, cuda.ErrInvalidValue)
	_, err = ctx.NewEvent(0x100)
	mustIs(t, err, cuda.ErrInvalidValue)

	b, err := cuda.EventFromHandle(ctx, nt.Handle())
	must(t, err)
	done, err := b.Query()
	must(t, err)
	if !done {
		t.Error("borrowed event not done")
	}
	must(t, b.Close())
	must(t, nt.Synchronize()) // still alive

	for _, e := range []*cuda.Event{start, end, nt} {
		must(t, e.Close())
		mustIs(t, e.Close(), cuda.ErrInvalidHandle)
		mustIs(t, e.Record(s), cuda.ErrInvalidHandle)
		mustIs(t, e.Synchronize(), cuda.ErrInvalidHandle)
		mustIs(t, s.WaitEvent(e), cuda.ErrInvalidHandle)
		if e.Handle() != 0 {
			t.Error("closed event has a handle")
		}
	}
	_, err = cuda.ElapsedTime(start, end)
	mustIs(t, err, cuda.ErrInvalidHandle)
}

// mmapHost returns n bytes of anonymous mmap memory: host memory CUDA does not
// know (pageable, unregistered), and not Go heap memory.
func mmapHost(t testing.TB, n int) []byte {
	t.Helper()
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	must(t, err)
	t.Cleanup(func() { syscall.Munmap(b) })
	return b
}

func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

func TestMemory(t *testing.T) {
	dev := requireGPU(t)
	caps, _ := dev.Caps()
	ctx := newContext(t)
	s := newStream(t, ctx)
	const n = 1 << 20

	dm := devMem(t, ctx, n)
	dm2 := devMem(t, ctx, n)
	src := hostMem(t, ctx, n, cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
	dst := hostMem(t, ctx, n, 0)
	if dst.DevicePtr() != 0 {
		t.Error("unmapped pinned memory has a device pointer")
	}
	for i, b := 0, src.Bytes(); i < n; i++ {
		b[i] = byte(i * 31)
	}

	// H2D, memset, D2D, generic copy, D2H.
	must(t, s.MemcpyHtoD(dm.Ptr(), src.Addr(), n))
	must(t, s.MemsetD8(dm.Ptr()+100, 0xab, 50))
	must(t, s.MemcpyDtoD(dm2.Ptr(), dm.Ptr(), n))
	must(t, s.Memcpy(dst.Addr(), dm2.Ptr(), n))
	syncWithin(t, s, 5*time.Second)
	for i, b := 0, dst.Bytes(); i < n; i++ {
		want := byte(i * 31)
		if i >= 100 && i < 150 {
			want = 0xab
		}
		if b[i] != want {
			t.Fatalf("byte %d = %#x, want %#x", i, b[i], want)
		}
	}
	must(t, s.MemsetD32(dm.Ptr(), 0xdeadbeef, n/4))
	must(t, s.MemcpyDtoH(dst.Addr(), dm.Ptr(), n))
	syncWithin(t, s, 5*time.Second)
	for i := 0; i < n/4; i++ {
		if v := *(*uint32)(unsafe.Add(dst.Ptr(), 4*i)); v != 0xdeadbeef {
			t.Fatalf("word %d = %#x after MemsetD32", i, v)
		}
	}

	// Registered mmap memory, mapped for the device.
	region := mmapHost(t, n)
	reg, err := ctx.MemHostRegister(addr(region), n, cuda.HostRegisterPortable|cuda.HostRegisterDeviceMap)
	must(t, err)
	if reg.DevicePtr() == 0 {
		t.Fatal("registered memory has no device pointer")
	}
	must(t, s.Memcpy(reg.DevicePtr(), src.DevicePtr(), n))
	syncWithin(t, s, 5*time.Second)
	if i, last := 77, n-1; region[i] != byte(i*31) || region[last] != byte(last*31) {
		t.Fatal("copy into registered memory")
	}
	_, err = ctx.MemHostRegister(addr(region), n, 0)
	mustIs(t, err, cuda.ErrHostMemoryRegistered)

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
		must(t, err)
		t.Logf("%s: %+v", k.name, a)
		typ := a.Type
		if k.managed && typ == cuda.MemoryUnified {
			typ = cuda.MemoryDevice
		}
		if k.typ == cuda.MemoryUnregistered && typ != k.typ && caps.PageableMemoryAccess {
			t.Logf("%s: reported as %v on a device that reaches pageable memory", k.name, typ)
			continue
		}
		if typ != k.typ || a.Managed != k.managed {
			t.Errorf("%s: type %v managed %v, want %v %v", k.name, a.Type, a.Managed, k.typ, k.managed)
		}
		if k.typ == cuda.MemoryDevice && !k.managed && a.DeviceOrdinal != 0 {
			t.Errorf("%s: device ordinal %d", k.name, a.DeviceOrdinal)
		}
		if k.typ == cuda.MemoryUnregistered && a.DeviceOrdinal != -1 {
			t.Errorf("%s: device ordinal %d", k.name, a.DeviceOrdinal)
		}
	}
	a, err := ctx.PointerAttributes(dm.Ptr() + 10)
	must(t, err)
	if a.RangeStart != dm.Ptr() || a.RangeSize != n || a.Context != ctx.Handle() {
		t.Errorf("device range %+v", a)
	}
	v, err := ctx.PointerGetAttribute(cuda.PointerAttrMemoryType, dm.Ptr())
	must(t, err)
	if cuda.MemoryType(v) != cuda.MemoryDevice {
		t.Errorf("single attribute memory type %d", v)
	}
	if _, err = ctx.PointerGetAttribute(cuda.PointerAttrMemoryType, addr(goMem)); !caps.PageableMemoryAccess {
		mustIs(t, err, cuda.ErrInvalidValue)
	}
	dp, err := ctx.HostGetDevicePointer(src.Addr())
	must(t, err)
	if dp != src.DevicePtr() {
		t.Errorf("HostGetDevicePointer %#x vs %#x", dp, src.DevicePtr())
	}
	if caps.UnifiedAddressing && dp != src.Addr() {
		t.Logf("note: mapped pinned memory has different host and device addresses (%#x, %#x)", src.Addr(), dp)
	}

	// Frees: twice is an error, and a freed block reports a zero address.
	must(t, reg.Close())
	mustIs(t, reg.Close(), cuda.ErrInvalidHandle)
	_, err = ctx.MemAlloc(0)
	mustIs(t, err, cuda.ErrInvalidValue)
	if _, err = ctx.MemAlloc(1 << 52); !errors.Is(err, cuda.ErrOutOfMemory) && !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("allocating 4 PiB: %v", err)
	}
	_, err = ctx.MemHostAlloc(8, 0x40)
	mustIs(t, err, cuda.ErrInvalidValue)
	extra, err := ctx.MemAlloc(8)
	must(t, err)
	must(t, extra.Close())
	mustIs(t, extra.Close(), cuda.ErrInvalidHandle)
	if extra.Ptr() != 0 {
		t.Error("freed memory has an address")
	}
}

// TestCopyWrongKinds: copies and memsets naming memory of the wrong kind fail at
// the call instead of crashing. Run in a child process: were the driver to
// accept one and fault later, the fault would poison only that process.
func TestCopyWrongKinds(t *testing.T) {
	dev := requireGPU(t)
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

	if err := s.MemcpyDtoD(addr(a), addr(b), 4096); err == nil {
		t.Error("DtoD between unregistered host buffers was accepted")
	}
	if err := s.MemcpyHtoD(addr(a), dm.Ptr(), 4096); err == nil {
		t.Error("HtoD into unregistered host memory was accepted")
	}
	if err := s.MemcpyDtoH(addr(a), addr(b), 4096); err == nil {
		t.Error("DtoH from unregistered host memory was accepted")
	}
	if err := s.MemsetD8(addr(a), 1, 4096); err == nil {
		t.Error("memset of unregistered host memory was accepted")
	}
	// The unified copy treats unknown memory as pageable host memory: a
	// host-to-host copy is fine.
	a[10] = 42
	must(t, s.Memcpy(addr(b), addr(a), 4096))
	syncWithin(t, s, 5*time.Second)
	if b[10] != 42 {
		t.Error("pageable host-to-host copy")
	}
	// And the stream is still healthy.
	must(t, s.MemsetD8(dm.Ptr(), 7, 4096))
	syncWithin(t, s, 5*time.Second)
}

func TestPeerAccess(t *testing.T) {
	requireGPU(t)
	if gpuCount(t) < 2 {
		t.Skip("one GPU: no peer to access")
	}
	d0, _ := cuda.GetDevice(0)
	d1, _ := cuda.GetDevice(1)
	can, err := d0.CanAccessPeer(d1)
	must(t, err)
	c0, err := d0.RetainPrimaryContext()
	must(t, err)
	defer c0.Close()
	c1, err := d1.RetainPrimaryContext()
	must(t, err)
	defer c1.Close()
	if !can {
		err := c0.EnablePeerAccess(c1)
		mustIs(t, err, cuda.ErrPeerAccessUnsupported)
		t.Skip("devices 0 and 1 cannot access each other")
	}
	err = c0.EnablePeerAccess(c1)
	if err != nil && !errors.Is(err, cuda.ErrPeerAccessAlreadyOn) {
		t.Fatal(err)
	}
	mustIs(t, c0.EnablePeerAccess(c1), cuda.ErrPeerAccessAlreadyOn)

	const n = 8 << 20
	m0 := devMem(t, c0, n)
	m1 := devMem(t, c1, n)
	h := hostMem(t, c0, n, 0)
	s := newStream(t, c0)
	must(t, s.MemsetD8(m0.Ptr(), 0x3c, n))
	must(t, s.MemcpyPeer(m1.Ptr(), c1, m0.Ptr(), c0, n))
	must(t, s.Memcpy(h.Addr(), m1.Ptr(), n))
	syncWithin(t, s, 5*time.Second)
	if b := h.Bytes(); b[0] != 0x3c || b[n-1] != 0x3c {
		t.Fatal("peer copy")
	}
	must(t, c0.DisablePeerAccess(c1))
	mustIs(t, c0.DisablePeerAccess(c1), cuda.ErrPeerAccessNotEnabled)
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
		must(t, s.WriteValue64(w.dev(0), uint64(i), cuda.WriteDefault))
		must(t, s.LaunchHostFunc(func() {
			if w.load(0) != uint64(i) {
				misordered.Add(1)
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
		}))
	}
	syncWithin(t, s, 5*time.Second)
	if len(order) != 100 || misordered.Load() != 0 {
		t.Fatalf("%d callbacks, %d saw a later word", len(order), misordered.Load())
	}
	for i, v := range order {
		if v != i+1 {
			t.Fatalf("callback %d ran at position %d", v, i)
		}
	}

	// A callback holds back the stream until it returns.
	gate := make(chan struct{})
	must(t, s.LaunchHostFunc(func() { <-gate }))
	must(t, s.WriteValue64(w.dev(1), 1, cuda.WriteDefault))
	time.Sleep(blockedFor)
	if done, _ := s.Query(); done || w.load(1) != 0 {
		close(gate)
		t.Fatal("the stream ran past a blocked callback")
	}
	close(gate)
	syncWithin(t, s, 5*time.Second)
	if w.load(1) != 1 {
		t.Fatal("work after the callback did not run")
	}
}

package tests

import (
	"context"
	"fmt"
	"hash/crc32"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/internal/testenv"
	"github.com/ucpx/ucpx/internal/testenv/streamenv"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// The engine must never make a driver call that can wait for the application's
// stream work. Here the application blocks in driver calls — pageable copies of the
// very buffers conditioned operations use, allocations, a context synchronize — while
// stream-ordered sends and receives on CUDA streams are pending; the operations need
// the engine to complete before those calls can return. Once, the engine allocated
// the doorbell it rings (cuMemHostAlloc) on its first ring, and on the H200 that
// allocation waited for a pageable device-to-host copy which waited for a receive the
// engine was about to complete: a deadlock. A hang fails the case with a message
// instead of hanging the test.

// blockingKinds are the blocking driver calls, each issued on a goroutine of its own
// while the operations of one case are pending.
var blockingKinds = []string{"d2h", "ctxsync", "memhostalloc", "memalloc", "h2d"}

// blockingLimit bounds each blocking call and each wait of a case; generous, so that
// only a deadlock reaches it.
const blockingLimit = 60 * time.Second

// blockingEnv is one test's setup: two workers over shared memory, a CUDA backend,
// a receiving and a sending stream with a Stream condition each, a setup stream, and
// the gate words that hold each stream's operations back until the case opens them.
type blockingEnv struct {
	ctx          *cuda.Context
	recvW        *ucp.Worker
	toRecv       *ucp.Endpoint
	sr, ss, su   stream.Stream
	csr, css     *cuda.Stream
	csu          *cuda.Stream
	cr, cs       *condition.Condition
	gateR, gateS *stream.Word
}

// blockingBufs are the buffers of one size and memory kind. Device: the operations
// move sendA/sendB (device) into recvA/recvB (device), staged by ucpx. Host: they move
// pinned host memory; devRecv receives a device copy of recvB on the receiving stream
// and devSend is copied into sendB after its send, so that the pageable copies have a
// device buffer the operations' stream work writes or reads in both kinds.
type blockingBufs struct {
	device                     bool
	n                          int
	sendA, sendB, recvA, recvB uintptr
	host                       map[uintptr][]byte // host kind: the bytes of each pinned buffer
	devRecv, devSend           uintptr
}

func TestGPUBlockingDriverCalls(t *testing.T) {
	testenv.RequireGPU(t)
	backend := streamenv.CUDABackend(t)
	ctx, _, ok := stream.CUDAContext(backend)
	require.True(t, ok)
	recvW, _, toRecv, _ := shmWorkers(t)
	gates, err := backend.AllocWords(2)
	require.NoError(t, err)
	t.Cleanup(func() { _ = gates.Close() }) // after the streams (cleanups run last first)
	e := &blockingEnv{ctx: ctx, recvW: recvW, toRecv: toRecv, gateR: gates.Word(0), gateS: gates.Word(1)}
	for _, s := range []*stream.Stream{&e.sr, &e.ss, &e.su} {
		*s, err = backend.NewStream()
		require.NoError(t, err)
		st := *s
		t.Cleanup(func() { _ = st.Close() })
	}
	e.csr, _ = stream.CUDAStream(e.sr)
	e.css, _ = stream.CUDAStream(e.ss)
	e.csu, _ = stream.CUDAStream(e.su)
	e.cr, err = condition.Create(condition.Param{Category: condition.Stream, Backend: backend, Stream: e.sr})
	require.NoError(t, err)
	e.cs, err = condition.Create(condition.Param{Category: condition.Stream, Backend: backend, Stream: e.ss})
	require.NoError(t, err)

	// The first case is the one that deadlocked: 4 bytes of device memory, the copy
	// issued before the operations are triggered, on a backend that never rang.
	idx := 0
	for _, n := range []int{4, 64 << 10, 16 << 20} {
		for _, device := range []bool{true, false} {
			bufs := e.buffers(t, n, device)
			mem := map[bool]string{true: "device", false: "host"}[device]
			for _, order := range []string{"before", "after"} {
				for _, kind := range blockingKinds {
					name := fmt.Sprintf("%dB/%s/%s-trigger/%s", n, mem, order, kind)
					if !t.Run(name, func(t *testing.T) { e.runCase(t, bufs, order, kind, idx) }) {
						t.Fatalf("%s failed: later cases would run on streams that may still be blocked", name)
					}
					idx++
				}
			}
		}
	}
	require.NoError(t, e.cr.Destroy())
	require.NoError(t, e.cs.Destroy())
}

// buffers allocates the buffers of one size and memory kind, freed when the test ends.
func (e *blockingEnv) buffers(t *testing.T, n int, device bool) *blockingBufs {
	t.Helper()
	dev := func() uintptr {
		m, err := e.ctx.MemAlloc(n)
		require.NoError(t, err)
		t.Cleanup(func() { _ = m.Close() })
		return m.Ptr()
	}
	b := &blockingBufs{device: device, n: n, devRecv: dev(), devSend: dev()}
	if device {
		b.sendA, b.sendB, b.recvA, b.recvB = dev(), dev(), dev(), dev()
		return b
	}
	b.host = map[uintptr][]byte{}
	pinned := func() uintptr {
		m, err := e.ctx.MemHostAlloc(n, cuda.HostAllocPortable)
		require.NoError(t, err)
		t.Cleanup(func() { _ = m.Close() })
		b.host[m.Addr()] = m.Bytes()
		return m.Addr()
	}
	b.sendA, b.sendB, b.recvA, b.recvB = pinned(), pinned(), pinned(), pinned()
	return b
}

// slice is the []byte an operation gets for buffer addr.
func (b *blockingBufs) slice(addr uintptr) []byte {
	if b.device {
		return ucp.DeviceBuffer(addr, b.n)
	}
	return b.host[addr]
}

func (b *blockingBufs) param(c *condition.Condition) *ucp.RequestParam {
	p := &ucp.RequestParam{Condition: c}
	if b.device {
		p.MemoryType = ucp.MemoryCUDA
	}
	return p
}

// runCase runs one exchange of two messages, a then b, from the sending stream to the
// receiving stream while the goroutine of the blocking call sits in the driver. With
// order "before" the call is issued before any operation is triggered; with "after",
// a has completed and b's receive is in flight (triggered, issued) when it is issued,
// and b's send is triggered while it is in the driver.
func (e *blockingEnv) runCase(t *testing.T, b *blockingBufs, order, kind string, idx int) {
	n := b.n
	gen := uint64(idx + 1)
	seedA, seedB, seedNew := byte(3*idx+1), byte(3*idx+2), byte(3*idx+3)
	tagA, tagB := uint64(0xb10c000+2*idx), uint64(0xb10c001+2*idx)

	// Sources in, receive buffers cleared.
	srcA, srcB := makePattern(n, seedA), makePattern(n, seedB)
	e.write(t, b, b.sendA, srcA)
	e.write(t, b, b.sendB, srcB)
	zero := make([]byte, n)
	for _, r := range []uintptr{b.recvA, b.recvB, b.devRecv} {
		e.write(t, b, r, zero)
	}

	// The receiving stream: gate, receive a, receive b (host kind: then b's data to
	// the device). The sending stream: gate, send a, gate, send b.
	require.NoError(t, e.sr.WaitValue(e.gateR, gen, stream.GEQ))
	ra, err := e.recvW.TagRecvNbx(b.slice(b.recvA), tagA, ^uint64(0), b.param(e.cr))
	require.NoError(t, err)
	rb, err := e.recvW.TagRecvNbx(b.slice(b.recvB), tagB, ^uint64(0), b.param(e.cr))
	require.NoError(t, err)
	checkedB := b.recvB // the device buffer the pageable copy reads
	if !b.device {
		require.NoError(t, e.sr.Copy(b.devRecv, b.recvB, n))
		checkedB = b.devRecv
	}
	require.NoError(t, e.ss.WaitValue(e.gateS, 2*gen, stream.GEQ))
	sa, err := e.toRecv.TagSendNbx(b.slice(b.sendA), tagA, b.param(e.cs))
	require.NoError(t, err)
	require.NoError(t, e.ss.WaitValue(e.gateS, 2*gen+1, stream.GEQ))
	sb, err := e.toRecv.TagSendNbx(b.slice(b.sendB), tagB, b.param(e.cs))
	require.NoError(t, err)

	openRecv := func() { e.gateR.Store(gen) }
	openA := func() { e.gateS.Store(2 * gen) }
	openB := func() { e.gateS.Store(2*gen + 1) }
	var opener func()
	switch order {
	case "before":
		opener = func() {
			openRecv()
			time.Sleep(2 * time.Millisecond) // both receives issued, waiting for data
			openA()
			time.Sleep(5 * time.Millisecond) // a completes while the call is in the driver
			openB()
		}
	case "after":
		openRecv()
		openA()
		ctx, cancel := context.WithTimeout(context.Background(), blockingLimit)
		defer cancel()
		require.NoError(t, ra.Wait(ctx), "receive a")
		require.NoError(t, sa.Wait(ctx), "send a")
		time.Sleep(2 * time.Millisecond) // b's receive issued, waiting for data
		opener = openB
	}

	// The blocking call, on a goroutine of its own; the operations go on meanwhile.
	gotB := make([]byte, n)
	newB := makePattern(n, seedNew)
	var call func() error
	var pin runtime.Pinner
	defer pin.Unpin()
	switch kind {
	case "d2h": // pageable: returns once the receiving stream reached it and copied
		pin.Pin(&gotB[0])
		call = func() error { return e.csr.MemcpyDtoH(addrOf(gotB), checkedB, n) }
	case "h2d": // pageable: reuses b's send buffer once the sending stream is past its send
		pin.Pin(&newB[0])
		target := b.sendB
		if !b.device {
			target = b.devSend
		}
		call = func() error {
			if err := e.css.MemcpyHtoD(target, addrOf(newB), n); err != nil {
				return err
			}
			if !b.device {
				return e.ss.Copy(b.sendB, b.devSend, n)
			}
			return nil
		}
	case "ctxsync":
		call = e.ctx.Synchronize
	case "memalloc":
		call = func() error {
			m, err := e.ctx.MemAlloc(n)
			if err != nil {
				return err
			}
			return m.Close()
		}
	case "memhostalloc":
		call = func() error {
			m, err := e.ctx.MemHostAlloc(n, cuda.HostAllocPortable)
			if err != nil {
				return err
			}
			return m.Close()
		}
	}
	called := make(chan error, 1)
	go func() { called <- call() }()
	go func() {
		time.Sleep(20 * time.Millisecond) // let the call get into the driver first
		opener()
	}()
	awaitWithin(t, called, fmt.Sprintf("blocking %s", kind))

	// Everything completes, with the right data.
	ctx, cancel := context.WithTimeout(context.Background(), blockingLimit)
	defer cancel()
	for _, r := range []struct {
		what string
		req  *ucp.Request
	}{{"receive a", ra}, {"receive b", rb}, {"send a", sa}, {"send b", sb}} {
		require.NoError(t, r.req.Wait(ctx), "%s", r.what)
	}
	for _, s := range []stream.Stream{e.sr, e.ss} {
		done := make(chan error, 1)
		go func() { done <- s.Synchronize() }()
		awaitWithin(t, done, "stream synchronize")
	}
	require.NoError(t, e.cr.Err())
	require.NoError(t, e.cs.Err())

	if kind != "d2h" {
		gotB = e.read(t, b, checkedB)
	}
	require.Equal(t, crc32.ChecksumIEEE(srcA), crc32.ChecksumIEEE(e.read(t, b, b.recvA)), "message a received")
	require.Equal(t, crc32.ChecksumIEEE(srcB), crc32.ChecksumIEEE(gotB), "message b received")
	if kind == "h2d" {
		got := e.read(t, b, b.sendB)
		require.Equal(t, crc32.ChecksumIEEE(newB), crc32.ChecksumIEEE(got), "b's send buffer reused after the send")
	}
}

// awaitWithin fails the test if the call reporting on done has not returned within
// blockingLimit: the engine waited for the driver, which waited for the engine.
func awaitWithin(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		require.NoError(t, err, what)
	case <-time.After(blockingLimit):
		t.Fatalf("%s did not return within %v: the conditioned operations it waits for did not complete, "+
			"so the engine is blocked (in a driver call waiting for this one?)", what, blockingLimit)
	}
}

// write stores data at addr: a pinned buffer of the host kind directly, device memory
// by a pageable copy on the setup stream.
func (e *blockingEnv) write(t *testing.T, b *blockingBufs, addr uintptr, data []byte) {
	t.Helper()
	if h, ok := b.host[addr]; ok {
		copy(h, data)
		return
	}
	e.pageable(t, "write", data, func(p uintptr) error { return e.csu.Memcpy(addr, p, len(data)) })
}

// read returns a copy of the n bytes at addr (see write).
func (e *blockingEnv) read(t *testing.T, b *blockingBufs, addr uintptr) []byte {
	t.Helper()
	out := make([]byte, b.n)
	if h, ok := b.host[addr]; ok {
		copy(out, h)
		return out
	}
	e.pageable(t, "read", out, func(p uintptr) error { return e.csu.Memcpy(p, addr, b.n) })
	return out
}

// pageable runs enqueue with the address of Go buffer buf, pinned until the setup
// stream, on which enqueue copies, is synchronized.
func (e *blockingEnv) pageable(t *testing.T, what string, buf []byte, enqueue func(p uintptr) error) {
	t.Helper()
	var pin runtime.Pinner
	defer pin.Unpin()
	pin.Pin(&buf[0])
	done := make(chan error, 1)
	go func() {
		if err := enqueue(addrOf(buf)); err != nil {
			done <- err
			return
		}
		done <- e.csu.Synchronize()
	}()
	awaitWithin(t, done, what)
}

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }

// TestGPUBlockingDriverCallsFakeDriver runs the test above against the CPU emulation
// of the driver (cgo/cuda/testdata/fakecuda) where there is no GPU, so its logic and
// the engine's CUDA paths run everywhere. The emulation does not block where a real
// driver does (its pageable copies are asynchronous), so it proves nothing about the
// deadlock itself: the GPU run does.
func TestGPUBlockingDriverCallsFakeDriver(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a child process against the fake driver")
	}
	testenv.RunUnderFakeDriver(t, []string{"TestGPUBlockingDriverCalls"})
}

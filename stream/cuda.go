package stream

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/device"
	"github.com/ucpx/ucpx/stream/streamcore"
)

// The CUDA backend: streams are non-blocking CUstreams of one device's primary
// context, events are CUevents created with CU_EVENT_DISABLE_TIMING, and signal
// words are host-mapped pinned memory (cuMemHostAlloc(PORTABLE|DEVICEMAP)), so
// the CPU reads them with atomics and the GPU through their device address.
//
// Word width: WriteValue and WaitValue use 64-bit stream memops where the device
// supports them (cuda.Caps.StreamMemOps64, true on every GPU ucpx targets).
// Elsewhere they fall back to 32-bit memops on the low half of the word: values
// above 2^32-1 are refused with ErrNotSupported, GEQ then compares the low 32
// bits wrap-aware as int32, and the high half must stay zero (CPU code must not
// store larger values into words a 32-bit device waits on).
//
// The backend holds the primary context until it and every stream, event and
// word block made from it are closed, so closing the backend early never frees
// memory a Word still points to.
//
// # Calls the engine makes
//
// The engine (condition.Engine) must never make a driver call that can wait for the
// application's stream work: the application may sit in a call that waits for its
// stream (a pageable copy, a synchronize) while that stream waits for an operation
// only the engine can complete. Calls that allocate (cuMemHostAlloc, cuMemAlloc),
// create streams or load modules can wait for such a call on another thread, so the
// engine makes none. What it reaches here:
//
//   - Word.Load, Word.Store: CPU atomics on host-mapped memory, no driver call.
//   - WordBlock.Ring: one cuStreamWriteValue64 on the backend's doorbell stream (plus
//     the current-context check cgo/cuda makes around every call). The stream and its
//     word are made when the backend opens, never on a ring; the stream is
//     non-blocking and carries only doorbell writes, which wait for nothing, so the
//     write never queues behind user work.
//   - WordBlock.Notify, Drive, Kick: Go only.
//
// Every other driver call runs on the goroutine that enqueues (WriteThenWait,
// PollValue, copies) or creates (AllocWords, streams, events). PollValue's signal
// kernels are loaded at open too, so an enqueue, made under a condition's lock, never
// loads a module. tests/gpu_blocking_test.go is the regression test.

// openCUDA opens device's primary context. The error wraps cuda.ErrNoDriver where
// CUDA cannot be used at all (no libcuda, no device), so Open(Auto) falls back.
func openCUDA(device int) (Backend, error) {
	if err := cuda.Load(); err != nil {
		return nil, fmt.Errorf("stream: cuda backend: %w", err)
	}
	n, err := cuda.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("stream: cuda backend: %w", err)
	}
	if n == 0 {
		return nil, fmt.Errorf("stream: cuda backend: %w: %w", cuda.ErrNoDriver, cuda.ErrNoDevice)
	}
	if device < 0 || device >= n {
		return nil, fmt.Errorf("stream: cuda backend: device %d of %d: %w", device, n, ErrInvalidArgument)
	}
	dev, err := cuda.GetDevice(device)
	if err != nil {
		return nil, fmt.Errorf("stream: cuda backend: %w", err)
	}
	caps, err := dev.Caps()
	if err != nil {
		return nil, fmt.Errorf("stream: cuda backend: %w", err)
	}
	if !caps.MapHostMemory || !caps.UnifiedAddressing {
		return nil, fmt.Errorf("stream: cuda backend: device %d cannot map host memory with unified addressing: %w", device, ErrNotSupported)
	}
	ctx, err := dev.RetainPrimaryContext()
	if err != nil {
		return nil, fmt.Errorf("stream: cuda backend: %w", err)
	}
	bell, err := newDoorbell(ctx)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("stream: cuda backend: %w", err), ctx.Close())
	}
	b := &cudaBackend{ctx: ctx, caps: caps, refs: 1, bell: bell}
	b.loadSignalKernels()
	return b, nil
}

// The CUDA backend classifies and stages device memory for protocol's staging pool.
var _ HostStaging = (*cudaBackend)(nil)

type cudaBackend struct {
	ctx  *cuda.Context
	caps cuda.Caps

	// The signal kernels of PollValue, loaded when the backend opens (see "Calls the
	// engine makes"). pollErr: they could not be loaded; PollValue then waits with a
	// memop.
	pollModule *cuda.Module
	pollFn     *cuda.Function
	copyFn     *cuda.Function // ucpx_signal_copy_word, CopyWord's kernel
	stampFn    *cuda.Function // ucpx_signal_wait_stamped, PollValueStamped's kernel
	pollErr    error
	// copyKernel (ucpx_copy) makes CopyDevice's small same-device copies, in grids
	// of at most copyKernelBlocks; nil: the copy engine makes them all.
	copyKernel       *cuda.Function
	copyKernelBlocks int

	// bell is the doorbell of WordBlock.Ring, made when the backend opens; nil on the
	// backends of WrapCUDAStream, which allocate no words.
	bell *doorbell

	ipc ipcMaps

	mu       sync.Mutex
	closed   bool
	refs     int  // the backend itself plus each live stream, event and word block
	borrowed bool // WrapCUDAStream: the context is not ours to release
}

func (b *cudaBackend) Kind() Kind { return KindCUDA }

// acquire takes a reference for a new child object, unless the backend is closed.
func (b *cudaBackend) acquire() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return fmt.Errorf("stream: cuda backend: %w", ErrClosed)
	}
	b.refs++
	return nil
}

func (b *cudaBackend) release() error {
	b.mu.Lock()
	b.refs--
	last := b.refs == 0
	b.mu.Unlock()
	if !last {
		return nil
	}
	b.dropOwnExports()
	var err error
	if b.pollModule != nil {
		err = cudaErr("signal kernels", b.pollModule.Close())
	}
	if b.bell != nil {
		err = errors.Join(err, b.bell.close())
	}
	if !b.borrowed {
		err = errors.Join(err, b.ctx.Close())
	}
	return err
}

// loadSignalKernels loads the signal kernels of PollValue (where that fails,
// PollValue waits with a memop instead) and CopyDevice's copy kernel (without it the
// copy engine makes every copy).
func (b *cudaBackend) loadSignalKernels() {
	m, err := b.ctx.LoadModule(device.SignalKernelsPTX())
	if err != nil {
		b.pollErr = err
		return
	}
	b.pollModule = m
	sms, err := b.ctx.Device().Attribute(cuda.AttrMultiprocessorCount)
	if k, kerr := m.Function(device.KernelCopy); kerr == nil && err == nil && sms > 0 {
		b.copyKernel, b.copyKernelBlocks = k, sms*copyKernelBlocksPerSM
	}
	f, err := m.Function(device.KernelSignalWait)
	if err != nil {
		b.pollErr = err
		return
	}
	c, err := m.Function(device.KernelSignalCopyWord)
	if err != nil {
		b.pollErr = err
		return
	}
	b.pollFn, b.copyFn = f, c
	// Optional: without it traced polls go unstamped.
	if st, err := m.Function(device.KernelSignalWaitStamped); err == nil {
		b.stampFn = st
	}
}

// pollKernel returns ucpx_signal_wait, or why it could not be loaded.
func (b *cudaBackend) pollKernel() (*cuda.Function, error) { return b.pollFn, b.pollErr }

// doorbell is what WordBlock.Ring submits work on: a stream of its own and a word it
// writes (the submission is what matters, not the value).
type doorbell struct {
	stream *cuda.Stream
	mem    *cuda.HostMemory
	// ringing counts rings in progress and closed refuses new ones, so that close
	// never destroys the stream under a ring without a ring ever waiting for a lock
	// (the closing goroutine may sit in the driver, and a ring must not wait for it).
	ringing atomic.Int64
	closed  atomic.Bool
}

func newDoorbell(ctx *cuda.Context) (*doorbell, error) {
	m, err := ctx.MemHostAlloc(8, cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
	if err != nil {
		return nil, cudaErr("doorbell", err)
	}
	s, err := ctx.NewStream(cuda.StreamNonBlocking, 0)
	if err != nil {
		return nil, errors.Join(cudaErr("doorbell", err), m.Close())
	}
	return &doorbell{stream: s, mem: m}, nil
}

// ring submits one memop write on the doorbell stream (WordBlock.Ring).
func (d *doorbell) ring() error {
	d.ringing.Add(1)
	defer d.ringing.Add(-1)
	if d.closed.Load() {
		return nil
	}
	return cudaErr("doorbell", d.stream.WriteValue64(d.mem.DevicePtr(), 1, cuda.WriteDefault))
}

// close releases the doorbell once the rings in progress have returned. Both sides
// use sequentially consistent atomics: either a ring sees closed, or close sees it
// ringing and waits for it.
func (d *doorbell) close() error {
	d.closed.Store(true)
	for d.ringing.Load() != 0 {
		runtime.Gosched()
	}
	// The last rings' writes land before their word is freed.
	return errors.Join(cudaErr("doorbell", d.stream.Synchronize()),
		cudaErr("doorbell", d.stream.Close()), cudaErr("doorbell", d.mem.Close()))
}

func (b *cudaBackend) NewStream() (Stream, error) {
	if err := b.acquire(); err != nil {
		return nil, err
	}
	s, err := b.ctx.NewStream(cuda.StreamNonBlocking, 0)
	if err != nil {
		b.release()
		return nil, cudaErr("NewStream", err)
	}
	return &cudaStream{b: b, s: s}, nil
}

func (b *cudaBackend) NewEvent() (Event, error) {
	if err := b.acquire(); err != nil {
		return nil, err
	}
	e, err := b.ctx.NewEvent(cuda.EventDisableTiming)
	if err != nil {
		b.release()
		return nil, cudaErr("NewEvent", err)
	}
	return &cudaEvent{b: b, e: e}, nil
}

// AllocWords allocates n zeroed words in host-mapped pinned memory.
func (b *cudaBackend) AllocWords(n int) (*WordBlock, error) {
	if n <= 0 || n > math.MaxInt32 {
		return nil, fmt.Errorf("stream: cuda AllocWords(%d): %w", n, ErrInvalidArgument)
	}
	if err := b.acquire(); err != nil {
		return nil, err
	}
	m, err := b.ctx.MemHostAlloc(8*n, cuda.HostAllocPortable|cuda.HostAllocDeviceMap)
	if err != nil {
		b.release()
		return nil, cudaErr("AllocWords", err)
	}
	free := func() error {
		// Host executors accept CUDA words too: as for host blocks, none may sit
		// between its "block still open?" check and its access when the memory goes.
		quiesceWordAccess()
		err := m.Close()
		return errors.Join(cudaErr("WordBlock.Close", err), b.release())
	}
	var ring func() error
	if b.bell != nil {
		ring = b.bell.ring
	}
	return streamcore.NewWordBlock(KindCUDA, m.Ptr(), m.DevicePtr(), n, free, ring), nil
}

// Locate classifies addr for the staging pool (HostStaging) with
// cuPointerGetAttributes; an address the driver does not know (ErrInvalidValue) is
// pageable host memory.
func (b *cudaBackend) Locate(addr uintptr) (device, managed bool, err error) {
	a, err := b.ctx.PointerAttributes(addr)
	if errors.Is(err, cuda.ErrInvalidValue) {
		return false, false, nil
	}
	if err != nil {
		return false, false, err
	}
	return a.Type == cuda.MemoryDevice, a.Managed, nil
}

// AllocPinned allocates n bytes of page-locked host memory (cuMemHostAlloc PORTABLE)
// for the staging pool (HostStaging).
func (b *cudaBackend) AllocPinned(n int) (Pinned, error) {
	m, err := b.ctx.MemHostAlloc(n, cuda.HostAllocPortable)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// Close releases the backend. The device context is released once every stream,
// event and word block made from it is closed too. A second Close returns ErrClosed.
func (b *cudaBackend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return fmt.Errorf("stream: cuda backend: %w", ErrClosed)
	}
	b.closed = true
	b.mu.Unlock()
	return b.release()
}

// cudaErr wraps an error of the cuda layer so that both the cuda sentinel and the
// matching stream sentinel hold (errors.Is(err, ErrInvalidArgument) and
// errors.Is(err, cuda.ErrInvalidValue)).
func cudaErr(op string, err error) error {
	if err == nil {
		return nil
	}
	var sentinel error
	switch {
	case errors.Is(err, cuda.ErrInvalidValue):
		sentinel = ErrInvalidArgument
	case errors.Is(err, cuda.ErrNotSupported):
		sentinel = ErrNotSupported
	case errors.Is(err, cuda.ErrInvalidHandle), errors.Is(err, cuda.ErrContextIsDestroyed):
		sentinel = ErrClosed
	}
	if sentinel == nil || errors.Is(err, sentinel) {
		return fmt.Errorf("stream: cuda %s: %w", op, err)
	}
	return fmt.Errorf("stream: cuda %s: %w: %w", op, sentinel, err)
}

type cudaStream struct {
	b      *cudaBackend
	s      *cuda.Stream
	closed atomic.Bool
	// failed: the sticky error a query found (the context is dead: the stream runs
	// nothing more); lastQuery: when Failed last asked the driver (UnixNano).
	failed    atomic.Pointer[error]
	lastQuery atomic.Int64
	asked     atomic.Uint32 // Failed's calls: it reads the clock at every 64th
	// gone: Close drained (or abandoned) the stream's work and destroyed it; until
	// then the work queued before Close still runs.
	gone atomic.Bool
}

// failedQueryEvery bounds how often Failed asks the driver: a caller may ask at every
// round of a polling loop.
const failedQueryEvery = time.Millisecond

// Failed reports the error that stopped the stream (streamcore.Failer): a sticky error
// of its context (an illegal address in a kernel, ...), after which it runs nothing
// more, or ErrClosed once Close has drained it (the work queued before Close runs
// during the drain); nil while it may still run. It asks the driver (cuStreamQuery,
// which does not wait) at most once per failedQueryEvery, and reads the clock at one
// call in 64: the engine asks at every round. It never queries a stream being
// captured (that would invalidate the capture), and a capture's errors do not count.
func (s *cudaStream) Failed() error {
	if s.gone.Load() {
		return s.errClosed("Failed")
	}
	if s.closed.Load() {
		return nil // draining
	}
	if e := s.failed.Load(); e != nil {
		return *e
	}
	if s.asked.Add(1)%64 != 1 {
		return nil
	}
	now := time.Now().UnixNano()
	if last := s.lastQuery.Load(); now-last < int64(failedQueryEvery) || !s.lastQuery.CompareAndSwap(last, now) {
		return nil
	}
	if st, err := s.s.CaptureStatus(); err != nil || st != cuda.CaptureNone {
		return nil
	}
	if _, err := s.s.Query(); err != nil && !captureError(err) {
		err = s.wrap("Query", err)
		s.failed.Store(&err)
		return err
	}
	return nil
}

// captureError reports whether err is one of the driver's stream-capture errors
// (CUDA_ERROR_STREAM_CAPTURE_*, 900-908): a capture's state, not a dead context.
func captureError(err error) bool {
	var ce *cuda.Error
	return errors.As(err, &ce) && ce.Code >= 900 && ce.Code <= 908
}

func (s *cudaStream) Kind() Kind { return KindCUDA }

func (s *cudaStream) errClosed(op string) error {
	return fmt.Errorf("stream: cuda %s: %w", op, ErrClosed)
}

// wrap maps an error of a cuda call on this stream; after Close every failure
// reads as ErrClosed.
func (s *cudaStream) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if s.closed.Load() {
		return fmt.Errorf("stream: cuda %s: %w: %w", op, ErrClosed, err)
	}
	return cudaErr(op, err)
}

// device returns the GPU address of w, refusing words the GPU cannot reach.
func (s *cudaStream) device(op string, w *Word) (uintptr, error) {
	if err := s.stuck(); err != nil {
		return 0, err
	}
	if !w.Valid() {
		return 0, fmt.Errorf("stream: cuda %s: nil word: %w", op, ErrInvalidArgument)
	}
	dev := w.DevicePtr()
	if w.Kind() != KindCUDA || dev == 0 {
		return 0, fmt.Errorf("stream: cuda %s: %v has no device address: %w", op, w, ErrWrongBackend)
	}
	if dev%8 != 0 {
		return 0, fmt.Errorf("stream: cuda %s: %v not 8-byte aligned: %w", op, w, ErrInvalidArgument)
	}
	if w.Block().Closed() {
		return 0, fmt.Errorf("stream: cuda %s: %v: word block: %w", op, w, ErrClosed)
	}
	return dev, nil
}

func (s *cudaStream) WriteValue(w *Word, value uint64) error {
	addr, err := s.device("WriteValue", w)
	if err != nil {
		return err
	}
	if s.b.caps.StreamMemOps64 {
		return s.wrap("WriteValue", s.s.WriteValue64(addr, value, cuda.WriteDefault))
	}
	if value > math.MaxUint32 {
		return fmt.Errorf("stream: cuda WriteValue(%d): device has only 32-bit stream memops: %w", value, ErrNotSupported)
	}
	return s.wrap("WriteValue", s.s.WriteValue32(addr, uint32(value), cuda.WriteDefault))
}

func (s *cudaStream) WaitValue(w *Word, value uint64, cmp Compare) error {
	addr, err := s.device("WaitValue", w)
	if err != nil {
		return err
	}
	if cmp > NOR {
		return fmt.Errorf("stream: cuda WaitValue: %v: %w", cmp, ErrInvalidArgument)
	}
	if cmp == NOR && !s.b.caps.WaitValueNOR {
		return fmt.Errorf("stream: cuda WaitValue: NOR: %w", ErrNotSupported)
	}
	flags := cuda.WaitFlags(cmp) // Compare values are CUDA's
	if s.b.caps.StreamMemOps64 {
		return s.wrap("WaitValue", s.s.WaitValue64(addr, value, flags))
	}
	if value > math.MaxUint32 {
		return fmt.Errorf("stream: cuda WaitValue(%d): device has only 32-bit stream memops: %w", value, ErrNotSupported)
	}
	return s.wrap("WaitValue", s.s.WaitValue32(addr, uint32(value), flags))
}

// WriteThenWait enqueues one cuStreamBatchMemOp of the write and the wait where the
// device has 64-bit memops, else the two single memops.
func (s *cudaStream) WriteThenWait(w *Word, value uint64, waitOn *Word, waitValue uint64, cmp Compare) error {
	if !s.b.caps.StreamMemOps64 || cmp == NOR {
		if err := s.WriteValue(w, value); err != nil {
			return err
		}
		return s.WaitValue(waitOn, waitValue, cmp)
	}
	wa, err := s.device("WriteThenWait", w)
	if err != nil {
		return err
	}
	da, err := s.device("WriteThenWait", waitOn)
	if err != nil {
		return err
	}
	if cmp > NOR {
		return fmt.Errorf("stream: cuda WriteThenWait: %v: %w", cmp, ErrInvalidArgument)
	}
	return s.wrap("WriteThenWait", s.s.BatchMemOp([]cuda.MemOp{
		cuda.WriteValue64Op(wa, value, cuda.WriteDefault),
		cuda.WaitValue64Op(da, waitValue, cuda.WaitFlags(cmp)),
	}))
}

// PollValue launches ucpx_signal_wait (one thread polling the word with acquire loads).
// Where the kernels cannot be loaded, or the device has only 32-bit memops (the word's
// high half is then not maintained), it waits with a memop instead.
func (s *cudaStream) PollValue(w *Word, value uint64) error {
	addr, err := s.device("PollValue", w)
	if err != nil {
		return err
	}
	fn, err := s.b.pollKernel()
	if err != nil || !s.b.caps.StreamMemOps64 {
		return s.WaitValue(w, value, GEQ)
	}
	return s.wrap("PollValue", s.s.LaunchKernel(fn, cuda.Linear(1, 1), addr, value))
}

// PollValueStamped is PollValue by ucpx_signal_wait_stamped (streamcore.StampedPoller).
// Where the signal kernels cannot poll, it is refused (ErrNotSupported): the memop wait
// that PollValue falls back to has nothing to stamp with.
func (s *cudaStream) PollValueStamped(w *Word, value uint64, stamps *Word) error {
	addr, err := s.device("PollValueStamped", w)
	if err != nil {
		return err
	}
	saddr, err := s.device("PollValueStamped", stamps)
	if err != nil {
		return err
	}
	if !stamps.Block().Has(stamps, 2) {
		return fmt.Errorf("stream: cuda PollValueStamped: %v is not the first of two words of its block: %w", stamps, ErrInvalidArgument)
	}
	if s.b.stampFn == nil || !s.b.caps.StreamMemOps64 {
		return fmt.Errorf("stream: cuda PollValueStamped: signal kernels: %w", ErrNotSupported)
	}
	return s.wrap("PollValueStamped", s.s.LaunchKernel(s.b.stampFn, cuda.Linear(1, 1), addr, value, saddr))
}

func (s *cudaStream) CopyWord(dst, src *Word) error {
	daddr, err := s.device("CopyWord", dst)
	if err != nil {
		return err
	}
	saddr, err := s.device("CopyWord", src)
	if err != nil {
		return err
	}
	if s.b.copyFn == nil {
		return fmt.Errorf("stream: cuda CopyWord: signal kernels: %w: %w", s.b.pollErr, ErrNotSupported)
	}
	return s.wrap("CopyWord", s.s.LaunchKernel(s.b.copyFn, cuda.Linear(1, 1), saddr, daddr))
}

// LaunchHostFunc runs fn on a CUDA driver thread (cuLaunchHostFunc). fn must not
// call CUDA, a driver rule on top of the Stream contract. A panic in fn is
// recovered on the driver's thread (a panic escaping there would kill the process)
// and becomes the stream's sticky error, a *PanicError, as on host streams: Failed,
// Synchronize, Query and every later enqueue return it. The GPU cannot drop work
// already queued behind fn, so that work still runs.
func (s *cudaStream) LaunchHostFunc(fn func()) error {
	if fn == nil {
		return fmt.Errorf("stream: cuda LaunchHostFunc: nil func: %w", ErrInvalidArgument)
	}
	if err := s.stuck(); err != nil {
		return err
	}
	return s.wrap("LaunchHostFunc", s.s.LaunchHostFunc(func() {
		if err := runHostFunc(fn); err != nil {
			s.failed.CompareAndSwap(nil, &err)
		}
	}))
}

// stuck returns the sticky error a host func's panic (or a dead context found by
// Failed) left on the stream, or nil; ErrClosed wins once the stream is closed.
func (s *cudaStream) stuck() error {
	if s.closed.Load() {
		return nil // the call reports ErrClosed itself
	}
	if e := s.failed.Load(); e != nil {
		return *e
	}
	return nil
}

// Copy uses cuMemcpyAsync, which finds each side's memory by unified addressing.
func (s *cudaStream) Copy(dst, src uintptr, n int) error {
	switch {
	case n <= 0:
		return fmt.Errorf("stream: cuda Copy: length %d: %w", n, ErrInvalidArgument)
	case dst == 0 || src == 0:
		return fmt.Errorf("stream: cuda Copy: nil address (dst %#x, src %#x): %w", dst, src, ErrInvalidArgument)
	case dst+uintptr(n) < dst || src+uintptr(n) < src:
		return fmt.Errorf("stream: cuda Copy: range wraps the address space: %w", ErrInvalidArgument)
	case dst < src+uintptr(n) && src < dst+uintptr(n):
		return fmt.Errorf("stream: cuda Copy: ranges [%#x,+%d) and [%#x,+%d) overlap: %w", dst, n, src, n, ErrInvalidArgument)
	}
	if err := s.stuck(); err != nil {
		return err
	}
	return s.wrap("Copy", s.s.Memcpy(dst, src, n))
}

func asCUDAEvent(op string, e Event) (*cudaEvent, error) {
	if e == nil {
		return nil, fmt.Errorf("stream: cuda %s: nil event: %w", op, ErrInvalidArgument)
	}
	ce, ok := e.(*cudaEvent)
	if !ok {
		return nil, fmt.Errorf("stream: cuda %s: given a %T: %w", op, e, ErrWrongBackend)
	}
	if ce == nil {
		return nil, fmt.Errorf("stream: cuda %s: nil event: %w", op, ErrInvalidArgument)
	}
	if ce.closed.Load() {
		return nil, fmt.Errorf("stream: cuda %s: event: %w", op, ErrClosed)
	}
	return ce, nil
}

func (s *cudaStream) Record(e Event) error {
	ce, err := asCUDAEvent("Record", e)
	if err != nil {
		return err
	}
	if err := s.stuck(); err != nil {
		return err
	}
	err = ce.e.Record(s.s)
	if err != nil && ce.closed.Load() {
		return ce.wrap("Record", err)
	}
	return s.wrap("Record", err)
}

func (s *cudaStream) WaitEvent(e Event) error {
	ce, err := asCUDAEvent("WaitEvent", e)
	if err != nil {
		return err
	}
	if err := s.stuck(); err != nil {
		return err
	}
	err = s.s.WaitEvent(ce.e)
	if err != nil && ce.closed.Load() {
		return ce.wrap("WaitEvent", err)
	}
	return s.wrap("WaitEvent", err)
}

func (s *cudaStream) Synchronize() error {
	if err := s.wrap("Synchronize", s.s.Synchronize()); err != nil {
		return err
	}
	return s.stuck()
}

func (s *cudaStream) Query() (bool, error) {
	done, err := s.s.Query()
	if err = s.wrap("Query", err); err != nil {
		return done, err
	}
	if err := s.stuck(); err != nil {
		return false, err
	}
	return done, nil
}

func (s *cudaStream) Handle() uintptr { return s.s.Handle() }

// cudaCloseGrace bounds how long Close waits for a CUDA stream's work. Unlike a
// host stream, a GPU stream cannot tell a blocked wait from long-running work, so
// the bound is generous.
const cudaCloseGrace = time.Second

// Close waits for the enqueued work, then destroys the stream; a second Close
// returns ErrClosed. Like the host backend, Close does not hang on a wait nobody
// satisfies: after cudaCloseGrace it releases the stream anyway and returns an
// error wrapping ErrAbandoned. The GPU cannot drop queued work, so that work
// still runs if its waits ever hold: keep the words it names alive until then.
func (s *cudaStream) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return s.errClosed("Close")
	}
	drainErr := s.drain(cudaCloseGrace)
	closeErr := s.s.Close()
	s.gone.Store(true)
	return errors.Join(drainErr, cudaErr("Close", closeErr), s.b.release())
}

// drain polls the stream until its work is done or grace has passed. Polling,
// rather than cuStreamSynchronize in a goroutine, leaves no thread stuck in the
// driver when the work never finishes.
func (s *cudaStream) drain(grace time.Duration) error {
	deadline := time.Now().Add(grace)
	pause := 10 * time.Microsecond
	for {
		done, err := s.s.Query()
		if err != nil {
			return cudaErr("Close", err)
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("stream: cuda Close: work still pending after %v (a wait nobody satisfies?); "+
				"the stream is released and the GPU runs the work if its waits ever hold: %w", grace, ErrAbandoned)
		}
		time.Sleep(pause)
		pause = min(2*pause, time.Millisecond)
	}
}

type cudaEvent struct {
	b      *cudaBackend
	e      *cuda.Event
	closed atomic.Bool
}

func (e *cudaEvent) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if e.closed.Load() {
		return fmt.Errorf("stream: cuda %s: event: %w: %w", op, ErrClosed, err)
	}
	return cudaErr(op, err)
}

func (e *cudaEvent) Query() (bool, error) {
	done, err := e.e.Query()
	return done, e.wrap("Event.Query", err)
}

func (e *cudaEvent) Synchronize() error { return e.wrap("Event.Synchronize", e.e.Synchronize()) }

func (e *cudaEvent) Handle() uintptr { return e.e.Handle() }

// Close destroys the event; work already waiting on it is unaffected. A second
// Close returns ErrClosed.
func (e *cudaEvent) Close() error {
	if !e.closed.CompareAndSwap(false, true) {
		return fmt.Errorf("stream: cuda Event.Close: %w", ErrClosed)
	}
	return errors.Join(cudaErr("Event.Close", e.e.Close()), e.b.release())
}

// WrapCUDAStream adopts a CUstream made elsewhere (the CUDA runtime, PyTorch,
// gorgonia.org/cu) as a Stream, so conditions can be enqueued on a framework's
// stream. The Stream borrows the handle: Close synchronizes it but does not
// destroy it. Events for it come from a backend of the same device. It loads ucpx's
// signal kernels into the stream's context, and the driver's module load waits for
// the context's streams: wrap a stream before work that may hold it back (a wait
// nobody answers yet).
func WrapCUDAStream(handle uintptr) (Stream, error) {
	if err := cuda.Load(); err != nil {
		return nil, fmt.Errorf("stream: WrapCUDAStream: %w", err)
	}
	cs, err := cuda.StreamFromHandle(handle)
	if err != nil {
		return nil, cudaErr("WrapCUDAStream", err)
	}
	caps, err := cs.Context().Device().Caps()
	if err != nil {
		return nil, cudaErr("WrapCUDAStream", err)
	}
	// A private backend with a borrowed context: release never closes it. It
	// allocates no words, so it needs no doorbell; PollValue needs the signal kernels.
	b := &cudaBackend{ctx: cs.Context(), caps: caps, refs: 1, closed: true, borrowed: true}
	b.loadSignalKernels()
	return &cudaStream{b: b, s: cs}, nil
}

// CUDAStream returns the cuda.Stream under a CUDA-backend Stream, for layers that
// need CUDA-only operations on it (batch memops, graph capture, kernel launches).
func CUDAStream(s Stream) (*cuda.Stream, bool) {
	cs, ok := s.(*cudaStream)
	if !ok || cs == nil {
		return nil, false
	}
	return cs.s, true
}

// CUDAEvent returns the cuda.Event under a CUDA-backend Event.
func CUDAEvent(e Event) (*cuda.Event, bool) {
	ce, ok := e.(*cudaEvent)
	if !ok || ce == nil {
		return nil, false
	}
	return ce.e, true
}

// CUDAContext returns the context and capabilities of a CUDA backend.
func CUDAContext(b Backend) (*cuda.Context, cuda.Caps, bool) {
	cb, ok := b.(*cudaBackend)
	if !ok || cb == nil {
		return nil, cuda.Caps{}, false
	}
	return cb.ctx, cb.caps, true
}

// CUDACopyWordKernel returns ucpx_signal_copy_word from a CUDA backend's signal
// kernels, loaded when the backend opened, for layers that put it in CUDA graphs:
// loading a module later waits for the context's streams, which may be held back.
func CUDACopyWordKernel(b Backend) (*cuda.Function, error) {
	cb, ok := b.(*cudaBackend)
	switch {
	case !ok || cb == nil:
		return nil, fmt.Errorf("stream: copy-word kernel of a backend that is not CUDA: %w", ErrInvalidArgument)
	case cb.copyFn == nil && cb.pollErr != nil:
		return nil, fmt.Errorf("stream: the backend's signal kernels did not load: %w", cb.pollErr)
	case cb.copyFn == nil:
		return nil, fmt.Errorf("stream: the backend has no copy-word kernel: %w", ErrNotSupported)
	}
	return cb.copyFn, nil
}

// Capturing reports whether the stream is recording its work into a graph (CUDA
// stream capture, begun here or by other code that owns the CUstream) instead of
// running it (cuStreamIsCapturing). A capture that was invalidated is an error: work
// enqueued now would be lost.
func (s *cudaStream) Capturing() (bool, error) {
	st, err := s.s.CaptureStatus()
	if err != nil {
		return false, cudaErr("CaptureStatus", err)
	}
	return capturing(st)
}

// capturing is Capturing's answer for capture status st.
func capturing(st cuda.CaptureStatus) (bool, error) {
	switch st {
	case cuda.CaptureNone:
		return false, nil
	case cuda.CaptureActive:
		return true, nil
	}
	return false, fmt.Errorf("stream: cuda capture %v: %w", st, ErrInvalidArgument)
}

package streamcore

import (
	"context"
	"fmt"
	"time"

	"github.com/ucpx/ucpx/internal/errs"
)

// Kind says which execution engine runs a Stream.
type Kind int

const (
	// KindHost is a serial CPU execution context: a goroutine draining an ordered queue.
	KindHost Kind = iota + 1
	// KindCUDA is a CUstream driven through the CUDA driver API.
	KindCUDA
)

func (k Kind) String() string {
	switch k {
	case KindHost:
		return "host"
	case KindCUDA:
		return "cuda"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Compare is the condition a WaitValue blocks on. The values match
// CU_STREAM_WAIT_VALUE_{GEQ,EQ,AND,NOR} so the CUDA backend passes them through.
type Compare uint32

const (
	// GEQ waits until (int32/int64)(*word - value) >= 0, the CUDA wrap-aware "greater or equal".
	GEQ Compare = 0x0
	// EQ waits until *word == value.
	EQ Compare = 0x1
	// AND waits until (*word & value) != 0.
	AND Compare = 0x2
	// NOR waits until ^(*word | value) != 0.
	NOR Compare = 0x3
)

func (c Compare) String() string {
	switch c {
	case GEQ:
		return "GEQ"
	case EQ:
		return "EQ"
	case AND:
		return "AND"
	case NOR:
		return "NOR"
	}
	return fmt.Sprintf("Compare(%d)", uint32(c))
}

// Holds reports whether current satisfies the comparison against value, with the
// semantics CUDA documents for 64-bit stream memops (GEQ is wrap-aware signed difference).
func (c Compare) Holds(current, value uint64) bool {
	switch c {
	case GEQ:
		return int64(current-value) >= 0
	case EQ:
		return current == value
	case AND:
		return current&value != 0
	case NOR:
		return ^(current | value) != 0
	}
	return false
}

// Errors common to every backend, the roots every ucpx package shares (ucp.ErrClosed,
// ucp.ErrInvalidParam and ucp.ErrUnsupported match them). Backends wrap them with detail (fmt.Errorf("...: %w", ErrX)).
var (
	// ErrClosed: the stream, event or backend was closed or destroyed.
	ErrClosed = errs.Closed
	// ErrInvalidArgument: nil word, unaligned address, zero-length or overlapping copy, bad Compare.
	ErrInvalidArgument = errs.InvalidParam
	// ErrNotSupported: the backend or device lacks the feature (for example 64-bit memops).
	ErrNotSupported = errs.Unsupported
	// ErrWrongBackend: an object from one backend was handed to another (a host Event to a CUDA stream).
	ErrWrongBackend = errs.New("stream: object belongs to another backend", errs.InvalidParam)
)

// Failer is a Stream that tells, without blocking and without a driver call, that it
// stopped for good after an error (a host stream whose host function panicked, or
// whose wait Close abandoned): work enqueued behind that point never runs. The
// condition engine fails the operations whose triggers were behind it.
type Failer interface {
	// Failed returns the error that stopped the stream, nil while it runs.
	Failed() error
}

// HostFuncDropper is a Stream that tells a host func it will never run: dropped runs
// instead of fn (on the stream's executor: it must be quick and must not block) when
// the stream drops it, after a failure or when Close abandons its work; every dropped
// func ran before the failure shows (Synchronize, Failed). Host streams implement it;
// layers that count what a host func releases use it, so nothing stays held by work
// a stream dropped.
type HostFuncDropper interface {
	LaunchHostFuncOrDrop(fn, dropped func()) error
}

// LaunchOrDrop enqueues fn on s, to run in stream order or, where s drops it
// (HostFuncDropper), when dropped: fn runs once either way unless s refuses it.
func LaunchOrDrop(s Stream, fn func()) error {
	if d, ok := s.(HostFuncDropper); ok {
		return d.LaunchHostFuncOrDrop(fn, fn)
	}
	return s.LaunchHostFunc(fn)
}

// Closing is implemented by streams whose Close abandons a blocked wait after a grace
// period (host streams): a host func that waits itself (a host graph's launch) gives up
// when the stream's own waits would, so Close never hangs on it.
type Closing interface {
	// Abandon is done once Close was called and its grace passed.
	Abandon() context.Context
	// CloseGrace is that grace: a wait that begins after Abandon is done gets as long.
	CloseGrace() time.Duration
}

// Stream is an ordered queue of work. Every method enqueues and returns without waiting
// for the work, except Synchronize and Query. Methods are safe for concurrent use; the
// order of work from one goroutine is the order of its calls.
type Stream interface {
	Kind() Kind
	// WriteValue stores value into w once all earlier work on the stream is done.
	WriteValue(w *Word, value uint64) error
	// WaitValue holds back later work until cmp(w, value) holds.
	WaitValue(w *Word, value uint64, cmp Compare) error
	// WriteThenWait is WriteValue(w, value) followed by WaitValue(waitOn, waitValue,
	// cmp) in one enqueue: a condition's trigger and completion wait cost one driver
	// call (one batch of two memops) on CUDA instead of two.
	WriteThenWait(w *Word, value uint64, waitOn *Word, waitValue uint64, cmp Compare) error
	// PollValue is WaitValue(w, value, GEQ) by an active poll, for waits expected to be
	// long. On CUDA a one-thread kernel polls the word and notices the value soon, where
	// the GPU looks again at a memop wait not satisfied at once only now and then
	// (docs/performance.md, "Stream signal kernels against memop waits"); it costs a
	// kernel launch, dearer than a memop, and one GPU thread while it waits. Host
	// streams poll either way.
	PollValue(w *Word, value uint64) error
	// CopyWord stores src's value, as it is when the stream gets here, into dst (a
	// one-thread kernel on CUDA, where cuMemcpyAsync between two host words would
	// block the caller until the stream reached it). Both words are of the stream's
	// backend.
	CopyWord(dst, src *Word) error
	// LaunchHostFunc runs fn on a CPU thread in stream order. On every backend fn must
	// return, and must not Synchronize or Close the stream it was launched on, Close
	// its backend, or wait on an event recorded on that stream after it: those waits
	// could never end (host streams refuse them with an error wrapping
	// ErrInvalidArgument). Whether fn may enqueue depends on the backend: a host
	// stream's fn may enqueue on any stream, its own included (the work runs after fn
	// returns); a CUDA stream's fn must not call CUDA at all (a driver rule), so it
	// must not enqueue on any CUDA stream. Portable code does neither.
	LaunchHostFunc(fn func()) error
	// Copy copies n bytes from src to dst in stream order. Addresses are raw: C memory,
	// pinned host memory or device memory, never unpinned Go memory.
	Copy(dst, src uintptr, n int) error
	// Record captures the stream's current end into e.
	Record(e Event) error
	// WaitEvent holds back later work until the work captured by e is done.
	WaitEvent(e Event) error
	// Synchronize blocks until all enqueued work is done; it returns the first error
	// the stream met (a failed copy, a destroyed word).
	Synchronize() error
	// Query reports whether all enqueued work is done, without blocking.
	Query() (bool, error)
	// Handle is the raw CUstream for CUDA streams (so gorgonia.org/cu or cgo users can
	// interoperate) and 0 for host streams.
	Handle() uintptr
	// Capturing reports whether the stream is recording its work into a graph (CUDA
	// stream capture, begun by ucpx or by other code that owns the CUstream) instead of
	// running it. Host streams never capture (false, nil). A capture that was
	// invalidated is an error: work enqueued now would be lost.
	Capturing() (bool, error)
	// Close waits for enqueued work, then releases the stream. Later calls return ErrClosed.
	Close() error
}

// StampedPoller is a Stream whose device stamps its polls (CUDA streams with the
// signal kernels): PollValueStamped is PollValue that also stores the device's
// nanosecond clock (%globaltimer) into stamps[0] when the stream reaches the wait and
// into stamps[1] when the wait is over, stamps[1] last. stamps is the first of two
// consecutive words of one block. The engine's trace puts them on a device track.
type StampedPoller interface {
	PollValueStamped(w *Word, value uint64, stamps *Word) error
}

// Event marks a point in a stream.
type Event interface {
	// Query reports whether the recorded work is done. An event never recorded is done.
	Query() (bool, error)
	// Synchronize blocks until the recorded work is done.
	Synchronize() error
	// Handle is the raw CUevent for CUDA events and 0 for host events.
	Handle() uintptr
	Close() error
}

// Backend creates streams, events and signal words of one kind.
type Backend interface {
	Kind() Kind
	NewStream() (Stream, error)
	NewEvent() (Event, error)
	// AllocWords returns n zeroed 64-bit signal words visible to the CPU (atomics) and,
	// on CUDA, to the GPU (device pointer of host-mapped pinned memory).
	AllocWords(n int) (*WordBlock, error)
	Close() error
}

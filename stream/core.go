package stream

import (
	"unsafe"

	"github.com/ucpx/ucpx/stream/streamcore"
)

// The backend-free core lives in package streamcore (so the layers above can use it
// without linking the CUDA backend); these are the same types and values under the
// names this package has always had.

// Kind says which execution engine runs a Stream.
type Kind = streamcore.Kind

const (
	// KindHost is a serial CPU execution context: a goroutine draining an ordered queue.
	KindHost = streamcore.KindHost
	// KindCUDA is a CUstream driven through the CUDA driver API.
	KindCUDA = streamcore.KindCUDA
)

// Compare is the condition a WaitValue blocks on (CU_STREAM_WAIT_VALUE_* values).
type Compare = streamcore.Compare

const (
	// GEQ waits until (int32/int64)(*word - value) >= 0, the CUDA wrap-aware "greater or equal".
	GEQ = streamcore.GEQ
	// EQ waits until *word == value.
	EQ = streamcore.EQ
	// AND waits until (*word & value) != 0.
	AND = streamcore.AND
	// NOR waits until ^(*word | value) != 0.
	NOR = streamcore.NOR
)

// Errors common to every backend; see streamcore.
var (
	// ErrClosed: the stream, event or backend was closed or destroyed.
	ErrClosed = streamcore.ErrClosed
	// ErrInvalidArgument: nil word, unaligned address, zero-length or overlapping copy, bad Compare.
	ErrInvalidArgument = streamcore.ErrInvalidArgument
	// ErrNotSupported: the backend or device lacks the feature (for example 64-bit memops).
	ErrNotSupported = streamcore.ErrNotSupported
	// ErrWrongBackend: an object from one backend was handed to another (a host Event to a CUDA stream).
	ErrWrongBackend = streamcore.ErrWrongBackend
)

type (
	// Stream is an ordered queue of work (streamcore.Stream).
	Stream = streamcore.Stream
	// Event marks a point in a stream (streamcore.Event).
	Event = streamcore.Event
	// Backend creates streams, events and signal words of one kind (streamcore.Backend).
	Backend = streamcore.Backend
	// Word is a 64-bit signal word (streamcore.Word).
	Word = streamcore.Word
	// WordBlock is a run of signal words allocated together (streamcore.WordBlock).
	WordBlock = streamcore.WordBlock
	// Driver does the work that the words of a block wait for (streamcore.Driver).
	Driver = streamcore.Driver
	// Follower is a Driver that starts a graph node's successor itself (streamcore.Follower).
	Follower = streamcore.Follower
	// Chainer is a Driver that runs a host graph as one completion chain (streamcore.Chainer).
	Chainer = streamcore.Chainer
	// ChainedLaunch is a host graph's chain (streamcore.ChainedLaunch).
	ChainedLaunch = streamcore.ChainedLaunch
	// Failer is a Stream that tells it stopped for good (streamcore.Failer).
	Failer = streamcore.Failer
	// Closing is a Stream whose Close a waiting host func can see (streamcore.Closing).
	Closing = streamcore.Closing
	// HostFuncDropper is a Stream that tells a host func it dropped
	// (streamcore.HostFuncDropper).
	HostFuncDropper = streamcore.HostFuncDropper
	// HostStaging is what the CUDA backend offers for staging device memory
	// (streamcore.HostStaging).
	HostStaging = streamcore.HostStaging
	// DeviceIPC is streamcore.DeviceIPC: a backend whose device memory processes of
	// one host can map (the CUDA backend).
	DeviceIPC = streamcore.DeviceIPC
	// IPCHandle is streamcore.IPCHandle.
	IPCHandle = streamcore.IPCHandle
	// SharedWords is streamcore.SharedWords.
	SharedWords = streamcore.SharedWords
	// IPCAllocation is streamcore.IPCAllocation.
	IPCAllocation = streamcore.IPCAllocation
	// Pinned is page-locked host memory from HostStaging (streamcore.Pinned).
	Pinned = streamcore.Pinned
)

// NewWordBlock wraps n words at hostBase (and devBase, 0 if none), with no doorbell
// (streamcore.NewWordBlock sets one). Backends call it; free releases the memory once
// (nil: nothing to free). n < 0 or a nil hostBase with n > 0 gives a closed block
// with no words whose Close returns an error wrapping ErrInvalidArgument.
func NewWordBlock(kind Kind, hostBase unsafe.Pointer, devBase uintptr, n int, free func() error) *WordBlock {
	return streamcore.NewWordBlock(kind, hostBase, devBase, n, free, nil)
}

// Capturing reports whether s is recording its work into a graph instead of running
// it (Stream.Capturing): cuStreamIsCapturing on CUDA streams, whoever began the
// capture; host streams never capture. A capture that was invalidated is an error.
func Capturing(s Stream) (bool, error) {
	if s == nil {
		return false, nil
	}
	return s.Capturing()
}

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"math"
)

// WaitFlags select the condition of a stream wait (CUstreamWaitValue_flags).
// The compare values equal stream.Compare's, so they pass through unchanged.
type WaitFlags uint32

const (
	// WaitGEQ waits until (int32/int64)(*addr - value) >= 0, a cyclic >=.
	WaitGEQ WaitFlags = 0x0
	// WaitEQ waits until *addr == value.
	WaitEQ WaitFlags = 0x1
	// WaitAND waits until (*addr & value) != 0.
	WaitAND WaitFlags = 0x2
	// WaitNOR waits until ^(*addr | value) != 0 (needs Caps.WaitValueNOR).
	WaitNOR WaitFlags = 0x3
	// WaitFlush follows the wait with a flush of outstanding remote (GPUDirect
	// RDMA) writes; needs Caps.FlushRemoteWrites.
	WaitFlush WaitFlags = 1 << 30

	waitCompareMask = 0x3
)

// WriteFlags modify a stream write (CUstreamWriteValue_flags).
type WriteFlags uint32

const (
	// WriteDefault orders the write after all earlier work's memory writes.
	WriteDefault WriteFlags = 0x0
	// WriteNoMemoryBarrier lets the write overtake earlier writes. cuda.h: "This flag
	// is not supported in the v2 API", which is the only one ucpx loads; the driver
	// answers CUDA_ERROR_INVALID_VALUE (docs/gpu-runs.md), so ucpx refuses it with
	// ErrNotSupported before the call. Kept so callers get a clear error.
	WriteNoMemoryBarrier WriteFlags = 0x1
)

// MemOpKind is a CUstreamBatchMemOpType.
type MemOpKind uint32

const (
	MemOpWaitValue32       MemOpKind = 1
	MemOpWriteValue32      MemOpKind = 2
	MemOpFlushRemoteWrites MemOpKind = 3
	MemOpWaitValue64       MemOpKind = 4
	MemOpWriteValue64      MemOpKind = 5
	MemOpBarrier           MemOpKind = 6
)

// BarrierScope is the scope of a MemOpBarrier (CUstreamMemoryBarrier_flags).
type BarrierScope uint32

const (
	BarrierSystem BarrierScope = 0x0
	BarrierGPU    BarrierScope = 0x1
)

// MaxBatch is the most operations one BatchMemOp or batch node may carry
// (the driver requires fewer than 256).
const MaxBatch = 255

// The C helpers size their union arrays with UCPX_MAX_BATCH: keep them equal.
const (
	_ = uint(MaxBatch - C.UCPX_MAX_BATCH)
	_ = uint(C.UCPX_MAX_BATCH - MaxBatch)
)

// MemOp is one stream memory operation, for BatchMemOp and batch-memop graph
// nodes. Build it with the constructors below. Addr is a device address: device
// memory, or the device pointer of host-mapped pinned memory.
type MemOp struct {
	Kind  MemOpKind
	Addr  uintptr
	Value uint64
	Flags uint32
}

// WaitValue32Op waits until the 32-bit word at addr satisfies flags against v.
func WaitValue32Op(addr uintptr, v uint32, flags WaitFlags) MemOp {
	return MemOp{Kind: MemOpWaitValue32, Addr: addr, Value: uint64(v), Flags: uint32(flags)}
}

// WaitValue64Op waits until the 64-bit word at addr satisfies flags against v.
func WaitValue64Op(addr uintptr, v uint64, flags WaitFlags) MemOp {
	return MemOp{Kind: MemOpWaitValue64, Addr: addr, Value: v, Flags: uint32(flags)}
}

// WriteValue32Op stores v into the 32-bit word at addr.
func WriteValue32Op(addr uintptr, v uint32, flags WriteFlags) MemOp {
	return MemOp{Kind: MemOpWriteValue32, Addr: addr, Value: uint64(v), Flags: uint32(flags)}
}

// WriteValue64Op stores v into the 64-bit word at addr.
func WriteValue64Op(addr uintptr, v uint64, flags WriteFlags) MemOp {
	return MemOp{Kind: MemOpWriteValue64, Addr: addr, Value: v, Flags: uint32(flags)}
}

// FlushRemoteWritesOp flushes outstanding remote writes (Caps.FlushRemoteWrites).
func FlushRemoteWritesOp() MemOp { return MemOp{Kind: MemOpFlushRemoteWrites} }

// BarrierOp is a memory barrier of the given scope.
func BarrierOp(scope BarrierScope) MemOp { return MemOp{Kind: MemOpBarrier, Flags: uint32(scope)} }

// Validate checks the operation the way the driver would, before any driver call:
// known kind, non-nil naturally aligned address, 32-bit values that fit, known flags.
func (op MemOp) Validate() error { return op.validate("MemOp") }

func (op MemOp) validate(name string) error {
	switch op.Kind {
	case MemOpWaitValue32, MemOpWriteValue32:
		if op.Value > math.MaxUint32 {
			return invalid(name, "value %#x does not fit a 32-bit memop", op.Value)
		}
		return op.checkAddrFlags(name, 4)
	case MemOpWaitValue64, MemOpWriteValue64:
		return op.checkAddrFlags(name, 8)
	case MemOpFlushRemoteWrites:
		if op.Flags != 0 {
			return invalid(name, "flush-remote-writes flags must be 0, got %#x", op.Flags)
		}
		return nil
	case MemOpBarrier:
		if op.Flags > uint32(BarrierGPU) {
			return invalid(name, "unknown barrier scope %#x", op.Flags)
		}
		return nil
	}
	return invalid(name, "unknown memop kind %d", op.Kind)
}

func (op MemOp) checkAddrFlags(name string, align uintptr) error {
	if op.Addr == 0 {
		return invalid(name, "nil address")
	}
	if op.Addr%align != 0 {
		return invalid(name, "address %#x is not %d-byte aligned", op.Addr, align)
	}
	switch op.Kind {
	case MemOpWaitValue32, MemOpWaitValue64:
		if op.Flags&^uint32(WaitFlush|waitCompareMask) != 0 {
			return invalid(name, "unknown wait flags %#x", op.Flags)
		}
	default:
		if op.Flags&uint32(WriteNoMemoryBarrier) != 0 {
			return notSupportedErr(name, "CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER is not supported by the v2 memop API")
		}
		if op.Flags != 0 {
			return invalid(name, "unknown write flags %#x", op.Flags)
		}
	}
	return nil
}

// memopArray validates ops and lays them out as C records. The slice is Go
// memory without Go pointers, so C may read it during the call.
func memopArray(name string, ops []MemOp) ([]C.ucpx_memop, error) {
	if len(ops) == 0 {
		return nil, invalid(name, "empty memop batch")
	}
	if len(ops) > MaxBatch {
		return nil, invalid(name, "%d memops exceed the batch limit of %d", len(ops), MaxBatch)
	}
	out := make([]C.ucpx_memop, len(ops))
	for i, op := range ops {
		if err := op.validate(name); err != nil {
			return nil, err
		}
		out[i] = C.ucpx_memop{kind: C.uint32_t(op.Kind), flags: C.uint32_t(op.Flags), addr: C.uint64_t(op.Addr), value: C.uint64_t(op.Value)}
	}
	return out, nil
}

// WriteValue32 enqueues a store of v into the 32-bit word at device address addr.
func (s *Stream) WriteValue32(addr uintptr, v uint32, flags WriteFlags) error {
	const op = "cuStreamWriteValue32"
	if err := WriteValue32Op(addr, v, flags).validate(op); err != nil {
		return err
	}
	if err := s.rlock(op); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	return check(op, C.ucpx_stream_write_value32(s.ctx.h, s.h, C.CUdeviceptr(addr), C.uint32_t(v), C.uint(flags)))
}

// WaitValue32 holds back later work until the 32-bit word at addr satisfies flags against v.
func (s *Stream) WaitValue32(addr uintptr, v uint32, flags WaitFlags) error {
	const op = "cuStreamWaitValue32"
	if err := WaitValue32Op(addr, v, flags).validate(op); err != nil {
		return err
	}
	if err := s.rlock(op); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	return check(op, C.ucpx_stream_wait_value32(s.ctx.h, s.h, C.CUdeviceptr(addr), C.uint32_t(v), C.uint(flags)))
}

// WriteValue64 enqueues a store of v into the 64-bit word at device address addr
// (needs Caps.StreamMemOps64).
func (s *Stream) WriteValue64(addr uintptr, v uint64, flags WriteFlags) error {
	const op = "cuStreamWriteValue64"
	if err := WriteValue64Op(addr, v, flags).validate(op); err != nil {
		return err
	}
	if err := s.rlock(op); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	return check(op, C.ucpx_stream_write_value64(s.ctx.h, s.h, C.CUdeviceptr(addr), C.uint64_t(v), C.uint(flags)))
}

// WaitValue64 holds back later work until the 64-bit word at addr satisfies
// flags against v (needs Caps.StreamMemOps64).
func (s *Stream) WaitValue64(addr uintptr, v uint64, flags WaitFlags) error {
	const op = "cuStreamWaitValue64"
	if err := WaitValue64Op(addr, v, flags).validate(op); err != nil {
		return err
	}
	if err := s.rlock(op); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	return check(op, C.ucpx_stream_wait_value64(s.ctx.h, s.h, C.CUdeviceptr(addr), C.uint64_t(v), C.uint(flags)))
}

// BatchMemOp enqueues up to MaxBatch memory operations with one driver call,
// in order. It is cheaper than the same operations one by one.
func (s *Stream) BatchMemOp(ops []MemOp) error {
	const op = "cuStreamBatchMemOp"
	arr, err := memopArray(op, ops)
	if err != nil {
		return err
	}
	if err := s.rlock(op); err != nil {
		return err
	}
	defer s.mu.RUnlock()
	return check(op, C.ucpx_stream_batch_memop(s.ctx.h, s.h, &arr[0], C.uint(len(arr))))
}

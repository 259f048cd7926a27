package device

import (
	"bytes"
	"embed"
)

//go:embed ptx/*.ptx
var ptxFiles embed.FS

//go:embed ucpx_signal.cuh
var signalHeader []byte

// Names of the kernels in test_kernels.cu.
const (
	KernelEcho     = "ucpx_test_echo"     // (trigger, done *u64, base, n u64, result *u64)
	KernelHandle   = "ucpx_test_handle"   // (h Handle, result *u64)
	KernelPingPong = "ucpx_test_pingpong" // (h Handle, n, step u64, result *u64)
	// KernelTriggerNewestFirst triggers newer, then older; result = {trigger word after
	// both, after newer alone}.
	KernelTriggerNewestFirst = "ucpx_test_trigger_newest_first" // (newer, older Handle, result *u64)
	KernelChecksum           = "ucpx_test_checksum"             // (buf *u8, n u64, out *u64)
	KernelFill               = "ucpx_test_fill"                 // (buf *u8, n u64, seed u32)
	// Prepared partitions: a producer block per partition (fill, ucpx_pready_block) and
	// a consumer block per partition (ucpx_parrived_wait_block, checksum).
	KernelPready   = "ucpx_test_pready"   // (h PartitionHandle, buf *u8, seed, reverse u32, failures *u64)
	KernelParrived = "ucpx_test_parrived" // (h PartitionHandle, buf *u8, sums *u64, status *u64)
	// A prepared ping-pong between kernels, one partition each way, one block.
	KernelPartPingPong = "ucpx_test_part_pingpong" // (sh, rh PartitionHandle, out, in *u8, seed, initiator u32, sums, stamps, failures *u64)
	// The launch counter and the partition fill of the PreadyNode graph test.
	KernelTick   = "ucpx_test_tick"    // (w *u64)
	KernelFillAt = "ucpx_test_fill_at" // (buf *u8, n, offset u64, seedWord *u64)
	// Kernel-initiated put with signal into a peer's mapped memory, and its receiver.
	KernelPutSignal = "ucpx_test_put_signal" // (dst, src *u8, chunk u64, flags *u64, value u64)
	KernelWaitFlags = "ucpx_test_wait_flags" // (flags *u64, value u64, buf *u8, chunk u64, sum *u64)
)

// Names of the kernels in signal_kernels.cu.
const (
	KernelSignalWriteWait = "ucpx_signal_write_wait" // (trigger *u64, value u64, completion *u64, completionValue u64)
	KernelSignalWait      = "ucpx_signal_wait"       // (completion *u64, completionValue u64)
	// KernelSignalWaitStamped is ucpx_signal_wait that stores %globaltimer into
	// stamps[0] on arrival and stamps[1] on release (the trace's device track).
	KernelSignalWaitStamped = "ucpx_signal_wait_stamped" // (completion *u64, completionValue u64, stamps *u64)
	KernelSignalCopyWord    = "ucpx_signal_copy_word"    // (src, dst *u64)
	// KernelCopy copies n bytes between two addresses equal modulo 16 (cuda.Stream.LaunchCopy).
	KernelCopy = "ucpx_copy" // (dst, src *u8, n u64)
)

// SignalKernelsPTX returns the embedded PTX of signal_kernels.cu.
func SignalKernelsPTX() []byte { return embedded("ptx/signal_kernels.ptx") }

func embedded(name string) []byte {
	b, err := ptxFiles.ReadFile(name)
	if err != nil {
		return nil
	}
	return b
}

// TestKernelsPTX returns the embedded PTX of test_kernels.cu. Until
// scripts/ptx.sh has been run on a machine with nvcc it is a placeholder;
// check with IsPlaceholder.
func TestKernelsPTX() []byte { return embedded("ptx/test_kernels.ptx") }

// IsPlaceholder reports whether ptx holds no kernel, i.e. is the placeholder
// committed before the PTX was generated.
func IsPlaceholder(ptx []byte) bool { return !bytes.Contains(ptx, []byte(".entry")) }

// SignalHeader returns the text of ucpx_signal.cuh, for programs that compile
// kernels at run time (NVRTC) and want the same device functions.
func SignalHeader() []byte { return bytes.Clone(signalHeader) }

// Handle mirrors struct ucpx_device_handle: 32 bytes, four 8-byte fields, no
// padding. Pass it by value to a kernel (cuda.Stream.LaunchKernel lays it out
// with encoding/binary, which matches the C layout).
type Handle struct {
	Trigger         uint64 // device address of the trigger word
	Value           uint64 // value ucpx_trigger stores
	Completion      uint64 // device address of the completion word, 0 if none
	CompletionValue uint64 // ucpx_test/ucpx_wait succeed once *Completion reaches it
}

// PartitionHandle mirrors struct ucpx_partition_handle, the handle a kernel makes
// partitions of a prepared request ready (ucpx_pready) or checks their arrival
// (ucpx_pstatus, ucpx_parrived) with: 88 bytes, eleven 8-byte fields, no padding. Get it
// from prepare.Request.DeviceHandle().Kernel() after every Start and pass it by value.
type PartitionHandle struct {
	Words         uint64 // sender: ready flags, one per own partition; receiver: arrival counters, one per sender partition
	Triggers      uint64 // sender: address of a table of the partitions' trigger word addresses; receiver: 0
	TriggerValue  uint64 // sender: what ucpx_pready stores into a partition's trigger word this iteration
	Iteration     uint64 // the iteration the handle belongs to
	Failed        uint64 // the value the words hold once the peer failed
	Partitions    uint64 // this side's partitions
	PartBytes     uint64 // this side's partition size in bytes
	PeerPartBytes uint64 // the peer's partition size in bytes
	// Buf, PeerBuf, PeerWords: a sender on the direct path (CUDA IPC): its buffer, and
	// the receiver's buffer and arrival counters mapped in this process; 0 otherwise.
	Buf, PeerBuf, PeerWords uint64
}

// Partition status values of ucpx_pstatus (UCPX_PART_*).
const (
	PartPending int64 = 0
	PartDone    int64 = 1
	PartFailed  int64 = -1
)

// Pattern is the byte ucpx_test_fill writes at index i for seed.
func Pattern(i uint64, seed uint32) byte { return byte((i*2654435761 + uint64(seed)) >> 7) }

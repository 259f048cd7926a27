package cuda_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
)

// cudaHeader finds a real cuda.h to check ucpx's declarations against:
// $UCPX_CUDA_H, else the CUDA toolkit's. Where there is none, or no C compiler,
// the test skips: the declarations were checked when they were written.
func cudaHeader(t *testing.T) (header, cc string) {
	t.Helper()
	header = os.Getenv("UCPX_CUDA_H")
	if header == "" {
		header = "/usr/local/cuda/include/cuda.h"
	}
	if _, err := os.Stat(header); err != nil {
		t.Skipf("no cuda.h to check against (set UCPX_CUDA_H): %v", err)
	}
	header, _ = filepath.Abs(header)
	for _, c := range []string{os.Getenv("CC"), "cc", "gcc", "clang"} {
		if c == "" {
			continue
		}
		if p, err := exec.LookPath(c); err == nil {
			return header, p
		}
	}
	t.Skip("no C compiler")
	return "", ""
}

func runC(t *testing.T, cc string, args ...string) []byte {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "a.out")
	out, err := exec.Command(cc, append(args, "-o", bin)...).CombinedOutput()
	require.NoError(t, err, "%s %s:\n%s", cc, strings.Join(args, " "), out)
	out, err = exec.Command(bin).Output()
	require.NoError(t, err, "running the check")
	return out
}

// TestABIAgainstHeader checks cu_types.h and cu_syms.h against a real cuda.h:
// struct/union layouts and the enum values the shim uses must match, and every
// entry point must be a symbol cuda.h declares, with ucpx's parameter list.
func TestABIAgainstHeader(t *testing.T) {
	header, cc := cudaHeader(t)
	real := fmt.Sprintf(`-DUCPX_REAL="%s"`, header)

	mine := runC(t, cc, "-I.", "testdata/abicheck/layout.c")
	theirs := runC(t, cc, "-I.", real, "testdata/abicheck/layout.c")
	assert.Truef(t, bytes.Equal(mine, theirs), "layouts differ from %s\nucpx:\n%s\ncuda.h:\n%s", header, mine, theirs)

	dir := t.TempDir()
	out, err := exec.Command(cc, "-Werror", "-I.", real, "-c", "testdata/abicheck/signatures.c", "-o", filepath.Join(dir, "s.o")).CombinedOutput()
	assert.NoError(t, err, "entry points disagree with %s:\n%s", header, out)
}

// TestGoConstantsAgainstHeader checks the Go-side enum values against cuda.h.
func TestGoConstantsAgainstHeader(t *testing.T) {
	header, cc := cudaHeader(t)
	consts := []struct {
		c   string
		val int64
	}{
		{"CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK", int64(cuda.AttrMaxThreadsPerBlock)},
		{"CU_DEVICE_ATTRIBUTE_WARP_SIZE", int64(cuda.AttrWarpSize)},
		{"CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT", int64(cuda.AttrMultiprocessorCount)},
		{"CU_DEVICE_ATTRIBUTE_INTEGRATED", int64(cuda.AttrIntegrated)},
		{"CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY", int64(cuda.AttrCanMapHostMemory)},
		{"CU_DEVICE_ATTRIBUTE_PCI_BUS_ID", int64(cuda.AttrPCIBusID)},
		{"CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID", int64(cuda.AttrPCIDeviceID)},
		{"CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT", int64(cuda.AttrAsyncEngineCount)},
		{"CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING", int64(cuda.AttrUnifiedAddressing)},
		{"CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID", int64(cuda.AttrPCIDomainID)},
		{"CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR", int64(cuda.AttrComputeCapabilityMajor)},
		{"CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR", int64(cuda.AttrComputeCapabilityMinor)},
		{"CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY", int64(cuda.AttrManagedMemory)},
		{"CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED", int64(cuda.AttrHostNativeAtomicSupported)},
		{"CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS", int64(cuda.AttrPageableMemoryAccess)},
		{"CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS", int64(cuda.AttrConcurrentManagedAccess)},
		{"CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM", int64(cuda.AttrCanUseHostPointerForRegistered)},
		{"CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH", int64(cuda.AttrCooperativeLaunch)},
		{"CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES", int64(cuda.AttrCanFlushRemoteWrites)},
		{"CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED", int64(cuda.AttrMemoryPoolsSupported)},
		{"CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED", int64(cuda.AttrGPUDirectRDMASupported)},
		{"CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS", int64(cuda.AttrCanUse64BitStreamMemOps)},
		{"CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR", int64(cuda.AttrCanUseStreamWaitValueNOR)},
		{"CU_STREAM_NON_BLOCKING", int64(cuda.StreamNonBlocking)},
		{"CU_STREAM_WAIT_VALUE_GEQ", int64(cuda.WaitGEQ)},
		{"CU_STREAM_WAIT_VALUE_EQ", int64(cuda.WaitEQ)},
		{"CU_STREAM_WAIT_VALUE_AND", int64(cuda.WaitAND)},
		{"CU_STREAM_WAIT_VALUE_NOR", int64(cuda.WaitNOR)},
		{"CU_STREAM_WAIT_VALUE_FLUSH", int64(cuda.WaitFlush)},
		{"CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER", int64(cuda.WriteNoMemoryBarrier)},
		{"CU_STREAM_MEM_OP_WAIT_VALUE_32", int64(cuda.MemOpWaitValue32)},
		{"CU_STREAM_MEM_OP_WRITE_VALUE_32", int64(cuda.MemOpWriteValue32)},
		{"CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES", int64(cuda.MemOpFlushRemoteWrites)},
		{"CU_STREAM_MEM_OP_WAIT_VALUE_64", int64(cuda.MemOpWaitValue64)},
		{"CU_STREAM_MEM_OP_WRITE_VALUE_64", int64(cuda.MemOpWriteValue64)},
		{"CU_STREAM_MEM_OP_BARRIER", int64(cuda.MemOpBarrier)},
		{"CU_STREAM_MEMORY_BARRIER_TYPE_SYS", int64(cuda.BarrierSystem)},
		{"CU_STREAM_MEMORY_BARRIER_TYPE_GPU", int64(cuda.BarrierGPU)},
		{"CU_EVENT_BLOCKING_SYNC", int64(cuda.EventBlockingSync)},
		{"CU_EVENT_DISABLE_TIMING", int64(cuda.EventDisableTiming)},
		{"CU_EVENT_INTERPROCESS", int64(cuda.EventInterprocess)},
		{"CU_MEMHOSTALLOC_PORTABLE", int64(cuda.HostAllocPortable)},
		{"CU_MEMHOSTALLOC_DEVICEMAP", int64(cuda.HostAllocDeviceMap)},
		{"CU_MEMHOSTALLOC_WRITECOMBINED", int64(cuda.HostAllocWriteCombined)},
		{"CU_MEMHOSTREGISTER_PORTABLE", int64(cuda.HostRegisterPortable)},
		{"CU_MEMHOSTREGISTER_DEVICEMAP", int64(cuda.HostRegisterDeviceMap)},
		{"CU_MEMHOSTREGISTER_IOMEMORY", int64(cuda.HostRegisterIOMemory)},
		{"CU_MEMHOSTREGISTER_READ_ONLY", int64(cuda.HostRegisterReadOnly)},
		{"CU_MEMORYTYPE_HOST", int64(cuda.MemoryHost)},
		{"CU_MEMORYTYPE_DEVICE", int64(cuda.MemoryDevice)},
		{"CU_MEMORYTYPE_ARRAY", int64(cuda.MemoryArray)},
		{"CU_MEMORYTYPE_UNIFIED", int64(cuda.MemoryUnified)},
		{"CU_POINTER_ATTRIBUTE_CONTEXT", int64(cuda.PointerAttrContext)},
		{"CU_POINTER_ATTRIBUTE_MEMORY_TYPE", int64(cuda.PointerAttrMemoryType)},
		{"CU_POINTER_ATTRIBUTE_DEVICE_POINTER", int64(cuda.PointerAttrDevicePointer)},
		{"CU_POINTER_ATTRIBUTE_HOST_POINTER", int64(cuda.PointerAttrHostPointer)},
		{"CU_POINTER_ATTRIBUTE_BUFFER_ID", int64(cuda.PointerAttrBufferID)},
		{"CU_POINTER_ATTRIBUTE_IS_MANAGED", int64(cuda.PointerAttrIsManaged)},
		{"CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL", int64(cuda.PointerAttrDeviceOrdinal)},
		{"CU_POINTER_ATTRIBUTE_RANGE_START_ADDR", int64(cuda.PointerAttrRangeStart)},
		{"CU_POINTER_ATTRIBUTE_RANGE_SIZE", int64(cuda.PointerAttrRangeSize)},
		{"CU_POINTER_ATTRIBUTE_MAPPED", int64(cuda.PointerAttrMapped)},
		{"CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE", int64(cuda.PointerAttrLegacyIPCCapable)},
		{"CU_GRAPH_NODE_TYPE_KERNEL", int64(cuda.NodeKernel)},
		{"CU_GRAPH_NODE_TYPE_MEMCPY", int64(cuda.NodeMemcpy)},
		{"CU_GRAPH_NODE_TYPE_MEMSET", int64(cuda.NodeMemset)},
		{"CU_GRAPH_NODE_TYPE_HOST", int64(cuda.NodeHost)},
		{"CU_GRAPH_NODE_TYPE_GRAPH", int64(cuda.NodeGraph)},
		{"CU_GRAPH_NODE_TYPE_EMPTY", int64(cuda.NodeEmpty)},
		{"CU_GRAPH_NODE_TYPE_WAIT_EVENT", int64(cuda.NodeWaitEvent)},
		{"CU_GRAPH_NODE_TYPE_EVENT_RECORD", int64(cuda.NodeEventRecord)},
		{"CU_GRAPH_NODE_TYPE_BATCH_MEM_OP", int64(cuda.NodeBatchMemOp)},
		{"CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH", int64(cuda.InstantiateAutoFreeOnLaunch)},
		{"CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH", int64(cuda.InstantiateDeviceLaunch)},
		{"CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY", int64(cuda.InstantiateUseNodePriority)},
		{"CU_STREAM_CAPTURE_MODE_GLOBAL", int64(cuda.CaptureGlobal)},
		{"CU_STREAM_CAPTURE_MODE_THREAD_LOCAL", int64(cuda.CaptureThreadLocal)},
		{"CU_STREAM_CAPTURE_MODE_RELAXED", int64(cuda.CaptureRelaxed)},
		{"CU_STREAM_CAPTURE_STATUS_NONE", int64(cuda.CaptureNone)},
		{"CU_STREAM_CAPTURE_STATUS_ACTIVE", int64(cuda.CaptureActive)},
		{"CU_STREAM_CAPTURE_STATUS_INVALIDATED", int64(cuda.CaptureInvalidated)},
		{"CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS", int64(cuda.IPCLazyEnablePeerAccess)},
		{"CU_IPC_HANDLE_SIZE", int64(cuda.IPCHandleSize)},
		{"CUDA_ERROR_INVALID_VALUE", int64(cuda.ErrInvalidValue.Code)},
		{"CUDA_ERROR_NO_DEVICE", int64(cuda.ErrNoDevice.Code)},
		{"CUDA_ERROR_INVALID_PTX", int64(cuda.ErrInvalidPTX.Code)},
		{"CUDA_ERROR_INVALID_IMAGE", int64(cuda.ErrInvalidImage.Code)},
		{"CUDA_ERROR_INVALID_HANDLE", int64(cuda.ErrInvalidHandle.Code)},
		{"CUDA_ERROR_NOT_READY", int64(cuda.ErrNotReady.Code)},
		{"CUDA_ERROR_ILLEGAL_ADDRESS", int64(cuda.ErrIllegalAddress.Code)},
		{"CUDA_ERROR_PEER_ACCESS_UNSUPPORTED", int64(cuda.ErrPeerAccessUnsupported.Code)},
		{"CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", int64(cuda.ErrPeerAccessAlreadyOn.Code)},
		{"CUDA_ERROR_NOT_SUPPORTED", int64(cuda.ErrNotSupported.Code)},
		{"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", int64(cuda.ErrCaptureUnsupported.Code)},
	}
	var src strings.Builder
	fmt.Fprintf(&src, "#include <stdio.h>\n#include \"%s\"\nint main(void) {\n", header)
	for _, c := range consts {
		fmt.Fprintf(&src, "\tprintf(\"%s %%lld\\n\", (long long)(%s));\n", c.c, c.c)
	}
	src.WriteString("\treturn 0;\n}\n")
	file := filepath.Join(t.TempDir(), "consts.c")
	require.NoError(t, os.WriteFile(file, []byte(src.String()), 0o644))
	out := runC(t, cc, file)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Len(t, lines, len(consts), "one value per constant")
	for i, c := range consts {
		var name string
		var v int64
		_, err := fmt.Sscanf(lines[i], "%s %d", &name, &v)
		require.NoError(t, err, "%q", lines[i])
		assert.Equal(t, v, c.val, "%s: cuda.h's value first, ucpx's second", c.c)
	}
}

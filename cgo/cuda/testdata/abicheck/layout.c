/* Prints the layout of the CUDA types ucpx declares. Built twice by
 * TestABIAgainstHeader: with -DUCPX_REAL='"<path to cuda.h>"' and without it
 * (then cu_types.h is used); the two outputs must be identical. */
#include <stddef.h>
#include <stdio.h>

#ifdef UCPX_REAL
#include UCPX_REAL
#define K(name) printf("const %s %lld\n", #name, (long long)CU_##name);
#else
#include "cu_types.h"
#define K(name) printf("const %s %lld\n", #name, (long long)UCPX_CU_##name);
#endif

#define S(t) printf("sizeof %s %zu\n", #t, sizeof(t));
#define O(t, f) printf("offsetof %s.%s %zu\n", #t, #f, offsetof(t, f));

int main(void) {
	S(CUresult) S(CUdeviceptr) S(CUdevice) S(CUcontext) S(CUstream) S(CUevent) S(CUgraph)
	S(CUgraphNode) S(CUgraphExec) S(CUmodule) S(CUfunction) S(CUhostFn)
	S(CUdevice_attribute) S(CUpointer_attribute) S(CUstreamCaptureStatus) S(CUstreamCaptureMode)
	S(CUjit_option) S(CUmemorytype) S(CUstreamBatchMemOpType) S(CUgraphNodeType)
	S(CUipcMemHandle) S(CUipcEventHandle)

	S(CUstreamBatchMemOpParams)
	O(CUstreamBatchMemOpParams, operation)
	O(CUstreamBatchMemOpParams, waitValue.operation)
	O(CUstreamBatchMemOpParams, waitValue.address)
	O(CUstreamBatchMemOpParams, waitValue.value)
	O(CUstreamBatchMemOpParams, waitValue.value64)
	O(CUstreamBatchMemOpParams, waitValue.flags)
	O(CUstreamBatchMemOpParams, waitValue.alias)
	O(CUstreamBatchMemOpParams, writeValue.operation)
	O(CUstreamBatchMemOpParams, writeValue.address)
	O(CUstreamBatchMemOpParams, writeValue.value)
	O(CUstreamBatchMemOpParams, writeValue.value64)
	O(CUstreamBatchMemOpParams, writeValue.flags)
	O(CUstreamBatchMemOpParams, writeValue.alias)
	O(CUstreamBatchMemOpParams, flushRemoteWrites.flags)
	O(CUstreamBatchMemOpParams, memoryBarrier.flags)

	S(CUDA_BATCH_MEM_OP_NODE_PARAMS)
	O(CUDA_BATCH_MEM_OP_NODE_PARAMS, ctx)
	O(CUDA_BATCH_MEM_OP_NODE_PARAMS, count)
	O(CUDA_BATCH_MEM_OP_NODE_PARAMS, paramArray)
	O(CUDA_BATCH_MEM_OP_NODE_PARAMS, flags)

	S(CUDA_HOST_NODE_PARAMS)
	O(CUDA_HOST_NODE_PARAMS, fn)
	O(CUDA_HOST_NODE_PARAMS, userData)

	S(CUDA_MEMSET_NODE_PARAMS)
	O(CUDA_MEMSET_NODE_PARAMS, dst)
	O(CUDA_MEMSET_NODE_PARAMS, pitch)
	O(CUDA_MEMSET_NODE_PARAMS, value)
	O(CUDA_MEMSET_NODE_PARAMS, elementSize)
	O(CUDA_MEMSET_NODE_PARAMS, width)
	O(CUDA_MEMSET_NODE_PARAMS, height)

	S(CUDA_KERNEL_NODE_PARAMS)
	O(CUDA_KERNEL_NODE_PARAMS, func)
	O(CUDA_KERNEL_NODE_PARAMS, gridDimX)
	O(CUDA_KERNEL_NODE_PARAMS, gridDimY)
	O(CUDA_KERNEL_NODE_PARAMS, gridDimZ)
	O(CUDA_KERNEL_NODE_PARAMS, blockDimX)
	O(CUDA_KERNEL_NODE_PARAMS, blockDimY)
	O(CUDA_KERNEL_NODE_PARAMS, blockDimZ)
	O(CUDA_KERNEL_NODE_PARAMS, sharedMemBytes)
	O(CUDA_KERNEL_NODE_PARAMS, kernelParams)
	O(CUDA_KERNEL_NODE_PARAMS, extra)
	O(CUDA_KERNEL_NODE_PARAMS, kern)
	O(CUDA_KERNEL_NODE_PARAMS, ctx)

	S(CUDA_MEMCPY3D)
	O(CUDA_MEMCPY3D, srcXInBytes)
	O(CUDA_MEMCPY3D, srcY)
	O(CUDA_MEMCPY3D, srcZ)
	O(CUDA_MEMCPY3D, srcLOD)
	O(CUDA_MEMCPY3D, srcMemoryType)
	O(CUDA_MEMCPY3D, srcHost)
	O(CUDA_MEMCPY3D, srcDevice)
	O(CUDA_MEMCPY3D, srcArray)
	O(CUDA_MEMCPY3D, reserved0)
	O(CUDA_MEMCPY3D, srcPitch)
	O(CUDA_MEMCPY3D, srcHeight)
	O(CUDA_MEMCPY3D, dstXInBytes)
	O(CUDA_MEMCPY3D, dstY)
	O(CUDA_MEMCPY3D, dstZ)
	O(CUDA_MEMCPY3D, dstLOD)
	O(CUDA_MEMCPY3D, dstMemoryType)
	O(CUDA_MEMCPY3D, dstHost)
	O(CUDA_MEMCPY3D, dstDevice)
	O(CUDA_MEMCPY3D, dstArray)
	O(CUDA_MEMCPY3D, reserved1)
	O(CUDA_MEMCPY3D, dstPitch)
	O(CUDA_MEMCPY3D, dstHeight)
	O(CUDA_MEMCPY3D, WidthInBytes)
	O(CUDA_MEMCPY3D, Height)
	O(CUDA_MEMCPY3D, Depth)

	S(CUgraphEdgeData)
	O(CUgraphEdgeData, from_port)
	O(CUgraphEdgeData, to_port)
	O(CUgraphEdgeData, type)
	O(CUgraphEdgeData, reserved)

	K(MEMORYTYPE_HOST) K(MEMORYTYPE_DEVICE) K(MEMORYTYPE_UNIFIED)
	K(STREAM_MEM_OP_WAIT_VALUE_32) K(STREAM_MEM_OP_WRITE_VALUE_32) K(STREAM_MEM_OP_FLUSH_REMOTE_WRITES)
	K(STREAM_MEM_OP_WAIT_VALUE_64) K(STREAM_MEM_OP_WRITE_VALUE_64) K(STREAM_MEM_OP_BARRIER)
	K(JIT_INFO_LOG_BUFFER) K(JIT_INFO_LOG_BUFFER_SIZE_BYTES) K(JIT_ERROR_LOG_BUFFER) K(JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
	K(POINTER_ATTRIBUTE_CONTEXT) K(POINTER_ATTRIBUTE_MEMORY_TYPE) K(POINTER_ATTRIBUTE_IS_MANAGED)
	K(POINTER_ATTRIBUTE_DEVICE_ORDINAL) K(POINTER_ATTRIBUTE_RANGE_START_ADDR) K(POINTER_ATTRIBUTE_RANGE_SIZE)
	return 0;
}

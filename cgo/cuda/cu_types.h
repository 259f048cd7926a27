/*
 * The CUDA driver API types ucpx uses, declared from the CUDA driver API
 * documentation so that no CUDA header is needed to build ucpx.
 *
 * Only what the shim touches is here. Layouts are those of CUDA 12/13 on
 * LP64 (x86_64, aarch64). TestABIAgainstHeader compiles the same
 * sizeof/offsetof report against this file and against a real cuda.h
 * (UCPX_CUDA_H or /usr/local/cuda/include/cuda.h) and fails on any difference.
 */
#ifndef UCPX_CU_TYPES_H
#define UCPX_CU_TYPES_H

#include <stddef.h>
#include <stdint.h>

typedef uint32_t cuuint32_t;
typedef uint64_t cuuint64_t;

/* Enums are int-sized in the C ABI; CUresult and friends are plain unsigned
 * ints here so cgo sees simple integer types. */
typedef unsigned int CUresult;
typedef unsigned int CUdevice_attribute;
typedef unsigned int CUpointer_attribute;
typedef unsigned int CUstreamCaptureStatus;
typedef unsigned int CUstreamCaptureMode;
typedef unsigned int CUjit_option;
typedef unsigned int CUmemorytype;
typedef unsigned int CUstreamBatchMemOpType;
typedef unsigned int CUgraphNodeType;

typedef unsigned long long CUdeviceptr;
typedef int CUdevice;

typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUkern_st *CUkernel;
typedef struct CUarray_st *CUarray;
typedef struct CUevent_st *CUevent;
typedef struct CUstream_st *CUstream;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;

typedef void (*CUhostFn)(void *userData);

#define UCPX_CU_IPC_HANDLE_SIZE 64
typedef struct CUipcMemHandle_st {
	char reserved[UCPX_CU_IPC_HANDLE_SIZE];
} CUipcMemHandle;
typedef struct CUipcEventHandle_st {
	char reserved[UCPX_CU_IPC_HANDLE_SIZE];
} CUipcEventHandle;

typedef struct CUuuid_st {
	char bytes[16];
} CUuuid;

/* CUstreamBatchMemOpParams (the _v1 union that cuStreamBatchMemOp_v2 takes):
 * 48 bytes; operation at 0, address at 8, value at 16, flags at 24. */
typedef union CUstreamBatchMemOpParams_union {
	CUstreamBatchMemOpType operation;
	struct CUstreamMemOpWaitValueParams_st {
		CUstreamBatchMemOpType operation;
		CUdeviceptr address;
		union {
			cuuint32_t value;
			cuuint64_t value64;
		};
		unsigned int flags;
		CUdeviceptr alias;
	} waitValue;
	struct CUstreamMemOpWriteValueParams_st {
		CUstreamBatchMemOpType operation;
		CUdeviceptr address;
		union {
			cuuint32_t value;
			cuuint64_t value64;
		};
		unsigned int flags;
		CUdeviceptr alias;
	} writeValue;
	struct CUstreamMemOpFlushRemoteWritesParams_st {
		CUstreamBatchMemOpType operation;
		unsigned int flags;
	} flushRemoteWrites;
	struct CUstreamMemOpMemoryBarrierParams_st {
		CUstreamBatchMemOpType operation;
		unsigned int flags;
	} memoryBarrier;
	cuuint64_t pad[6];
} CUstreamBatchMemOpParams;

/* CUDA_BATCH_MEM_OP_NODE_PARAMS (_v1, the one cuGraphAddBatchMemOpNode takes). */
typedef struct CUDA_BATCH_MEM_OP_NODE_PARAMS_st {
	CUcontext ctx;
	unsigned int count;
	CUstreamBatchMemOpParams *paramArray;
	unsigned int flags;
} CUDA_BATCH_MEM_OP_NODE_PARAMS;

typedef struct CUDA_HOST_NODE_PARAMS_st {
	CUhostFn fn;
	void *userData;
} CUDA_HOST_NODE_PARAMS;

/* CUDA_MEMSET_NODE_PARAMS (_v1, taken by cuGraphAddMemsetNode). */
typedef struct CUDA_MEMSET_NODE_PARAMS_st {
	CUdeviceptr dst;
	size_t pitch;
	unsigned int value;
	unsigned int elementSize;
	size_t width;
	size_t height;
} CUDA_MEMSET_NODE_PARAMS;

/* CUDA_KERNEL_NODE_PARAMS is the _v2 layout since CUDA 12 (taken by
 * cuGraphAddKernelNode_v2). */
typedef struct CUDA_KERNEL_NODE_PARAMS_st {
	CUfunction func;
	unsigned int gridDimX;
	unsigned int gridDimY;
	unsigned int gridDimZ;
	unsigned int blockDimX;
	unsigned int blockDimY;
	unsigned int blockDimZ;
	unsigned int sharedMemBytes;
	void **kernelParams;
	void **extra;
	CUkernel kern;
	CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS;

/* CUDA_MEMCPY3D (_v2 layout), taken by cuGraphAddMemcpyNode. */
typedef struct CUDA_MEMCPY3D_st {
	size_t srcXInBytes;
	size_t srcY;
	size_t srcZ;
	size_t srcLOD;
	CUmemorytype srcMemoryType;
	const void *srcHost;
	CUdeviceptr srcDevice;
	CUarray srcArray;
	void *reserved0;
	size_t srcPitch;
	size_t srcHeight;

	size_t dstXInBytes;
	size_t dstY;
	size_t dstZ;
	size_t dstLOD;
	CUmemorytype dstMemoryType;
	void *dstHost;
	CUdeviceptr dstDevice;
	CUarray dstArray;
	void *reserved1;
	size_t dstPitch;
	size_t dstHeight;

	size_t WidthInBytes;
	size_t Height;
	size_t Depth;
} CUDA_MEMCPY3D;

/* CUgraphEdgeData: 8 bytes; all-zero means a full dependency. */
typedef struct CUgraphEdgeData_st {
	unsigned char from_port;
	unsigned char to_port;
	unsigned char type;
	unsigned char reserved[5];
} CUgraphEdgeData;

/* Enum values used by the shim (the Go side has its own typed constants). */
#define UCPX_CU_MEMORYTYPE_HOST 1
#define UCPX_CU_MEMORYTYPE_DEVICE 2
#define UCPX_CU_MEMORYTYPE_UNIFIED 4

#define UCPX_CU_STREAM_MEM_OP_WAIT_VALUE_32 1
#define UCPX_CU_STREAM_MEM_OP_WRITE_VALUE_32 2
#define UCPX_CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES 3
#define UCPX_CU_STREAM_MEM_OP_WAIT_VALUE_64 4
#define UCPX_CU_STREAM_MEM_OP_WRITE_VALUE_64 5
#define UCPX_CU_STREAM_MEM_OP_BARRIER 6

#define UCPX_CU_JIT_INFO_LOG_BUFFER 3
#define UCPX_CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES 4
#define UCPX_CU_JIT_ERROR_LOG_BUFFER 5
#define UCPX_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES 6

#define UCPX_CU_POINTER_ATTRIBUTE_CONTEXT 1
#define UCPX_CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define UCPX_CU_POINTER_ATTRIBUTE_BUFFER_ID 7
#define UCPX_CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define UCPX_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define UCPX_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR 11
#define UCPX_CU_POINTER_ATTRIBUTE_RANGE_SIZE 12
#define UCPX_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE 10

#endif

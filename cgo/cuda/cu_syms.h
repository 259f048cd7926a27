/*
 * The driver entry points ucpx loads from libcuda.so.1, as an X-macro:
 *
 *   X(api, symbol, parameters)
 *
 * api is the name a program compiled against cuda.h writes; symbol is the
 * versioned name cuda.h (CUDA 13.0) maps it to and that dlsym looks up. The
 * list is the single source of truth: the function table, the loader and the
 * ABI test (which assigns &symbol to a pointer of this prototype under a real
 * cuda.h and so catches a wrong version suffix or parameter list) all expand it.
 * SYMBOLS.md documents the same list; TestSymbolsDocumented keeps them in step.
 *
 * UCPX_CU_REQUIRED lists the entry points Load cannot do without; any other
 * missing symbol only makes the wrappers that need it return
 * CUDA_ERROR_NOT_SUPPORTED.
 */
#ifndef UCPX_CU_SYMS_H
#define UCPX_CU_SYMS_H

#define UCPX_CU_REQUIRED(X) \
	X(cuInit, cuInit, (unsigned int Flags)) \
	X(cuDriverGetVersion, cuDriverGetVersion, (int *driverVersion)) \
	X(cuGetErrorName, cuGetErrorName, (CUresult error, const char **pStr)) \
	X(cuGetErrorString, cuGetErrorString, (CUresult error, const char **pStr)) \
	X(cuCtxGetCurrent, cuCtxGetCurrent, (CUcontext *pctx)) \
	X(cuCtxSetCurrent, cuCtxSetCurrent, (CUcontext ctx)) \
	X(cuDeviceGetCount, cuDeviceGetCount, (int *count)) \
	X(cuDeviceGet, cuDeviceGet, (CUdevice *device, int ordinal))

#define UCPX_CU_OPTIONAL(X) \
	/* devices */ \
	X(cuDeviceGetName, cuDeviceGetName, (char *name, int len, CUdevice dev)) \
	X(cuDeviceGetAttribute, cuDeviceGetAttribute, (int *pi, CUdevice_attribute attrib, CUdevice dev)) \
	X(cuDeviceTotalMem, cuDeviceTotalMem_v2, (size_t *bytes, CUdevice dev)) \
	X(cuDeviceGetPCIBusId, cuDeviceGetPCIBusId, (char *pciBusId, int len, CUdevice dev)) \
	X(cuDeviceCanAccessPeer, cuDeviceCanAccessPeer, (int *canAccessPeer, CUdevice dev, CUdevice peerDev)) \
	X(cuDeviceGetUuid, cuDeviceGetUuid_v2, (CUuuid *uuid, CUdevice dev)) \
	/* contexts */ \
	X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, (CUcontext *pctx, CUdevice dev)) \
	X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, (CUdevice dev)) \
	X(cuCtxGetDevice, cuCtxGetDevice, (CUdevice *device)) \
	X(cuCtxSynchronize, cuCtxSynchronize, (void)) \
	X(cuCtxEnablePeerAccess, cuCtxEnablePeerAccess, (CUcontext peerContext, unsigned int Flags)) \
	X(cuCtxDisablePeerAccess, cuCtxDisablePeerAccess, (CUcontext peerContext)) \
	X(cuCtxGetStreamPriorityRange, cuCtxGetStreamPriorityRange, (int *leastPriority, int *greatestPriority)) \
	X(cuMemGetInfo, cuMemGetInfo_v2, (size_t *free, size_t *total)) \
	/* streams */ \
	X(cuStreamCreateWithPriority, cuStreamCreateWithPriority, (CUstream *phStream, unsigned int flags, int priority)) \
	X(cuStreamDestroy, cuStreamDestroy_v2, (CUstream hStream)) \
	X(cuStreamSynchronize, cuStreamSynchronize, (CUstream hStream)) \
	X(cuStreamQuery, cuStreamQuery, (CUstream hStream)) \
	X(cuStreamWaitEvent, cuStreamWaitEvent, (CUstream hStream, CUevent hEvent, unsigned int Flags)) \
	X(cuStreamGetCtx, cuStreamGetCtx, (CUstream hStream, CUcontext *pctx)) \
	/* stream memory operations */ \
	X(cuStreamWriteValue32, cuStreamWriteValue32_v2, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags)) \
	X(cuStreamWaitValue32, cuStreamWaitValue32_v2, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags)) \
	X(cuStreamWriteValue64, cuStreamWriteValue64_v2, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags)) \
	X(cuStreamWaitValue64, cuStreamWaitValue64_v2, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags)) \
	X(cuStreamBatchMemOp, cuStreamBatchMemOp_v2, (CUstream stream, unsigned int count, CUstreamBatchMemOpParams *paramArray, unsigned int flags)) \
	/* events */ \
	X(cuEventCreate, cuEventCreate, (CUevent *phEvent, unsigned int Flags)) \
	X(cuEventRecord, cuEventRecord, (CUevent hEvent, CUstream hStream)) \
	X(cuEventQuery, cuEventQuery, (CUevent hEvent)) \
	X(cuEventSynchronize, cuEventSynchronize, (CUevent hEvent)) \
	X(cuEventElapsedTime, cuEventElapsedTime_v2, (float *pMilliseconds, CUevent hStart, CUevent hEnd)) \
	X(cuEventDestroy, cuEventDestroy_v2, (CUevent hEvent)) \
	/* memory */ \
	X(cuMemAlloc, cuMemAlloc_v2, (CUdeviceptr *dptr, size_t bytesize)) \
	X(cuMemAllocManaged, cuMemAllocManaged, (CUdeviceptr *dptr, size_t bytesize, unsigned int flags)) \
	X(cuMemFree, cuMemFree_v2, (CUdeviceptr dptr)) \
	X(cuMemHostAlloc, cuMemHostAlloc, (void **pp, size_t bytesize, unsigned int Flags)) \
	X(cuMemFreeHost, cuMemFreeHost, (void *p)) \
	X(cuMemHostGetDevicePointer, cuMemHostGetDevicePointer_v2, (CUdeviceptr *pdptr, void *p, unsigned int Flags)) \
	X(cuMemHostRegister, cuMemHostRegister_v2, (void *p, size_t bytesize, unsigned int Flags)) \
	X(cuMemHostUnregister, cuMemHostUnregister, (void *p)) \
	X(cuMemcpyAsync, cuMemcpyAsync, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)) \
	X(cuMemcpyPeerAsync, cuMemcpyPeerAsync, (CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount, CUstream hStream)) \
	X(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2, (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)) \
	X(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync_v2, (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)) \
	X(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)) \
	X(cuMemsetD8Async, cuMemsetD8Async, (CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)) \
	X(cuMemsetD32Async, cuMemsetD32Async, (CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream)) \
	X(cuPointerGetAttribute, cuPointerGetAttribute, (void *data, CUpointer_attribute attribute, CUdeviceptr ptr)) \
	X(cuPointerGetAttributes, cuPointerGetAttributes, (unsigned int numAttributes, CUpointer_attribute *attributes, void **data, CUdeviceptr ptr)) \
	/* graphs */ \
	X(cuGraphCreate, cuGraphCreate, (CUgraph *phGraph, unsigned int flags)) \
	X(cuGraphDestroy, cuGraphDestroy, (CUgraph hGraph)) \
	X(cuGraphAddBatchMemOpNode, cuGraphAddBatchMemOpNode, (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, const CUDA_BATCH_MEM_OP_NODE_PARAMS *nodeParams)) \
	X(cuGraphAddHostNode, cuGraphAddHostNode, (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, const CUDA_HOST_NODE_PARAMS *nodeParams)) \
	X(cuGraphAddMemcpyNode, cuGraphAddMemcpyNode, (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, const CUDA_MEMCPY3D *copyParams, CUcontext ctx)) \
	X(cuGraphAddMemsetNode, cuGraphAddMemsetNode, (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, const CUDA_MEMSET_NODE_PARAMS *memsetParams, CUcontext ctx)) \
	X(cuGraphAddKernelNode, cuGraphAddKernelNode_v2, (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS *nodeParams)) \
	X(cuGraphAddEventRecordNode, cuGraphAddEventRecordNode, (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, CUevent event)) \
	X(cuGraphAddEventWaitNode, cuGraphAddEventWaitNode, (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, CUevent event)) \
	X(cuGraphAddEmptyNode, cuGraphAddEmptyNode, (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies)) \
	X(cuGraphAddChildGraphNode, cuGraphAddChildGraphNode, (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, CUgraph childGraph)) \
	X(cuGraphAddDependencies, cuGraphAddDependencies_v2, (CUgraph hGraph, const CUgraphNode *from, const CUgraphNode *to, const CUgraphEdgeData *edgeData, size_t numDependencies)) \
	X(cuGraphGetNodes, cuGraphGetNodes, (CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)) \
	X(cuGraphNodeGetType, cuGraphNodeGetType, (CUgraphNode hNode, CUgraphNodeType *type)) \
	X(cuGraphDestroyNode, cuGraphDestroyNode, (CUgraphNode hNode)) \
	X(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, (CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)) \
	X(cuGraphLaunch, cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream)) \
	X(cuGraphExecBatchMemOpNodeSetParams, cuGraphExecBatchMemOpNodeSetParams, (CUgraphExec hGraphExec, CUgraphNode hNode, const CUDA_BATCH_MEM_OP_NODE_PARAMS *nodeParams)) \
	X(cuGraphExecDestroy, cuGraphExecDestroy, (CUgraphExec hGraphExec)) \
	/* stream capture */ \
	X(cuStreamBeginCapture, cuStreamBeginCapture_v2, (CUstream hStream, CUstreamCaptureMode mode)) \
	X(cuStreamEndCapture, cuStreamEndCapture, (CUstream hStream, CUgraph *phGraph)) \
	X(cuStreamIsCapturing, cuStreamIsCapturing, (CUstream hStream, CUstreamCaptureStatus *captureStatus)) \
	X(cuStreamGetCaptureInfo, cuStreamGetCaptureInfo_v3, (CUstream hStream, CUstreamCaptureStatus *captureStatus_out, cuuint64_t *id_out, CUgraph *graph_out, const CUgraphNode **dependencies_out, const CUgraphEdgeData **edgeData_out, size_t *numDependencies_out)) \
	X(cuStreamUpdateCaptureDependencies, cuStreamUpdateCaptureDependencies_v2, (CUstream hStream, CUgraphNode *dependencies, const CUgraphEdgeData *dependencyData, size_t numDependencies, unsigned int flags)) \
	/* modules and kernels */ \
	X(cuModuleLoadDataEx, cuModuleLoadDataEx, (CUmodule *module, const void *image, unsigned int numOptions, CUjit_option *options, void **optionValues)) \
	X(cuModuleUnload, cuModuleUnload, (CUmodule hmod)) \
	X(cuModuleGetFunction, cuModuleGetFunction, (CUfunction *hfunc, CUmodule hmod, const char *name)) \
	X(cuLaunchKernel, cuLaunchKernel, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)) \
	X(cuLaunchHostFunc, cuLaunchHostFunc, (CUstream hStream, CUhostFn fn, void *userData)) \
	/* IPC */ \
	X(cuIpcGetMemHandle, cuIpcGetMemHandle, (CUipcMemHandle *pHandle, CUdeviceptr dptr)) \
	X(cuIpcOpenMemHandle, cuIpcOpenMemHandle_v2, (CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)) \
	X(cuIpcCloseMemHandle, cuIpcCloseMemHandle, (CUdeviceptr dptr)) \
	X(cuIpcGetEventHandle, cuIpcGetEventHandle, (CUipcEventHandle *pHandle, CUevent event)) \
	X(cuIpcOpenEventHandle, cuIpcOpenEventHandle, (CUevent *phEvent, CUipcEventHandle handle))

#define UCPX_CU_SYMBOLS(X) UCPX_CU_REQUIRED(X) UCPX_CU_OPTIONAL(X)

#endif

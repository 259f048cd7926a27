// The raw layer: dlopen/dlsym of libcuda.so.1 and one boring helper per entry
// point. No CUDA header is included; see cu_types.h.

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"
#include "_cgo_export.h"

ucpx_cu_table ucpx_cu;

/* ---- loading ---- */

int ucpx_cu_load(const char *lib, char *err, size_t errlen) {
	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return 1;
	}
	ucpx_cu_table t;
	memset(&t, 0, sizeof t);
#define UCPX_LOAD(api, sym, params) t.api = (CUresult (*) params) dlsym(h, #sym);
	UCPX_CU_SYMBOLS(UCPX_LOAD)
#undef UCPX_LOAD
	/* cuEventElapsedTime_v2 appeared in CUDA 12.8; older drivers only have the
	 * unversioned entry point, with the same signature. */
	if (t.cuEventElapsedTime == NULL)
		t.cuEventElapsedTime = (CUresult (*)(float *, CUevent, CUevent)) dlsym(h, "cuEventElapsedTime");
#define UCPX_REQ(api, sym, params) \
	if (t.api == NULL) { \
		snprintf(err, errlen, "%s does not export %s", lib, #sym); \
		dlclose(h); \
		return 2; \
	}
	UCPX_CU_REQUIRED(UCPX_REQ)
#undef UCPX_REQ
	ucpx_cu = t; /* published to Go by sync.Once */
	return 0;
}

#define UCPX_NAME_API(api, sym, params) #api,
#define UCPX_NAME_SYM(api, sym, params) #sym,
#define UCPX_COUNT(api, sym, params) +1
static const char *const ucpx_apis[] = {UCPX_CU_SYMBOLS(UCPX_NAME_API)};
static const char *const ucpx_syms[] = {UCPX_CU_SYMBOLS(UCPX_NAME_SYM)};
static const int ucpx_nrequired = 0 UCPX_CU_REQUIRED(UCPX_COUNT);

int ucpx_cu_symbol_count(void) { return (int)(sizeof ucpx_apis / sizeof ucpx_apis[0]); }
const char *ucpx_cu_symbol_api(int i) { return ucpx_apis[i]; }
const char *ucpx_cu_symbol_name(int i) { return ucpx_syms[i]; }
int ucpx_cu_symbol_required(int i) { return i < ucpx_nrequired; }
int ucpx_cu_symbol_loaded(int i) {
	/* The table is a struct of function pointers in X-macro order. */
	void *const *slots = (void *const *)&ucpx_cu;
	return slots[i] != NULL;
}

/* ---- context discipline ----
 *
 * A goroutine may move between OS threads between two cgo calls, and CUDA's
 * current context is per OS thread. So every helper gets the context it must
 * run in and makes it current here, inside the same C call. When the thread
 * already has it current (the steady state) this costs one cuCtxGetCurrent.
 * A context we replace is put back afterwards, so code that bound its own
 * context on a locked thread keeps it; a thread that had none keeps ours,
 * which makes the next call on it cheap. */
static inline CUresult ucpx_enter(CUcontext ctx, CUcontext *prev, int *restore) {
	*restore = 0;
	if (ctx == NULL)
		return 0;
	CUcontext cur = NULL;
	CUresult r = ucpx_cu.cuCtxGetCurrent(&cur);
	if (r != 0 || cur == ctx)
		return r;
	r = ucpx_cu.cuCtxSetCurrent(ctx);
	if (r != 0)
		return r;
	*prev = cur;
	*restore = cur != NULL;
	return 0;
}

#define UCPX_CALL(ctx, api, ...) \
	do { \
		if (ucpx_cu.api == NULL) \
			return UCPX_ERR_NOSYM; \
		CUcontext prev_ = NULL; \
		int restore_ = 0; \
		CUresult r_ = ucpx_enter((ctx), &prev_, &restore_); \
		if (r_ != 0) \
			return r_; \
		r_ = ucpx_cu.api(__VA_ARGS__); \
		if (restore_) \
			ucpx_cu.cuCtxSetCurrent(prev_); \
		return r_; \
	} while (0)

/* For helpers that do more than one driver call in the context. */
#define UCPX_ENTER(ctx) \
	CUcontext prev_ = NULL; \
	int restore_ = 0; \
	{ \
		CUresult e_ = ucpx_enter((ctx), &prev_, &restore_); \
		if (e_ != 0) \
			return e_; \
	}
#define UCPX_LEAVE(expr) \
	do { \
		CUresult l_ = (expr); \
		if (restore_) \
			ucpx_cu.cuCtxSetCurrent(prev_); \
		return l_; \
	} while (0)
#define UCPX_NEED(api) \
	if (ucpx_cu.api == NULL) \
	return UCPX_ERR_NOSYM

/* ---- errors and version ---- */

/* Kernel arguments arrive as one flat buffer of values and their offsets (Go memory
 * holding no pointers, valid for the call); the pointer array the driver wants is
 * built here, on the stack. The driver copies the values at launch. */
#define UCPX_KERNEL_PARAMS(params, flat, offs, nargs) \
	void *params[UCPX_MAX_KERNEL_ARGS]; \
	if ((nargs) > UCPX_MAX_KERNEL_ARGS) \
		return 1 /* CUDA_ERROR_INVALID_VALUE: packArgs allows no more */; \
	for (int i_ = 0; i_ < (nargs); i_++) \
		params[i_] = (void *)((flat) + (offs)[i_]);

CUresult ucpx_init(unsigned int flags) { UCPX_CALL(NULL, cuInit, flags); }
CUresult ucpx_driver_version(int *v) { UCPX_CALL(NULL, cuDriverGetVersion, v); }

const char *ucpx_error_name(CUresult r) {
	const char *s = NULL;
	if (ucpx_cu.cuGetErrorName == NULL || ucpx_cu.cuGetErrorName(r, &s) != 0)
		return NULL;
	return s;
}

const char *ucpx_error_string(CUresult r) {
	const char *s = NULL;
	if (ucpx_cu.cuGetErrorString == NULL || ucpx_cu.cuGetErrorString(r, &s) != 0)
		return NULL;
	return s;
}

/* ---- devices ---- */

CUresult ucpx_device_count(int *n) { UCPX_CALL(NULL, cuDeviceGetCount, n); }
CUresult ucpx_device_get(CUdevice *d, int ordinal) { UCPX_CALL(NULL, cuDeviceGet, d, ordinal); }
CUresult ucpx_device_name(char *buf, int len, CUdevice d) { UCPX_CALL(NULL, cuDeviceGetName, buf, len, d); }
CUresult ucpx_device_attribute(int *v, CUdevice_attribute a, CUdevice d) { UCPX_CALL(NULL, cuDeviceGetAttribute, v, a, d); }
CUresult ucpx_device_total_mem(size_t *bytes, CUdevice d) { UCPX_CALL(NULL, cuDeviceTotalMem, bytes, d); }
CUresult ucpx_device_pci_bus_id(char *buf, int len, CUdevice d) { UCPX_CALL(NULL, cuDeviceGetPCIBusId, buf, len, d); }
CUresult ucpx_device_uuid(unsigned char out[16], CUdevice d) {
	/* CUuuid is 16 chars: the caller's buffer has that layout. */
	UCPX_CALL(NULL, cuDeviceGetUuid, (CUuuid *)(void *)out, d);
}
CUresult ucpx_device_can_access_peer(int *can, CUdevice d, CUdevice peer) { UCPX_CALL(NULL, cuDeviceCanAccessPeer, can, d, peer); }

/* ---- contexts ---- */

CUresult ucpx_primary_ctx_retain(CUcontext *ctx, CUdevice d) { UCPX_CALL(NULL, cuDevicePrimaryCtxRetain, ctx, d); }
CUresult ucpx_primary_ctx_release(CUdevice d) { UCPX_CALL(NULL, cuDevicePrimaryCtxRelease, d); }
CUresult ucpx_ctx_get_current(CUcontext *ctx) { UCPX_CALL(NULL, cuCtxGetCurrent, ctx); }
CUresult ucpx_ctx_set_current(CUcontext ctx) { UCPX_CALL(NULL, cuCtxSetCurrent, ctx); }
CUresult ucpx_ctx_get_device(CUcontext ctx, CUdevice *d) { UCPX_CALL(ctx, cuCtxGetDevice, d); }
CUresult ucpx_ctx_synchronize(CUcontext ctx) { UCPX_CALL(ctx, cuCtxSynchronize); }
CUresult ucpx_ctx_enable_peer_access(CUcontext ctx, CUcontext peer) { UCPX_CALL(ctx, cuCtxEnablePeerAccess, peer, 0); }
CUresult ucpx_ctx_disable_peer_access(CUcontext ctx, CUcontext peer) { UCPX_CALL(ctx, cuCtxDisablePeerAccess, peer); }
CUresult ucpx_ctx_stream_priority_range(CUcontext ctx, int *least, int *greatest) {
	UCPX_CALL(ctx, cuCtxGetStreamPriorityRange, least, greatest);
}
CUresult ucpx_mem_get_info(CUcontext ctx, size_t *free_, size_t *total) { UCPX_CALL(ctx, cuMemGetInfo, free_, total); }

/* ---- streams ---- */

CUresult ucpx_stream_create(CUcontext ctx, CUstream *s, unsigned int flags, int priority) {
	UCPX_CALL(ctx, cuStreamCreateWithPriority, s, flags, priority);
}
CUresult ucpx_stream_destroy(CUcontext ctx, CUstream s) { UCPX_CALL(ctx, cuStreamDestroy, s); }
CUresult ucpx_stream_synchronize(CUcontext ctx, CUstream s) { UCPX_CALL(ctx, cuStreamSynchronize, s); }
CUresult ucpx_stream_query(CUcontext ctx, CUstream s) { UCPX_CALL(ctx, cuStreamQuery, s); }
CUresult ucpx_stream_wait_event(CUcontext ctx, CUstream s, CUevent e, unsigned int flags) {
	UCPX_CALL(ctx, cuStreamWaitEvent, s, e, flags);
}
CUresult ucpx_stream_get_ctx(CUstream s, CUcontext *ctx) { UCPX_CALL(NULL, cuStreamGetCtx, s, ctx); }

/* ---- stream memory operations ---- */

CUresult ucpx_stream_write_value32(CUcontext ctx, CUstream s, CUdeviceptr addr, uint32_t v, unsigned int flags) {
	UCPX_CALL(ctx, cuStreamWriteValue32, s, addr, v, flags);
}
CUresult ucpx_stream_wait_value32(CUcontext ctx, CUstream s, CUdeviceptr addr, uint32_t v, unsigned int flags) {
	UCPX_CALL(ctx, cuStreamWaitValue32, s, addr, v, flags);
}
CUresult ucpx_stream_write_value64(CUcontext ctx, CUstream s, CUdeviceptr addr, uint64_t v, unsigned int flags) {
	UCPX_CALL(ctx, cuStreamWriteValue64, s, addr, v, flags);
}
CUresult ucpx_stream_wait_value64(CUcontext ctx, CUstream s, CUdeviceptr addr, uint64_t v, unsigned int flags) {
	UCPX_CALL(ctx, cuStreamWaitValue64, s, addr, v, flags);
}

/* Fills the driver's union from the flat records. The Go side validated kinds,
 * alignment and n (1..UCPX_MAX_BATCH). */
static void ucpx_fill_memops(CUstreamBatchMemOpParams *p, const ucpx_memop *ops, unsigned int n) {
	memset(p, 0, sizeof(*p) * n);
	for (unsigned int i = 0; i < n; i++) {
		p[i].operation = ops[i].kind;
		switch (ops[i].kind) {
		case UCPX_CU_STREAM_MEM_OP_WAIT_VALUE_32:
		case UCPX_CU_STREAM_MEM_OP_WAIT_VALUE_64:
			p[i].waitValue.operation = ops[i].kind;
			p[i].waitValue.address = ops[i].addr;
			if (ops[i].kind == UCPX_CU_STREAM_MEM_OP_WAIT_VALUE_32)
				p[i].waitValue.value = (cuuint32_t)ops[i].value;
			else
				p[i].waitValue.value64 = ops[i].value;
			p[i].waitValue.flags = ops[i].flags;
			break;
		case UCPX_CU_STREAM_MEM_OP_WRITE_VALUE_32:
		case UCPX_CU_STREAM_MEM_OP_WRITE_VALUE_64:
			p[i].writeValue.operation = ops[i].kind;
			p[i].writeValue.address = ops[i].addr;
			if (ops[i].kind == UCPX_CU_STREAM_MEM_OP_WRITE_VALUE_32)
				p[i].writeValue.value = (cuuint32_t)ops[i].value;
			else
				p[i].writeValue.value64 = ops[i].value;
			p[i].writeValue.flags = ops[i].flags;
			break;
		case UCPX_CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES:
			p[i].flushRemoteWrites.operation = ops[i].kind;
			p[i].flushRemoteWrites.flags = 0;
			break;
		case UCPX_CU_STREAM_MEM_OP_BARRIER:
			p[i].memoryBarrier.operation = ops[i].kind;
			p[i].memoryBarrier.flags = ops[i].flags;
			break;
		}
	}
}

CUresult ucpx_stream_batch_memop(CUcontext ctx, CUstream s, const ucpx_memop *ops, unsigned int n) {
	if (n == 0 || n > UCPX_MAX_BATCH)
		return 1; /* CUDA_ERROR_INVALID_VALUE */
	CUstreamBatchMemOpParams p[UCPX_MAX_BATCH];
	ucpx_fill_memops(p, ops, n);
	UCPX_CALL(ctx, cuStreamBatchMemOp, s, n, p, 0);
}

/* ---- events ---- */

CUresult ucpx_event_create(CUcontext ctx, CUevent *e, unsigned int flags) { UCPX_CALL(ctx, cuEventCreate, e, flags); }
CUresult ucpx_event_record(CUcontext ctx, CUevent e, CUstream s) { UCPX_CALL(ctx, cuEventRecord, e, s); }
CUresult ucpx_event_query(CUcontext ctx, CUevent e) { UCPX_CALL(ctx, cuEventQuery, e); }
CUresult ucpx_event_synchronize(CUcontext ctx, CUevent e) { UCPX_CALL(ctx, cuEventSynchronize, e); }
CUresult ucpx_event_elapsed(CUcontext ctx, float *ms, CUevent start, CUevent end) {
	UCPX_CALL(ctx, cuEventElapsedTime, ms, start, end);
}
CUresult ucpx_event_destroy(CUcontext ctx, CUevent e) { UCPX_CALL(ctx, cuEventDestroy, e); }

/* ---- memory ---- */

CUresult ucpx_mem_alloc(CUcontext ctx, CUdeviceptr *p, size_t n) { UCPX_CALL(ctx, cuMemAlloc, p, n); }
CUresult ucpx_mem_alloc_managed(CUcontext ctx, CUdeviceptr *p, size_t n, unsigned int flags) {
	UCPX_CALL(ctx, cuMemAllocManaged, p, n, flags);
}
CUresult ucpx_mem_free(CUcontext ctx, CUdeviceptr p) { UCPX_CALL(ctx, cuMemFree, p); }
CUresult ucpx_mem_host_alloc(CUcontext ctx, void **p, size_t n, unsigned int flags) { UCPX_CALL(ctx, cuMemHostAlloc, p, n, flags); }
CUresult ucpx_mem_free_host(CUcontext ctx, void *p) { UCPX_CALL(ctx, cuMemFreeHost, p); }
CUresult ucpx_mem_host_get_device_pointer(CUcontext ctx, CUdeviceptr *d, uintptr_t host) {
	UCPX_CALL(ctx, cuMemHostGetDevicePointer, d, (void *)host, 0);
}
CUresult ucpx_mem_host_register(CUcontext ctx, uintptr_t p, size_t n, unsigned int flags) {
	UCPX_CALL(ctx, cuMemHostRegister, (void *)p, n, flags);
}
CUresult ucpx_mem_host_unregister(CUcontext ctx, uintptr_t p) { UCPX_CALL(ctx, cuMemHostUnregister, (void *)p); }
CUresult ucpx_memcpy_async(CUcontext ctx, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
	UCPX_CALL(ctx, cuMemcpyAsync, dst, src, n, s);
}
CUresult ucpx_memcpy_peer_async(CUcontext ctx, CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n, CUstream s) {
	UCPX_CALL(ctx, cuMemcpyPeerAsync, dst, dctx, src, sctx, n, s);
}
CUresult ucpx_memcpy_htod_async(CUcontext ctx, CUdeviceptr dst, uintptr_t src, size_t n, CUstream s) {
	UCPX_CALL(ctx, cuMemcpyHtoDAsync, dst, (const void *)src, n, s);
}
CUresult ucpx_memcpy_dtoh_async(CUcontext ctx, uintptr_t dst, CUdeviceptr src, size_t n, CUstream s) {
	UCPX_CALL(ctx, cuMemcpyDtoHAsync, (void *)dst, src, n, s);
}
CUresult ucpx_memcpy_dtod_async(CUcontext ctx, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
	UCPX_CALL(ctx, cuMemcpyDtoDAsync, dst, src, n, s);
}
/* The copy unless s is capturing (then *st says how, and nothing is enqueued): the
 * capture check of a caller that takes another path under capture, in the same call. */
CUresult ucpx_memcpy_dtod_async_uncaptured(CUcontext ctx, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s,
	CUstreamCaptureStatus *st) {
	UCPX_NEED(cuStreamIsCapturing);
	UCPX_NEED(cuMemcpyDtoDAsync);
	UCPX_ENTER(ctx);
	CUresult r = ucpx_cu.cuStreamIsCapturing(s, st);
	if (r != 0 || *st != 0) /* CU_STREAM_CAPTURE_STATUS_NONE */
		UCPX_LEAVE(r);
	UCPX_LEAVE(ucpx_cu.cuMemcpyDtoDAsync(dst, src, n, s));
}
CUresult ucpx_memset_d8_async(CUcontext ctx, CUdeviceptr dst, unsigned char v, size_t n, CUstream s) {
	UCPX_CALL(ctx, cuMemsetD8Async, dst, v, n, s);
}
CUresult ucpx_memset_d32_async(CUcontext ctx, CUdeviceptr dst, unsigned int v, size_t n, CUstream s) {
	UCPX_CALL(ctx, cuMemsetD32Async, dst, v, n, s);
}

CUresult ucpx_pointer_get_attribute(CUcontext ctx, uint64_t *out, CUpointer_attribute a, CUdeviceptr p) {
	/* Every attribute fits in 8 bytes; smaller ones land in the low bytes
	 * (little-endian) of the zeroed slot. */
	*out = 0;
	UCPX_CALL(ctx, cuPointerGetAttribute, out, a, p);
}

CUresult ucpx_pointer_get_attributes(CUcontext ctx, ucpx_ptr_attrs *out, CUdeviceptr p) {
	memset(out, 0, sizeof *out);
	/* The attributes UCX's own memory-type detection queries together; each
	 * is defined for every kind of pointer, so the call fails for none. */
	CUpointer_attribute attrs[6] = {
		UCPX_CU_POINTER_ATTRIBUTE_CONTEXT,
		UCPX_CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
		UCPX_CU_POINTER_ATTRIBUTE_IS_MANAGED,
		UCPX_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
		UCPX_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
		UCPX_CU_POINTER_ATTRIBUTE_RANGE_SIZE,
	};
	void *data[6] = {
		&out->context, &out->memory_type, &out->is_managed, &out->device_ordinal,
		&out->range_start, &out->range_size,
	};
	UCPX_CALL(ctx, cuPointerGetAttributes, 6, attrs, data, p);
}

CUresult ucpx_pointer_get_allocation(CUcontext ctx, ucpx_alloc_attrs *out, CUdeviceptr p) {
	/* Zeroed slots: the legacy-IPC flag is a bool, the rest 8 bytes. */
	memset(out, 0, sizeof *out);
	CUpointer_attribute attrs[4] = {
		UCPX_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
		UCPX_CU_POINTER_ATTRIBUTE_RANGE_SIZE,
		UCPX_CU_POINTER_ATTRIBUTE_BUFFER_ID,
		UCPX_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
	};
	void *data[4] = { &out->range_start, &out->range_size, &out->buffer_id, &out->legacy_ipc };
	UCPX_CALL(ctx, cuPointerGetAttributes, 4, attrs, data, p);
}

/* ---- graphs ---- */

CUresult ucpx_graph_create(CUcontext ctx, CUgraph *g, unsigned int flags) { UCPX_CALL(ctx, cuGraphCreate, g, flags); }
CUresult ucpx_graph_destroy(CUcontext ctx, CUgraph g) { UCPX_CALL(ctx, cuGraphDestroy, g); }

CUresult ucpx_graph_add_batch_memop_node(CUcontext ctx, CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
	const ucpx_memop *ops, unsigned int n) {
	if (n == 0 || n > UCPX_MAX_BATCH)
		return 1;
	CUstreamBatchMemOpParams p[UCPX_MAX_BATCH];
	ucpx_fill_memops(p, ops, n);
	CUDA_BATCH_MEM_OP_NODE_PARAMS np;
	memset(&np, 0, sizeof np);
	np.ctx = ctx; /* the node's memops run in this context; the array is copied */
	np.count = n;
	np.paramArray = p;
	UCPX_CALL(ctx, cuGraphAddBatchMemOpNode, node, g, deps, ndeps, &np);
}

static void ucpx_host_trampoline(void *user) { ucpxHostFnTrampoline((uintptr_t)user); }

CUresult ucpx_graph_add_host_node(CUcontext ctx, CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps, uintptr_t handle) {
	CUDA_HOST_NODE_PARAMS np;
	np.fn = ucpx_host_trampoline;
	np.userData = (void *)handle;
	UCPX_CALL(ctx, cuGraphAddHostNode, node, g, deps, ndeps, &np);
}

CUresult ucpx_graph_add_memcpy_node(CUcontext ctx, CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
	CUdeviceptr dst, CUdeviceptr src, size_t n) {
	/* A 1-D copy between unified (UVA) addresses: the driver works out where
	 * each side lives, as cuMemcpyAsync does. */
	CUDA_MEMCPY3D p;
	memset(&p, 0, sizeof p);
	p.srcMemoryType = UCPX_CU_MEMORYTYPE_UNIFIED;
	p.srcDevice = src;
	p.dstMemoryType = UCPX_CU_MEMORYTYPE_UNIFIED;
	p.dstDevice = dst;
	p.WidthInBytes = n;
	p.Height = 1;
	p.Depth = 1;
	UCPX_CALL(ctx, cuGraphAddMemcpyNode, node, g, deps, ndeps, &p, ctx);
}

CUresult ucpx_graph_add_memset_node(CUcontext ctx, CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
	CUdeviceptr dst, unsigned int value, unsigned int elem_size, size_t width) {
	CUDA_MEMSET_NODE_PARAMS p;
	memset(&p, 0, sizeof p);
	p.dst = dst;
	p.pitch = width * elem_size; /* unused for one row, but some drivers check it */
	p.value = value;
	p.elementSize = elem_size;
	p.width = width;
	p.height = 1;
	UCPX_CALL(ctx, cuGraphAddMemsetNode, node, g, deps, ndeps, &p, ctx);
}

CUresult ucpx_graph_add_kernel_node(CUcontext ctx, CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUfunction f,
	unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
	const unsigned char *flat, const unsigned int *offs, int nargs) {
	UCPX_KERNEL_PARAMS(params, flat, offs, nargs);
	CUDA_KERNEL_NODE_PARAMS p;
	memset(&p, 0, sizeof p);
	p.func = f;
	p.gridDimX = gx;
	p.gridDimY = gy;
	p.gridDimZ = gz;
	p.blockDimX = bx;
	p.blockDimY = by;
	p.blockDimZ = bz;
	p.sharedMemBytes = shmem;
	p.kernelParams = nargs > 0 ? params : NULL; /* argument values are copied into the node */
	UCPX_CALL(ctx, cuGraphAddKernelNode, node, g, deps, ndeps, &p);
}

CUresult ucpx_graph_add_event_record_node(CUcontext ctx, CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUevent e) {
	UCPX_CALL(ctx, cuGraphAddEventRecordNode, node, g, deps, ndeps, e);
}
CUresult ucpx_graph_add_event_wait_node(CUcontext ctx, CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUevent e) {
	UCPX_CALL(ctx, cuGraphAddEventWaitNode, node, g, deps, ndeps, e);
}
CUresult ucpx_graph_add_empty_node(CUcontext ctx, CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps) {
	UCPX_CALL(ctx, cuGraphAddEmptyNode, node, g, deps, ndeps);
}
CUresult ucpx_graph_add_child_graph_node(CUcontext ctx, CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUgraph child) {
	UCPX_CALL(ctx, cuGraphAddChildGraphNode, node, g, deps, ndeps, child);
}
CUresult ucpx_graph_add_dependencies(CUcontext ctx, CUgraph g, const CUgraphNode *from, const CUgraphNode *to, size_t n) {
	UCPX_CALL(ctx, cuGraphAddDependencies, g, from, to, NULL, n);
}
CUresult ucpx_graph_get_nodes(CUcontext ctx, CUgraph g, CUgraphNode *nodes, size_t *n) { UCPX_CALL(ctx, cuGraphGetNodes, g, nodes, n); }
CUresult ucpx_graph_node_get_type(CUcontext ctx, CUgraphNode node, CUgraphNodeType *t) { UCPX_CALL(ctx, cuGraphNodeGetType, node, t); }
CUresult ucpx_graph_destroy_node(CUcontext ctx, CUgraphNode node) { UCPX_CALL(ctx, cuGraphDestroyNode, node); }
CUresult ucpx_graph_instantiate(CUcontext ctx, CUgraphExec *x, CUgraph g, unsigned long long flags) {
	UCPX_CALL(ctx, cuGraphInstantiateWithFlags, x, g, flags);
}
CUresult ucpx_graph_launch(CUcontext ctx, CUgraphExec x, CUstream s) { UCPX_CALL(ctx, cuGraphLaunch, x, s); }
CUresult ucpx_graph_exec_batch_memop_node_set_params(CUcontext ctx, CUgraphExec x, CUgraphNode node, const ucpx_memop *ops, unsigned int n) {
	if (n == 0 || n > UCPX_MAX_BATCH)
		return 1;
	CUstreamBatchMemOpParams p[UCPX_MAX_BATCH];
	ucpx_fill_memops(p, ops, n);
	CUDA_BATCH_MEM_OP_NODE_PARAMS np;
	memset(&np, 0, sizeof np);
	np.ctx = ctx;
	np.count = n;
	np.paramArray = p;
	UCPX_CALL(ctx, cuGraphExecBatchMemOpNodeSetParams, x, node, &np);
}
CUresult ucpx_graph_exec_destroy(CUcontext ctx, CUgraphExec x) { UCPX_CALL(ctx, cuGraphExecDestroy, x); }

/* ---- stream capture ---- */

CUresult ucpx_stream_begin_capture(CUcontext ctx, CUstream s, CUstreamCaptureMode mode) {
	UCPX_CALL(ctx, cuStreamBeginCapture, s, mode);
}
CUresult ucpx_stream_end_capture(CUcontext ctx, CUstream s, CUgraph *g) { UCPX_CALL(ctx, cuStreamEndCapture, s, g); }
CUresult ucpx_stream_is_capturing(CUcontext ctx, CUstream s, CUstreamCaptureStatus *st) {
	UCPX_CALL(ctx, cuStreamIsCapturing, s, st);
}

CUresult ucpx_stream_get_capture_info(CUcontext ctx, CUstream s, CUstreamCaptureStatus *st, uint64_t *id, CUgraph *g,
	CUgraphNode *deps, size_t cap, size_t *ndeps) {
	UCPX_NEED(cuStreamGetCaptureInfo);
	UCPX_ENTER(ctx);
	const CUgraphNode *d = NULL;
	const CUgraphEdgeData *edges = NULL;
	size_t n = 0;
	cuuint64_t cid = 0;
	*st = 0;
	*g = NULL;
	/* edgeData is requested so that non-default edges do not make the query
	 * fail with CUDA_ERROR_LOSSY_QUERY; ucpx only creates default edges. */
	CUresult r = ucpx_cu.cuStreamGetCaptureInfo(s, st, &cid, g, &d, &edges, &n);
	if (r == 0) {
		*id = cid;
		*ndeps = n;
		/* The driver's array is valid only until the next call on the stream. */
		for (size_t i = 0; i < n && i < cap; i++)
			deps[i] = d[i];
	}
	UCPX_LEAVE(r);
}

CUresult ucpx_stream_update_capture_dependencies(CUcontext ctx, CUstream s, CUgraphNode *deps, size_t n, unsigned int flags) {
	UCPX_CALL(ctx, cuStreamUpdateCaptureDependencies, s, deps, NULL, n, flags);
}

/* ---- modules and kernels ---- */

CUresult ucpx_module_load_data(CUcontext ctx, CUmodule *m, const void *image, char *errlog, size_t errlen, char *infolog, size_t infolen) {
	CUjit_option opts[4] = {
		UCPX_CU_JIT_ERROR_LOG_BUFFER,
		UCPX_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
		UCPX_CU_JIT_INFO_LOG_BUFFER,
		UCPX_CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
	};
	/* Size options travel by value in the pointer slot, as the driver API
	 * specifies for integer-typed JIT options. */
	void *vals[4] = {errlog, (void *)(uintptr_t)errlen, infolog, (void *)(uintptr_t)infolen};
	if (errlen > 0)
		errlog[0] = 0;
	if (infolen > 0)
		infolog[0] = 0;
	UCPX_CALL(ctx, cuModuleLoadDataEx, m, image, 4, opts, vals);
}
CUresult ucpx_module_unload(CUcontext ctx, CUmodule m) { UCPX_CALL(ctx, cuModuleUnload, m); }
CUresult ucpx_module_get_function(CUcontext ctx, CUfunction *f, CUmodule m, const char *name) {
	UCPX_CALL(ctx, cuModuleGetFunction, f, m, name);
}
CUresult ucpx_launch_kernel(CUcontext ctx, CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
	unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem, CUstream s,
	const unsigned char *flat, const unsigned int *offs, int nargs) {
	UCPX_KERNEL_PARAMS(params, flat, offs, nargs);
	UCPX_CALL(ctx, cuLaunchKernel, f, gx, gy, gz, bx, by, bz, shmem, s, nargs > 0 ? params : NULL, NULL);
}

/* The reference for LaunchKernel's cost: n launches of f with params packed once, in
 * one C loop (benchmarks only). */
CUresult ucpx_launch_kernel_repeat(CUcontext ctx, CUfunction f, unsigned int gx, unsigned int bx, CUstream s,
	const unsigned char *flat, const unsigned int *offs, int nargs, int n) {
	UCPX_NEED(cuLaunchKernel);
	UCPX_KERNEL_PARAMS(params, flat, offs, nargs);
	UCPX_ENTER(ctx);
	CUresult r = 0;
	for (int i = 0; i < n && r == 0; i++)
		r = ucpx_cu.cuLaunchKernel(f, gx, 1, 1, bx, 1, 1, 0, s, params, NULL);
	UCPX_LEAVE(r);
}

/* A kernel of signature (dst, src *u8, n u64) launched on s, grid x block threads;
 * with st set, only if s is not capturing (*st says how it is, and nothing is
 * enqueued): a copy by kernel (Stream.LaunchCopy), one driver call like the
 * copy-engine copy it stands in for. */
CUresult ucpx_launch_copy(CUcontext ctx, CUfunction f, unsigned int grid, unsigned int block, CUdeviceptr dst,
	CUdeviceptr src, size_t n, CUstream s, CUstreamCaptureStatus *st) {
	UCPX_NEED(cuLaunchKernel);
	if (st != NULL)
		UCPX_NEED(cuStreamIsCapturing);
	UCPX_ENTER(ctx);
	if (st != NULL) {
		CUresult r = ucpx_cu.cuStreamIsCapturing(s, st);
		if (r != 0 || *st != 0) /* CU_STREAM_CAPTURE_STATUS_NONE */
			UCPX_LEAVE(r);
	}
	uint64_t n64 = n;
	void *params[3] = {&dst, &src, &n64};
	UCPX_LEAVE(ucpx_cu.cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, s, params, NULL));
}

/* ---- host functions ---- */

CUresult ucpx_launch_host_func(CUcontext ctx, CUstream s, uintptr_t handle, int *capturing) {
	UCPX_NEED(cuLaunchHostFunc);
	UCPX_ENTER(ctx);
	CUstreamCaptureStatus st = 0;
	*capturing = 0;
	if (ucpx_cu.cuStreamIsCapturing != NULL) {
		CUresult r = ucpx_cu.cuStreamIsCapturing(s, &st);
		if (r != 0)
			UCPX_LEAVE(r);
		*capturing = st != 0;
	}
	UCPX_LEAVE(ucpx_cu.cuLaunchHostFunc(s, ucpx_host_trampoline, (void *)handle));
}

/* The reference for LaunchHostFunc's cost: the same launch of a C function that
 * does nothing, with no Go callback behind it (benchmarks only). */
static void ucpx_host_noop(void *user) { (void)user; }
CUresult ucpx_launch_host_noop(CUcontext ctx, CUstream s) { UCPX_CALL(ctx, cuLaunchHostFunc, s, ucpx_host_noop, NULL); }

/* ---- IPC ---- */

CUresult ucpx_ipc_get_mem_handle(CUcontext ctx, void *handle64, CUdeviceptr p) {
	UCPX_CALL(ctx, cuIpcGetMemHandle, (CUipcMemHandle *)handle64, p);
}
CUresult ucpx_ipc_open_mem_handle(CUcontext ctx, CUdeviceptr *p, const void *handle64, unsigned int flags) {
	CUipcMemHandle h;
	memcpy(&h, handle64, sizeof h);
	UCPX_CALL(ctx, cuIpcOpenMemHandle, p, h, flags);
}
CUresult ucpx_ipc_close_mem_handle(CUcontext ctx, CUdeviceptr p) { UCPX_CALL(ctx, cuIpcCloseMemHandle, p); }
CUresult ucpx_ipc_get_event_handle(CUcontext ctx, void *handle64, CUevent e) {
	UCPX_CALL(ctx, cuIpcGetEventHandle, (CUipcEventHandle *)handle64, e);
}
CUresult ucpx_ipc_open_event_handle(CUcontext ctx, CUevent *e, const void *handle64) {
	CUipcEventHandle h;
	memcpy(&h, handle64, sizeof h);
	UCPX_CALL(ctx, cuIpcOpenEventHandle, e, h);
}

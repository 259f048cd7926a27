/*
 * The raw layer: a function table filled by dlsym and one small C helper per
 * entry point. Every helper that runs in a context takes the CUcontext first and
 * makes it current inside the same C call (see ucpx_enter in shim.c), so the Go
 * side never depends on which OS thread a goroutine is on.
 */
#ifndef UCPX_SHIM_H
#define UCPX_SHIM_H

#include <stddef.h>
#include <stdint.h>

#include "cu_types.h"
#include "cu_syms.h"

typedef struct ucpx_cu_table {
#define UCPX_FIELD(api, sym, params) CUresult (*api) params;
	UCPX_CU_SYMBOLS(UCPX_FIELD)
#undef UCPX_FIELD
} ucpx_cu_table;

extern ucpx_cu_table ucpx_cu;

/* Returned by a helper whose entry point the loaded driver lacks (or before
 * Load). Outside the CUresult range the driver uses. */
#define UCPX_ERR_NOSYM ((CUresult)0x7fff0001u)

/* Loading. */
int ucpx_cu_load(const char *lib, char *err, size_t errlen);
int ucpx_cu_symbol_count(void);
const char *ucpx_cu_symbol_api(int i);
const char *ucpx_cu_symbol_name(int i);
int ucpx_cu_symbol_required(int i);
int ucpx_cu_symbol_loaded(int i);

/* Handle conversions done in C so Go never turns an integer into a pointer. */
static inline CUcontext ucpx_ctx_from(uintptr_t h) { return (CUcontext)h; }
static inline CUstream ucpx_stream_from(uintptr_t h) { return (CUstream)h; }
static inline CUevent ucpx_event_from(uintptr_t h) { return (CUevent)h; }
static inline CUgraph ucpx_graph_from(uintptr_t h) { return (CUgraph)h; }
static inline CUgraphNode ucpx_node_from(uintptr_t h) { return (CUgraphNode)h; }

/* Errors and version. */
CUresult ucpx_init(unsigned int flags);
CUresult ucpx_driver_version(int *v);
const char *ucpx_error_name(CUresult r);
const char *ucpx_error_string(CUresult r);

/* Devices. */
CUresult ucpx_device_count(int *n);
CUresult ucpx_device_get(CUdevice *d, int ordinal);
CUresult ucpx_device_name(char *buf, int len, CUdevice d);
CUresult ucpx_device_attribute(int *v, CUdevice_attribute a, CUdevice d);
CUresult ucpx_device_total_mem(size_t *bytes, CUdevice d);
CUresult ucpx_device_pci_bus_id(char *buf, int len, CUdevice d);
CUresult ucpx_device_uuid(unsigned char out[16], CUdevice d);
CUresult ucpx_device_can_access_peer(int *can, CUdevice d, CUdevice peer);

/* Contexts. */
CUresult ucpx_primary_ctx_retain(CUcontext *ctx, CUdevice d);
CUresult ucpx_primary_ctx_release(CUdevice d);
CUresult ucpx_ctx_get_current(CUcontext *ctx);
CUresult ucpx_ctx_set_current(CUcontext ctx);
CUresult ucpx_ctx_get_device(CUcontext ctx, CUdevice *d);
CUresult ucpx_ctx_synchronize(CUcontext ctx);
CUresult ucpx_ctx_enable_peer_access(CUcontext ctx, CUcontext peer);
CUresult ucpx_ctx_disable_peer_access(CUcontext ctx, CUcontext peer);
CUresult ucpx_ctx_stream_priority_range(CUcontext ctx, int *least, int *greatest);
CUresult ucpx_mem_get_info(CUcontext ctx, size_t *free_, size_t *total);

/* Streams. */
CUresult ucpx_stream_create(CUcontext ctx, CUstream *s, unsigned int flags, int priority);
CUresult ucpx_stream_destroy(CUcontext ctx, CUstream s);
CUresult ucpx_stream_synchronize(CUcontext ctx, CUstream s);
CUresult ucpx_stream_query(CUcontext ctx, CUstream s);
CUresult ucpx_stream_wait_event(CUcontext ctx, CUstream s, CUevent e, unsigned int flags);
CUresult ucpx_stream_get_ctx(CUstream s, CUcontext *ctx);

/* Stream memory operations. The batch forms take ucpx_memop records and build
 * the CUstreamBatchMemOpParams union array here, in C. */
typedef struct ucpx_memop {
	uint32_t kind;
	uint32_t flags;
	uint64_t addr;
	uint64_t value;
} ucpx_memop;
#define UCPX_MAX_BATCH 255

CUresult ucpx_stream_write_value32(CUcontext ctx, CUstream s, CUdeviceptr addr, uint32_t v, unsigned int flags);
CUresult ucpx_stream_wait_value32(CUcontext ctx, CUstream s, CUdeviceptr addr, uint32_t v, unsigned int flags);
CUresult ucpx_stream_write_value64(CUcontext ctx, CUstream s, CUdeviceptr addr, uint64_t v, unsigned int flags);
CUresult ucpx_stream_wait_value64(CUcontext ctx, CUstream s, CUdeviceptr addr, uint64_t v, unsigned int flags);
CUresult ucpx_stream_batch_memop(CUcontext ctx, CUstream s, const ucpx_memop *ops, unsigned int n);

/* Events. */
CUresult ucpx_event_create(CUcontext ctx, CUevent *e, unsigned int flags);
CUresult ucpx_event_record(CUcontext ctx, CUevent e, CUstream s);
CUresult ucpx_event_query(CUcontext ctx, CUevent e);
CUresult ucpx_event_synchronize(CUcontext ctx, CUevent e);
CUresult ucpx_event_elapsed(CUcontext ctx, float *ms, CUevent start, CUevent end);
CUresult ucpx_event_destroy(CUcontext ctx, CUevent e);

/* Memory. Host addresses travel as uintptr_t. */
CUresult ucpx_mem_alloc(CUcontext ctx, CUdeviceptr *p, size_t n);
CUresult ucpx_mem_alloc_managed(CUcontext ctx, CUdeviceptr *p, size_t n, unsigned int flags);
CUresult ucpx_mem_free(CUcontext ctx, CUdeviceptr p);
CUresult ucpx_mem_host_alloc(CUcontext ctx, void **p, size_t n, unsigned int flags);
CUresult ucpx_mem_free_host(CUcontext ctx, void *p);
CUresult ucpx_mem_host_get_device_pointer(CUcontext ctx, CUdeviceptr *d, uintptr_t host);
CUresult ucpx_mem_host_register(CUcontext ctx, uintptr_t p, size_t n, unsigned int flags);
CUresult ucpx_mem_host_unregister(CUcontext ctx, uintptr_t p);
CUresult ucpx_memcpy_async(CUcontext ctx, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
CUresult ucpx_memcpy_peer_async(CUcontext ctx, CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n, CUstream s);
CUresult ucpx_memcpy_htod_async(CUcontext ctx, CUdeviceptr dst, uintptr_t src, size_t n, CUstream s);
CUresult ucpx_memcpy_dtoh_async(CUcontext ctx, uintptr_t dst, CUdeviceptr src, size_t n, CUstream s);
CUresult ucpx_memcpy_dtod_async(CUcontext ctx, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);
CUresult ucpx_memcpy_dtod_async_uncaptured(CUcontext ctx, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s,
	CUstreamCaptureStatus *st);
CUresult ucpx_memset_d8_async(CUcontext ctx, CUdeviceptr dst, unsigned char v, size_t n, CUstream s);
CUresult ucpx_memset_d32_async(CUcontext ctx, CUdeviceptr dst, unsigned int v, size_t n, CUstream s);
CUresult ucpx_pointer_get_attribute(CUcontext ctx, uint64_t *out, CUpointer_attribute a, CUdeviceptr p);

typedef struct ucpx_ptr_attrs {
	uint64_t context;
	uint64_t memory_type;
	uint64_t is_managed;
	uint64_t device_ordinal;
	uint64_t range_start;
	uint64_t range_size;
} ucpx_ptr_attrs;
CUresult ucpx_pointer_get_attributes(CUcontext ctx, ucpx_ptr_attrs *out, CUdeviceptr p);

/* The allocation containing a device address, for CUDA IPC (one call). */
typedef struct ucpx_alloc_attrs {
	uint64_t range_start;
	uint64_t range_size;
	uint64_t buffer_id;
	uint64_t legacy_ipc;
} ucpx_alloc_attrs;
CUresult ucpx_pointer_get_allocation(CUcontext ctx, ucpx_alloc_attrs *out, CUdeviceptr p);

/* Graphs. deps is an array of ndeps node handles (may be NULL when 0). */
CUresult ucpx_graph_create(CUcontext ctx, CUgraph *g, unsigned int flags);
CUresult ucpx_graph_destroy(CUcontext ctx, CUgraph g);
CUresult ucpx_graph_add_batch_memop_node(CUcontext ctx, CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps, const ucpx_memop *ops, unsigned int n);
CUresult ucpx_graph_add_host_node(CUcontext ctx, CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps, uintptr_t handle);
CUresult ucpx_graph_add_memcpy_node(CUcontext ctx, CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUdeviceptr dst, CUdeviceptr src, size_t n);
CUresult ucpx_graph_add_memset_node(CUcontext ctx, CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUdeviceptr dst, unsigned int value, unsigned int elem_size, size_t width);
CUresult ucpx_graph_add_kernel_node(CUcontext ctx, CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUfunction f,
	unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
	const unsigned char *flat, const unsigned int *offs, int nargs);
CUresult ucpx_graph_add_event_record_node(CUcontext ctx, CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUevent e);
CUresult ucpx_graph_add_event_wait_node(CUcontext ctx, CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUevent e);
CUresult ucpx_graph_add_empty_node(CUcontext ctx, CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps);
CUresult ucpx_graph_add_child_graph_node(CUcontext ctx, CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUgraph child);
CUresult ucpx_graph_add_dependencies(CUcontext ctx, CUgraph g, const CUgraphNode *from, const CUgraphNode *to, size_t n);
CUresult ucpx_graph_get_nodes(CUcontext ctx, CUgraph g, CUgraphNode *nodes, size_t *n);
CUresult ucpx_graph_node_get_type(CUcontext ctx, CUgraphNode node, CUgraphNodeType *t);
CUresult ucpx_graph_destroy_node(CUcontext ctx, CUgraphNode node);
CUresult ucpx_graph_instantiate(CUcontext ctx, CUgraphExec *x, CUgraph g, unsigned long long flags);
CUresult ucpx_graph_launch(CUcontext ctx, CUgraphExec x, CUstream s);
CUresult ucpx_graph_exec_batch_memop_node_set_params(CUcontext ctx, CUgraphExec x, CUgraphNode node, const ucpx_memop *ops, unsigned int n);
CUresult ucpx_graph_exec_destroy(CUcontext ctx, CUgraphExec x);

/* Stream capture. */
CUresult ucpx_stream_begin_capture(CUcontext ctx, CUstream s, CUstreamCaptureMode mode);
CUresult ucpx_stream_end_capture(CUcontext ctx, CUstream s, CUgraph *g);
CUresult ucpx_stream_is_capturing(CUcontext ctx, CUstream s, CUstreamCaptureStatus *st);
/* Copies up to cap dependency handles into deps; *ndeps is the full count. */
CUresult ucpx_stream_get_capture_info(CUcontext ctx, CUstream s, CUstreamCaptureStatus *st, uint64_t *id, CUgraph *g, CUgraphNode *deps, size_t cap, size_t *ndeps);
CUresult ucpx_stream_update_capture_dependencies(CUcontext ctx, CUstream s, CUgraphNode *deps, size_t n, unsigned int flags);

/* Modules and kernels. */
CUresult ucpx_module_load_data(CUcontext ctx, CUmodule *m, const void *image, char *errlog, size_t errlen, char *infolog, size_t infolen);
CUresult ucpx_module_unload(CUcontext ctx, CUmodule m);
CUresult ucpx_module_get_function(CUcontext ctx, CUfunction *f, CUmodule m, const char *name);
#define UCPX_MAX_KERNEL_ARGS 64
CUresult ucpx_launch_copy(CUcontext ctx, CUfunction f, unsigned int grid, unsigned int block, CUdeviceptr dst,
	CUdeviceptr src, size_t n, CUstream s, CUstreamCaptureStatus *st);
CUresult ucpx_launch_kernel_repeat(CUcontext ctx, CUfunction f, unsigned int gx, unsigned int bx, CUstream s,
	const unsigned char *flat, const unsigned int *offs, int nargs, int n);
CUresult ucpx_launch_kernel(CUcontext ctx, CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
	unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem, CUstream s,
	const unsigned char *flat, const unsigned int *offs, int nargs);

/* Host functions: handle is a cgo.Handle the trampoline resolves. *capturing
 * reports whether the stream was capturing (the callback then belongs to a graph
 * and may run many times). */
CUresult ucpx_launch_host_func(CUcontext ctx, CUstream s, uintptr_t handle, int *capturing);
CUresult ucpx_launch_host_noop(CUcontext ctx, CUstream s);

/* IPC: handles travel as 64-byte arrays. */
CUresult ucpx_ipc_get_mem_handle(CUcontext ctx, void *handle64, CUdeviceptr p);
CUresult ucpx_ipc_open_mem_handle(CUcontext ctx, CUdeviceptr *p, const void *handle64, unsigned int flags);
CUresult ucpx_ipc_close_mem_handle(CUcontext ctx, CUdeviceptr p);
CUresult ucpx_ipc_get_event_handle(CUcontext ctx, void *handle64, CUevent e);
CUresult ucpx_ipc_open_event_handle(CUcontext ctx, CUevent *e, const void *handle64);

#endif

/*
 * A fake libcuda.so.1 for TestFakeDriver: it emulates, on the CPU, the part of
 * the CUDA driver API ucpx uses, so that the wrappers and the GPU tests'
 * plumbing run on machines without a GPU. "Device" memory is host memory,
 * streams are worker threads executing queued operations in order, graphs are
 * node lists run in creation order, and the test kernels are C functions that
 * read their kernelParams exactly as the GPU would. It checks what ucpx passes
 * (union layouts, JIT options, kernel parameters, callbacks from a foreign
 * thread); it says nothing about a real GPU's timing or memory model.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cu_types.h"

#define OK 0
#define E_INVALID_VALUE 1
#define E_NOT_INITIALIZED 3
#define E_INVALID_DEVICE 101
#define E_INVALID_IMAGE 200
#define E_INVALID_CONTEXT 201
#define E_INVALID_PTX 218
#define E_INVALID_HANDLE 400
#define E_ILLEGAL_STATE 401
#define E_NOT_FOUND 500
#define E_NOT_READY 600
#define E_PEER_UNSUPPORTED 217
#define E_HOST_REGISTERED 712
#define E_HOST_UNREGISTERED 713
#define E_NOT_SUPPORTED 801

static int initialized;
static struct CUctx_st { int refs; } the_ctx;
static __thread CUcontext current;
static pthread_mutex_t big = PTHREAD_MUTEX_INITIALIZER;

static uint64_t now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static void relax(void) { sched_yield(); }
static uint64_t load64(uint64_t a) { return __atomic_load_n((uint64_t *)a, __ATOMIC_ACQUIRE); }
static uint32_t load32(uint64_t a) { return __atomic_load_n((uint32_t *)a, __ATOMIC_ACQUIRE); }

/* ---- allocations, for pointer attributes ---- */
enum { MEM_HOST = 1, MEM_DEVICE = 2 };
typedef struct alloc { uintptr_t base; size_t size; int type, managed, registered; unsigned long long id; struct alloc *next; } alloc;
static alloc *allocs;
static unsigned long long next_buffer_id;
static void track(uintptr_t base, size_t size, int type, int managed, int registered) {
	alloc *a = calloc(1, sizeof *a);
	a->base = base, a->size = size, a->type = type, a->managed = managed, a->registered = registered;
	pthread_mutex_lock(&big);
	a->id = ++next_buffer_id; /* CU_POINTER_ATTRIBUTE_BUFFER_ID: never reused */
	a->next = allocs, allocs = a;
	pthread_mutex_unlock(&big);
}
static alloc *find(uintptr_t p) {
	alloc *r = NULL;
	pthread_mutex_lock(&big);
	for (alloc *a = allocs; a; a = a->next)
		if (p >= a->base && p < a->base + a->size) {
			r = a;
			break;
		}
	pthread_mutex_unlock(&big);
	return r;
}
static int untrack(uintptr_t base) {
	pthread_mutex_lock(&big);
	for (alloc **pp = &allocs; *pp; pp = &(*pp)->next)
		if ((*pp)->base == base) {
			alloc *a = *pp;
			*pp = a->next;
			free(a);
			pthread_mutex_unlock(&big);
			return 1;
		}
	pthread_mutex_unlock(&big);
	return 0;
}

/* ---- events ---- */
struct CUevent_st { unsigned flags; uint64_t recorded, completed; uint64_t stamp; };

/* ---- operations ---- */
enum { OP_WRITE, OP_WAIT, OP_HOST, OP_COPY, OP_SET8, OP_SET32, OP_RECORD, OP_WAITEV, OP_KERNEL, OP_BARRIER };
enum { K_ECHO = 1, K_HANDLE, K_CHECKSUM, K_FILL, K_COPY };
typedef struct op {
	int kind, width;
	unsigned flags;
	uint64_t addr, value;
	CUhostFn fn;
	void *ud;
	uintptr_t dst, src;
	size_t n;
	CUevent ev;
	uint64_t gen;
	int kernel;
	unsigned char params[64];
	struct op *next;
} op;

static int holds(unsigned cmp, uint64_t cur, uint64_t v, int width) {
	switch (cmp & 3) {
	case 0: return width == 32 ? (int32_t)((uint32_t)cur - (uint32_t)v) >= 0 : (int64_t)(cur - v) >= 0;
	case 1: return cur == v;
	case 2: return (cur & v) != 0;
	default: return width == 32 ? (uint32_t)~(cur | v) != 0 : ~(cur | v) != 0;
	}
}

static void run_kernel(op *o) {
	unsigned char *p = o->params;
	uint64_t a[8];
	memcpy(a, p, sizeof a);
	switch (o->kernel) {
	case K_ECHO: { /* trigger, done, base, n, result */
		uint64_t t0 = now_ns(), k;
		for (k = 1; k <= a[3]; k++) {
			__atomic_store_n((uint64_t *)a[0], a[2] + k, __ATOMIC_RELEASE);
			while ((int64_t)(load64(a[1]) - (a[2] + k)) < 0)
				relax();
		}
		((uint64_t *)a[4])[0] = k - 1;
		((uint64_t *)a[4])[1] = now_ns() - t0;
		break;
	}
	case K_HANDLE: { /* {trigger, value, completion, completion_value}, result */
		uint64_t *res = (uint64_t *)a[4];
		res[0] = (int64_t)(load64(a[2]) - a[3]) >= 0;
		__atomic_store_n((uint64_t *)a[0], a[1], __ATOMIC_RELEASE);
		while ((int64_t)(load64(a[2]) - a[3]) < 0)
			relax();
		res[1] = load64(a[2]);
		break;
	}
	case K_CHECKSUM: { /* buf, n, out */
		unsigned long long s = 0;
		for (uint64_t i = 0; i < a[1]; i++)
			s += ((unsigned char *)a[0])[i];
		__atomic_fetch_add((unsigned long long *)a[2], s, __ATOMIC_RELAXED);
		break;
	}
	case K_FILL: { /* buf, n, seed (u32) */
		uint32_t seed;
		memcpy(&seed, p + 16, 4);
		for (uint64_t i = 0; i < a[1]; i++)
			((unsigned char *)a[0])[i] = (unsigned char)((i * 2654435761ull + seed) >> 7);
		break;
	}
	case K_COPY: /* dst, src, n: ucpx_copy, which needs dst - src a multiple of 16 */
		if ((a[0] - a[1]) % 16 == 0)
			memmove((void *)a[0], (void *)a[1], a[2]);
		break;
	}
}

/* FAKECUDA_STICKY=code (read at every call): the context met a sticky error, as after
 * an illegal address: streams run nothing more, and their queries and synchronizations
 * return code. */
static int sticky(void) {
	const char *v = getenv("FAKECUDA_STICKY");
	return v && *v ? atoi(v) : 0;
}

static void run_op(op *o) {
	if (sticky())
		return; /* a dead context runs nothing */
	if (getenv("FAKECUDA_TRACE"))
		fprintf(stderr, "fakecuda: op %d width %d addr %#llx value %#llx flags %#x\n", o->kind, o->width,
			(unsigned long long)o->addr, (unsigned long long)o->value, o->flags);
	switch (o->kind) {
	case OP_WRITE:
		if (o->width == 32)
			__atomic_store_n((uint32_t *)o->addr, (uint32_t)o->value, __ATOMIC_RELEASE);
		else
			__atomic_store_n((uint64_t *)o->addr, o->value, __ATOMIC_RELEASE);
		break;
	case OP_WAIT:
		while (!holds(o->flags, o->width == 32 ? load32(o->addr) : load64(o->addr), o->value, o->width))
			relax();
		break;
	case OP_HOST: o->fn(o->ud); break;
	case OP_COPY: memmove((void *)o->dst, (void *)o->src, o->n); break;
	case OP_SET8: memset((void *)o->dst, (int)o->value, o->n); break;
	case OP_SET32:
		for (size_t i = 0; i < o->n; i++)
			((uint32_t *)o->dst)[i] = (uint32_t)o->value;
		break;
	case OP_RECORD:
		o->ev->stamp = now_ns();
		__atomic_store_n(&o->ev->completed, o->gen, __ATOMIC_RELEASE);
		break;
	case OP_WAITEV:
		while (__atomic_load_n(&o->ev->completed, __ATOMIC_ACQUIRE) < o->gen)
			relax();
		break;
	case OP_KERNEL: run_kernel(o); break;
	case OP_BARRIER: __atomic_thread_fence(__ATOMIC_SEQ_CST); break;
	}
}

/* ---- graphs ---- */
typedef struct node_st { CUgraphNodeType type; int nops; op *ops; } node_st;
struct CUgraphNode_st {
	node_st n;
	CUgraph g; /* NULL once destroyed */
	int ndeps, capdeps;
	struct CUgraphNode_st **deps; /* the nodes it depends on (edges into it) */
};
struct CUgraph_st { int count, cap; struct CUgraphNode_st **nodes; };
struct CUgraphExec_st { int count; struct CUgraphNode_st **orig; node_st *nodes; };

static struct CUgraphNode_st *add_node(CUgraph g, CUgraphNodeType type, const op *ops, int nops) {
	struct CUgraphNode_st *nd = calloc(1, sizeof *nd);
	nd->n.type = type;
	nd->n.nops = nops;
	nd->n.ops = calloc(nops ? nops : 1, sizeof(op));
	memcpy(nd->n.ops, ops, sizeof(op) * nops);
	if (g->count == g->cap) {
		g->cap = g->cap ? 2 * g->cap : 8;
		g->nodes = realloc(g->nodes, sizeof *g->nodes * g->cap);
	}
	g->nodes[g->count++] = nd;
	nd->g = g;
	return nd;
}
static void add_edge(struct CUgraphNode_st *to, struct CUgraphNode_st *from) {
	if (to->ndeps == to->capdeps) {
		to->capdeps = to->capdeps ? 2 * to->capdeps : 4;
		to->deps = realloc(to->deps, sizeof *to->deps * to->capdeps);
	}
	to->deps[to->ndeps++] = from;
}

/* ---- streams ---- */
struct CUstream_st {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	op *head, *tail;
	uint64_t enq, done;
	int dying;
	CUgraph capture;
	uint64_t capture_id;
	CUgraphNode last;
};
#define MAX_STREAMS 4096
static CUstream streams[MAX_STREAMS];
static int nstreams;

static void *worker(void *arg) {
	CUstream s = arg;
	for (;;) {
		pthread_mutex_lock(&s->mu);
		while (!s->head && !s->dying)
			pthread_cond_wait(&s->cv, &s->mu);
		op *o = s->head;
		if (!o) {
			pthread_mutex_unlock(&s->mu);
			return NULL;
		}
		pthread_mutex_unlock(&s->mu);
		run_op(o);
		pthread_mutex_lock(&s->mu);
		s->head = o->next;
		if (!s->head)
			s->tail = NULL;
		__atomic_store_n(&s->done, s->done + 1, __ATOMIC_RELEASE);
		pthread_mutex_unlock(&s->mu);
		free(o);
	}
}

static void push(CUstream s, const op *src) {
	op *o = malloc(sizeof *o);
	*o = *src;
	o->next = NULL;
	pthread_mutex_lock(&s->mu);
	if (s->tail)
		s->tail->next = o;
	else
		s->head = o;
	s->tail = o;
	s->enq++;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

/* Enqueue ops on s, or record them as a node of the graph s captures. */
static CUresult submit(CUstream s, CUgraphNodeType type, const op *ops, int n) {
	if (!s)
		return E_INVALID_HANDLE;
	if (s->capture) {
		s->last = add_node(s->capture, type, ops, n);
		return OK;
	}
	for (int i = 0; i < n; i++) {
		op o = ops[i];
		if (o.kind == OP_RECORD)
			o.gen = ++o.ev->recorded; /* the event's new target, fixed at enqueue */
		if (o.kind == OP_WAITEV)
			o.gen = o.ev->recorded;
		push(s, &o);
	}
	return OK;
}

static void drain(CUstream s) {
	while (__atomic_load_n(&s->done, __ATOMIC_ACQUIRE) != s->enq)
		usleep(20);
}

/* ---- the API ---- */
#define NEED_INIT if (!initialized) return E_NOT_INITIALIZED

CUresult cuInit(unsigned int f) { initialized = f == 0; return f == 0 ? OK : E_INVALID_VALUE; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }
static const char *names[][2] = {
	{"0", "CUDA_SUCCESS"}, {"1", "CUDA_ERROR_INVALID_VALUE"}, {"101", "CUDA_ERROR_INVALID_DEVICE"},
	{"200", "CUDA_ERROR_INVALID_IMAGE"}, {"201", "CUDA_ERROR_INVALID_CONTEXT"}, {"218", "CUDA_ERROR_INVALID_PTX"},
	{"400", "CUDA_ERROR_INVALID_HANDLE"}, {"401", "CUDA_ERROR_ILLEGAL_STATE"}, {"500", "CUDA_ERROR_NOT_FOUND"},
	{"600", "CUDA_ERROR_NOT_READY"}, {"712", "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"},
	{"801", "CUDA_ERROR_NOT_SUPPORTED"},
};
CUresult cuGetErrorName(CUresult e, const char **s) {
	char buf[16];
	snprintf(buf, sizeof buf, "%u", e);
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if (!strcmp(names[i][0], buf)) {
			*s = names[i][1];
			return OK;
		}
	return E_INVALID_VALUE;
}
CUresult cuGetErrorString(CUresult e, const char **s) {
	const char *n;
	if (cuGetErrorName(e, &n))
		return E_INVALID_VALUE;
	*s = "fake driver error";
	return OK;
}
CUresult cuCtxGetCurrent(CUcontext *c) { *c = current; return OK; }
CUresult cuCtxSetCurrent(CUcontext c) { current = c; return OK; }
CUresult cuDeviceGetCount(int *n) { NEED_INIT; *n = 1; return OK; }
CUresult cuDeviceGet(CUdevice *d, int i) { NEED_INIT; if (i != 0) return E_INVALID_DEVICE; *d = 0; return OK; }
CUresult cuDeviceGetName(char *b, int n, CUdevice d) { snprintf(b, n, "ucpx fake GPU"); return d ? E_INVALID_DEVICE : OK; }
CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
	if (d)
		return E_INVALID_DEVICE;
	switch (a) {
	case 1: *v = 1024; return OK;
	case 10: *v = 32; return OK;
	case 16: *v = 4; return OK;
	case 19: case 41: case 83: case 89: case 122: case 123: *v = 1; return OK;
	case 75: *v = 9; return OK;
	case 76: case 86: case 88: case 98: *v = 0; return OK;
	}
	return a < 200 ? (*v = 0, OK) : E_INVALID_VALUE;
}
CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice d) { *b = 1ull << 34; return d ? E_INVALID_DEVICE : OK; }
CUresult cuDeviceGetPCIBusId(char *b, int n, CUdevice d) { snprintf(b, n, "0000:FA:KE.0"); return d ? E_INVALID_DEVICE : OK; }
CUresult cuDeviceCanAccessPeer(int *c, CUdevice d, CUdevice p) { *c = 0; return OK; }
CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { memcpy(u->bytes, "ucpx-fake-gpu-00", 16); return d ? E_INVALID_DEVICE : OK; }
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { NEED_INIT; the_ctx.refs++; *c = &the_ctx; return d ? E_INVALID_DEVICE : OK; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { the_ctx.refs--; return OK; }
CUresult cuCtxGetDevice(CUdevice *d) { if (!current) return E_INVALID_CONTEXT; *d = 0; return OK; }
CUresult cuCtxSynchronize(void) {
	if (!current)
		return E_INVALID_CONTEXT;
	for (int i = 0; i < nstreams; i++)
		drain(streams[i]);
	return sticky() ? sticky() : OK;
}
CUresult cuCtxEnablePeerAccess(CUcontext p, unsigned f) { return E_PEER_UNSUPPORTED; }
CUresult cuCtxDisablePeerAccess(CUcontext p) { return E_PEER_UNSUPPORTED; }
CUresult cuCtxGetStreamPriorityRange(int *l, int *g) { *l = 0, *g = -5; return current ? OK : E_INVALID_CONTEXT; }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { *f = 1ull << 33, *t = 1ull << 34; return current ? OK : E_INVALID_CONTEXT; }

CUresult cuStreamCreateWithPriority(CUstream *ps, unsigned flags, int prio) {
	if (!current)
		return E_INVALID_CONTEXT;
	if (flags > 1)
		return E_INVALID_VALUE;
	CUstream s = calloc(1, sizeof *s);
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	pthread_t th;
	pthread_create(&th, NULL, worker, s);
	pthread_detach(th);
	pthread_mutex_lock(&big);
	if (nstreams < MAX_STREAMS)
		streams[nstreams++] = s;
	pthread_mutex_unlock(&big);
	*ps = s;
	return OK;
}
CUresult cuStreamDestroy_v2(CUstream s) {
	pthread_mutex_lock(&s->mu);
	s->dying = 1;
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return OK;
}
CUresult cuStreamSynchronize(CUstream s) { drain(s); return sticky() ? sticky() : OK; }
CUresult cuStreamQuery(CUstream s) {
	if (sticky())
		return sticky();
	return __atomic_load_n(&s->done, __ATOMIC_ACQUIRE) == s->enq ? OK : E_NOT_READY;
}
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned f) {
	op o = {.kind = OP_WAITEV, .ev = e};
	return submit(s, 6, &o, 1);
}
CUresult cuStreamGetCtx(CUstream s, CUcontext *c) { *c = &the_ctx; return s ? OK : E_INVALID_HANDLE; }

static CUresult memop(CUstream s, int kind, int width, CUdeviceptr a, uint64_t v, unsigned f) {
	if (a % (width / 8))
		return E_INVALID_VALUE;
	op o = {.kind = kind, .width = width, .addr = a, .value = v, .flags = f};
	return submit(s, 12, &o, 1);
}
CUresult cuStreamWriteValue32_v2(CUstream s, CUdeviceptr a, cuuint32_t v, unsigned f) { return memop(s, OP_WRITE, 32, a, v, f); }
CUresult cuStreamWaitValue32_v2(CUstream s, CUdeviceptr a, cuuint32_t v, unsigned f) { return memop(s, OP_WAIT, 32, a, v, f); }
CUresult cuStreamWriteValue64_v2(CUstream s, CUdeviceptr a, cuuint64_t v, unsigned f) { return memop(s, OP_WRITE, 64, a, v, f); }
CUresult cuStreamWaitValue64_v2(CUstream s, CUdeviceptr a, cuuint64_t v, unsigned f) { return memop(s, OP_WAIT, 64, a, v, f); }

/* Decodes the union exactly as the driver reads it. */
static CUresult decode(const CUstreamBatchMemOpParams *p, unsigned n, op *out) {
	if (n == 0 || n >= 256)
		return E_INVALID_VALUE;
	for (unsigned i = 0; i < n; i++) {
		op o = {0};
		switch (p[i].operation) {
		case 1: o = (op){.kind = OP_WAIT, .width = 32, .addr = p[i].waitValue.address, .value = p[i].waitValue.value, .flags = p[i].waitValue.flags}; break;
		case 4: o = (op){.kind = OP_WAIT, .width = 64, .addr = p[i].waitValue.address, .value = p[i].waitValue.value64, .flags = p[i].waitValue.flags}; break;
		case 2: o = (op){.kind = OP_WRITE, .width = 32, .addr = p[i].writeValue.address, .value = p[i].writeValue.value, .flags = p[i].writeValue.flags}; break;
		case 5: o = (op){.kind = OP_WRITE, .width = 64, .addr = p[i].writeValue.address, .value = p[i].writeValue.value64, .flags = p[i].writeValue.flags}; break;
		case 3: case 6: o = (op){.kind = OP_BARRIER}; break;
		default: return E_INVALID_VALUE;
		}
		if (o.kind != OP_BARRIER && (o.addr == 0 || o.addr % (o.width / 8)))
			return E_INVALID_VALUE;
		out[i] = o;
	}
	return OK;
}
CUresult cuStreamBatchMemOp_v2(CUstream s, unsigned n, CUstreamBatchMemOpParams *p, unsigned flags) {
	op ops[256];
	CUresult r = decode(p, n, ops);
	if (r || flags)
		return r ? r : E_INVALID_VALUE;
	if (s && s->capture) {
		s->last = add_node(s->capture, 12, ops, n);
		return OK;
	}
	return submit(s, 12, ops, n);
}

CUresult cuEventCreate(CUevent *e, unsigned f) {
	if (!current)
		return E_INVALID_CONTEXT;
	*e = calloc(1, sizeof **e);
	(*e)->flags = f;
	return OK;
}
CUresult cuEventRecord(CUevent e, CUstream s) {
	op o = {.kind = OP_RECORD, .ev = e};
	return submit(s, 7, &o, 1);
}
CUresult cuEventQuery(CUevent e) { return __atomic_load_n(&e->completed, __ATOMIC_ACQUIRE) >= e->recorded ? OK : E_NOT_READY; }
CUresult cuEventSynchronize(CUevent e) {
	while (cuEventQuery(e))
		usleep(20);
	return OK;
}
CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) {
	if ((a->flags | b->flags) & 2)
		return E_INVALID_HANDLE;
	if (cuEventQuery(a) || cuEventQuery(b))
		return E_NOT_READY;
	*ms = (float)((double)(b->stamp - a->stamp) / 1e6);
	return OK;
}
CUresult cuEventDestroy_v2(CUevent e) { return OK; /* leaked: queued ops may still name it */ }

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	if (!current)
		return E_INVALID_CONTEXT;
	if (n == 0)
		return E_INVALID_VALUE;
	if (n > (1ull << 40))
		return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
	void *m = NULL;
	if (posix_memalign(&m, 256, n))
		return 2;
	track((uintptr_t)m, n, MEM_DEVICE, 0, 0);
	*p = (CUdeviceptr)m;
	return OK;
}
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned f) {
	CUresult r = cuMemAlloc_v2(p, n);
	if (!r)
		find(*p)->managed = 1;
	return r;
}
CUresult cuMemFree_v2(CUdeviceptr p) { return untrack(p) ? (free((void *)p), OK) : E_INVALID_VALUE; }
CUresult cuMemHostAlloc(void **p, size_t n, unsigned f) {
	if (!current)
		return E_INVALID_CONTEXT;
	if (n == 0)
		return E_INVALID_VALUE;
	if (n > (1ull << 40) || !(*p = calloc(1, n)))
		return 2; /* CUDA_ERROR_OUT_OF_MEMORY, as the driver answers */
	track((uintptr_t)*p, n, MEM_HOST, 0, 0);
	return OK;
}
CUresult cuMemFreeHost(void *p) { return untrack((uintptr_t)p) ? (free(p), OK) : E_INVALID_VALUE; }
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned f) {
	alloc *a = find((uintptr_t)p);
	if (!a || a->type != MEM_HOST)
		return E_INVALID_VALUE;
	*d = (CUdeviceptr)p;
	return OK;
}
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned f) {
	if (find((uintptr_t)p))
		return E_HOST_REGISTERED;
	track((uintptr_t)p, n, MEM_HOST, 0, 1);
	return OK;
}
CUresult cuMemHostUnregister(void *p) { return untrack((uintptr_t)p) ? OK : E_HOST_UNREGISTERED; }
static CUresult copy(CUstream s, uintptr_t d, uintptr_t src, size_t n) {
	op o = {.kind = OP_COPY, .dst = d, .src = src, .n = n};
	return submit(s, 1, &o, 1);
}
CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return copy(st, d, s, n); }
CUresult cuMemcpyPeerAsync(CUdeviceptr d, CUcontext dc, CUdeviceptr s, CUcontext sc, size_t n, CUstream st) { return copy(st, d, s, n); }
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, CUstream st) { return copy(st, d, (uintptr_t)s, n); }
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, CUstream st) { return copy(st, (uintptr_t)d, s, n); }
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) { return copy(st, d, s, n); }
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) {
	op o = {.kind = OP_SET8, .dst = d, .value = v, .n = n};
	return submit(s, 2, &o, 1);
}
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, CUstream s) {
	op o = {.kind = OP_SET32, .dst = d, .value = v, .n = n};
	return submit(s, 2, &o, 1);
}
static CUresult attr(void *data, CUpointer_attribute at, CUdeviceptr p, int lenient) {
	alloc *a = find(p);
	if (!a) {
		if (!lenient)
			return E_INVALID_VALUE;
		if (at == UCPX_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
			*(int *)data = -2;
		return OK;
	}
	switch (at) {
	case UCPX_CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = &the_ctx; break;
	case UCPX_CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned *)data = a->type; break;
	case UCPX_CU_POINTER_ATTRIBUTE_IS_MANAGED: *(unsigned *)data = a->managed; break;
	case UCPX_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = 0; break;
	case UCPX_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = a->base; break;
	case UCPX_CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = a->size; break;
	case UCPX_CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long *)data = a->id; break;
	case UCPX_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
		*(unsigned char *)data = a->type == UCPX_CU_MEMORYTYPE_DEVICE && !a->managed && !a->registered;
		break;
	default: return E_INVALID_VALUE;
	}
	return OK;
}
CUresult cuPointerGetAttribute(void *d, CUpointer_attribute a, CUdeviceptr p) { return attr(d, a, p, 0); }
CUresult cuPointerGetAttributes(unsigned n, CUpointer_attribute *a, void **d, CUdeviceptr p) {
	for (unsigned i = 0; i < n; i++)
		if (attr(d[i], a[i], p, 1))
			return E_INVALID_VALUE;
	return OK;
}

CUresult cuGraphCreate(CUgraph *g, unsigned f) { *g = calloc(1, sizeof **g); return current ? OK : E_INVALID_CONTEXT; }
CUresult cuGraphDestroy(CUgraph g) { return g ? OK : E_INVALID_HANDLE; }
static CUresult check_deps(CUgraph g, const CUgraphNode *deps, size_t n) {
	for (size_t i = 0; i < n; i++) {
		int found = 0;
		for (int j = 0; j < g->count; j++)
			found |= g->nodes[j] == deps[i];
		if (!found)
			return E_INVALID_VALUE;
	}
	return OK;
}
/* FAKECUDA_GRAPH_NODES_MAX=n (read at every call): adding a node to a graph that holds n
 * nodes already fails with CUDA_ERROR_OUT_OF_MEMORY and adds nothing, as a driver out of
 * resources does (captures are not limited). */
static CUresult graph_full(CUgraph g) {
	const char *v = getenv("FAKECUDA_GRAPH_NODES_MAX");
	return v && *v && g->count >= atoi(v) ? 2 : OK;
}
#define ADD(type, ops, n) \
	do { \
		CUresult r_ = check_deps(g, deps, nd); \
		if (!r_) \
			r_ = graph_full(g); \
		if (r_) \
			return r_; \
		*node = add_node(g, type, ops, n); \
		for (size_t i_ = 0; i_ < nd; i_++) \
			add_edge(*node, deps[i_]); \
		return OK; \
	} while (0)
CUresult cuGraphAddBatchMemOpNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t nd, const CUDA_BATCH_MEM_OP_NODE_PARAMS *p) {
	op ops[256];
	if (p->ctx != &the_ctx)
		return E_INVALID_CONTEXT;
	CUresult r = decode(p->paramArray, p->count, ops);
	if (r)
		return r;
	ADD(12, ops, (int)p->count);
}
CUresult cuGraphAddHostNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t nd, const CUDA_HOST_NODE_PARAMS *p) {
	op o = {.kind = OP_HOST, .fn = p->fn, .ud = p->userData};
	ADD(3, &o, 1);
}
CUresult cuGraphAddMemcpyNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t nd, const CUDA_MEMCPY3D *p, CUcontext c) {
	if (p->srcMemoryType != 4 || p->dstMemoryType != 4 || p->Height != 1 || p->Depth != 1 || c != &the_ctx)
		return E_INVALID_VALUE;
	op o = {.kind = OP_COPY, .dst = p->dstDevice, .src = p->srcDevice, .n = p->WidthInBytes};
	ADD(1, &o, 1);
}
CUresult cuGraphAddMemsetNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t nd, const CUDA_MEMSET_NODE_PARAMS *p, CUcontext c) {
	if (p->elementSize != 1 && p->elementSize != 4)
		return E_NOT_SUPPORTED;
	op o = {.kind = p->elementSize == 1 ? OP_SET8 : OP_SET32, .dst = p->dst, .value = p->value, .n = p->width};
	ADD(2, &o, 1);
}
static int kernel_id(CUfunction f);
static size_t kernel_params(int k, void **params, unsigned char *out) {
	static const int sizes[][6] = {{0}, {8, 8, 8, 8, 8, 0}, {32, 8, 0}, {8, 8, 8, 0}, {8, 8, 4, 0}, {8, 8, 8, 0}};
	size_t off = 0;
	for (int i = 0; sizes[k][i]; i++) {
		memcpy(out + off, params[i], sizes[k][i]);
		off += sizes[k][i];
	}
	return off;
}
CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t nd, const CUDA_KERNEL_NODE_PARAMS *p) {
	op o = {.kind = OP_KERNEL, .kernel = kernel_id(p->func)};
	if (!o.kernel || p->blockDimX * p->blockDimY * p->blockDimZ > 1024 || p->extra || p->kern)
		return E_INVALID_VALUE;
	kernel_params(o.kernel, p->kernelParams, o.params);
	ADD(0, &o, 1);
}
CUresult cuGraphAddEventRecordNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t nd, CUevent e) {
	op o = {.kind = OP_RECORD, .ev = e};
	ADD(7, &o, 1);
}
CUresult cuGraphAddEventWaitNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t nd, CUevent e) {
	op o = {.kind = OP_WAITEV, .ev = e};
	ADD(6, &o, 1);
}
CUresult cuGraphAddEmptyNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t nd) { ADD(5, NULL, 0); }
CUresult cuGraphAddChildGraphNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t nd, CUgraph child) {
	int total = 0;
	for (int i = 0; i < child->count; i++)
		total += child->nodes[i]->n.nops;
	op *ops = calloc(total ? total : 1, sizeof(op));
	for (int i = 0, k = 0; i < child->count; i++)
		for (int j = 0; j < child->nodes[i]->n.nops; j++)
			ops[k++] = child->nodes[i]->n.ops[j];
	ADD(4, ops, total);
}
CUresult cuGraphAddDependencies_v2(CUgraph g, const CUgraphNode *from, const CUgraphNode *to, const CUgraphEdgeData *e, size_t n) {
	/* Nodes run in creation order here; an edge must agree with it. */
	for (size_t i = 0; i < n; i++) {
		int fi = -1, ti = -1;
		for (int j = 0; j < g->count; j++) {
			if (g->nodes[j] == from[i]) fi = j;
			if (g->nodes[j] == to[i]) ti = j;
		}
		if (fi < 0 || ti < 0 || fi >= ti)
			return E_INVALID_VALUE;
	}
	for (size_t i = 0; i < n; i++)
		add_edge(to[i], from[i]);
	return OK;
}
CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *n) {
	if (nodes)
		for (size_t i = 0; i < *n && i < (size_t)g->count; i++)
			nodes[i] = g->nodes[i];
	*n = g->count;
	return OK;
}
CUresult cuGraphNodeGetType(CUgraphNode n, CUgraphNodeType *t) { *t = n->n.type; return OK; }
/* Takes the node out of its graph with its edges: those into it (its own list) and those
 * out of it (in the lists of the nodes after it). Its memory is kept (like an event's):
 * executables compare their nodes' original handles, which must not be reused, and a
 * second destroy must find the node gone. */
CUresult cuGraphDestroyNode(CUgraphNode n) {
	if (!n || !n->g)
		return E_INVALID_VALUE;
	CUgraph g = n->g;
	for (int i = 0; i < g->count; i++)
		if (g->nodes[i] == n) {
			memmove(&g->nodes[i], &g->nodes[i + 1], sizeof *g->nodes * (g->count - i - 1));
			g->count--;
			break;
		}
	for (int i = 0; i < g->count; i++) {
		struct CUgraphNode_st *m = g->nodes[i];
		int k = 0;
		for (int j = 0; j < m->ndeps; j++)
			if (m->deps[j] != n)
				m->deps[k++] = m->deps[j];
		m->ndeps = k;
	}
	n->ndeps = 0;
	n->g = NULL;
	return OK;
}

/* FAKECUDA_MAX_BLOCKED_WAITS=n (read at every instantiation): refuse (CUDA_ERROR_ILLEGAL_STATE,
 * with a line on stderr) a graph in which more than n memop waits would wait at once if
 * none were ever released: each such wait holds one of the GPU's hardware work queues
 * (CUDA_DEVICE_MAX_CONNECTIONS), and a real GPU whose queues the waits fill runs nothing
 * else of the context. Nodes are in creation order, which is a topological order. */
static int is_wait(const struct CUgraphNode_st *nd) {
	for (int i = 0; i < nd->n.nops; i++)
		if (nd->n.ops[i].kind == OP_WAIT)
			return nd->n.type == 12;
	return 0;
}
static int blocked_waits(CUgraph g) {
	char *done = calloc(g->count + 1, 1);
	int blocked = 0;
	for (int i = 0; i < g->count; i++) {
		struct CUgraphNode_st *nd = g->nodes[i];
		int ready = 1;
		for (int j = 0; j < nd->ndeps && ready; j++)
			for (int k = 0; k < i; k++)
				if (g->nodes[k] == nd->deps[j]) {
					ready = done[k];
					break;
				}
		if (ready && is_wait(nd))
			blocked++;
		done[i] = ready && !is_wait(nd);
	}
	free(done);
	return blocked;
}
CUresult cuGraphInstantiateWithFlags(CUgraphExec *x, CUgraph g, unsigned long long f) {
	const char *max = getenv("FAKECUDA_MAX_BLOCKED_WAITS");
	if (max && *max) {
		int blocked = blocked_waits(g);
		if (blocked > atoi(max)) {
			fprintf(stderr, "fakecuda: %d memop waits of the graph would wait at once (FAKECUDA_MAX_BLOCKED_WAITS=%s)\n", blocked, max);
			return E_ILLEGAL_STATE;
		}
	}
	CUgraphExec e = calloc(1, sizeof *e);
	e->count = g->count;
	e->orig = calloc(g->count + 1, sizeof *e->orig);
	e->nodes = calloc(g->count + 1, sizeof *e->nodes);
	for (int i = 0; i < g->count; i++) {
		e->orig[i] = g->nodes[i];
		e->nodes[i] = g->nodes[i]->n;
		e->nodes[i].ops = calloc(e->nodes[i].nops + 1, sizeof(op));
		memcpy(e->nodes[i].ops, g->nodes[i]->n.ops, sizeof(op) * e->nodes[i].nops);
	}
	*x = e;
	return OK;
}
CUresult cuGraphLaunch(CUgraphExec x, CUstream s) {
	if (s->capture)
		return E_NOT_SUPPORTED;
	for (int i = 0; i < x->count; i++)
		submit(s, x->nodes[i].type, x->nodes[i].ops, x->nodes[i].nops);
	return OK;
}
CUresult cuGraphExecBatchMemOpNodeSetParams(CUgraphExec x, CUgraphNode n, const CUDA_BATCH_MEM_OP_NODE_PARAMS *p) {
	for (int i = 0; i < x->count; i++)
		if (x->orig[i] == n) {
			op ops[256];
			if (x->nodes[i].type != 12 || (int)p->count != x->nodes[i].nops)
				return E_INVALID_VALUE;
			CUresult r = decode(p->paramArray, p->count, ops);
			if (r)
				return r;
			memcpy(x->nodes[i].ops, ops, sizeof(op) * p->count);
			return OK;
		}
	return E_INVALID_VALUE;
}
CUresult cuGraphExecDestroy(CUgraphExec x) { return x ? OK : E_INVALID_HANDLE; }

static uint64_t capture_ids;
CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode m) {
	if (s->capture)
		return E_ILLEGAL_STATE;
	drain(s);
	cuGraphCreate(&s->capture, 0);
	s->capture_id = ++capture_ids;
	s->last = NULL;
	return OK;
}
CUresult cuStreamEndCapture(CUstream s, CUgraph *g) {
	if (!s->capture)
		return E_ILLEGAL_STATE;
	*g = s->capture;
	s->capture = NULL;
	return OK;
}
CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st) { *st = s->capture != NULL; return OK; }
CUresult cuStreamGetCaptureInfo_v3(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g, const CUgraphNode **deps,
	const CUgraphEdgeData **edges, size_t *n) {
	*st = s->capture != NULL;
	if (!s->capture)
		return OK;
	if (id) *id = s->capture_id;
	if (g) *g = s->capture;
	if (deps) *deps = s->last ? &s->last : NULL;
	if (edges) *edges = NULL;
	if (n) *n = s->last ? 1 : 0;
	return OK;
}
CUresult cuStreamUpdateCaptureDependencies_v2(CUstream s, CUgraphNode *deps, const CUgraphEdgeData *e, size_t n, unsigned f) {
	if (!s->capture || f > 1 || n != 1)
		return E_INVALID_VALUE;
	s->last = deps[0];
	return OK;
}

struct CUmod_st { int unused; };
static struct CUmod_st the_module;
static struct CUfunc_st { int id; } funcs[] = {{0}, {K_ECHO}, {K_HANDLE}, {K_CHECKSUM}, {K_FILL}, {K_COPY}};
static int kernel_id(CUfunction f) {
	for (int i = 1; i < 6; i++)
		if (f == &funcs[i])
			return i;
	return 0;
}
CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n, CUjit_option *opts, void **vals) {
	char *errbuf = NULL;
	size_t errlen = 0;
	for (unsigned i = 0; i < n; i++) {
		if (opts[i] == UCPX_CU_JIT_ERROR_LOG_BUFFER) errbuf = vals[i];
		if (opts[i] == UCPX_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES) errlen = (size_t)(uintptr_t)vals[i];
	}
	const char *img = image;
	if (strstr(img, "this_is_not_an_instruction")) {
		if (errbuf && errlen)
			snprintf(errbuf, errlen, "ptxas application ptx input, line 6; error   : Unknown symbol 'this_is_not_an_instruction'");
		return E_INVALID_PTX;
	}
	if (!strstr(img, ".entry"))
		return E_INVALID_IMAGE;
	*m = &the_module;
	return OK;
}
CUresult cuModuleUnload(CUmodule m) { return OK; }
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
	static const char *names[] = {"", "ucpx_test_echo", "ucpx_test_handle", "ucpx_test_checksum", "ucpx_test_fill", "ucpx_copy"};
	for (int i = 1; i < 6; i++)
		if (!strcmp(name, names[i])) {
			*f = &funcs[i];
			return OK;
		}
	return E_NOT_FOUND;
}
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sh,
	CUstream s, void **params, void **extra) {
	op o = {.kind = OP_KERNEL, .kernel = kernel_id(f)};
	if (!o.kernel || bx * by * bz > 1024 || extra)
		return E_INVALID_VALUE;
	kernel_params(o.kernel, params, o.params);
	return submit(s, 0, &o, 1);
}
/* FAKECUDA_HOSTFUNC_ERROR=code (read at every call): cuLaunchHostFunc refuses with code
 * and enqueues nothing, as a driver out of resources does; other work is taken. */
CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *ud) {
	const char *refuse = getenv("FAKECUDA_HOSTFUNC_ERROR");
	if (refuse && *refuse)
		return atoi(refuse);
	op o = {.kind = OP_HOST, .fn = fn, .ud = ud};
	return submit(s, 3, &o, 1);
}

CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) { memset(h, 0, sizeof *h); memcpy(h, &p, 8); return OK; }
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned f) { return E_INVALID_CONTEXT; }
CUresult cuIpcCloseMemHandle(CUdeviceptr p) { return E_INVALID_VALUE; }
CUresult cuIpcGetEventHandle(CUipcEventHandle *h, CUevent e) { return (e->flags & 4) ? OK : E_INVALID_VALUE; }
CUresult cuIpcOpenEventHandle(CUevent *e, CUipcEventHandle h) { return E_NOT_SUPPORTED; }

/*
 * cuda_exchange.c: the C ABI's CUDA path (tests/capi_test.go runs it against the fake
 * driver, cgo/cuda/testdata/fakecuda, where there is no GPU).
 *
 *   cuda_exchange RANK DIR
 *
 * Rank 1 makes its own CUstreams and CUevents through the driver API, as a framework
 * does, receives into device memory with a condition on its stream
 * (ucpx_cuda_condition_create), records its raw event right after the enqueue
 * (ucpx_request_record_event, or ucpx_condition_record_event), and lets a second stream
 * that only waits on that event copy the buffer to the host. Rank 0 sends from host
 * memory 200 ms after rank 1 said it posted: the event must not be ready before
 * (MPICH #7612). Prints "OK cuda rank N".
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

/* The driver entry points used, declared as cuda.h (CUDA 13) does. */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int flags, int priority);
CUresult cuStreamSynchronize(CUstream s);
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags);
CUresult cuEventCreate(CUevent *e, unsigned int flags);
CUresult cuEventQuery(CUevent e);
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n);
CUresult cuMemHostAlloc(void **p, size_t n, unsigned int flags);
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s);
enum { CUDA_ERROR_NOT_READY = 600 };

#define CU(call)                                                                           \
	do {                                                                               \
		CUresult r_ = (call);                                                      \
		if (r_ != 0) {                                                             \
			fprintf(stderr, "rank %d: line %d: %s = CUresult %d\n", rank, __LINE__, #call, r_); \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

static unsigned char pattern(size_t i, unsigned seed) { return (unsigned char)(i * 13 + seed * 5 + 3); }

int main(int argc, char **argv) {
	if (argc != 3) {
		fprintf(stderr, "usage: %s RANK DIR\n", argv[0]);
		return 2;
	}
	rank = atoi(argv[1]);
	const char *dir = argv[2];
	static const size_t sizes[] = {4, 65536, 1 << 20};
	enum { K = sizeof sizes / sizeof sizes[0] };
	const int T = 60000;
	ucpx_handle_t ctx, w, ep;
	CHECK(ucpx_context_create(&ctx));
	CHECK(ucpx_worker_create(ctx, 0, &w));
	char addr[8192];
	CHECK(ucpx_worker_address(w, addr, sizeof addr, NULL));
	publish(dir, "cuda-addr", addr);
	char *peer = fetch(dir, "cuda-addr");
	CHECK(ucpx_ep_create(w, peer, 0, &ep));
	unsigned char note[8] = {0};

	if (rank == 0) {
		for (int k = 0; k < K; k++) {
			size_t n = sizes[k];
			unsigned char *buf = malloc(n);
			for (size_t i = 0; i < n; i++) buf[i] = pattern(i, k);
			CHECK(ucpx_tag_recv_wait(w, note, sizeof note, 0x100 + k, ~0ull, T, NULL, NULL));
			usleep(200000); /* the peer is late */
			CHECK(ucpx_tag_send_wait(ep, buf, n, 0x1900 + k, T));
			free(buf);
		}
	} else {
		CUdevice d;
		CUcontext c;
		CUstream s, s2;
		CU(cuInit(0));
		CU(cuDeviceGet(&d, 0));
		CU(cuDevicePrimaryCtxRetain(&c, d));
		CU(cuCtxSetCurrent(c));
		CU(cuStreamCreateWithPriority(&s, 1, 0));
		CU(cuStreamCreateWithPriority(&s2, 1, 0));
		ucpx_handle_t cond, req;
		CHECK(ucpx_cuda_condition_create((uintptr_t)s, &cond));
		for (int k = 0; k < K; k++) {
			size_t n = sizes[k];
			CUdeviceptr dev;
			void *host;
			CUevent ev;
			CU(cuMemAlloc_v2(&dev, n));
			CU(cuMemHostAlloc(&host, n, 0));
			memset(host, 0, n);
			CU(cuEventCreate(&ev, 2 /* CU_EVENT_DISABLE_TIMING */));
			CHECK(ucpx_tag_recv(w, (void *)(uintptr_t)dev, n, 0x1900 + k, ~0ull, UCPX_MEMORY_CUDA, cond, 0, &req));
			if (k == 1)
				CHECK(ucpx_condition_record_event(cond, (uintptr_t)ev));
			else
				CHECK(ucpx_request_record_event(req, (uintptr_t)ev));
			CU(cuStreamWaitEvent(s2, ev, 0)); /* s2 knows nothing but the raw event */
			CU(cuMemcpyDtoHAsync_v2(host, dev, n, s2));
			CHECK(ucpx_tag_send_wait(ep, note, sizeof note, 0x100 + k, T));
			EXPECT(cuEventQuery(ev) == CUDA_ERROR_NOT_READY, "the event is ready at once");
			usleep(100000);
			EXPECT(cuEventQuery(ev) == CUDA_ERROR_NOT_READY, "the event is ready while the peer is late");
			CHECK(ucpx_request_wait(req, T));
			size_t got;
			CHECK(ucpx_request_info(req, &got, NULL));
			EXPECT(got == n, "received length");
			CHECK(ucpx_request_free(req));
			CU(cuStreamSynchronize(s2));
			EXPECT(cuEventQuery(ev) == 0, "the event after the data");
			for (size_t i = 0; i < n; i++)
				if (((unsigned char *)host)[i] != pattern(i, k)) {
					fprintf(stderr, "rank 1: size %zu: byte %zu differs\n", n, i);
					exit(1);
				}
		}
		/* Bad input at the boundary. */
		ucpx_handle_t plain;
		CHECK(ucpx_tag_recv(w, note, sizeof note, 0x7777, ~0ull, UCPX_MEMORY_HOST, 0, 0, &plain));
		EXPECT(ucpx_request_record_event(plain, 1) == UCPX_ERR_INVALID_PARAM, "record_event without a condition");
		CHECK(ucpx_request_cancel(plain));
		EXPECT(ucpx_request_wait(plain, T) == UCPX_ERR_CANCELED, "cancel");
		CHECK(ucpx_request_free(plain));
		EXPECT(ucpx_condition_record_event(cond, 0) == UCPX_ERR_INVALID_PARAM, "NULL event");
		CU(cuStreamSynchronize(s));
		CHECK(ucpx_condition_destroy(cond));
		EXPECT(ucpx_condition_destroy(cond) == UCPX_ERR_INVALID_HANDLE, "a destroyed condition");
	}
	if (rank == 0) {
		CHECK(ucpx_tag_send_wait(ep, note, sizeof note, 0x999, T));
	} else {
		CHECK(ucpx_tag_recv_wait(w, note, sizeof note, 0x999, ~0ull, T, NULL, NULL));
	}
	CHECK(ucpx_ep_destroy(ep));
	CHECK(ucpx_worker_destroy(w));
	CHECK(ucpx_context_destroy(ctx));
	free(peer);
	printf("OK cuda rank %d\n", rank);
	return 0;
}

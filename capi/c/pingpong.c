/*
 * pingpong.c: 8-byte (or SIZE) tag ping-pong over libucpx.so, the C side of the C ABI
 * benchmark (bench/capi-pingpong.sh compares it with `ucpx perf` tag_lat).
 *
 *   pingpong RANK DIR ITERS WARMUP SIZE
 *
 * Wire-up by worker address strings exchanged as files in DIR. Rank 0 times each round
 * trip with one clock read per iteration (as ucpx perf does) and prints one-way
 * latencies (half a round trip) in microseconds:
 *   lat_last2048_us X   median of the last 2048 iterations (ucx_perftest's "typical")
 *   lat_p50_us X        median over all timed iterations
 * The worker polls without an event fd (UCPX_WORKER_NO_WAKEUP), as ucpx perf's does.
 * Each iteration is one call: ucpx_tag_sendrecv (the ping and the wait for the pong)
 * on rank 0; on rank 1 the pong and the receive of the next ping.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

static int64_t now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp64(const void *a, const void *b) {
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x > y) - (x < y);
}

static double median_us(int64_t *v, size_t n) {
	qsort(v, n, sizeof *v, cmp64);
	return (double)v[n / 2] / 2 / 1000; /* one way */
}

int main(int argc, char **argv) {
	if (argc != 6) {
		fprintf(stderr, "usage: %s RANK DIR ITERS WARMUP SIZE\n", argv[0]);
		return 2;
	}
	rank = atoi(argv[1]);
	const char *dir = argv[2];
	long iters = atol(argv[3]), warmup = atol(argv[4]);
	size_t size = (size_t)atol(argv[5]);
	long total = iters + warmup;
	const uint64_t PING = 1, PONG = 2, ALL = ~0ull;
	ucpx_handle_t ctx, w, ep;
	CHECK(ucpx_context_create(&ctx));
	CHECK(ucpx_worker_create(ctx, UCPX_WORKER_NO_WAKEUP, &w)); /* as ucpx perf's */
	size_t need;
	ucpx_worker_address(w, NULL, 0, &need);
	char *addr = malloc(need);
	CHECK(ucpx_worker_address(w, addr, need, NULL));
	publish(dir, "addr", addr);
	char *peer = fetch(dir, "addr");
	CHECK(ucpx_ep_create(w, peer, 0, &ep));
	unsigned char *sbuf = calloc(1, size + 1), *rbuf = calloc(1, size + 1);

	if (rank == 0) {
		int64_t *stamps = malloc((total + 1) * sizeof *stamps);
		for (long i = 0; i < total; i++) {
			stamps[i] = now_ns();
			CHECK(ucpx_tag_sendrecv(ep, sbuf, size, PING, rbuf, size, PONG, ALL, -1, NULL, NULL));
		}
		stamps[total] = now_ns();
		int64_t *rtt = malloc(iters * sizeof *rtt);
		for (long i = 0; i < iters; i++) rtt[i] = stamps[warmup + i + 1] - stamps[warmup + i];
		long last = iters < 2048 ? iters : 2048;
		int64_t *tail = malloc(last * sizeof *tail);
		memcpy(tail, rtt + iters - last, last * sizeof *tail);
		printf("lat_last2048_us %.3f\n", median_us(tail, last));
		printf("lat_p50_us %.3f\n", median_us(rtt, iters));
	} else {
		CHECK(ucpx_tag_recv_wait(w, rbuf, size, PING, ALL, -1, NULL, NULL));
		for (long i = 0; i + 1 < total; i++)
			CHECK(ucpx_tag_sendrecv(ep, sbuf, size, PONG, rbuf, size, PING, ALL, -1, NULL, NULL));
		CHECK(ucpx_tag_send_wait(ep, sbuf, size, PONG, -1));
	}
	/* Neither side closes before the other is done. */
	unsigned char bye[8] = {0};
	if (rank == 0) {
		CHECK(ucpx_tag_send_wait(ep, bye, 8, 3, -1));
		CHECK(ucpx_tag_recv_wait(w, bye, 8, 4, ALL, -1, NULL, NULL));
	} else {
		CHECK(ucpx_tag_recv_wait(w, bye, 8, 3, ALL, -1, NULL, NULL));
		CHECK(ucpx_tag_send_wait(ep, bye, 8, 4, -1));
	}
	CHECK(ucpx_ep_destroy(ep));
	CHECK(ucpx_worker_destroy(w));
	CHECK(ucpx_context_destroy(ctx));
	return 0;
}

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

#include "ucpx.h"

static int rank;

static void check(int rc, const char *what) {
	if (rc != UCPX_OK) {
		char msg[512];
		ucpx_last_error(msg, sizeof msg);
		fprintf(stderr, "rank %d: %s: %s: %s\n", rank, what, ucpx_strerror(rc), msg);
		exit(1);
	}
}

static void publish(const char *dir, const char *s) {
	char tmp[4096], path[4096];
	snprintf(tmp, sizeof tmp, "%s/.addr.%d", dir, rank);
	snprintf(path, sizeof path, "%s/addr.%d", dir, rank);
	FILE *f = fopen(tmp, "w");
	if (!f || fputs(s, f) < 0 || fclose(f) != 0 || rename(tmp, path) != 0) {
		perror("publish");
		exit(1);
	}
}

static char *fetch(const char *dir) {
	char path[4096];
	snprintf(path, sizeof path, "%s/addr.%d", dir, 1 - rank);
	for (int i = 0; i < 6000; i++) {
		FILE *f = fopen(path, "r");
		if (f) {
			char *buf = calloc(1, 1 << 16);
			size_t n = fread(buf, 1, (1 << 16) - 1, f);
			buf[n] = 0;
			fclose(f);
			return buf;
		}
		usleep(10000);
	}
	fprintf(stderr, "rank %d: no address from the peer\n", rank);
	exit(1);
}

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
	check(ucpx_context_create(&ctx), "context");
	check(ucpx_worker_create(ctx, UCPX_WORKER_NO_WAKEUP, &w), "worker"); /* as ucpx perf's */
	size_t need;
	ucpx_worker_address(w, NULL, 0, &need);
	char *addr = malloc(need);
	check(ucpx_worker_address(w, addr, need, NULL), "address");
	publish(dir, addr);
	char *peer = fetch(dir);
	check(ucpx_ep_create(w, peer, 0, &ep), "endpoint");
	unsigned char *sbuf = calloc(1, size + 1), *rbuf = calloc(1, size + 1);

	if (rank == 0) {
		int64_t *stamps = malloc((total + 1) * sizeof *stamps);
		for (long i = 0; i < total; i++) {
			stamps[i] = now_ns();
			check(ucpx_tag_sendrecv(ep, sbuf, size, PING, rbuf, size, PONG, ALL, -1, NULL, NULL), "sendrecv");
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
		check(ucpx_tag_recv_wait(w, rbuf, size, PING, ALL, -1, NULL, NULL), "first ping");
		for (long i = 0; i + 1 < total; i++)
			check(ucpx_tag_sendrecv(ep, sbuf, size, PONG, rbuf, size, PING, ALL, -1, NULL, NULL), "pong+ping");
		check(ucpx_tag_send_wait(ep, sbuf, size, PONG, -1), "last pong");
	}
	/* Neither side closes before the other is done. */
	unsigned char bye[8] = {0};
	if (rank == 0) {
		check(ucpx_tag_send_wait(ep, bye, 8, 3, -1), "bye");
		check(ucpx_tag_recv_wait(w, bye, 8, 4, ALL, -1, NULL, NULL), "bye");
	} else {
		check(ucpx_tag_recv_wait(w, bye, 8, 3, ALL, -1, NULL, NULL), "bye");
		check(ucpx_tag_send_wait(ep, bye, 8, 4, -1), "bye");
	}
	check(ucpx_ep_destroy(ep), "ep destroy");
	check(ucpx_worker_destroy(w), "worker destroy");
	check(ucpx_context_destroy(ctx), "context destroy");
	return 0;
}

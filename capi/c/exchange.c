/*
 * exchange.c: the C test of libucpx.so (tests/capi_test.go builds and runs it).
 *
 *   exchange RANK DIR
 *
 * Two processes (RANK 0 and 1) wire up through worker address strings exchanged as
 * files in DIR, then check, through the C ABI only: tag send/receive of several sizes
 * (request handles and the blocking calls), concurrent exchanges from several threads,
 * the blocking calls beside request-handle exchanges on one worker (late replies,
 * rendezvous sizes, the handles and arguments they refuse),
 * RMA put and get on registered memory with packed remote keys, prepared partitioned
 * iterations, and error codes with their messages. Prints "OK rank N" on success;
 * any failure prints the call, its code and ucpx_last_error, and exits 1.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

static const int TIMEOUT = 60000; /* ms */

static unsigned char pattern(size_t i, unsigned seed) { return (unsigned char)(i * 31 + seed * 7 + 1); }

static void fill(unsigned char *b, size_t n, unsigned seed) {
	for (size_t i = 0; i < n; i++) b[i] = pattern(i, seed);
}

static void verify(const unsigned char *b, size_t n, unsigned seed, const char *what) {
	for (size_t i = 0; i < n; i++)
		EXPECT(b[i] == pattern(i, seed), "%s: byte %zu of %zu is %u, want %u", what, i, n, b[i], pattern(i, seed));
}

static ucpx_handle_t worker, ep;

/* Tag messages of several sizes, rank 0 to 1 and back, through request handles. */
static void tag_exchange(void) {
	static const size_t sizes[] = {0, 8, 4096, 65536, 1 << 20};
	for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
		size_t n = sizes[k];
		unsigned char *buf = malloc(n + 1);
		uint64_t tag = 0x100 + k;
		ucpx_handle_t req;
		if (rank == 0) {
			fill(buf, n, (unsigned)k);
			CHECK(ucpx_tag_send(ep, buf, n, tag, UCPX_MEMORY_HOST, 0, 0, &req));
			CHECK(ucpx_request_wait(req, TIMEOUT));
			CHECK(ucpx_request_free(req));
			memset(buf, 0, n);
			CHECK(ucpx_tag_recv(worker, buf, n, tag | 0x1000, ~0ull, UCPX_MEMORY_HOST, 0, 0, &req));
			CHECK(ucpx_request_wait(req, TIMEOUT));
			size_t got;
			uint64_t stag;
			CHECK(ucpx_request_info(req, &got, &stag));
			EXPECT(got == n && stag == (tag | 0x1000), "reply length %zu tag %#llx", got, (unsigned long long)stag);
			CHECK(ucpx_request_free(req));
			verify(buf, n, (unsigned)k + 100, "tag reply");
		} else {
			CHECK(ucpx_tag_recv(worker, buf, n, tag, ~0ull, UCPX_MEMORY_HOST, 0, 0, &req));
			int done = 0;
			while (!done) CHECK(ucpx_request_test(req, &done));
			size_t got;
			CHECK(ucpx_request_info(req, &got, NULL));
			EXPECT(got == n, "length %zu, want %zu", got, n);
			CHECK(ucpx_request_free(req));
			verify(buf, n, (unsigned)k, "tag message");
			fill(buf, n, (unsigned)k + 100);
			CHECK(ucpx_tag_send_wait(ep, buf, n, tag | 0x1000, TIMEOUT));
		}
		free(buf);
	}
}

/* Threads exchange concurrently, each with its own tags, through the blocking calls. */
struct thread_arg {
	int id;
};

static void *thread_exchange(void *p) {
	int id = ((struct thread_arg *)p)->id;
	unsigned char buf[256];
	for (int i = 0; i < 50; i++) {
		uint64_t ping = 0x2000 + id * 1000 + i, pong = ping | 0x100000;
		size_t got;
		uint64_t stag;
		if (rank == 0) {
			unsigned char out[256];
			fill(out, sizeof out, id * 100 + i);
			CHECK(ucpx_tag_sendrecv(ep, out, sizeof out, ping, buf, sizeof buf, pong, ~0ull, TIMEOUT, &got, &stag));
			EXPECT(got == sizeof buf && stag == pong, "thread %d: got %zu tag %#llx", id, got, (unsigned long long)stag);
			verify(buf, sizeof buf, id * 100 + i + 7, "thread pong");
		} else {
			CHECK(ucpx_tag_recv_wait(worker, buf, sizeof buf, ping, ~0ull, TIMEOUT, &got, &stag));
			EXPECT(got == sizeof buf && stag == ping, "thread %d: got %zu", id, got);
			verify(buf, sizeof buf, id * 100 + i, "thread ping");
			fill(buf, sizeof buf, id * 100 + i + 7);
			CHECK(ucpx_tag_send_wait(ep, buf, sizeof buf, pong, TIMEOUT));
		}
	}
	return NULL;
}

static void threads(void) {
	enum { N = 4 };
	pthread_t t[N];
	struct thread_arg a[N];
	for (int i = 0; i < N; i++) {
		a[i].id = i;
		EXPECT(pthread_create(&t[i], NULL, thread_exchange, &a[i]) == 0, "pthread_create");
	}
	for (int i = 0; i < N; i++) pthread_join(t[i], NULL);
}

/* The blocking calls complete in C while they can and finish in Go otherwise: a
 * ping-pong on one thread while another thread's request-handle exchanges run on the
 * same worker, replies late enough to outlast the call's spin, rendezvous sizes, and
 * the handles they refuse. */
struct mixed_arg {
	int failed;
};

static void *mixed_requests(void *p) {
	struct mixed_arg *a = p; /* failures exit the process (CHECK): reaching the end is success */
	unsigned char buf[512];
	for (int i = 0; i < 200; i++) {
		ucpx_handle_t sreq, rreq;
		uint64_t tag = 0xB000 + i;
		if (rank == 0) {
			unsigned char out[512];
			fill(out, sizeof out, 300 + i);
			CHECK(ucpx_tag_send(ep, out, sizeof out, tag, UCPX_MEMORY_HOST, 0, 0, &sreq));
			CHECK(ucpx_tag_recv(worker, buf, sizeof buf, tag | 0x800, ~0ull, UCPX_MEMORY_HOST, 0, 0, &rreq));
			CHECK(ucpx_request_wait(sreq, TIMEOUT));
			CHECK(ucpx_request_wait(rreq, TIMEOUT));
			CHECK(ucpx_request_free(sreq));
			CHECK(ucpx_request_free(rreq));
			verify(buf, sizeof buf, 300 + i + 1, "request exchange reply");
		} else {
			CHECK(ucpx_tag_recv(worker, buf, sizeof buf, tag, ~0ull, UCPX_MEMORY_HOST, 0, 0, &rreq));
			CHECK(ucpx_request_wait(rreq, TIMEOUT));
			CHECK(ucpx_request_free(rreq));
			verify(buf, sizeof buf, 300 + i, "request exchange");
			fill(buf, sizeof buf, 300 + i + 1);
			CHECK(ucpx_tag_send(ep, buf, sizeof buf, tag | 0x800, UCPX_MEMORY_HOST, 0, 0, &sreq));
			CHECK(ucpx_request_wait(sreq, TIMEOUT));
			CHECK(ucpx_request_free(sreq));
		}
	}
	a->failed = 0;
	return NULL;
}

static void blocking(char *peer_addr) {
	enum { ROUNDS = 3000 };
	unsigned char out[8], in[8];
	size_t got;
	uint64_t stag;
	pthread_t t;
	struct mixed_arg a = {1};
	EXPECT(pthread_create(&t, NULL, mixed_requests, &a) == 0, "pthread_create");
	if (rank == 1) CHECK(ucpx_tag_recv_wait(worker, in, sizeof in, 0xA000, ~0ull, TIMEOUT, NULL, NULL));
	for (int i = 0; i < ROUNDS; i++) {
		if (rank == 0) {
			fill(out, sizeof out, i);
			CHECK(ucpx_tag_sendrecv(ep, out, sizeof out, 0xA000, in, sizeof in, 0xA001, ~0ull, TIMEOUT, &got, &stag));
			EXPECT(got == sizeof in && stag == 0xA001, "ping-pong %d: got %zu tag %#llx", i, got, (unsigned long long)stag);
			verify(in, sizeof in, i + 1, "ping-pong reply");
		} else {
			verify(in, sizeof in, i, "ping");
			fill(out, sizeof out, i + 1);
			if (i + 1 < ROUNDS)
				CHECK(ucpx_tag_sendrecv(ep, out, sizeof out, 0xA001, in, sizeof in, 0xA000, ~0ull, TIMEOUT, NULL, NULL));
			else
				CHECK(ucpx_tag_send_wait(ep, out, sizeof out, 0xA001, TIMEOUT));
		}
	}
	pthread_join(t, NULL);
	EXPECT(a.failed == 0, "request exchanges");

	/* Late replies (30 ms: far past the call's spin) and 1 MiB messages (rendezvous). */
	enum { BIG = 1 << 20 };
	unsigned char *bout = malloc(BIG), *bin = malloc(BIG);
	for (int i = 0; i < 3; i++) {
		if (rank == 0) {
			fill(bout, BIG, 500 + i);
			CHECK(ucpx_tag_sendrecv(ep, bout, BIG, 0xA100, bin, BIG, 0xA101, ~0ull, TIMEOUT, &got, &stag));
			EXPECT(got == BIG && stag == 0xA101, "big reply %d: %zu", i, got);
			verify(bin, BIG, 600 + i, "big reply");
		} else {
			CHECK(ucpx_tag_recv_wait(worker, bin, BIG, 0xA100, ~0ull, TIMEOUT, &got, NULL));
			EXPECT(got == BIG, "big message %d: %zu", i, got);
			verify(bin, BIG, 500 + i, "big message");
			usleep(30000);
			fill(bout, BIG, 600 + i);
			CHECK(ucpx_tag_send_wait(ep, bout, BIG, 0xA101, TIMEOUT));
		}
	}
	free(bout);
	free(bin);

	/* A message longer than the buffer: UCPX_ERR_TRUNCATED, with its length and tag. */
	{
		unsigned char long_msg[64] = {0}, short_buf[8];
		got = 0;
		stag = 0;
		if (rank == 0) {
			CHECK(ucpx_tag_send_wait(ep, long_msg, sizeof long_msg, 0xA200, TIMEOUT));
			EXPECT(ucpx_tag_sendrecv(ep, out, 8, 0xA202, short_buf, sizeof short_buf, 0xA203, ~0ull, TIMEOUT, &got,
			                         &stag) == UCPX_ERR_TRUNCATED && got == sizeof long_msg && stag == 0xA203,
			       "a truncated reply: got %zu tag %#llx", got, (unsigned long long)stag);
		} else {
			EXPECT(ucpx_tag_recv_wait(worker, short_buf, sizeof short_buf, 0xA200, ~0ull, TIMEOUT, &got, &stag) ==
			               UCPX_ERR_TRUNCATED && got == sizeof long_msg && stag == 0xA200,
			       "a truncated message: got %zu tag %#llx", got, (unsigned long long)stag);
			CHECK(ucpx_tag_recv_wait(worker, short_buf, sizeof short_buf, 0xA202, ~0ull, TIMEOUT, NULL, NULL));
			CHECK(ucpx_tag_send_wait(ep, long_msg, sizeof long_msg, 0xA203, TIMEOUT));
		}
	}

	/* A reply that came while the send did not complete (4 MiB, not received before the
	 * 200 ms timeout): UCPX_ERR_SEND_INCOMPLETE with the reply's length and tag; the
	 * reply was lost before. The send then completes once the peer receives it. */
	{
		enum { HUGE = 4 << 20 };
		unsigned char *hout = calloc(1, HUGE), *hin = malloc(HUGE), reply[8] = "REPLY-16", r8[8];
		got = 0;
		stag = 0;
		if (rank == 0) {
			fill(hout, HUGE, 700);
			int rc = ucpx_tag_sendrecv(ep, hout, HUGE, 0xA300, r8, sizeof r8, 0xA301, ~0ull, 200, &got, &stag);
			EXPECT(rc == UCPX_ERR_SEND_INCOMPLETE && got == sizeof r8 && stag == 0xA301 && memcmp(r8, reply, 8) == 0,
			       "a reply while the send was pending: %s, got %zu tag %#llx", ucpx_strerror(rc), got,
			       (unsigned long long)stag);
			CHECK(ucpx_tag_recv_wait(worker, r8, sizeof r8, 0xA302, ~0ull, TIMEOUT, NULL, NULL)); /* progresses the send */
		} else {
			CHECK(ucpx_tag_send_wait(ep, reply, sizeof reply, 0xA301, TIMEOUT));
			usleep(500000);
			CHECK(ucpx_tag_recv_wait(worker, hin, HUGE, 0xA300, ~0ull, TIMEOUT, &got, NULL));
			EXPECT(got == HUGE, "the pending send: %zu", got);
			verify(hin, HUGE, 700, "the pending send");
			CHECK(ucpx_tag_send_wait(ep, reply, sizeof reply, 0xA302, TIMEOUT));
		}
		free(hout);
		free(hin);
	}

	/* What the blocking calls refuse, with the codes the Go path gives. */
	EXPECT(ucpx_tag_sendrecv(ep, out, 8, 1ull << 50, in, 8, 2, ~0ull, TIMEOUT, NULL, NULL) == UCPX_ERR_INVALID_PARAM,
	       "a tag above UCPX_MAX_TAG");
	EXPECT(ucpx_tag_send_wait(ep, NULL, 8, 1, TIMEOUT) == UCPX_ERR_INVALID_PARAM, "a NULL buffer");
	EXPECT(ucpx_tag_sendrecv(worker, out, 8, 1, in, 8, 2, ~0ull, TIMEOUT, NULL, NULL) == UCPX_ERR_INVALID_HANDLE,
	       "a worker as the endpoint");
	EXPECT(ucpx_tag_recv_wait(ep, in, 8, 1, ~0ull, TIMEOUT, NULL, NULL) == UCPX_ERR_INVALID_HANDLE,
	       "an endpoint as the worker");
	ucpx_handle_t ep2;
	CHECK(ucpx_ep_create(worker, peer_addr, 0, &ep2));
	CHECK(ucpx_ep_destroy(ep2));
	EXPECT(ucpx_tag_send_wait(ep2, out, 8, 1, TIMEOUT) == UCPX_ERR_INVALID_HANDLE, "a destroyed endpoint");
	EXPECT(ucpx_tag_sendrecv(ep2, out, 8, 1, in, 8, 2, ~0ull, TIMEOUT, NULL, NULL) == UCPX_ERR_INVALID_HANDLE,
	       "a destroyed endpoint");
}

/* RMA: each side exposes a region; rank 0 puts into rank 1's, rank 1 gets from rank
 * 0's; tag messages say when a side may look. */
static void rma(ucpx_handle_t context, const char *dir) {
	enum { R = 1 << 20 };
	unsigned char *region = malloc(R), *local = malloc(R);
	memset(region, 0, R);
	fill(region, R, 40 + rank); /* rank 0's region is what rank 1 gets */
	if (rank == 1) memset(region, 0, R);
	ucpx_handle_t mem, rkey, req;
	CHECK(ucpx_mem_map(context, region, R, UCPX_MEMORY_HOST, &mem));
	size_t need;
	EXPECT(ucpx_rkey_pack(mem, NULL, 0, &need) == UCPX_ERR_BUFFER_TOO_SMALL && need > 1, "rkey size query");
	char *packed = malloc(need);
	CHECK(ucpx_rkey_pack(mem, packed, need, NULL));
	publish(dir, "rkey", packed);
	char *peer = fetch(dir, "rkey");
	CHECK(ucpx_rkey_unpack(ep, peer, &rkey));
	uint64_t base;
	size_t len;
	CHECK(ucpx_rkey_region(rkey, &base, &len));
	EXPECT(len == R && base != 0, "region %#llx+%zu", (unsigned long long)base, len);
	unsigned char note[8];
	if (rank == 0) {
		fill(local, R, 77);
		CHECK(ucpx_put(ep, local, R / 2, base + R / 4, rkey, UCPX_MEMORY_HOST, 0, 0, &req));
		CHECK(ucpx_request_wait(req, TIMEOUT));
		CHECK(ucpx_request_free(req));
		CHECK(ucpx_ep_flush(ep, &req));
		CHECK(ucpx_request_wait(req, TIMEOUT));
		CHECK(ucpx_request_free(req));
		EXPECT(ucpx_put(ep, local, 16, base + R - 8, rkey, UCPX_MEMORY_HOST, 0, 0, &req) == UCPX_ERR_OUT_OF_RANGE,
		       "a put past the region");
		CHECK(ucpx_tag_send_wait(ep, note, sizeof note, 0x3000, TIMEOUT)); /* put done */
		/* Rank 1 gets from our region: keep it (and progress) until it says so. */
		CHECK(ucpx_tag_recv_wait(worker, note, sizeof note, 0x3001, ~0ull, TIMEOUT, NULL, NULL));
	} else {
		CHECK(ucpx_tag_recv_wait(worker, note, sizeof note, 0x3000, ~0ull, TIMEOUT, NULL, NULL));
		for (size_t i = 0; i < R; i++) {
			unsigned char want = (i >= R / 4 && i < R / 4 + R / 2) ? pattern(i - R / 4, 77) : 0;
			EXPECT(region[i] == want, "put: byte %zu is %u, want %u", i, region[i], want);
		}
		memset(local, 0, R);
		CHECK(ucpx_get(ep, local, R, base, rkey, UCPX_MEMORY_HOST, 0, 0, &req));
		CHECK(ucpx_request_wait(req, TIMEOUT));
		CHECK(ucpx_request_free(req));
		verify(local, R, 40, "get");
		CHECK(ucpx_tag_send_wait(ep, note, sizeof note, 0x3001, TIMEOUT));
	}
	CHECK(ucpx_rkey_destroy(rkey));
	CHECK(ucpx_mem_unmap(mem));
	free(packed);
	free(peer);
	free(region);
	free(local);
}

/* Prepared partitions: 3 iterations of an 8-partition send of 64 KiB. */
static void partitions(void) {
	enum { N = 65536, P = 8 };
	unsigned char *buf = malloc(N);
	ucpx_handle_t preq;
	if (rank == 0)
		CHECK(ucpx_psend_init(worker, ep, buf, N, P, 0x19, &preq));
	else
		CHECK(ucpx_precv_init(worker, ep, buf, N, P, 0x19, &preq));
	CHECK(ucpx_prepare_all(&preq, 1, TIMEOUT));
	for (int it = 0; it < 3; it++) {
		if (rank == 0) fill(buf, N, 200 + it);
		else memset(buf, 0, N);
		CHECK(ucpx_pstart(preq));
		if (it == 0) /* BUSY changes nothing: the handle stays usable */
			EXPECT(ucpx_pfree(preq) == UCPX_ERR_BUSY, "pfree with an iteration in flight");
		if (rank == 0) {
			for (int p = P - 1; p >= 0; p--) CHECK(ucpx_pready(preq, p));
		}
		CHECK(ucpx_pwait(preq, TIMEOUT));
		if (rank == 1) {
			int arrived;
			CHECK(ucpx_parrived(preq, P - 1, &arrived));
			EXPECT(arrived == 1, "partition %d not arrived after the wait", P - 1);
			verify(buf, N, 200 + it, "partitioned iteration");
		}
	}
	CHECK(ucpx_pfree(preq));
	free(buf);
}

/* Error codes and messages at the boundary. */
static void errors(ucpx_handle_t context) {
	char msg[256];
	ucpx_handle_t h;
	int rc;
	EXPECT(ucpx_worker_progress(0, NULL) == UCPX_ERR_INVALID_HANDLE, "handle 0");
	EXPECT(ucpx_last_error(msg, sizeof msg) > 0 && strstr(msg, "invalid handle") != NULL, "message: %s", msg);
	EXPECT(ucpx_ep_destroy(context) == UCPX_ERR_INVALID_HANDLE, "a context handle as an endpoint");
	EXPECT(ucpx_ep_create(worker, "not-hex", 0, &h) == UCPX_ERR_INVALID_ADDR, "a bad address string");
	rc = ucpx_ep_create(worker, "00ff", 0, &h); /* not sealed under our key, where there is one */
	EXPECT(rc == UCPX_ERR_INVALID_ADDR || rc == UCPX_ERR_AUTH, "an address that is not one: %s", ucpx_strerror(rc));
	EXPECT(ucpx_rkey_unpack(ep, "0011", &h) != UCPX_OK, "a bad remote key");
	EXPECT(ucpx_tag_send(ep, NULL, 8, 1, UCPX_MEMORY_HOST, 0, 0, &h) == UCPX_ERR_INVALID_PARAM, "NULL buffer");
	EXPECT(ucpx_tag_send(ep, msg, 8, 1, 99, 0, 0, &h) == UCPX_ERR_INVALID_PARAM, "memory type 99");
	EXPECT(ucpx_tag_send(ep, msg, 8, 1, UCPX_MEMORY_HOST, 0, UCPX_OP_NONBLOCKING_ENQUEUE, &h) == UCPX_ERR_INVALID_PARAM,
	       "non-blocking enqueue without a condition");
	EXPECT(ucpx_tag_recv_wait(worker, msg, 8, 0x7777, ~0ull, 50, NULL, NULL) == UCPX_ERR_TIMEOUT, "timeout");
	EXPECT(ucpx_cuda_condition_create(0, &h) == UCPX_ERR_INVALID_PARAM, "NULL stream");
	EXPECT(strcmp(ucpx_strerror(UCPX_ERR_TRUNCATED), "UCPX_ERR_TRUNCATED") == 0, "strerror");
	/* A message longer than the receive buffer. */
	unsigned char big[64] = {0}, small[8];
	if (rank == 0) {
		CHECK(ucpx_tag_send_wait(ep, big, sizeof big, 0x4000, TIMEOUT));
	} else {
		EXPECT(ucpx_tag_recv_wait(worker, small, sizeof small, 0x4000, ~0ull, TIMEOUT, NULL, NULL) == UCPX_ERR_TRUNCATED,
		       "truncated receive");
	}
	ucpx_handle_t req;
	CHECK(ucpx_tag_recv(worker, small, sizeof small, 0x5000, ~0ull, UCPX_MEMORY_HOST, 0, 0, &req));
	CHECK(ucpx_request_cancel(req));
	EXPECT(ucpx_request_wait(req, TIMEOUT) == UCPX_ERR_CANCELED, "canceled receive");
	CHECK(ucpx_request_free(req));
	EXPECT(ucpx_request_free(req) == UCPX_ERR_INVALID_HANDLE, "a freed request");
}

int main(int argc, char **argv) {
	if (argc != 3) {
		fprintf(stderr, "usage: %s RANK DIR\n", argv[0]);
		return 2;
	}
	rank = atoi(argv[1]);
	const char *dir = argv[2];
	ucpx_handle_t context;
	CHECK(ucpx_context_create(&context));
	CHECK(ucpx_worker_create(context, 0, &worker));
	size_t need;
	EXPECT(ucpx_worker_address(worker, NULL, 0, &need) == UCPX_ERR_BUFFER_TOO_SMALL, "size query");
	char *addr = malloc(need);
	CHECK(ucpx_worker_address(worker, addr, need, NULL));
	EXPECT(strlen(addr) + 1 == need, "address length");
	publish(dir, "addr", addr);
	char *peer = fetch(dir, "addr");
	CHECK(ucpx_ep_create(worker, peer, 0, &ep));

	tag_exchange();
	threads();
	blocking(peer);
	rma(context, dir);
	partitions();
	errors(context);

	/* Both sides are done before either closes its endpoint. */
	unsigned char bye[8] = {0};
	if (rank == 0) {
		CHECK(ucpx_tag_send_wait(ep, bye, sizeof bye, 0x6000, TIMEOUT));
		CHECK(ucpx_tag_recv_wait(worker, bye, sizeof bye, 0x6001, ~0ull, TIMEOUT, NULL, NULL));
	} else {
		CHECK(ucpx_tag_recv_wait(worker, bye, sizeof bye, 0x6000, ~0ull, TIMEOUT, NULL, NULL));
		CHECK(ucpx_tag_send_wait(ep, bye, sizeof bye, 0x6001, TIMEOUT));
	}
	CHECK(ucpx_ep_destroy(ep));
	CHECK(ucpx_worker_destroy(worker));
	EXPECT(ucpx_tag_recv_wait(worker, bye, sizeof bye, 1, ~0ull, TIMEOUT, NULL, NULL) == UCPX_ERR_INVALID_HANDLE,
	       "a destroyed worker");
	CHECK(ucpx_context_destroy(context));
	EXPECT(ucpx_context_destroy(context) == UCPX_ERR_INVALID_HANDLE, "a destroyed context");
	free(addr);
	free(peer);
	printf("OK rank %d\n", rank);
	return 0;
}

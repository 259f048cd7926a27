/*
 * nulls.c: every function of the C ABI called with handle 0, NULL pointers and zero
 * sizes, then with live handles and NULL (or bad) pointers, must return an error code
 * (never crash, never hang); the live handles must still work afterwards. Prints
 * "OK nulls" on success. One process: the endpoint connects to its own worker.
 */
#include <stdint.h>
#include <string.h>

#include "common.h"

#define FAILS(call) EXPECT((call) < 0, "an error code")

int main(void) {
	char buf[64];
	size_t n = 0;
	int i = 0;
	uint64_t u = 0;
	ucpx_handle_t h = 0;

	/* Handle 0 and NULL everywhere. */
	EXPECT(ucpx_strerror(0) != NULL && ucpx_strerror(12345) != NULL, "strerror");
	ucpx_last_error(NULL, 0);
	FAILS(ucpx_context_create(NULL));
	FAILS(ucpx_context_destroy(0));
	FAILS(ucpx_worker_create(0, 0, NULL));
	FAILS(ucpx_worker_create(0, 0, &h));
	FAILS(ucpx_worker_destroy(0));
	FAILS(ucpx_worker_address(0, NULL, 0, NULL));
	FAILS(ucpx_worker_progress(0, NULL));
	FAILS(ucpx_ep_create(0, NULL, 0, NULL));
	FAILS(ucpx_ep_destroy(0));
	FAILS(ucpx_mem_map(0, NULL, 0, 0, NULL));
	FAILS(ucpx_mem_unmap(0));
	FAILS(ucpx_rkey_pack(0, NULL, 0, NULL));
	FAILS(ucpx_rkey_unpack(0, NULL, NULL));
	FAILS(ucpx_rkey_region(0, NULL, NULL));
	FAILS(ucpx_rkey_destroy(0));
	FAILS(ucpx_cuda_condition_create(0, NULL));
	FAILS(ucpx_condition_record_event(0, 0));
	FAILS(ucpx_condition_destroy(0));
	FAILS(ucpx_tag_send(0, NULL, 0, 0, 0, 0, 0, NULL));
	FAILS(ucpx_tag_recv(0, NULL, 0, 0, 0, 0, 0, 0, NULL));
	FAILS(ucpx_put(0, NULL, 0, 0, 0, 0, 0, 0, NULL));
	FAILS(ucpx_get(0, NULL, 0, 0, 0, 0, 0, 0, NULL));
	FAILS(ucpx_ep_flush(0, NULL));
	FAILS(ucpx_tag_send_wait(0, NULL, 0, 0, 0));
	FAILS(ucpx_tag_recv_wait(0, NULL, 0, 0, 0, 0, NULL, NULL));
	FAILS(ucpx_tag_sendrecv(0, NULL, 0, 0, NULL, 0, 0, 0, 0, NULL, NULL));
	FAILS(ucpx_request_test(0, NULL));
	FAILS(ucpx_request_wait(0, 0));
	FAILS(ucpx_request_info(0, NULL, NULL));
	FAILS(ucpx_request_record_event(0, 0));
	FAILS(ucpx_request_cancel(0));
	FAILS(ucpx_request_free(0));
	FAILS(ucpx_psend_init(0, 0, NULL, 0, 0, 0, NULL));
	FAILS(ucpx_precv_init(0, 0, NULL, 0, 0, 0, NULL));
	FAILS(ucpx_prepare_all(NULL, 3, 0));
	FAILS(ucpx_pstart(0));
	FAILS(ucpx_pready(0, 0));
	FAILS(ucpx_parrived(0, 0, NULL));
	FAILS(ucpx_pwait(0, 0));
	FAILS(ucpx_pfree(0));

	/* Live handles, NULL or bad pointers and sizes. */
	ucpx_handle_t ctx = 0, worker = 0, ep = 0, mem = 0, rkey = 0, req = 0, rkey2 = 0;
	CHECK(ucpx_context_create(&ctx));
	FAILS(ucpx_worker_create(ctx, 0, NULL));
	CHECK(ucpx_worker_create(ctx, 0, &worker));
	FAILS(ucpx_worker_address(worker, NULL, 0, NULL));
	FAILS(ucpx_worker_address(worker, buf, 0, NULL));
	EXPECT(ucpx_worker_address(worker, NULL, 0, &n) == UCPX_ERR_BUFFER_TOO_SMALL && n > 0, "size query");
	char *addr = malloc(n);
	CHECK(ucpx_worker_address(worker, addr, n, NULL));
	CHECK(ucpx_worker_progress(worker, NULL));
	FAILS(ucpx_ep_create(worker, NULL, 0, &ep));
	FAILS(ucpx_ep_create(worker, "not an address", 0, &ep));
	FAILS(ucpx_ep_create(worker, addr, 0, NULL));
	CHECK(ucpx_ep_create(worker, addr, 0, &ep));
	FAILS(ucpx_mem_map(ctx, NULL, 64, 0, &mem));
	FAILS(ucpx_mem_map(ctx, buf, 0, 0, &mem));
	FAILS(ucpx_mem_map(ctx, buf, sizeof buf, 12345, &mem));
	FAILS(ucpx_mem_map(ctx, buf, sizeof buf, 0, NULL));
	CHECK(ucpx_mem_map(ctx, buf, sizeof buf, 0, &mem));
	FAILS(ucpx_rkey_pack(mem, NULL, 0, NULL));
	EXPECT(ucpx_rkey_pack(mem, NULL, 0, &n) == UCPX_ERR_BUFFER_TOO_SMALL && n > 0, "rkey size query");
	char *packed = malloc(n);
	CHECK(ucpx_rkey_pack(mem, packed, n, NULL));
	FAILS(ucpx_rkey_unpack(ep, NULL, &rkey));
	FAILS(ucpx_rkey_unpack(ep, "garbage", &rkey));
	FAILS(ucpx_rkey_unpack(ep, packed, NULL));
	CHECK(ucpx_rkey_unpack(ep, packed, &rkey));
	CHECK(ucpx_rkey_region(rkey, &u, &n));
	EXPECT(n == sizeof buf, "region of %zu bytes", n);
	req = 12345; /* a failed call leaves no stale handle behind */
	FAILS(ucpx_tag_send(ep, NULL, 8, 1, 0, 0, 0, &req));
	EXPECT(req == 0, "*request after a failed call: %llu", (unsigned long long)req);
	h = 12345;
	FAILS(ucpx_psend_init(worker, ep, buf, sizeof buf, 0, 9, &h));
	EXPECT(h == 0, "*request after a failed init: %llu", (unsigned long long)h);
	rkey2 = 12345;
	FAILS(ucpx_rkey_unpack(ep, "garbage", &rkey2));
	EXPECT(rkey2 == 0, "*rkey after a failed unpack: %llu", (unsigned long long)rkey2);
	FAILS(ucpx_tag_send(ep, buf, 8, 1, 0, 0, 0, NULL));
	FAILS(ucpx_tag_send(ep, buf, 8, 1, 99, 0, 0, &req));
	FAILS(ucpx_tag_recv(worker, NULL, 8, 1, ~0ull, 0, 0, 0, &req));
	FAILS(ucpx_tag_recv(worker, buf, 8, 1, ~0ull, 0, 0, 0, NULL));
	FAILS(ucpx_put(ep, buf, 8, u, rkey, 0, 0, 0, NULL));
	FAILS(ucpx_put(ep, buf, sizeof buf, u + 8, rkey, 0, 0, 0, &req)); /* past the region */
	FAILS(ucpx_get(ep, NULL, 8, u, rkey, 0, 0, 0, &req));
	FAILS(ucpx_ep_flush(ep, NULL));
	FAILS(ucpx_tag_recv_wait(worker, NULL, 8, 1, ~0ull, 10, NULL, NULL));
	EXPECT(ucpx_tag_recv_wait(worker, buf, 8, 0x55, ~0ull, 10, NULL, NULL) == UCPX_ERR_TIMEOUT, "timeout");
	FAILS(ucpx_tag_sendrecv(ep, NULL, 8, 1, buf, 8, 1, ~0ull, 10, NULL, NULL));
	FAILS(ucpx_tag_sendrecv(ep, buf, 8, 1, NULL, 8, 1, ~0ull, 10, NULL, NULL));
	FAILS(ucpx_psend_init(worker, ep, NULL, 64, 4, 9, &h));
	FAILS(ucpx_psend_init(worker, ep, buf, sizeof buf, 0, 9, &h));
	FAILS(ucpx_psend_init(worker, ep, buf, sizeof buf, -4, 9, &h));
	FAILS(ucpx_psend_init(worker, ep, buf, sizeof buf, 3, 9, &h)); /* 64 / 3 */
	FAILS(ucpx_psend_init(worker, ep, buf, sizeof buf, 4, 9, NULL));
	FAILS(ucpx_precv_init(worker, ep, buf, sizeof buf, 4, 9, NULL));
	ucpx_handle_t none[2] = {0, 0};
	FAILS(ucpx_prepare_all(none, 2, 10));
	FAILS(ucpx_prepare_all(none, (size_t)-1, 10)); /* a huge count: refused, not read */
	EXPECT(ucpx_tag_send_wait(ep, buf, (size_t)-1, 1, 10) == UCPX_ERR_INVALID_PARAM, "a length past INT64_MAX");
	EXPECT(ucpx_tag_recv_wait(worker, buf, (size_t)-1, 1, ~0ull, 10, NULL, NULL) == UCPX_ERR_INVALID_PARAM,
	       "a receive length past INT64_MAX");
	{
		/* A buffer whose range wraps around the address space is refused: before, it
		 * was taken for an empty one (tag_send and put returned UCPX_OK, moving 0
		 * bytes). The blocking calls check in C first (they take the Go path for it). */
		void *wrap = (void *)(uintptr_t)0xFFFFFFFFFFFFF000ull;
		size_t wn = 0x2000;
		req = 12345;
		EXPECT(ucpx_tag_send(ep, wrap, wn, 1, 0, 0, 0, &req) == UCPX_ERR_INVALID_PARAM && req == 0,
		       "tag_send of a wrapping buffer");
		EXPECT(ucpx_tag_recv(worker, wrap, wn, 1, ~0ull, 0, 0, 0, &req) == UCPX_ERR_INVALID_PARAM && req == 0,
		       "tag_recv into a wrapping buffer");
		EXPECT(ucpx_put(ep, wrap, wn, u, rkey, 0, 0, 0, &req) == UCPX_ERR_INVALID_PARAM && req == 0,
		       "put from a wrapping buffer");
		EXPECT(ucpx_get(ep, wrap, wn, u, rkey, 0, 0, 0, &req) == UCPX_ERR_INVALID_PARAM && req == 0,
		       "get into a wrapping buffer");
		h = 12345;
		EXPECT(ucpx_psend_init(worker, ep, wrap, wn, 4, 9, &h) == UCPX_ERR_INVALID_PARAM && h == 0,
		       "psend_init of a wrapping buffer");
		EXPECT(ucpx_precv_init(worker, ep, wrap, wn, 4, 9, &h) == UCPX_ERR_INVALID_PARAM && h == 0,
		       "precv_init of a wrapping buffer");
		EXPECT(ucpx_tag_send_wait(ep, wrap, wn, 1, 10) == UCPX_ERR_INVALID_PARAM, "tag_send_wait of a wrapping buffer");
		EXPECT(ucpx_tag_recv_wait(worker, wrap, wn, 1, ~0ull, 10, NULL, NULL) == UCPX_ERR_INVALID_PARAM,
		       "tag_recv_wait into a wrapping buffer");
		EXPECT(ucpx_tag_sendrecv(ep, wrap, wn, 1, buf, 8, 1, ~0ull, 10, NULL, NULL) == UCPX_ERR_INVALID_PARAM,
		       "tag_sendrecv of a wrapping buffer");
		EXPECT(ucpx_tag_sendrecv(ep, buf, 8, 1, wrap, wn, 1, ~0ull, 10, NULL, NULL) == UCPX_ERR_INVALID_PARAM,
		       "tag_sendrecv into a wrapping buffer");
	}
	{
		/* An output length past INT64_MAX is a large buffer, not a negative one:
		 * before, UCPX_ERR_BUFFER_TOO_SMALL. */
		size_t need = 0;
		EXPECT(ucpx_worker_address(worker, NULL, 0, &need) == UCPX_ERR_BUFFER_TOO_SMALL, "size query");
		char *out = malloc(need);
		EXPECT(ucpx_worker_address(worker, out, (size_t)1 << 63, NULL) == UCPX_OK, "worker address into 2^63 bytes");
		EXPECT(ucpx_worker_address(worker, out, (size_t)-1, NULL) == UCPX_OK && strlen(out) + 1 == need,
		       "worker address into SIZE_MAX bytes");
		free(out);
		EXPECT(ucpx_rkey_pack(mem, NULL, 0, &need) == UCPX_ERR_BUFFER_TOO_SMALL, "key size query");
		out = malloc(need);
		EXPECT(ucpx_rkey_pack(mem, out, (size_t)-1, NULL) == UCPX_OK, "rkey into SIZE_MAX bytes");
		free(out);
	}
	{
		/* A length past what a size_t - 1 fits in int: the message is copied whole. */
		static char big[4096];
		EXPECT(ucpx_last_error(big, (size_t)-1) > 0 && big[0] != 0, "last error with a huge length");
	}

	/* The live handles still work: a put into our own memory, a message to ourselves. */
	char src[8] = "payload";
	CHECK(ucpx_put(ep, src, sizeof src, u + 16, rkey, 0, 0, 0, &req));
	CHECK(ucpx_request_wait(req, 10000));
	CHECK(ucpx_request_free(req));
	CHECK(ucpx_ep_flush(ep, &req));
	CHECK(ucpx_request_wait(req, 10000));
	CHECK(ucpx_request_free(req));
	EXPECT(memcmp(buf + 16, "payload", 8) == 0, "the put landed");
	char in[8] = {0};
	CHECK(ucpx_tag_sendrecv(ep, src, sizeof src, 0x77, in, sizeof in, 0x77, ~0ull, 10000, &n, &u));
	EXPECT(n == 8 && u == 0x77 && memcmp(in, "payload", 8) == 0, "sendrecv to ourselves");
	(void)i;

	CHECK(ucpx_rkey_destroy(rkey));
	FAILS(ucpx_rkey_destroy(rkey));
	CHECK(ucpx_mem_unmap(mem));
	FAILS(ucpx_mem_unmap(mem));
	CHECK(ucpx_ep_destroy(ep));
	FAILS(ucpx_ep_destroy(ep));
	CHECK(ucpx_worker_destroy(worker));
	FAILS(ucpx_worker_progress(worker, NULL));
	CHECK(ucpx_context_destroy(ctx));
	FAILS(ucpx_context_destroy(ctx));

	/* A child whose parent was destroyed first was closed with it: destroying its
	 * handle frees it, without an error, once. */
	ucpx_handle_t ctx2, worker2;
	CHECK(ucpx_context_create(&ctx2));
	CHECK(ucpx_worker_create(ctx2, 0, &worker2));
	CHECK(ucpx_context_destroy(ctx2));
	/* Its worker was closed with it: progress says so (before, UCPX_OK and a count of
	 * 0 for good, and `while (ucpx_worker_progress(w, &n) == UCPX_OK)` never ended). */
	i = 7;
	EXPECT(ucpx_worker_progress(worker2, &i) == UCPX_ERR_CLOSED && i == 0, "progress on a closed worker: count %d", i);
	CHECK(ucpx_worker_destroy(worker2));
	FAILS(ucpx_worker_destroy(worker2));
	free(addr);
	free(packed);
	printf("OK nulls\n");
	return 0;
}

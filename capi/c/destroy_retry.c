/*
 * destroy_retry.c: a destroy call that times out keeps its handle, and calling it
 * again finishes the job (include/ucpx.h, UCPX_ERR_TIMEOUT). Two processes over tcp
 * (peer error handling), rank 1 leaving its worker unprogressed for a while, twice:
 *
 *  - ucpx_mem_unmap: rank 0 maps a region and packs its key, rank 1 (the importer)
 *    unpacks it; rank 0's unmap gets no acknowledgement within the revocation timeout
 *    (2 s): UCPX_ERR_TIMEOUT, the memory stays registered and the handle valid. Once
 *    the importer progresses again, the same call on the same handle succeeds and the
 *    importer's key is revoked. Before, the handle was gone after the timeout (the
 *    retry: UCPX_ERR_INVALID_HANDLE) and the memory stayed registered until the
 *    context was destroyed.
 *  - ucpx_ep_destroy: rank 0's flush gets no answer within 5 s: UCPX_ERR_TIMEOUT, the
 *    endpoint is closed (UCPX_ERR_CLOSED) and its handle valid; calling again releases
 *    it with UCPX_OK. Before, the handle was gone with the timeout.
 *
 * Run as `destroy_retry RANK DIR`; prints "OK destroy rank N".
 */
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

#include "common.h"

/* exists reports whether DIR/NAME.R was published. */
static int exists(const char *dir, const char *name, int r) {
	char path[4096];
	struct stat st;
	snprintf(path, sizeof path, "%s/%s.%d", dir, name, r);
	return stat(path, &st) == 0;
}

/* await waits (up to a minute) for the peer's NAME, progressing worker if it is not 0. */
static void await(const char *dir, const char *name, ucpx_handle_t worker) {
	for (int i = 0; i < 600000 && !exists(dir, name, 1 - rank); i++) {
		if (worker != 0) {
			CHECK(ucpx_worker_progress(worker, NULL));
		}
		usleep(100);
	}
	EXPECT(exists(dir, name, 1 - rank), "the peer's %s", name);
}

int main(int argc, char **argv) {
	EXPECT(argc == 3, "usage: destroy_retry RANK DIR");
	rank = atoi(argv[1]);
	const char *dir = argv[2];
	ucpx_handle_t ctx, worker, ep, mem, rkey, req;
	size_t n;
	static char region[4096];
	char src[8] = "payload";

	CHECK(ucpx_context_create(&ctx));
	CHECK(ucpx_worker_create(ctx, 0, &worker));
	EXPECT(ucpx_worker_address(worker, NULL, 0, &n) == UCPX_ERR_BUFFER_TOO_SMALL, "size query");
	char *addr = malloc(n);
	CHECK(ucpx_worker_address(worker, addr, n, NULL));
	publish(dir, "addr", addr);
	char *peer = fetch(dir, "addr");
	CHECK(ucpx_ep_create(worker, peer, 1, &ep));

	if (rank == 0) {
		CHECK(ucpx_mem_map(ctx, region, sizeof region, UCPX_MEMORY_HOST, &mem));
		EXPECT(ucpx_rkey_pack(mem, NULL, 0, &n) == UCPX_ERR_BUFFER_TOO_SMALL, "key size query");
		char *packed = malloc(n);
		CHECK(ucpx_rkey_pack(mem, packed, n, NULL));
		publish(dir, "rkey", packed);
		/* The importer's put and flush completed only once we progressed them, after
		 * its import notice (sent first on the same endpoint). */
		await(dir, "ready", worker);
		for (int i = 0; i < 1000; i++) {
			CHECK(ucpx_worker_progress(worker, NULL));
			usleep(100);
		}
		EXPECT(memcmp(region, "payload", 8) == 0, "the importer's put landed");

		int rc = ucpx_mem_unmap(mem);
		EXPECT(rc == UCPX_ERR_TIMEOUT, "ucpx_mem_unmap with the importer not progressing: %s", ucpx_strerror(rc));
		/* The handle is still valid (before: UCPX_ERR_INVALID_HANDLE); the region is
		 * being revoked, so no new key is packed from it. */
		rc = ucpx_rkey_pack(mem, packed, n, NULL);
		EXPECT(rc == UCPX_ERR_REVOKED, "ucpx_rkey_pack after the timed-out unmap: %s", ucpx_strerror(rc));
		publish(dir, "timedout", "x");
		/* The importer progresses again: the same handle, called again, finishes. */
		for (int i = 0; i < 5 && (rc = ucpx_mem_unmap(mem)) == UCPX_ERR_TIMEOUT; i++) {
		}
		if (rc != UCPX_OK) {
			char msg[512];
			ucpx_last_error(msg, sizeof msg);
			EXPECT(rc == UCPX_OK, "ucpx_mem_unmap again: %s: %s", ucpx_strerror(rc), msg);
		}
		EXPECT(ucpx_mem_unmap(mem) == UCPX_ERR_INVALID_HANDLE, "the handle released after UCPX_OK");
		publish(dir, "unmapped", "x");
		await(dir, "checked", worker);
		free(packed);

		/* The peer does not progress again (it waits for "epdone"). */
		rc = ucpx_ep_destroy(ep);
		EXPECT(rc == UCPX_ERR_TIMEOUT, "ucpx_ep_destroy with the peer not progressing: %s", ucpx_strerror(rc));
		rc = ucpx_tag_send_wait(ep, src, sizeof src, 1, 1000);
		EXPECT(rc == UCPX_ERR_CLOSED, "a send on the endpoint whose destroy timed out: %s", ucpx_strerror(rc));
		CHECK(ucpx_ep_destroy(ep));
		EXPECT(ucpx_ep_destroy(ep) == UCPX_ERR_INVALID_HANDLE, "the endpoint's handle released after UCPX_OK");
		publish(dir, "epdone", "x");
		await(dir, "bye", worker);
	} else {
		char *packed = fetch(dir, "rkey");
		CHECK(ucpx_rkey_unpack(ep, packed, &rkey));
		uint64_t base;
		CHECK(ucpx_rkey_region(rkey, &base, &n));
		CHECK(ucpx_put(ep, src, sizeof src, base, rkey, UCPX_MEMORY_HOST, 0, 0, &req));
		CHECK(ucpx_request_wait(req, 30000));
		CHECK(ucpx_request_free(req));
		CHECK(ucpx_ep_flush(ep, &req));
		CHECK(ucpx_request_wait(req, 30000));
		CHECK(ucpx_request_free(req));
		publish(dir, "ready", "x");
		await(dir, "timedout", 0); /* no progress: the revocation goes unanswered */
		await(dir, "unmapped", worker);
		int rc = ucpx_put(ep, src, sizeof src, base, rkey, UCPX_MEMORY_HOST, 0, 0, &req);
		EXPECT(rc == UCPX_ERR_REVOKED, "a put under the revoked key: %s", ucpx_strerror(rc));
		CHECK(ucpx_rkey_destroy(rkey));
		publish(dir, "checked", "x");
		free(packed);
		await(dir, "epdone", 0); /* no progress: rank 0's flush goes unanswered */
		rc = ucpx_ep_destroy(ep);
		if (rc == UCPX_ERR_TIMEOUT) {
			CHECK(ucpx_ep_destroy(ep));
		} else {
			CHECK(rc);
		}
		publish(dir, "bye", "x");
	}
	CHECK(ucpx_worker_destroy(worker));
	CHECK(ucpx_context_destroy(ctx));
	free(addr);
	free(peer);
	printf("OK destroy rank %d\n", rank);
	return 0;
}

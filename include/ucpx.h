/*
 * ucpx.h: the C ABI of ucpx (libucpx.so, built by `make libucpx`).
 *
 * ucpx is a Go library over UCX and CUDA; this header is how C, C++ and Python
 * (python/ucpx.py, through ctypes) use it: wire-up by worker address strings,
 * registered memory and remote keys, tag send/receive, put/get, operations
 * conditioned on a caller's raw CUDA stream (a framework's, e.g.
 * torch.cuda.current_stream().cuda_stream), completion events for streams the
 * library never sees, and prepared partitioned operations.
 *
 * Conventions
 *
 *  - Handles are integers (ucpx_handle_t). 0 is never a valid handle. No Go
 *    pointer ever crosses the boundary; every pointer argument is the caller's
 *    memory, read or written only during the call unless documented otherwise
 *    (message buffers stay in use until their request completes).
 *  - Every call is safe from any thread, concurrently.
 *  - Every int-returning call returns UCPX_OK (0) or a negative ucpx_status code. After a
 *    failed call, ucpx_last_error copies a message for it (per calling thread);
 *    ucpx_strerror names a code.
 *  - Buffers passed as void* are never written by sends and puts (the ABI has no
 *    const qualifiers: the header is checked against the Go exports by the compiler).
 *  - A handle of the wrong kind, or one already destroyed, gives
 *    UCPX_ERR_INVALID_HANDLE. Destroying a parent (context, worker) closes its
 *    children in the library; their handles must still be destroyed to be freed
 *    (which then returns UCPX_OK).
 *  - A destroy call (ucpx_*_destroy, ucpx_mem_unmap, ucpx_request_free, ucpx_pfree)
 *    that returns UCPX_ERR_BUSY or UCPX_ERR_TIMEOUT released nothing: the handle
 *    stays valid, and the caller calls it again (it returns UCPX_OK once done). After
 *    any other result the handle is released (ucpx_condition_destroy names one more
 *    case where it stays).
 *  - libcuda is opened at run time (dlopen), never linked; host-only programs need
 *    no GPU and no driver. CUDA streams and events are passed as uintptr_t (a
 *    CUstream is a cudaStream_t, a CUevent a cudaEvent_t).
 */
#ifndef UCPX_H
#define UCPX_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A handle on a library object. 0 is never valid. */
typedef uint64_t ucpx_handle_t;

/* Status codes: UCPX_OK or a negative error. */
typedef enum {
	UCPX_OK = 0,
	UCPX_ERR_INVALID_PARAM = -1,  /* a bad argument; nothing was done */
	UCPX_ERR_INVALID_HANDLE = -2, /* 0, unknown, destroyed, or a handle of another kind */
	UCPX_ERR_UNSUPPORTED = -3,    /* not available here (transport, device, feature) */
	UCPX_ERR_CLOSED = -4,         /* the object (or its worker, context) was closed */
	UCPX_ERR_TIMEOUT = -5,        /* the call's timeout passed; the operation goes on (a
	                               * destroy call's handle stays valid: call it again) */
	UCPX_ERR_PEER_FAILED = -6,    /* the peer failed or is unreachable */
	UCPX_ERR_CANCELED = -7,       /* the operation was canceled */
	UCPX_ERR_TRUNCATED = -8,      /* the received message is longer than the buffer */
	UCPX_ERR_OUT_OF_RANGE = -9,   /* an RMA range outside the remote region */
	UCPX_ERR_INVALID_ADDR = -10,  /* a worker address or remote key that is not one */
	UCPX_ERR_BUSY = -11,          /* the object still has work in flight; nothing changed */
	UCPX_ERR_BUFFER_TOO_SMALL = -12, /* the output buffer is too small; *needed says how big */
	UCPX_ERR_NO_DEVICE = -13,     /* no CUDA driver or device */
	UCPX_ERR_AUTH = -14,          /* a peer's address or remote key is not sealed under our auth key */
	UCPX_ERR_REVOKED = -15,       /* the remote key was revoked by its owner (its memory unmapped) */
	UCPX_ERR_SEND_INCOMPLETE = -16, /* ucpx_tag_sendrecv: the reply was received, the send did not
	                               * complete (timeout or failure: see ucpx_last_error) */
	UCPX_ERR_OTHER = -100         /* anything else (see ucpx_last_error) */
} ucpx_status;

/* Memory types of buffers (ucs_memory_type_t values). */
enum {
	UCPX_MEMORY_UNKNOWN = -1, /* let UCX detect it */
	UCPX_MEMORY_HOST = 0,
	UCPX_MEMORY_CUDA = 1,
	UCPX_MEMORY_CUDA_MANAGED = 2
};

/* Flags of ucpx_worker_create. */
enum {
	/* The worker gets a thread of its own that progresses it: a process that is only
	 * the target of RMA, or whose CUDA streams or graphs trigger operations with no host
	 * call, then needs no progress loop. */
	UCPX_WORKER_PROGRESS_THREAD = 1,
	/* No event fd: waits poll for as long as they wait and never sleep (the lowest
	 * latency, a core per waiting thread), as ucx_perftest and `ucpx perf` run. */
	UCPX_WORKER_NO_WAKEUP = 2
};

/* Flags of the operations (tag send/recv, put, get). */
enum {
	/* With a condition: enqueue only the trigger, the stream does not wait for the
	 * completion (order other work after it with ucpx_request_record_event). */
	UCPX_OP_NONBLOCKING_ENQUEUE = 1
};

/* ---- Errors ---------------------------------------------------------------- */

/* ucpx_strerror returns a static name for code ("UCPX_ERR_TIMEOUT"). */
const char *ucpx_strerror(int code);

/* ucpx_last_error copies into buf (len bytes, NUL-terminated, truncated to fit)
 * the message of the last call that failed on the calling thread, "" if none, and
 * returns the message's full length (excluding the NUL). buf may be NULL with len 0. */
size_t ucpx_last_error(char *buf, size_t len);

/* ---- Context and worker ---------------------------------------------------- */

/* ucpx_context_create makes a UCX context (tag, RMA, atomics, wakeup); UCX_*
 * environment variables configure it, and UCPX_AUTH_KEY_FILE names the auth key file
 * (`ucpx keygen`) that seals worker addresses and remote keys between peers. */
int ucpx_context_create(ucpx_handle_t *context);
int ucpx_context_destroy(ucpx_handle_t context);

/* ucpx_worker_create makes a worker of context; flags: UCPX_WORKER_* values. */
int ucpx_worker_create(ucpx_handle_t context, int flags, ucpx_handle_t *worker);
int ucpx_worker_destroy(ucpx_handle_t worker);

/* ucpx_worker_address writes the worker's address as a NUL-terminated string (hex)
 * into buf of len bytes; *needed (if not NULL) receives the size buf needs,
 * including the NUL. A peer passes the string to ucpx_ep_create. */
int ucpx_worker_address(ucpx_handle_t worker, char *buf, size_t len, size_t *needed);

/* ucpx_worker_progress runs one round of progress; *count (if not NULL) receives the
 * number of completions it made. Waits progress by themselves; a process that is
 * only the target of RMA calls it (or uses UCPX_WORKER_PROGRESS_THREAD). A worker
 * closed with its context gives UCPX_ERR_CLOSED (and *count 0), so a loop
 * `while (ucpx_worker_progress(w, &n) == UCPX_OK)` ends. */
int ucpx_worker_progress(ucpx_handle_t worker, int *count);

/* ---- Endpoints --------------------------------------------------------------- */

/* ucpx_ep_create connects worker to the peer worker whose address string (from the
 * peer's ucpx_worker_address) is address. flags: 1 = peer error handling (a failed
 * peer fails the endpoint's operations with UCPX_ERR_PEER_FAILED; UCX then selects
 * only tcp), 0 = none (shared memory allowed).
 *
 * Memory kept for good: every endpoint and worker handle keeps about 56 bytes until
 * the process exits, after its destroy too: the 40-byte record the blocking tag calls
 * reach it by (never freed, so that a call racing with the destroy finds it retired
 * rather than freed) and its 8-byte slot in the table of records (allocated 8 KiB per
 * 1024 handles). A program that creates and destroys a million endpoints keeps about
 * 56 MB; one that keeps its endpoints keeps nothing more. The table has slots for the
 * first 4,194,303 worker and endpoint handles of the process (counted together; at
 * most 32 MiB): the blocking calls on later ones always take the library's Go path
 * (the same results, a little slower), and their records still take 48 bytes each. */
int ucpx_ep_create(ucpx_handle_t worker, char *address, int flags, ucpx_handle_t *ep);

/* ucpx_ep_destroy flushes and closes the endpoint, waiting at most 5 s for the
 * flush. UCPX_ERR_TIMEOUT: the flush did not finish (the peer is dead or does not
 * progress); the endpoint is closed all the same (operations on it fail with
 * UCPX_ERR_CLOSED) and UCX's close goes on, but the handle stays valid, as for every
 * destroy call that times out: calling ucpx_ep_destroy again releases it and returns
 * UCPX_OK at once (it does not wait again). */
int ucpx_ep_destroy(ucpx_handle_t ep);

/* ---- Memory and remote keys ---------------------------------------------------- */

/* ucpx_mem_map registers len bytes at addr (host or device memory, mem_type a
 * UCPX_MEMORY_* value) for RMA; the memory stays the caller's and must outlive the
 * handle. */
int ucpx_mem_map(ucpx_handle_t context, void *addr, size_t len, int mem_type, ucpx_handle_t *mem);

/* ucpx_mem_unmap revokes the remote keys packed from mem (peers that unpacked one get
 * UCPX_ERR_REVOKED from then on) and deregisters the memory once every importer
 * acknowledged or failed. UCPX_ERR_TIMEOUT: an importer did neither within 2 s (it
 * does not progress its worker); the memory stays registered (the importer may still
 * write it), the handle stays valid, and the caller calls ucpx_mem_unmap again
 * (UCPX_OK once the importers answered) before it reuses or frees the memory. */
int ucpx_mem_unmap(ucpx_handle_t mem);

/* ucpx_rkey_pack writes the remote key of mem as a NUL-terminated string (hex),
 * with *needed as for ucpx_worker_address. The key carries the region's base address
 * and length (ucpx_rkey_region), so the peer needs nothing else. */
int ucpx_rkey_pack(ucpx_handle_t mem, char *buf, size_t len, size_t *needed);

/* ucpx_rkey_unpack makes a remote key for ep from a packed key string. Garbage gives
 * UCPX_ERR_INVALID_PARAM or UCPX_ERR_INVALID_ADDR, never a crash. */
int ucpx_rkey_unpack(ucpx_handle_t ep, char *packed, ucpx_handle_t *rkey);

/* ucpx_rkey_region gives the remote region's base address and length. */
int ucpx_rkey_region(ucpx_handle_t rkey, uint64_t *base, size_t *len);
int ucpx_rkey_destroy(ucpx_handle_t rkey);

/* ---- Conditions on a caller's CUDA stream ----------------------------------------- */

/* ucpx_cuda_condition_create makes a stream condition on the raw CUstream (or
 * cudaStream_t) stream, e.g. torch.cuda.current_stream().cuda_stream: an operation
 * given the condition starts when the stream reaches the point of the call, and
 * later work on the stream waits for its completion (unless
 * UCPX_OP_NONBLOCKING_ENQUEUE). The stream must be a stream of device 0's primary
 * context (the CUDA runtime's context); it is borrowed, never destroyed. */
int ucpx_cuda_condition_create(uintptr_t stream, ucpx_handle_t *condition);

/* ucpx_condition_record_event records the raw CUevent (cudaEvent_t) event on the
 * condition's stream at a point reached only once every operation armed on the
 * condition so far has completed; any stream may then cuStreamWaitEvent on it. */
int ucpx_condition_record_event(ucpx_handle_t condition, uintptr_t event);

/* ucpx_condition_destroy fails with UCPX_ERR_BUSY while operations are pending. After
 * BUSY, or another error after which the condition still exists (its stream could not
 * be synchronized), the handle stays valid for another call. */
int ucpx_condition_destroy(ucpx_handle_t condition);

/* ---- Operations -------------------------------------------------------------------- */

/* Each operation returns a request handle in *request (never 0 on success), even when
 * the operation completed in place. condition is 0 for none, else a condition handle;
 * flags are UCPX_OP_* values; mem_type describes buf. buf must stay valid until the
 * request completes. A call that fails sets *request to 0 (every call with a handle
 * output does), except one that enqueued its operation on a condition's stream and then
 * failed at a later step: the operation runs, and *request is its handle, to wait on
 * and free as any other (buf is in use until it completes). */
/* Tags are at most UCPX_MAX_TAG (48 bits: the top 16 carry the sender's source id, which
 * the receiver's unmatched-data limit charges); a larger tag is UCPX_ERR_INVALID_PARAM.
 * Masks may have any bits set. */
#define UCPX_MAX_TAG ((1ull << 48) - 1)
int ucpx_tag_send(ucpx_handle_t ep, void *buf, size_t len, uint64_t tag, int mem_type,
                  ucpx_handle_t condition, int flags, ucpx_handle_t *request);
int ucpx_tag_recv(ucpx_handle_t worker, void *buf, size_t len, uint64_t tag, uint64_t mask,
                  int mem_type, ucpx_handle_t condition, int flags, ucpx_handle_t *request);

/* RMA: len bytes between buf and the remote address raddr under rkey (the range must
 * lie in the rkey's region: UCPX_ERR_OUT_OF_RANGE). A put is complete at the target
 * after ucpx_ep_flush. */
int ucpx_put(ucpx_handle_t ep, void *buf, size_t len, uint64_t raddr, ucpx_handle_t rkey,
             int mem_type, ucpx_handle_t condition, int flags, ucpx_handle_t *request);
int ucpx_get(ucpx_handle_t ep, void *buf, size_t len, uint64_t raddr, ucpx_handle_t rkey,
             int mem_type, ucpx_handle_t condition, int flags, ucpx_handle_t *request);

/* ucpx_ep_flush completes every RMA operation of ep at its target. */
int ucpx_ep_flush(ucpx_handle_t ep, ucpx_handle_t *request);

/* Blocking tag calls: one call posts the operation and waits for it, with no request
 * handle (the low-latency path: a ping-pong's round trip is one call). Host memory;
 * buffers may be reused once the call returns. timeout_ms < 0 waits forever, else
 * UCPX_ERR_TIMEOUT (a receive is then canceled; a send may still be in flight).
 * length and sender_tag may be NULL; they are set on UCPX_OK and on UCPX_ERR_TRUNCATED
 * (then the message's length). ucpx_tag_sendrecv sends sbuf, then receives the
 * reply into rbuf; a reply that arrived while the send did not complete (the timeout
 * passed, or the send failed) is returned all the same: UCPX_ERR_SEND_INCOMPLETE, with
 * length and sender_tag set (the send may still be in flight after a timeout). A call whose operations complete within its spin (a ping-pong's
 * round trip usually does) runs in C alone; the worker is then busy for other threads
 * only while the call runs, as for any call on it. */
int ucpx_tag_send_wait(ucpx_handle_t ep, void *buf, size_t len, uint64_t tag, int timeout_ms);
int ucpx_tag_recv_wait(ucpx_handle_t worker, void *buf, size_t len, uint64_t tag, uint64_t mask,
                       int timeout_ms, size_t *length, uint64_t *sender_tag);
int ucpx_tag_sendrecv(ucpx_handle_t ep, void *sbuf, size_t slen, uint64_t stag, void *rbuf, size_t rlen,
                      uint64_t rtag, uint64_t rmask, int timeout_ms, size_t *length, uint64_t *sender_tag);

/* ---- Requests ----------------------------------------------------------------------- */

/* ucpx_request_test runs one round of progress if needed; *done receives 1 once the
 * request completed; the return value is then its result (UCPX_OK or the error). */
int ucpx_request_test(ucpx_handle_t request, int *done);

/* ucpx_request_wait waits until the request completed (driving progress) and returns
 * its result; timeout_ms < 0 waits forever, else UCPX_ERR_TIMEOUT once it passes (the
 * operation goes on). */
int ucpx_request_wait(ucpx_handle_t request, int timeout_ms);

/* ucpx_request_info gives, once completed, the received length and the sender's tag
 * of a tag receive (either pointer may be NULL); UCPX_ERR_BUSY while it is pending. */
int ucpx_request_info(ucpx_handle_t request, size_t *length, uint64_t *sender_tag);

/* ucpx_request_record_event records the raw CUevent event on the stream of the
 * request's condition, at a point reached only once the operation completed (MPICH
 * #7612: a framework records right after the enqueue and hands the event to other
 * streams). UCPX_ERR_INVALID_PARAM for a request without a condition. */
int ucpx_request_record_event(ucpx_handle_t request, uintptr_t event);

/* ucpx_request_cancel asks for cancellation; the request then completes with
 * UCPX_ERR_CANCELED (or its real result if it completed first). */
int ucpx_request_cancel(ucpx_handle_t request);

/* ucpx_request_free releases the handle; a pending operation still runs to completion
 * (its buffer stays in use until then). */
int ucpx_request_free(ucpx_handle_t request);

/* ---- Prepared partitioned operations (MPI 4 partitioned communication) ---------------- */

/* ucpx_psend_init / ucpx_precv_init make a persistent partitioned send of buf (len
 * bytes in `partitions` equal parts) to ep's peer, or receive from it, matched by tag
 * and order of init. Host memory. The result is a partitioned-request handle. */
int ucpx_psend_init(ucpx_handle_t worker, ucpx_handle_t ep, void *buf, size_t len, int partitions,
                    uint64_t tag, ucpx_handle_t *preq);
int ucpx_precv_init(ucpx_handle_t worker, ucpx_handle_t ep, void *buf, size_t len, int partitions,
                    uint64_t tag, ucpx_handle_t *preq);

/* ucpx_prepare_all prepares the n requests in preqs together (one exchange with each
 * peer), waiting at most timeout_ms (< 0: forever). The first ucpx_pstart does it too. */
int ucpx_prepare_all(ucpx_handle_t *preqs, size_t n, int timeout_ms);

/* ucpx_pstart starts an iteration; ucpx_pready(p) makes sender partition p ready
 * (it moves as soon as the receiver started the iteration); ucpx_parrived sets
 * *arrived to 1 once receive partition p is in; ucpx_pwait waits for the iteration. */
int ucpx_pstart(ucpx_handle_t preq);
int ucpx_pready(ucpx_handle_t preq, int partition);
int ucpx_parrived(ucpx_handle_t preq, int partition, int *arrived);
int ucpx_pwait(ucpx_handle_t preq, int timeout_ms);
int ucpx_pfree(ucpx_handle_t preq);

#ifdef __cplusplus
}
#endif

#endif /* UCPX_H */

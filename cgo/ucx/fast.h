/* Blocking tag calls for callers outside Go (the C ABI, capi/libucpx). A C thread
 * that calls ucpx_tag_sendrecv should not have to enter Go when the round trip
 * completes inside the call, which is what a ping-pong does: it takes the worker's
 * owner word, checks that its record is still usable, runs the same fused glue call
 * as Go's blocking calls, and returns. Anything Go must see (an operation still
 * pending, an error, a pulled message, other completions reaped or events queued)
 * makes the call return UCPXU_FAST_GO with the worker still held: the caller then
 * enters Go, whose resume takes over the result and the worker.
 *
 * A record (ucpxu_fast_t) stands for one worker or endpoint shared with C. Go makes it
 * and retires it (endpoint closed or failed, worker closed) while holding the owner
 * word; records and a shared worker's words are never freed, so a C caller with a
 * stale record finds it retired rather than freed. Included without UCX's headers. */
#ifndef UCPX_FAST_H
#define UCPX_FAST_H

#include <stddef.h>
#include <stdint.h>

typedef struct ucpxu_fast  ucpxu_fast_t;
typedef struct ucpxu_share ucpxu_share_t;

enum {
    UCPXU_FAST_DONE = 0, /* completed, nothing for Go to do */
    UCPXU_FAST_GO   = 1, /* posted; the worker is still held: resume in Go with *ret */
    UCPXU_FAST_NONE = 2  /* nothing posted and nothing held: take the Go path */
};

/* Each returns one of the above. *ret is the glue call's status pointer (GO only);
 * *len and *sender_tag the received message (DONE only). */
int ucpxu_fast_tag_send_recv(ucpxu_fast_t *f, void *sbuf, size_t slen, uint64_t stag,
                             void *rbuf, size_t rlen, uint64_t rtag, uint64_t rmask,
                             size_t *len, uint64_t *sender_tag, void **ret);
int ucpxu_fast_tag_send(ucpxu_fast_t *f, void *buf, size_t len, uint64_t tag, void **ret);
int ucpxu_fast_tag_recv(ucpxu_fast_t *f, void *buf, size_t len, uint64_t tag, uint64_t mask,
                        size_t *rlen, uint64_t *sender_tag, void **ret);

#endif

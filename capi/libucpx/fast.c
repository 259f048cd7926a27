/* The blocking tag calls: in C while they complete inside the call (a ping-pong's
 * round trip), in Go otherwise. See cgo/ucx/fast.h. */
#include <stdlib.h>

#include "_cgo_export.h"
#include "fast.h"
#include "internal.h"

/* Records by handle: handles of workers and endpoints carry UCPXC_FAST_BIT above an
 * index, which picks a chunk and a slot. Chunks are installed once and never freed,
 * so a lookup takes no lock; a handle past the table simply takes the Go path. */
#define CHUNK  1024
#define CHUNKS 4096

static ucpxu_fast_t **chunks[CHUNKS];

static inline ucpxu_fast_t **slot(uint64_t h, int make)
{
    uint64_t i = h & ~UCPXC_FAST_BIT;
    ucpxu_fast_t **c;
    if (!(h & UCPXC_FAST_BIT) || i / CHUNK >= CHUNKS) {
        return NULL;
    }
    c = __atomic_load_n(&chunks[i / CHUNK], __ATOMIC_ACQUIRE);
    if (c == NULL && make) {
        ucpxu_fast_t **n = calloc(CHUNK, sizeof(*n)), **none = NULL;
        if (n == NULL) {
            return NULL;
        }
        if (__atomic_compare_exchange_n(&chunks[i / CHUNK], &none, n, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            c = n;
        } else {
            free(n);
            c = none;
        }
    }
    return c == NULL ? NULL : &c[i % CHUNK];
}

void ucpxc_fast_set(uint64_t h, void *rec)
{
    ucpxu_fast_t **s = slot(h, rec != NULL);
    if (s != NULL) {
        __atomic_store_n(s, (ucpxu_fast_t *)rec, __ATOMIC_RELEASE);
    }
}

static inline ucpxu_fast_t *lookup(uint64_t h)
{
    ucpxu_fast_t **s = slot(h, 0);
    return s == NULL ? NULL : __atomic_load_n(s, __ATOMIC_ACQUIRE);
}

int ucpx_tag_send_wait(ucpx_handle_t eh, void *buf, size_t len, uint64_t tag, int timeout_ms)
{
    ucpxu_fast_t *f = lookup(eh);
    void *ret;
    if (f != NULL) {
        switch (ucpxu_fast_tag_send(f, buf, len, tag, &ret)) {
        case UCPXU_FAST_DONE:
            return UCPX_OK;
        case UCPXU_FAST_GO:
            return ucpxi_tag_send_resume(f, ret, buf, len, tag, timeout_ms);
        }
    }
    return ucpxi_tag_send_wait(eh, buf, len, tag, timeout_ms);
}

int ucpx_tag_recv_wait(ucpx_handle_t wh, void *buf, size_t len, uint64_t tag, uint64_t mask,
                       int timeout_ms, size_t *length, uint64_t *sender_tag)
{
    ucpxu_fast_t *f = lookup(wh);
    size_t n;
    uint64_t t;
    void *ret;
    if (f != NULL) {
        switch (ucpxu_fast_tag_recv(f, buf, len, tag, mask, &n, &t, &ret)) {
        case UCPXU_FAST_DONE:
            if (length != NULL) {
                *length = n;
            }
            if (sender_tag != NULL) {
                *sender_tag = t;
            }
            return UCPX_OK;
        case UCPXU_FAST_GO:
            return ucpxi_tag_recv_resume(f, ret, buf, len, tag, mask, timeout_ms, length,
                                         sender_tag);
        }
    }
    return ucpxi_tag_recv_wait(wh, buf, len, tag, mask, timeout_ms, length, sender_tag);
}

int ucpx_tag_sendrecv(ucpx_handle_t eh, void *sbuf, size_t slen, uint64_t stag, void *rbuf,
                      size_t rlen, uint64_t rtag, uint64_t rmask, int timeout_ms, size_t *length,
                      uint64_t *sender_tag)
{
    ucpxu_fast_t *f = lookup(eh);
    size_t n;
    uint64_t t;
    void *ret;
    if (f != NULL) {
        switch (ucpxu_fast_tag_send_recv(f, sbuf, slen, stag, rbuf, rlen, rtag, rmask, &n, &t,
                                         &ret)) {
        case UCPXU_FAST_DONE:
            if (length != NULL) {
                *length = n;
            }
            if (sender_tag != NULL) {
                *sender_tag = t;
            }
            return UCPX_OK;
        case UCPXU_FAST_GO:
            return ucpxi_tag_sendrecv_resume(f, ret, sbuf, slen, stag, rbuf, rlen, rtag, rmask,
                                             timeout_ms, length, sender_tag);
        }
    }
    return ucpxi_tag_sendrecv(eh, sbuf, slen, stag, rbuf, rlen, rtag, rmask, timeout_ms, length,
                              sender_tag);
}

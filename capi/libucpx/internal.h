/* internal.h: the Go exports of libucpx.so that only its own C code calls (fast.c):
 * the Go paths of the blocking tag calls and their resumes. Not part of the ABI. */
#ifndef UCPX_INTERNAL_H
#define UCPX_INTERNAL_H

#include "ucpx.h"

/* The blocking calls entirely in Go: where no record reaches the handle, or the
 * fast call could not take the worker (UCPXU_FAST_NONE). */
int ucpxi_tag_send_wait(ucpx_handle_t ep, void *buf, size_t len, uint64_t tag, int timeout_ms);
int ucpxi_tag_recv_wait(ucpx_handle_t worker, void *buf, size_t len, uint64_t tag, uint64_t mask,
                        int timeout_ms, size_t *length, uint64_t *sender_tag);
int ucpxi_tag_sendrecv(ucpx_handle_t ep, void *sbuf, size_t slen, uint64_t stag, void *rbuf,
                       size_t rlen, uint64_t rtag, uint64_t rmask, int timeout_ms, size_t *length,
                       uint64_t *sender_tag);

/* Resumes of a fast call that returned UCPXU_FAST_GO: rec is its record, ret the
 * status pointer it returned; the worker is still held and Go lets it go. */
int ucpxi_tag_send_resume(void *rec, void *ret, void *buf, size_t len, uint64_t tag, int timeout_ms);
int ucpxi_tag_recv_resume(void *rec, void *ret, void *buf, size_t len, uint64_t tag, uint64_t mask,
                          int timeout_ms, size_t *length, uint64_t *sender_tag);
int ucpxi_tag_sendrecv_resume(void *rec, void *ret, void *sbuf, size_t slen, uint64_t stag,
                              void *rbuf, size_t rlen, uint64_t rtag, uint64_t rmask,
                              int timeout_ms, size_t *length, uint64_t *sender_tag);

/* The table from handles to records (fast.c): handles with UCPXC_FAST_BIT index it. */
#define UCPXC_FAST_BIT (1ull << 62)
void ucpxc_fast_set(uint64_t handle, void *rec);

#endif

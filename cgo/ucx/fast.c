#include "glue.h"

#include <stdlib.h>
#include <time.h>

struct ucpxu_fast {
    ucpxu_share_t  *share;
    ucpxu_worker_t *w;  /* valid while usable */
    uintptr_t       ep; /* ucp_ep_h; 0 for a worker's record */
    uintptr_t       go; /* the Go object's handle (runtime/cgo.Handle), valid while usable */
    unsigned        spins;
    uint32_t        usable; /* written under the owner word */
};

uint32_t *ucpxu_share_keep(ucpxu_worker_t *w)
{
    w->share->kept = 1;
    return &w->share->owner;
}

ucpxu_fast_t *ucpxu_fast_new(ucpxu_worker_t *w, uintptr_t ep, uintptr_t go, unsigned spins)
{
    ucpxu_fast_t *f = calloc(1, sizeof(*f));
    if (f == NULL) {
        return NULL;
    }
    f->share = w->share;
    f->w = w;
    f->ep = ep;
    f->go = go;
    f->spins = spins;
    __atomic_store_n(&f->usable, 1, __ATOMIC_RELEASE);
    return f;
}

void ucpxu_fast_retire(ucpxu_fast_t *f) { __atomic_store_n(&f->usable, 0, __ATOMIC_RELEASE); }

uintptr_t ucpxu_fast_go(ucpxu_fast_t *f) { return f->go; }

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* How long a C caller waits for a worker someone else holds before it takes the Go
 * path, which parks instead of spinning. Holders that spin let go within one progress
 * call once yield is set. */
#define FAST_LOCK_NS 20000

static inline int take(uint32_t *owner)
{
    return __atomic_load_n(owner, __ATOMIC_RELAXED) == 0 &&
           !__atomic_exchange_n(owner, 1, __ATOMIC_ACQUIRE);
}

static inline void let_go(ucpxu_fast_t *f)
{
    __atomic_store_n(&f->share->owner, 0, __ATOMIC_RELEASE);
}

/* lock takes f's worker, if f is still usable. */
static int lock(ucpxu_fast_t *f)
{
    ucpxu_share_t *s = f->share;
    if (!take(&s->owner)) {
        int64_t deadline = now_ns() + FAST_LOCK_NS;
        int got = 0;
        unsigned i;
        __atomic_add_fetch(&s->yield, 1, __ATOMIC_RELAXED);
        for (i = 1; !got; i++) {
            got = take(&s->owner);
            if (!got && (i & 63) == 0 && now_ns() > deadline) {
                break;
            }
            cpu_relax();
        }
        __atomic_sub_fetch(&s->yield, 1, __ATOMIC_RELAXED);
        if (!got) {
            return 0;
        }
    }
    if (!__atomic_load_n(&f->usable, __ATOMIC_ACQUIRE)) {
        let_go(f);
        return 0;
    }
    return 1;
}

/* quiet: the call left Go nothing to handle (no other completion reaped, no event
 * queued). */
static inline int quiet(const ucpxu_worker_t *w)
{
    return w->nreaped == 0 && w->ndone == 0 && w->nevents == 0;
}

static inline int tag_ok(uint64_t tag) { return (tag & ~UCPXU_TAG_MASK) == 0; }

/* A length past INT64_MAX, or a range that wraps around the address space, goes the
 * Go way, which refuses it (UCX took it as given). */
static inline int buf_ok(const void *buf, size_t len)
{
    return (buf != NULL || len == 0) && len <= (size_t)INT64_MAX &&
           len <= UINTPTR_MAX - (uintptr_t)buf;
}

int ucpxu_fast_tag_send_recv(ucpxu_fast_t *f, void *sbuf, size_t slen, uint64_t stag,
                             void *rbuf, size_t rlen, uint64_t rtag, uint64_t rmask,
                             size_t *len, uint64_t *sender_tag, void **ret)
{
    ucpxu_worker_t *w;
    void *rret;
    if (f->ep == 0 || !tag_ok(stag) || !tag_ok(rtag) || !buf_ok(sbuf, slen) ||
        !buf_ok(rbuf, rlen) || !lock(f)) {
        return UCPXU_FAST_NONE;
    }
    w = f->w;
    rret = ucpxu_tag_send_recv((uintptr_t)w, f->ep, (uintptr_t)sbuf, slen, stag,
                               (uintptr_t)rbuf, rlen, rtag, rmask, 0, f->spins);
    *ret = rret;
    if (rret != NULL || w->send_req != NULL || (w->own.tag & UCPXU_PULL_BIT) || !quiet(w)) {
        return UCPXU_FAST_GO;
    }
    *len = w->own.length;
    *sender_tag = w->own.tag;
    let_go(f);
    return UCPXU_FAST_DONE;
}

int ucpxu_fast_tag_send(ucpxu_fast_t *f, void *buf, size_t len, uint64_t tag, void **ret)
{
    ucpxu_worker_t *w;
    void *sret;
    if (f->ep == 0 || !tag_ok(tag) || !buf_ok(buf, len) || !lock(f)) {
        return UCPXU_FAST_NONE;
    }
    w = f->w;
    sret = ucpxu_tag_send((uintptr_t)w, f->ep, (uintptr_t)buf, len, tag, 0,
                          UCS_MEMORY_TYPE_HOST, 0, f->spins);
    *ret = sret;
    if (sret != NULL || !quiet(w)) {
        return UCPXU_FAST_GO;
    }
    let_go(f);
    return UCPXU_FAST_DONE;
}

int ucpxu_fast_tag_recv(ucpxu_fast_t *f, void *buf, size_t len, uint64_t tag, uint64_t mask,
                        size_t *rlen, uint64_t *sender_tag, void **ret)
{
    ucpxu_worker_t *w;
    void *rret;
    if (f->ep != 0 || !tag_ok(tag) || !buf_ok(buf, len) || !lock(f)) {
        return UCPXU_FAST_NONE;
    }
    w = f->w;
    rret = ucpxu_tag_recv((uintptr_t)w, (uintptr_t)buf, len, tag, mask, 0, UCS_MEMORY_TYPE_HOST,
                          0, f->spins);
    *ret = rret;
    if (rret != NULL || (w->own.tag & UCPXU_PULL_BIT) || !quiet(w)) {
        return UCPXU_FAST_GO;
    }
    *rlen = w->own.length;
    *sender_tag = w->own.tag;
    let_go(f);
    return UCPXU_FAST_DONE;
}

/* Completion-chained operations: see glue.h. Everything here runs under the Go worker
 * lock: the Go calls, and the UCX callbacks, which run inside ucp_worker_progress. */
#include "glue.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ticks is what an iteration's end costs to stamp: the TSC where there is one (as
 * ucx_perftest reads it), else the monotonic clock in ns. Go converts with the
 * chain's start and end pairs. */
uint64_t ucpxu_ticks(void)
{
#if defined(__x86_64__)
    return __rdtsc();
#else
    return mono_ns();
#endif
}

ucpxu_chain_t *ucpxu_chain_new(uintptr_t wp)
{
    ucpxu_worker_t *w = (ucpxu_worker_t*)wp;
    ucpxu_chain_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return NULL;
    }
    c->first = calloc(1, sizeof(int));
    if (c->first == NULL) {
        free(c);
        return NULL;
    }
    c->w = w;
    c->next = w->chains;
    w->chains = c;
    return c;
}

ucs_status_t ucpxu_chain_add(uintptr_t cp, int step, int kind, uintptr_t ep, uintptr_t buf,
                             size_t len, uint64_t tag, uint64_t mask, int mem_type, uintptr_t memh)
{
    ucpxu_chain_t *c = (ucpxu_chain_t*)cp;
    ucpxu_chain_op_t *op;
    if (c->running || step < c->nsteps - 1 || step > c->nsteps || step < 0) {
        return UCS_ERR_INVALID_PARAM;
    }
    if (c->nops == c->cap) {
        int cap = c->cap ? 2 * c->cap : 4;
        ucpxu_chain_op_t *n = realloc(c->ops, cap * sizeof(*n));
        if (n == NULL) {
            return UCS_ERR_NO_MEMORY;
        }
        c->ops = n;
        c->cap = cap;
    }
    if (step == c->nsteps) {
        int *f = realloc(c->first, (c->nsteps + 2) * sizeof(int));
        if (f == NULL) {
            return UCS_ERR_NO_MEMORY;
        }
        c->first = f;
        c->nsteps++;
    }
    op = &c->ops[c->nops++];
    memset(op, 0, sizeof(*op));
    op->chain = c;
    op->kind = kind;
    op->ep = ep;
    op->buf = buf;
    op->len = len;
    op->tag = tag;
    op->mask = mask;
    op->mem_type = mem_type;
    op->memh = memh;
    c->first[c->nsteps] = c->nops;
    /* ops reallocated: their chain pointers stay right, their addresses are taken
     * only once the chain starts */
    return UCS_OK;
}

static void run(ucpxu_chain_t *c);

/* failed_stop: an operation failed and the run does not keep going. */
static inline int failed_stop(const ucpxu_chain_t *c)
{
    return c->status != UCS_OK && !c->keep_going;
}

/* note_status records op's status, and the run's first failure. */
static inline void note_status(ucpxu_chain_t *c, ucpxu_chain_op_t *op, ucs_status_t st)
{
    op->status = st;
    if (st != UCS_OK && c->status == UCS_OK) {
        c->status = st;
    }
}

/* op_done accounts one completed operation of the current step. */
static inline void op_done(ucpxu_chain_t *c, ucpxu_chain_op_t *op, ucs_status_t st)
{
    c->outstanding--;
    note_status(c, op, st);
}

/* completed is every chained operation's completion (a callback). Outside a step's
 * posting it frees the request and, when the step is complete, posts the next ones:
 * the chain's whole point, the next operation leaves from here. */
static inline void completed(ucpxu_chain_op_t *op, void *request, ucs_status_t st)
{
    ucpxu_chain_t *c = op->chain;
    if (c->posting) {
        /* Completed in place, or while another operation of the step was posted: the
         * poster frees it (UCX still returns this request to it). */
        op->cb_done = 1;
        op->cb_status = st;
        return;
    }
    op->req = NULL;
    ((ucpxu_req_t*)request)->done = 0;
    ucp_request_free(request);
    op_done(c, op, st);
    if (c->outstanding == 0) {
        run(c);
    }
}

static void chain_send_cb(void *request, ucs_status_t st, void *user_data)
{
    completed(user_data, request, st);
}

static void chain_recv_cb(void *request, ucs_status_t st, const ucp_tag_recv_info_t *info,
                          void *user_data)
{
    ucpxu_chain_op_t *op = user_data;
    uint64_t tag;
    size_t len;
    /* chain->w is NULL once the worker is being destroyed (ucpxu_chains_shutdown). */
    st = ucpxu_recv_seen(op->chain->w, st, info, &tag, &len);
    if (info != NULL) {
        op->recv_tag = tag;
        op->recv_len = len;
        if (info->sender_tag & UCPXU_PULL_BIT) {
            /* Its data waits in the sender's memory: the run pauses after this step
             * and Go pulls it (ucpxu_chain_pulled), then resumes. */
            op->pull = 1;
            op->recv_status = st;
            op->chain->npull++;
            st = UCS_OK;
        }
    }
    completed(op, request, st);
}

static void *post(ucpxu_chain_t *c, ucpxu_chain_op_t *op)
{
    ucp_request_param_t p;
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.user_data = op;
    if (op->mem_type >= 0) {
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
        p.memory_type = (ucs_memory_type_t)op->mem_type;
    }
    if (op->memh != 0) {
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        p.memh = (ucp_mem_h)op->memh;
    }
    if (op->kind == UCPXU_CHAIN_SEND) {
        if (op->ep_closed) {
            return UCS_STATUS_PTR(UCS_ERR_CANCELED);
        }
        p.cb.send = chain_send_cb;
        return ucp_tag_send_nbx((ucp_ep_h)op->ep, (void*)op->buf, op->len,
                                ucpxu_send_tag(c->w, op->tag), &p);
    }
    /* Never in place: a receive that matches a message already here (a pulled
     * message's descriptor among them) must meet chain_recv_cb, which marks a pull
     * and accounts the message (ucpxu_recv_seen); a NULL return carries no sender
     * tag. The callback then runs while the step is posted (c->posting). A send's
     * completion in place needs nothing of the callback. */
    p.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    p.cb.recv = chain_recv_cb;
    return ucpxu_post_recv(c->w, (void*)op->buf, op->len, op->tag, op->mask, &p);
}

/* post_step posts every operation of step s; those that completed in the call are
 * accounted (c->outstanding counts the rest). */
static void post_step(ucpxu_chain_t *c, int s)
{
    int i, end = c->first[s + 1];
    c->step = s;
    c->outstanding = end - c->first[s];
    c->posting = 1;
    for (i = c->first[s]; i < end; i++) {
        ucpxu_chain_op_t *op = &c->ops[i];
        void *ret;
        op->cb_done = 0;
        ret = post(c, op);
        if (ret == NULL) {
            op_done(c, op, UCS_OK);
        } else if (UCS_PTR_IS_ERR(ret)) {
            op_done(c, op, UCS_PTR_STATUS(ret));
        } else {
            op->req = ret;
        }
    }
    c->posting = 0;
    /* Completions that came while posting (in place, or of an earlier op of the step). */
    for (i = c->first[s]; i < end; i++) {
        ucpxu_chain_op_t *op = &c->ops[i];
        if (op->cb_done && op->req != NULL) {
            ucpxu_req_t *r = op->req;
            op->req = NULL;
            r->done = 0;
            ucp_request_free(r);
            op_done(c, op, op->cb_status);
        }
        op->cb_done = 0;
    }
}

static void finish(ucpxu_chain_t *c)
{
    c->tsc1 = ucpxu_ticks();
    c->ns1 = mono_ns();
    __atomic_store_n(&c->running, 0, __ATOMIC_RELEASE);
    if (c->parked && c->w != NULL) {
        /* A Go waiter sleeps on the event fd, while another goroutine's progress ran
         * this completion: Go wakes it after that call (chain_wake); the signal is
         * for a progress call of C's own (a worker shared with C), after which no Go
         * runs. */
        c->w->chain_wake = 1;
        ucp_worker_signal(c->w->worker);
    }
}

/* run posts steps while the current one is complete: the next step, or, after the
 * last, step 0 of the next iteration. */
static void run(ucpxu_chain_t *c)
{
    while (c->outstanding == 0) {
        int next;
        if (failed_stop(c) || c->stopping || c->npull > 0) {
            /* Pulls owed: the run has not ended until Go pulled them (or answered
             * them, Destroy) and resumed or ended it. */
            c->paused = c->npull > 0;
            finish(c);
            return;
        }
        next = c->step + 1;
        if (next == c->nsteps) {
            c->times[c->iters % UCPXU_CHAIN_TIMES] = ucpxu_ticks();
            if (++c->iters >= c->repeat) {
                finish(c);
                return;
            }
            next = 0;
        }
        post_step(c, next);
    }
}

ucs_status_t ucpxu_chain_start(uintptr_t cp, uint64_t repeat, int keep_going)
{
    ucpxu_chain_t *c = (ucpxu_chain_t*)cp;
    int i;
    if (c->running || c->paused || c->nsteps == 0 || repeat == 0) {
        return UCS_ERR_INVALID_PARAM;
    }
    if (c->w == NULL) {
        return UCS_ERR_CANCELED;
    }
    for (i = 0; i < c->nops; i++) {
        c->ops[i].status = UCS_OK;
    }
    c->keep_going = keep_going;
    c->repeat = repeat;
    c->iters = 0;
    c->status = UCS_OK;
    c->stopping = 0;
    c->npull = 0;
    c->running = 1;
    c->ns0 = mono_ns();
    c->tsc0 = ucpxu_ticks();
    post_step(c, 0);
    run(c);
    return UCS_OK;
}

int ucpxu_chain_wait(uintptr_t cp, unsigned spins)
{
    ucpxu_chain_t *c = (ucpxu_chain_t*)cp;
    ucpxu_worker_t *w = c->w;
    unsigned i;
    if (w == NULL) {
        return 0;
    }
    for (i = 0; i < spins && __atomic_load_n(&c->running, __ATOMIC_ACQUIRE); i++) {
        ucpxu_progress(w);
    }
    ucpxu_reap((uintptr_t)w);
    return __atomic_load_n(&c->running, __ATOMIC_ACQUIRE);
}

int ucpxu_chain_stop(uintptr_t cp, unsigned rounds)
{
    ucpxu_chain_t *c = (ucpxu_chain_t*)cp;
    unsigned i;
    int k;
    if (c->w == NULL) {
        return 0;
    }
    c->stopping = 1; /* a paused run is not resumed either */
    if (!c->running) {
        return 0;
    }
    for (k = 0; k < c->nops; k++) {
        if (c->ops[k].req != NULL) {
            ucp_request_cancel(c->w->worker, c->ops[k].req);
        }
    }
    for (i = 0; i < rounds && c->running; i++) {
        ucp_worker_progress(c->w->worker);
    }
    ucpxu_reap((uintptr_t)c->w);
    return c->running ? c->outstanding : 0;
}

void ucpxu_chain_pulled(uintptr_t cp, int i, int st, size_t len)
{
    ucpxu_chain_t *c = (ucpxu_chain_t*)cp;
    ucpxu_chain_op_t *op;
    if (i < 0 || i >= c->nops || !c->ops[i].pull) {
        return;
    }
    op = &c->ops[i];
    op->pull = 0;
    op->recv_tag &= UCPXU_TAG_MASK;
    op->recv_len = len;
    c->npull--;
    if (st != UCS_OK) {
        note_status(c, op, st);
    }
}

int ucpxu_chain_resume(uintptr_t cp)
{
    ucpxu_chain_t *c = (ucpxu_chain_t*)cp;
    if (c->running || !c->paused || c->npull > 0) {
        return 0;
    }
    c->paused = 0;
    if (failed_stop(c) || c->stopping || c->w == NULL || c->iters >= c->repeat) {
        return 0;
    }
    __atomic_store_n(&c->running, 1, __ATOMIC_RELEASE);
    run(c);
    return __atomic_load_n(&c->running, __ATOMIC_ACQUIRE);
}

/* chain_detach takes c off its worker's list. */
static void chain_detach(ucpxu_chain_t *c)
{
    ucpxu_chain_t **pp;
    if (c->w == NULL) {
        return;
    }
    for (pp = &c->w->chains; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    }
    c->w = NULL;
}

void ucpxu_chain_free(uintptr_t cp)
{
    ucpxu_chain_t *c = (ucpxu_chain_t*)cp;
    chain_detach(c);
    free(c->ops);
    free(c->first);
    free(c);
}

/* ucpxu_chains_ep_closed marks the sends of w's chains on ep, which Go is closing:
 * they are not posted again (UCX forbids using a closed endpoint) and fail with
 * CANCELED instead, as a send on a closed endpoint fails in Go; a send already posted
 * completes as the close lets it. */
void ucpxu_chains_ep_closed(ucpxu_worker_t *w, uintptr_t ep)
{
    ucpxu_chain_t *c;
    int k;
    for (c = w->chains; c != NULL; c = c->next) {
        for (k = 0; k < c->nops; k++) {
            if (c->ops[k].kind == UCPXU_CHAIN_SEND && c->ops[k].ep == ep) {
                c->ops[k].ep_closed = 1;
            }
        }
    }
}

/* ucpxu_chain_cancel_op cancels operation i if it is posted and pending. */
void ucpxu_chain_cancel_op(uintptr_t cp, int i)
{
    ucpxu_chain_t *c = (ucpxu_chain_t*)cp;
    if (c->w == NULL || i < 0 || i >= c->nops || c->ops[i].req == NULL) {
        return;
    }
    ucp_request_cancel(c->w->worker, c->ops[i].req);
}

/* ucpxu_chains_shutdown stops every chain of a worker about to be destroyed (its
 * operations canceled, so no callback runs after the worker is gone) and detaches
 * them; Go frees them later. */
void ucpxu_chains_shutdown(ucpxu_worker_t *w)
{
    while (w->chains != NULL) {
        ucpxu_chain_t *c = w->chains;
        ucpxu_chain_stop((uintptr_t)c, 100000);
        w->chains = c->next;
        if (c->running) {
            /* UCX did not complete the cancel: forget the requests (the worker's
             * destruction releases them) and stop. */
            c->running = 0;
        }
        c->paused = 0; /* the worker's close failed the pulls */
        c->w = NULL;
    }
}

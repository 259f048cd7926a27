/* The unmatched-data ledger: bounds what one source may leave unexpected on a worker.
 *
 * UCX keeps unexpected tag messages (eager data, rendezvous headers) in its own queue
 * and says nothing about who sent them. A look every UCPXU_UM_EVERY progress calls
 * probes that queue; a first message that is still the same one a look later has sat
 * unmatched for a whole interval, and then every unexpected message is taken out
 * (ucp_tag_probe_nb with remove) into our queue and charged to the source id in its
 * tag's top bits. A source whose charge passes the limit is cut off: its queued
 * messages and every later one are received into nothing, and Go is told (an event)
 * to fail its endpoints. Receives look in our queue first, oldest first, so matching
 * order is what UCX alone would give: every message in our queue arrived before any
 * message still in UCX's.
 *
 * Everything here runs under the Go worker lock (the looks, inside the calls that
 * progress; the receive posts, in calls and in chain callbacks within progress). */
#include "glue.h"

#include <stdlib.h>
#include <string.h>

/* What one message is charged: its data up to a rendezvous-sized cap (a larger
 * message is a rendezvous header whose data stays with the sender, unless the user
 * raised UCX's threshold), plus what UCX keeps per message. */
#define UM_CHARGE_CAP  (256u * 1024)
#define UM_CHARGE_BASE 256u

static inline uint64_t um_charge(size_t len)
{
    return (len < UM_CHARGE_CAP ? len : UM_CHARGE_CAP) + UM_CHARGE_BASE;
}

/* The source id is the sender's claim (its tag's top bits): a peer could spread its
 * messages over many ids, each under the limit. So the whole ledger is bounded too,
 * at this many limits; past it the source holding most is cut off. */
#define UCPXU_UM_TOTAL_LIMITS 4

static inline uint64_t um_total_cap(const ucpxu_worker_t *w)
{
    return w->um.limit > UINT64_MAX / UCPXU_UM_TOTAL_LIMITS ? UINT64_MAX : w->um.limit * UCPXU_UM_TOTAL_LIMITS;
}

static inline unsigned um_source(uint64_t tag)
{
    return (unsigned)((tag & ~UCPXU_PULL_BIT) >> UCPXU_TAG_BITS);
}

/* um_discard receives a message into nothing: UCX truncates it and releases its data
 * (a rendezvous one completes the sender's side as well). */
static void um_discard(ucpxu_worker_t *w, ucp_tag_message_h msg)
{
    ucp_request_param_t p;
    void *r;
    memset(&p, 0, sizeof(p));
    r = ucp_tag_msg_recv_nbx(w->worker, NULL, 0, msg, &p);
    if (r != NULL && !UCS_PTR_IS_ERR(r)) {
        ucp_request_free(r); /* no callback was asked for: it ends on its own */
    }
    w->um.discarded++;
}

static int um_alloc(ucpxu_worker_t *w)
{
    if (w->um.charge == NULL) {
        w->um.charge = calloc(UCPXU_SOURCES, sizeof(*w->um.charge));
    }
    if (w->um.cut == NULL) {
        w->um.cut = calloc(UCPXU_SOURCES, 1);
    }
    if (w->um.charge == NULL || w->um.cut == NULL) {
        return 0;
    }
    if (w->um.off + w->um.n == w->um.cap) {
        if (w->um.off > 0) {
            memmove(w->um.q, w->um.q + w->um.off, w->um.n * sizeof(*w->um.q));
            w->um.off = 0;
        }
        if (w->um.n == w->um.cap) {
            size_t cap = w->um.cap ? 2 * w->um.cap : 256;
            struct ucpxu_unmatched *q = realloc(w->um.q, cap * sizeof(*q));
            if (q == NULL) {
                return 0;
            }
            w->um.q = q;
            w->um.cap = cap;
        }
    }
    return 1;
}

/* um_cut cuts source s off: queued messages of s are discarded, Go is told. */
static void um_cut(ucpxu_worker_t *w, unsigned s)
{
    ucpxu_event_t ev = {0};
    size_t i, k = w->um.off;
    w->um.cut[s] = 1;
    w->um.ncut++;
    for (i = w->um.off; i < w->um.off + w->um.n; i++) {
        struct ucpxu_unmatched *e = &w->um.q[i];
        if (um_source(e->tag) == s) {
            um_discard(w, e->msg);
        } else {
            w->um.q[k++] = *e;
        }
    }
    w->um.n = k - w->um.off;
    ev.type = UCPX_EV_CUT_OFF;
    ev.id = s;
    ev.length = w->um.charge[s];
    w->um.total -= w->um.charge[s];
    w->um.charge[s] = 0;
    ucpxu_push_event(w, &ev);
}

void ucpxu_um_take_all(ucpxu_worker_t *w)
{
    ucp_tag_recv_info_t info;
    ucp_tag_message_h msg;
    if (w->um.limit == 0) {
        return;
    }
    while ((msg = ucp_tag_probe_nb(w->worker, 0, 0, 1, &info)) != NULL) {
        unsigned s = um_source(info.sender_tag);
        struct ucpxu_unmatched *e;
        if (!um_alloc(w)) {
            um_discard(w, msg); /* out of memory: the process is failing anyway */
            continue;
        }
        if (w->um.cut[s]) {
            um_discard(w, msg);
            continue;
        }
        e = &w->um.q[w->um.off + w->um.n++];
        e->msg = msg;
        e->tag = info.sender_tag;
        e->charge = um_charge(info.length);
        w->um.taken++;
        w->um.charge[s] += e->charge;
        w->um.total += e->charge;
        if (w->um.charge[s] > w->um.limit) {
            um_cut(w, s);
        } else if (w->um.total > um_total_cap(w)) {
            unsigned i, most = s;
            for (i = 0; i < UCPXU_SOURCES; i++) {
                if (w->um.charge[i] > w->um.charge[most]) {
                    most = i;
                }
            }
            um_cut(w, most);
        }
    }
    w->um.head_seen = NULL;
}

void ucpxu_um_look(ucpxu_worker_t *w)
{
    ucp_tag_recv_info_t info;
    ucp_tag_message_h head = ucp_tag_probe_nb(w->worker, 0, 0, 0, &info);
    if (head == NULL) {
        w->um.head_seen = NULL;
        return;
    }
    if (head != w->um.head_seen) {
        /* Give it an interval to be matched: in a healthy exchange the head moves. */
        w->um.head_seen = head;
        return;
    }
    ucpxu_um_take_all(w);
}

void *ucpxu_post_recv(ucpxu_worker_t *w, void *buf, size_t len, uint64_t tag, uint64_t mask,
                      const ucp_request_param_t *p)
{
    size_t i, end;
    mask &= UCPXU_TAG_MASK;
    tag &= mask;
    if (w->um.ncut > 0) {
        /* Messages of cut-off sources still in UCX's queue must not match. */
        ucpxu_um_take_all(w);
    }
    end = w->um.off + w->um.n;
    for (i = w->um.off; i < end; i++) {
        struct ucpxu_unmatched e = w->um.q[i];
        if ((e.tag & mask) != tag) {
            continue;
        }
        if (i == w->um.off) {
            w->um.off++;
        } else {
            memmove(&w->um.q[i], &w->um.q[i + 1], (end - i - 1) * sizeof(e));
        }
        w->um.n--;
        if (w->um.n == 0) {
            w->um.off = 0;
        }
        w->um.charge[um_source(e.tag)] -= e.charge;
        w->um.total -= e.charge;
        return ucp_tag_msg_recv_nbx(w->worker, buf, len, e.msg, p);
    }
    return ucp_tag_recv_nbx(w->worker, buf, len, tag, mask, p);
}

int ucpxu_um_is_cut(ucpxu_worker_t *w, uint64_t sender_tag)
{
    return w->um.ncut > 0 && w->um.cut[um_source(sender_tag)];
}

void ucpxu_um_set(uintptr_t wp, uint64_t limit, uint64_t tag_source)
{
    ucpxu_worker_t *w = (ucpxu_worker_t*)wp;
    w->um.limit = limit;
    w->tag_source = tag_source << UCPXU_TAG_BITS;
}

uint64_t ucpxu_um_held(uintptr_t wp, unsigned source)
{
    ucpxu_worker_t *w = (ucpxu_worker_t*)wp;
    if (w->um.charge == NULL || source >= UCPXU_SOURCES) {
        return 0;
    }
    return w->um.charge[source];
}

/* ucpxu_um_release frees the ledger before the worker is destroyed. What our queue
 * holds is left to ucp_worker_destroy, as UCX's own unexpected queue is: receiving a
 * rendezvous header now would reach for the memory of a sender that may be gone. */
void ucpxu_um_release(ucpxu_worker_t *w)
{
    free(w->um.q);
    free(w->um.charge);
    free(w->um.cut);
    memset(&w->um, 0, sizeof(w->um));
}

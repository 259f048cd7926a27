/* C glue between Go and UCX 1.13 (libucp). Thin and boring on purpose:
 * - fills ucp_*_param_t structs and unions that cgo cannot build conveniently;
 * - C callbacks never call into Go. A completion of an operation nobody registered a
 *   Go callback for only fills its request (ucpxu_req_t) and links it on the worker's
 *   done list; the call that waits for it (ucpxu_wait, the fused calls) reads and frees
 *   it, and every progressing call reaps the rest of the list into a result array Go
 *   reads without a call. Completions with a Go callback, endpoint errors, connection
 *   requests and active messages go to the worker's event queue, which Go drains
 *   after the call. No Go code therefore runs inside ucp_worker_progress.
 * - handles and buffers cross as uintptr_t: cgo checks every pointer argument of a
 *   call (~14 ns each); Go keeps what they point to alive and in place itself. */
#ifndef UCPX_GLUE_H
#define UCPX_GLUE_H

#include <stdint.h>
#include <stddef.h>
#include <ucp/api/ucp.h>

#include "fast.h"

enum {
    UCPX_EV_REQ_DONE = 1, /* a request with a Go callback completed */
    UCPX_EV_EP_ERROR = 2, /* an endpoint failed (peer error handling) */
    UCPX_EV_CONN_REQ = 3, /* a listener got a connection request */
    UCPX_EV_AM_RECV  = 4, /* an active message arrived */
    UCPX_EV_CUT_OFF  = 5  /* a source's unmatched data passed the limit (id: source) */
};

/* Tags: users have the low UCPXU_TAG_BITS; the 15 bits above carry the sender's
 * source id (ucpxu_worker_t.tag_source), which the unmatched-data ledger charges, and
 * the top bit marks a message whose data the receiver pulls (its payload is a
 * descriptor, Go's tagpull.go). Every send sets the source and every receive mask
 * ignores all 16. */
#define UCPXU_TAG_BITS   48
#define UCPXU_TAG_MASK   ((1ull << UCPXU_TAG_BITS) - 1)
#define UCPXU_PULL_BIT   (1ull << 63)
#define UCPXU_SOURCES    (1u << (63 - UCPXU_TAG_BITS))

/* UCPXU_NOTIFY in an operation's flags: its completion goes to the event queue (a Go
 * callback waits for it) instead of the done list. Never passed to UCX. */
#define UCPXU_NOTIFY (1u << 30)

/* Our part of every UCX request (UCP_PARAM_FIELD_REQUEST_SIZE). UCX calls
 * request_init once per request memory, not per use: whoever frees a request resets
 * done and next first. */
typedef struct ucpxu_req {
    volatile int      done;
    int               status;
    uint64_t          sender_tag;
    size_t            length;
    uint64_t          slot; /* index of the Go Request waiting on it */
    struct ucpxu_req *next; /* done list */
} ucpxu_req_t;

/* One queued event. Which fields are meaningful depends on type. */
typedef struct {
    int      type;
    int      status;
    void    *ptr;        /* REQ_DONE: unused after free; EP_ERROR: ep; CONN_REQ: conn request; AM: data */
    uint64_t id;         /* REQ_DONE: slot; CONN_REQ: listener id; AM: handler id */
    uint64_t tag;        /* REQ_DONE: sender tag */
    size_t   length;     /* REQ_DONE: received length; AM: data length */
    void    *header;     /* AM: malloc'd copy of the header (free with ucpxu_free) */
    size_t   header_len;
    void    *reply_ep;   /* AM: reply endpoint, or NULL */
    uint64_t flags;      /* AM: UCP_AM_RECV_ATTR_FLAG_* | UCPX_AM_COPIED */
} ucpxu_event_t;

#define UCPX_AM_COPIED (1ull << 40) /* AM eager data was copied into malloc'd memory */

/* The result of one completed request, as the calls leave it for Go. */
typedef struct {
    uint64_t slot;
    uint64_t tag;
    uint64_t length;
    int64_t  status;
} ucpxu_result_t;

#define UCPXU_REAP_MAX    64 /* results reaped per call */
#define UCPXU_EVENT_BATCH 64 /* events drained per call */

typedef struct ucpxu_worker ucpxu_worker_t;

/* The words that serialise a worker's UCX calls across languages (fast.h): owner is
 * held by whoever calls UCX on the worker where C callers share it (Go's worker lock
 * takes it too then); yield is nonzero while someone waits for the worker, and the
 * spin loops end early for it. Separate from the worker because a shared worker's
 * words outlive it (a C caller may still look at them after it closed). */
struct ucpxu_share {
    uint32_t owner;
    uint32_t yield;
    int      kept; /* shared with C: never freed */
};

/* Per-callback argument blocks (listener, AM handler): identify the source. */
typedef struct {
    ucpxu_worker_t *w;
    uint64_t       id;
} ucpxu_cb_arg_t;

struct ucpxu_worker {
    ucp_worker_h  worker;
    /* Event queue and done list: only touched under the Go worker lock, except from
     * UCX callbacks, which run inside progress on the same thread; the spin lock
     * covers callbacks UCX may run from its async thread. */
    volatile int  lock;
    ucpxu_event_t *events;
    size_t        nevents;
    size_t        cap;
    ucpxu_req_t   *done; /* completed requests without a Go callback, newest first */
    size_t        ndone;
    /* What the calls leave for Go, which reads it without a call. */
    ucpxu_result_t own;  /* the request a call posted or waited on, once complete */
    ucpxu_result_t own2; /* ucpxu_tag_send_recv: the send */
    void          *send_req; /* ucpxu_tag_send_recv: the send's status pointer */
    size_t        nreaped;
    ucpxu_result_t reaped[UCPXU_REAP_MAX];
    ucpxu_event_t out[UCPXU_EVENT_BATCH];
    struct ucpxu_chain *chains; /* completion chains built on this worker (chain.c) */
    /* chain_wake: a chain with a parked Go waiter ended inside a progress call; Go
     * wakes its parked waiters after the call (a signal alone can be drained by an
     * arm before the netpoller reports it). */
    int           chain_wake;
    /* share->yield: nonzero while a goroutine (the condition engine, an nbx call) or
     * a C caller waits for the worker: the spin loops below end early so that it gets
     * the worker within one progress call. Written atomically. */
    ucpxu_share_t *share;
    /* The sum of ucp_worker_progress's results (ucpxu_progress): what UCX did, the
     * remote operations it applied for peers included, which complete nothing of
     * ours. Added and read atomically. */
    uint64_t      progressed;
    uint64_t      tag_source; /* this worker's source id, in place (above UCPXU_TAG_MASK) */
    /* The unmatched-data ledger (unmatched.c), on while limit > 0: messages that sat
     * unexpected for a look interval are taken from UCX's queue into ours and charged
     * to their source; a source past the limit is cut off (its messages discarded,
     * UCPX_EV_CUT_OFF queued). Receives look in our queue first. */
    struct {
        uint64_t  limit;
        unsigned  tick;
        void     *head_seen; /* UCX's first unexpected message at the last look */
        struct ucpxu_unmatched *q;
        size_t    off, n, cap; /* q[off, off+n): oldest first */
        uint64_t *charge;      /* per source, UCPXU_SOURCES entries */
        uint64_t  total;       /* the sum of charge: bounded by UCPXU_UM_TOTAL_LIMITS limits */
        uint8_t  *cut;         /* per source: cut off */
        unsigned  ncut;
        uint64_t  taken, discarded;
    } um;
};

struct ucpxu_unmatched {
    ucp_tag_message_h msg;
    uint64_t          tag;
    uint64_t          charge;
};

/* The ledger's look, every UCPXU_UM_EVERY progress calls that progressed something
 * (an idle spin costs nothing). */
#define UCPXU_UM_EVERY 16
void ucpxu_um_look(ucpxu_worker_t *w);
static inline void ucpxu_um_tick(ucpxu_worker_t *w, unsigned progressed)
{
    if (progressed != 0 && w->um.limit != 0 && (++w->um.tick % UCPXU_UM_EVERY) == 0) {
        ucpxu_um_look(w);
    }
}
/* ucpxu_progress is one ucp_worker_progress, counted (progressed) and ticking the
 * ledger. */
static inline void ucpxu_progress(ucpxu_worker_t *w)
{
    unsigned n = ucp_worker_progress(w->worker);
    if (n != 0) {
        __atomic_fetch_add(&w->progressed, n, __ATOMIC_RELAXED);
    }
    ucpxu_um_tick(w, n);
}
/* ucpxu_post_recv posts a tag receive with p: from our queue when a message there
 * matches (ucp_tag_msg_recv_nbx), else ucp_tag_recv_nbx. The mask ignores the source
 * bits. */
void *ucpxu_post_recv(ucpxu_worker_t *w, void *buf, size_t len, uint64_t tag, uint64_t mask,
                      const ucp_request_param_t *p);
/* ucpxu_um_set turns the ledger on with limit bytes per source (0: off). */
void ucpxu_um_set(uintptr_t w, uint64_t limit, uint64_t tag_source);
/* ucpxu_um_held: bytes charged and not matched, of one source. */
uint64_t ucpxu_um_held(uintptr_t w, unsigned source);
void ucpxu_um_release(ucpxu_worker_t *w);
/* ucpxu_um_take_all takes every unexpected message into our queue now. */
void ucpxu_um_take_all(ucpxu_worker_t *w);
/* ucpxu_um_is_cut: the message's source was cut off (a receive that matched it fails
 * with UCS_ERR_EXCEEDS_LIMIT: it was posted before the message arrived). */
int ucpxu_um_is_cut(ucpxu_worker_t *w, uint64_t sender_tag);
void ucpxu_push_event(ucpxu_worker_t *w, const ucpxu_event_t *ev);

/* ucpxu_send_tag is the tag a send of w puts on the wire: the user's bits and w's
 * source id above them. */
static inline uint64_t ucpxu_send_tag(const ucpxu_worker_t *w, uint64_t tag)
{
    return (tag & (UCPXU_TAG_MASK | UCPXU_PULL_BIT)) | w->tag_source;
}

/* ucpxu_recv_seen is what a tag receive's callback reports of the message it got:
 * its status (UCS_ERR_EXCEEDS_LIMIT for a message of a cut-off source; w NULL: the
 * worker is being destroyed, nothing to check) and, in *tag and *len, the sender's
 * tag without the source bits (a pulled message's keeps them: Go answers its sender)
 * and the length (0 without info, or for a receive that matched nothing). */
static inline ucs_status_t ucpxu_recv_seen(ucpxu_worker_t *w, ucs_status_t st,
                                           const ucp_tag_recv_info_t *info, uint64_t *tag,
                                           size_t *len)
{
    if (info == NULL || (st != UCS_OK && st != UCS_ERR_MESSAGE_TRUNCATED)) {
        /* Only a matched receive has info: a canceled one's holds what the request
         * memory held before. */
        *tag = 0;
        *len = 0;
        return st;
    }
    *tag = (info->sender_tag & UCPXU_PULL_BIT) ? info->sender_tag
                                               : info->sender_tag & UCPXU_TAG_MASK;
    *len = info->length;
    if (w != NULL && ucpxu_um_is_cut(w, info->sender_tag)) {
        return UCS_ERR_EXCEEDS_LIMIT;
    }
    return st;
}

ucs_status_t ucpxu_init(uint64_t features, const char **cfg_kv, int n_kv,
                       size_t est_eps, ucp_context_h *ctx_p);
size_t       ucpxu_request_size(void);
uint64_t     ucpxu_context_mem_types(ucp_context_h ctx);

ucs_status_t ucpxu_worker_create(ucp_context_h ctx, int wakeup, int am, ucpxu_worker_t **w_p);

/* The slot of a request Go gave up on (ucpxu_abandon): UCX frees it itself. */
#define UCPXU_SLOT_ABANDONED UINT64_MAX
void ucpxu_abandon(uintptr_t w, uintptr_t req);
void         ucpxu_worker_destroy(ucpxu_worker_t *w);
/* ucpxu_share_release frees a destroyed worker's share unless C callers keep it. */
void         ucpxu_share_release(ucpxu_share_t *s);
ucs_status_t ucpxu_worker_address(ucpxu_worker_t *w, void **addr_p, size_t *len_p);
void         ucpxu_worker_address_release(ucpxu_worker_t *w, void *addr);

/* Progress until req (0: none) is done or spins rounds pass (req 0: once). If req is
 * done and own is set, its result goes to w->own and it is freed (req must complete
 * without UCPXU_NOTIFY). Then up to UCPXU_REAP_MAX other completed requests are
 * reaped into w->reaped (w->nreaped). Returns 1 when w->own holds req's result. */
int    ucpxu_wait(uintptr_t w, uintptr_t req, unsigned spins, int own);
/* Reap without progress (after a cancel); returns w->nreaped. */
size_t ucpxu_reap(uintptr_t w);
/* Copy up to UCPXU_EVENT_BATCH events into w->out; REQ_DONE requests are read and
 * freed here. */
size_t ucpxu_drain(uintptr_t w);

/* Endpoints. ip: 4 or 16 bytes (IPv4/IPv6); worker_addr: a UCX worker address. */
ucs_status_t ucpxu_ep_create_sockaddr(ucpxu_worker_t *w, const uint8_t *ip, int ip_len, int port,
                                     int err_mode_peer, ucp_ep_h *ep_p);
ucs_status_t ucpxu_ep_create_worker(ucpxu_worker_t *w, const void *worker_addr,
                                   int err_mode_peer, ucp_ep_h *ep_p);
ucs_status_t ucpxu_ep_create_conn(ucpxu_worker_t *w, ucp_conn_request_h req,
                                 int err_mode_peer, ucp_ep_h *ep_p);
void        *ucpxu_ep_close(uintptr_t w, uintptr_t ep, int force, uint32_t flags);

/* Listener: connection requests become UCPX_EV_CONN_REQ events with arg->id. */
ucs_status_t ucpxu_listener_create(ucpxu_worker_t *w, const uint8_t *ip, int ip_len, int port,
                                  ucpxu_cb_arg_t *arg, ucp_listener_h *l_p);
ucs_status_t ucpxu_listener_port(ucp_listener_h l, int *port_p);
ucs_status_t ucpxu_conn_request_addr(ucp_conn_request_h r, uint8_t *ip16, int *ip_len, int *port);
ucs_status_t ucpxu_listener_reject(ucp_listener_h l, ucp_conn_request_h r);

/* Operations. Each returns a ucs_status_ptr_t: NULL (done), an error, or a request.
 * The calls with spins progress the worker until the operation completes or spins
 * rounds pass, reap (as ucpxu_wait) and return NULL or an error once it completed;
 * spins 0 only posts. A receive that completed leaves its result in w->own. */
/* fast.c: Go's side of the records (see fast.h). */
uint32_t     *ucpxu_share_keep(ucpxu_worker_t *w);
ucpxu_fast_t *ucpxu_fast_new(ucpxu_worker_t *w, uintptr_t ep, uintptr_t go, unsigned spins);
void          ucpxu_fast_retire(ucpxu_fast_t *f);
uintptr_t     ucpxu_fast_go(ucpxu_fast_t *f);

void *ucpxu_tag_send(uintptr_t w, uintptr_t ep, uintptr_t buf, size_t len, uint64_t tag,
                    uint32_t flags, int mem_type, uintptr_t memh, unsigned spins);
void *ucpxu_tag_recv(uintptr_t w, uintptr_t buf, size_t len, uint64_t tag, uint64_t mask,
                    uint32_t flags, int mem_type, uintptr_t memh, unsigned spins);
/* Send, then receive the reply (host memory): returns the receive's status pointer
 * (result in w->own once done); the send's is w->send_req (result in w->own2 once
 * done). A send that fails at once posts no receive: send_req is its error and the
 * receive's is UCS_ERR_CANCELED. */
void *ucpxu_tag_send_recv(uintptr_t w, uintptr_t ep, uintptr_t sbuf, size_t slen, uint64_t stag,
                         uintptr_t rbuf, size_t rlen, uint64_t rtag, uint64_t rmask,
                         uint32_t flags, unsigned spins);
void *ucpxu_am_send(uintptr_t w, uintptr_t ep, unsigned id, uintptr_t header, size_t header_len,
                   uintptr_t buf, size_t len, uint32_t flags, uint32_t am_flags, int mem_type,
                   uintptr_t memh);
void *ucpxu_am_recv_data(uintptr_t w, uintptr_t desc, uintptr_t buf, size_t len, uint32_t flags,
                        int mem_type, uintptr_t memh);
void *ucpxu_put(uintptr_t w, uintptr_t ep, uintptr_t buf, size_t len, uint64_t raddr,
               uintptr_t rkey, uint32_t flags, int mem_type, uintptr_t memh);
void *ucpxu_get(uintptr_t w, uintptr_t ep, uintptr_t buf, size_t len, uint64_t raddr,
               uintptr_t rkey, uint32_t flags, int mem_type, uintptr_t memh);
void *ucpxu_atomic(uintptr_t w, uintptr_t ep, int op, uintptr_t operand, size_t size,
                  uintptr_t reply, uint64_t raddr, uintptr_t rkey, uint32_t flags);
void *ucpxu_ep_flush(uintptr_t w, uintptr_t ep, uint32_t flags);
void *ucpxu_worker_flush(uintptr_t w, uint32_t flags);

void         ucpxu_cancel(uintptr_t w, uintptr_t req);
ucs_status_t ucpxu_arm(uintptr_t w);
ucs_status_t ucpxu_signal(uintptr_t w);
ucs_status_t ucpxu_fence(uintptr_t w);

/* A ping-pong in C alone, the reference ucpx's benchmarks measure against: n round
 * trips of len bytes (the initiator sends tag 1 and receives tag 2, the responder the
 * reverse), each operation completed by progressing the worker, as ucx_perftest's
 * tag_lat does. Returns UCS_OK or the first error. */
ucs_status_t ucpxu_ref_pingpong(uintptr_t w, uintptr_t ep, uintptr_t sbuf, uintptr_t rbuf,
                                size_t len, uint64_t n, int initiator);

ucs_status_t ucpxu_set_am_handler(ucpxu_worker_t *w, unsigned id, ucpxu_cb_arg_t *arg, int enable);

ucs_status_t ucpxu_mem_map(ucp_context_h ctx, void *addr, size_t len, int allocate,
                          int mem_type, ucp_mem_h *memh_p, void **addr_p, size_t *len_p);

/* Completion-chained operations (chain.c): a chain is a list of steps, each a set of
 * tag operations described in C memory. Start posts step 0; the completion callback
 * that completes a step's last operation posts the next step, from inside
 * ucp_worker_progress, with no Go on the way; after the last step an iteration is
 * counted and step 0 is posted again until repeat iterations ran. An operation that
 * completes in place counts at once. The first error stops the chain (after the
 * step's other operations completed), unless the run keeps going (keep_going: a host
 * graph's, whose later nodes run after a failed one); each operation keeps its last
 * status. Built and run under the Go worker lock. */
enum { UCPXU_CHAIN_SEND = 1, UCPXU_CHAIN_RECV = 2 };

#define UCPXU_CHAIN_TIMES 2048 /* iteration end times kept (the last 2048) */

typedef struct ucpxu_chain ucpxu_chain_t;

typedef struct {
    ucpxu_chain_t *chain;
    int            kind;
    int            mem_type; /* -1: let UCX detect */
    uintptr_t      ep, buf, memh;
    size_t         len;
    uint64_t       tag, mask;
    void          *req;       /* pending request, or NULL */
    int            cb_done;   /* completed in a callback while its step was being posted */
    int            cb_status;
    uint64_t       recv_tag;  /* RECV: the last message's sender tag and length */
    size_t         recv_len;
    int            pull;        /* RECV: got a pulled message, Go is to pull its data */
    int            recv_status; /* RECV: its status */
    int            status;      /* its last completion's status in this run */
    int            ep_closed;   /* SEND: its endpoint was closed: never posted again */
} ucpxu_chain_op_t;

struct ucpxu_chain {
    ucpxu_worker_t   *w;       /* NULL once the worker is destroyed */
    ucpxu_chain_t    *next;    /* the worker's list */
    ucpxu_chain_op_t *ops;     /* in step order */
    int               nops, cap;
    int              *first;   /* first op of each step, nsteps + 1 entries */
    int               nsteps;
    uint64_t          repeat, iters;
    int               step, outstanding;
    int               status;
    int               posting, stopping, parked;
    int               keep_going; /* errors do not stop the run (ucpxu_chain_start) */
    int               npull;   /* receives that got a pulled message: the run pauses */
    int               paused;  /* the run stopped for pulls: not ended until resumed */
    volatile int      running;
    uint64_t          tsc0, tsc1, ns0, ns1; /* start and end: clock ticks and ns */
    uint64_t          times[UCPXU_CHAIN_TIMES]; /* tick count at the end of iteration i */
};

ucpxu_chain_t *ucpxu_chain_new(uintptr_t w);
/* Appends an operation to step (the last step or a new one after it). */
ucs_status_t ucpxu_chain_add(uintptr_t c, int step, int kind, uintptr_t ep, uintptr_t buf,
                             size_t len, uint64_t tag, uint64_t mask, int mem_type, uintptr_t memh);
ucs_status_t ucpxu_chain_start(uintptr_t c, uint64_t repeat, int keep_going);
/* Progresses until the chain stopped or spins rounds passed, then reaps as ucpxu_wait;
 * returns 1 while it runs. */
int          ucpxu_chain_wait(uintptr_t c, unsigned spins);
/* Cancels a running chain's pending operations and progresses until they completed
 * (bounded by rounds); returns the number still pending. A paused run is stopped too:
 * it is not resumed. */
int          ucpxu_chain_stop(uintptr_t c, unsigned rounds);
void         ucpxu_chain_free(uintptr_t c);
/* ucpxu_chain_pulled records Go's pull of operation i's message (st, len); once every
 * pulled receive is recorded, ucpxu_chain_resume goes on with the paused run
 * (returns 1 if it runs; either way the pause is over). A paused run has not ended:
 * start refuses it. */
void         ucpxu_chain_pulled(uintptr_t c, int i, int st, size_t len);
int          ucpxu_chain_resume(uintptr_t c);
void         ucpxu_chains_shutdown(ucpxu_worker_t *w);
void         ucpxu_chains_ep_closed(ucpxu_worker_t *w, uintptr_t ep);
void         ucpxu_chain_cancel_op(uintptr_t c, int i);
uint64_t     ucpxu_ticks(void);


/* Status pointer helpers (macros in UCX). */
static inline int   ucpxu_ptr_is_err(void *p) { return UCS_PTR_IS_ERR(p); }
static inline int   ucpxu_ptr_status(void *p) { return UCS_PTR_STATUS(p); }

#endif

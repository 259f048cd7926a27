/* C glue between Go and UCX 1.13 (libucp). Thin and boring on purpose:
 * - fills ucp_*_param_t structs and unions that cgo cannot build conveniently;
 * - C callbacks never call into Go: they record what happened in the worker's
 *   event queue, which Go drains after each progress call. No Go code therefore
 *   runs inside ucp_worker_progress, and no C->Go transition is paid per op. */
#ifndef UCPX_GLUE_H
#define UCPX_GLUE_H

#include <stdint.h>
#include <stddef.h>
#include <ucp/api/ucp.h>

enum {
    UCPX_EV_REQ_DONE = 1, /* a non-immediate request completed */
    UCPX_EV_EP_ERROR = 2, /* an endpoint failed (peer error handling) */
    UCPX_EV_CONN_REQ = 3, /* a listener got a connection request */
    UCPX_EV_AM_RECV  = 4  /* an active message arrived */
};

/* Our part of every UCX request (UCP_PARAM_FIELD_REQUEST_SIZE). */
typedef struct {
    volatile int done;
    int          status;
    uint64_t     sender_tag;
    size_t       length;
    uint64_t     slot; /* index of the Go Request waiting on it */
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

typedef struct ucpxu_worker ucpxu_worker_t;

/* Per-callback argument blocks (listener, AM handler): identify the source. */
typedef struct {
    ucpxu_worker_t *w;
    uint64_t       id;
} ucpxu_cb_arg_t;

struct ucpxu_worker {
    ucp_worker_h  worker;
    /* event queue: only touched under the Go worker lock, except from UCX
     * callbacks, which run inside progress on the same thread; the spin lock
     * covers callbacks UCX may run from its async thread. */
    volatile int  lock;
    ucpxu_event_t *events;
    size_t        nevents;
    size_t        cap;
};

ucs_status_t ucpxu_init(uint64_t features, const char **cfg_kv, int n_kv,
                       size_t est_eps, ucp_context_h *ctx_p);
size_t       ucpxu_request_size(void);
uint64_t     ucpxu_context_mem_types(ucp_context_h ctx);

ucs_status_t ucpxu_worker_create(ucp_context_h ctx, int wakeup, ucpxu_worker_t **w_p);
void         ucpxu_worker_destroy(ucpxu_worker_t *w);
ucs_status_t ucpxu_worker_address(ucpxu_worker_t *w, void **addr_p, size_t *len_p);
void         ucpxu_worker_address_release(ucpxu_worker_t *w, void *addr);

/* Progress until the request is done, the queue has events, or max_spins rounds
 * pass. Returns the number of events queued. Passing req == NULL progresses once. */
size_t ucpxu_progress(ucpxu_worker_t *w, void *req, unsigned max_spins);
/* Progress as ucpxu_progress, then drain into out: one C call per completion. */
size_t ucpxu_progress_drain(ucpxu_worker_t *w, void *req, unsigned max_spins, ucpxu_event_t *out,
                           size_t max);
/* Copy up to max events out; REQ_DONE requests are read and freed here. */
size_t ucpxu_drain(ucpxu_worker_t *w, ucpxu_event_t *out, size_t max);

/* Endpoints. ip: 4 or 16 bytes (IPv4/IPv6); worker_addr: a UCX worker address. */
ucs_status_t ucpxu_ep_create_sockaddr(ucpxu_worker_t *w, const uint8_t *ip, int ip_len, int port,
                                     int err_mode_peer, ucp_ep_h *ep_p);
ucs_status_t ucpxu_ep_create_worker(ucpxu_worker_t *w, const void *worker_addr,
                                   int err_mode_peer, ucp_ep_h *ep_p);
ucs_status_t ucpxu_ep_create_conn(ucpxu_worker_t *w, ucp_conn_request_h req,
                                 int err_mode_peer, ucp_ep_h *ep_p);
void        *ucpxu_ep_close(ucpxu_worker_t *w, ucp_ep_h ep, int force);

/* Listener: connection requests become UCPX_EV_CONN_REQ events with arg->id. */
ucs_status_t ucpxu_listener_create(ucpxu_worker_t *w, const uint8_t *ip, int ip_len, int port,
                                  ucpxu_cb_arg_t *arg, ucp_listener_h *l_p);
ucs_status_t ucpxu_listener_port(ucp_listener_h l, int *port_p);
ucs_status_t ucpxu_conn_request_addr(ucp_conn_request_h r, uint8_t *ip16, int *ip_len, int *port);
ucs_status_t ucpxu_listener_reject(ucp_listener_h l, ucp_conn_request_h r);

/* Operations. Each returns a ucs_status_ptr_t: NULL (done), an error, or a request. */
void *ucpxu_tag_send(ucpxu_worker_t *w, ucp_ep_h ep, const void *buf, size_t len,
                    uint64_t tag, uint32_t flags, int mem_type, ucp_mem_h memh);
void *ucpxu_tag_recv(ucpxu_worker_t *w, void *buf, size_t len, uint64_t tag, uint64_t mask,
                    uint32_t flags, int mem_type, ucp_mem_h memh, ucp_tag_recv_info_t *info);
void *ucpxu_am_send(ucpxu_worker_t *w, ucp_ep_h ep, unsigned id, const void *header,
                   size_t header_len, const void *buf, size_t len, uint32_t flags,
                   uint32_t am_flags, int mem_type, ucp_mem_h memh);
void *ucpxu_am_recv_data(ucpxu_worker_t *w, void *desc, void *buf, size_t len,
                        uint32_t flags, int mem_type, ucp_mem_h memh, size_t *len_p);
void *ucpxu_put(ucpxu_worker_t *w, ucp_ep_h ep, const void *buf, size_t len,
               uint64_t raddr, ucp_rkey_h rkey, uint32_t flags, int mem_type, ucp_mem_h memh);
void *ucpxu_get(ucpxu_worker_t *w, ucp_ep_h ep, void *buf, size_t len,
               uint64_t raddr, ucp_rkey_h rkey, uint32_t flags, int mem_type, ucp_mem_h memh);
void *ucpxu_atomic(ucpxu_worker_t *w, ucp_ep_h ep, int op, const void *operand, size_t size,
                  void *reply, uint64_t raddr, ucp_rkey_h rkey, uint32_t flags);
void *ucpxu_ep_flush(ucpxu_worker_t *w, ucp_ep_h ep);
void *ucpxu_worker_flush(ucpxu_worker_t *w);

ucs_status_t ucpxu_set_am_handler(ucpxu_worker_t *w, unsigned id, ucpxu_cb_arg_t *arg, int enable);

ucs_status_t ucpxu_mem_map(ucp_context_h ctx, void *addr, size_t len, int allocate,
                          int mem_type, ucp_mem_h *memh_p, void **addr_p, size_t *len_p);

/* ucpxu_addr turns an integer address (device or C memory) into a pointer. */
static inline void *ucpxu_addr(uintptr_t a) { return (void*)a; }

/* Status pointer helpers (macros in UCX). */
static inline int   ucpxu_ptr_is_err(void *p) { return UCS_PTR_IS_ERR(p); }
static inline int   ucpxu_ptr_status(void *p) { return UCS_PTR_STATUS(p); }

#endif

#include "glue.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static inline void q_lock(ucpxu_worker_t *w)
{
    while (__atomic_exchange_n(&w->lock, 1, __ATOMIC_ACQUIRE)) {
        while (__atomic_load_n(&w->lock, __ATOMIC_RELAXED)) {
        }
    }
}

static inline void q_unlock(ucpxu_worker_t *w) { __atomic_store_n(&w->lock, 0, __ATOMIC_RELEASE); }

/* push appends an event; on allocation failure the event is dropped, which can
 * only happen when the process is out of memory anyway. */
void ucpxu_push_event(ucpxu_worker_t *w, const ucpxu_event_t *ev)
{
    q_lock(w);
    if (w->nevents == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 64;
        ucpxu_event_t *n = realloc(w->events, cap * sizeof(*n));
        if (n == NULL) {
            q_unlock(w);
            return;
        }
        w->events = n;
        w->cap = cap;
    }
    w->events[w->nevents++] = *ev;
    q_unlock(w);
}

static void req_init(void *request) { memset(request, 0, sizeof(ucpxu_req_t)); }

#define W(x)   ((ucpxu_worker_t*)(x))
#define PTR(x) ((void*)(x))

/* release hands a request back to UCX; its memory is reused without request_init. */
static inline void release(ucpxu_req_t *r)
{
    r->done = 0;
    r->next = NULL;
    ucp_request_free(r);
}

static inline void fill_result(ucpxu_result_t *out, const ucpxu_req_t *r)
{
    out->slot = r->slot;
    out->tag = r->sender_tag;
    out->length = r->length;
    out->status = r->status;
}

/* complete: a request without a Go callback. It goes on the done list, which the
 * call waiting for it or the next progressing call reaps. */
static void complete(void *request, ucs_status_t status, uint64_t tag, size_t length,
                     void *user_data)
{
    ucpxu_req_t *r = request;
    ucpxu_worker_t *w = user_data;
    r->status = status;
    r->sender_tag = tag;
    r->length = length;
    q_lock(w);
    r->next = w->done;
    w->done = r;
    w->ndone++;
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
    q_unlock(w);
}

/* complete_event: a request a Go callback waits for, through the event queue. */
static void complete_event(void *request, ucs_status_t status, uint64_t tag, size_t length,
                           void *user_data)
{
    ucpxu_req_t *r = request;
    ucpxu_event_t ev = {0};
    r->status = status;
    r->sender_tag = tag;
    r->length = length;
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
    ev.type = UCPX_EV_REQ_DONE;
    ev.ptr = request;
    ucpxu_push_event((ucpxu_worker_t*)user_data, &ev);
}

static void send_cb(void *request, ucs_status_t status, void *user_data)
{
    complete(request, status, 0, 0, user_data);
}

static void send_cb_ev(void *request, ucs_status_t status, void *user_data)
{
    complete_event(request, status, 0, 0, user_data);
}

static void tag_recv_cb(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                        void *user_data)
{
    uint64_t tag;
    size_t len;
    status = ucpxu_recv_seen(user_data, status, info, &tag, &len);
    complete(request, status, tag, len, user_data);
}

static void tag_recv_cb_ev(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                           void *user_data)
{
    uint64_t tag;
    size_t len;
    status = ucpxu_recv_seen(user_data, status, info, &tag, &len);
    complete_event(request, status, tag, len, user_data);
}

static void am_data_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
    complete(request, status, 0, length, user_data);
}

static void am_data_cb_ev(void *request, ucs_status_t status, size_t length, void *user_data)
{
    complete_event(request, status, 0, length, user_data);
}

/* unlink_done takes r off the done list (it is almost always the head: the newest
 * completion). Caller holds no lock. */
static int unlink_done(ucpxu_worker_t *w, ucpxu_req_t *r)
{
    ucpxu_req_t **pp;
    int found = 0;
    q_lock(w);
    for (pp = &w->done; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == r) {
            *pp = r->next;
            w->ndone--;
            found = 1;
            break;
        }
    }
    q_unlock(w);
    return found;
}

/* take_own moves a completed request without a Go callback to *out and frees it. One
 * that is not on the done list completes through the event queue: it is left alone. */
static int take_own(ucpxu_worker_t *w, ucpxu_req_t *r, ucpxu_result_t *out)
{
    if (!unlink_done(w, r)) {
        return 0;
    }
    fill_result(out, r);
    release(r);
    return 1;
}

static size_t reap(ucpxu_worker_t *w)
{
    ucpxu_req_t *r;
    size_t n = 0;
    if (__atomic_load_n(&w->ndone, __ATOMIC_RELAXED) == 0) {
        w->nreaped = 0;
        return 0;
    }
    q_lock(w);
    while (w->done != NULL && n < UCPXU_REAP_MAX) {
        r = w->done;
        w->done = r->next;
        w->ndone--;
        fill_result(&w->reaped[n++], r);
        release(r);
    }
    q_unlock(w);
    w->nreaped = n;
    return n;
}

size_t ucpxu_reap(uintptr_t w) { return reap(W(w)); }

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    ucpxu_event_t ev = {0};
    ev.type = UCPX_EV_EP_ERROR;
    ev.status = status;
    ev.ptr = ep;
    ucpxu_push_event((ucpxu_worker_t*)arg, &ev);
}

static void conn_cb(ucp_conn_request_h conn_request, void *arg)
{
    ucpxu_cb_arg_t *a = arg;
    ucpxu_event_t ev = {0};
    ev.type = UCPX_EV_CONN_REQ;
    ev.ptr = conn_request;
    ev.id = a->id;
    ucpxu_push_event(a->w, &ev);
}

static ucs_status_t am_cb(void *arg, const void *header, size_t header_length, void *data,
                          size_t length, const ucp_am_recv_param_t *param)
{
    ucpxu_cb_arg_t *a = arg;
    ucpxu_event_t ev = {0};
    ucs_status_t ret = UCS_OK;

    ev.type = UCPX_EV_AM_RECV;
    ev.id = a->id;
    ev.length = length;
    ev.flags = param->recv_attr;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) {
        ev.reply_ep = param->reply_ep;
    }
    if (header_length > 0) {
        ev.header = malloc(header_length);
        if (ev.header == NULL) {
            return UCS_ERR_NO_MEMORY;
        }
        memcpy(ev.header, header, header_length);
        ev.header_len = header_length;
    }
    if (param->recv_attr & (UCP_AM_RECV_ATTR_FLAG_RNDV | UCP_AM_RECV_ATTR_FLAG_DATA)) {
        /* Keep UCX's descriptor: zero copy; released by ucp_am_data_release or
         * consumed by ucp_am_recv_data_nbx. */
        ev.ptr = data;
        ret = UCS_INPROGRESS;
    } else if (length > 0) {
        ev.ptr = malloc(length);
        if (ev.ptr == NULL) {
            free(ev.header);
            return UCS_ERR_NO_MEMORY;
        }
        memcpy(ev.ptr, data, length);
        ev.flags |= UCPX_AM_COPIED;
    }
    ucpxu_push_event(a->w, &ev);
    return ret;
}

ucs_status_t ucpxu_init(uint64_t features, const char **cfg_kv, int n_kv, size_t est_eps,
                       ucp_context_h *ctx_p)
{
    ucp_config_t *config;
    ucp_params_t params = {0};
    ucs_status_t st;
    int i;

    st = ucp_config_read(NULL, NULL, &config);
    if (st != UCS_OK) {
        return st;
    }
    for (i = 0; i + 1 < 2 * n_kv; i += 2) {
        st = ucp_config_modify(config, cfg_kv[i], cfg_kv[i + 1]);
        if (st != UCS_OK) {
            ucp_config_release(config);
            return st;
        }
    }
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_REQUEST_SIZE |
                        UCP_PARAM_FIELD_REQUEST_INIT | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = features;
    params.request_size = sizeof(ucpxu_req_t);
    params.request_init = req_init;
    /* Go programs use workers from several OS threads; context-level state
     * (registration cache) must be protected. */
    params.mt_workers_shared = 1;
    if (est_eps > 0) {
        params.field_mask |= UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
        params.estimated_num_eps = est_eps;
    }
    st = ucp_init(&params, config, ctx_p);
    ucp_config_release(config);
    return st;
}

size_t ucpxu_request_size(void) { return sizeof(ucpxu_req_t); }

uint64_t ucpxu_context_mem_types(ucp_context_h ctx)
{
    ucp_context_attr_t attr = {0};
    attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    if (ucp_context_query(ctx, &attr) != UCS_OK) {
        return 1; /* host only */
    }
    return attr.memory_types;
}

/* am_table_init gives every active-message id an empty handler. UCX 1.13 to 1.16
 * grow the worker's handler table for a registration without initialising the new
 * slots (ucp_worker_set_am_handler_common initialises the registered id again and
 * again), so a message to an id nobody registered, below the table's capacity, called
 * whatever the memory held: any peer could crash the process. Setting every id once,
 * highest first, makes the table whole in one growth (UCX then drops such a message
 * with a warning); later registrations never grow it. Called only on contexts with
 * the AM feature (without it UCX refuses the first call and logs an error). */
static void am_table_init(ucp_worker_h worker)
{
    ucp_am_handler_param_t p;
    int id;
    memset(&p, 0, sizeof(p));
    p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB;
    for (id = UINT16_MAX; id >= 0; id--) {
        p.id = (unsigned)id;
        if (ucp_worker_set_am_recv_handler(worker, &p) != UCS_OK) {
            return;
        }
    }
}

ucs_status_t ucpxu_worker_create(ucp_context_h ctx, int wakeup, int am, ucpxu_worker_t **w_p)
{
    ucp_worker_params_t params = {0};
    ucpxu_worker_t *w = calloc(1, sizeof(*w));
    ucs_status_t st;

    if (w == NULL) {
        return UCS_ERR_NO_MEMORY;
    }
    w->share = calloc(1, sizeof(*w->share));
    if (w->share == NULL) {
        free(w);
        return UCS_ERR_NO_MEMORY;
    }
    /* SERIALIZED: Go serialises every call on a worker with its own mutex, so
     * UCX needs no internal locks, yet calls may come from any OS thread. */
    params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    if (wakeup) {
        params.field_mask |= UCP_WORKER_PARAM_FIELD_EVENTS;
        params.events = UCP_WAKEUP_RMA | UCP_WAKEUP_AMO | UCP_WAKEUP_TAG_SEND |
                        UCP_WAKEUP_TAG_RECV | UCP_WAKEUP_TX | UCP_WAKEUP_RX;
    }
    st = ucp_worker_create(ctx, &params, &w->worker);
    if (st != UCS_OK) {
        free(w->share);
        free(w);
        return st;
    }
    if (am) { /* without the feature UCX refuses, and logs an error on stdout */
        am_table_init(w->worker);
    }
    *w_p = w;
    return UCS_OK;
}

void ucpxu_worker_destroy(ucpxu_worker_t *w)
{
    size_t i;
    ucpxu_chains_shutdown(w);
    ucpxu_um_release(w);
    /* Events not drained by Go still own memory. */
    for (i = 0; i < w->nevents; i++) {
        ucpxu_event_t *ev = &w->events[i];
        if (ev->type == UCPX_EV_REQ_DONE) {
            if (((ucpxu_req_t *)ev->ptr)->slot != UCPXU_SLOT_ABANDONED) {
                ucp_request_free(ev->ptr);
            }
        } else if (ev->type == UCPX_EV_AM_RECV) {
            free(ev->header);
            if (ev->flags & UCPX_AM_COPIED) {
                free(ev->ptr);
            } else if (ev->ptr != NULL) {
                ucp_am_data_release(w->worker, ev->ptr);
            }
        } else if (ev->type == UCPX_EV_CONN_REQ) {
            /* the listener is gone already; UCX frees pending requests with it */
        }
    }
    while (w->done != NULL) {
        ucpxu_req_t *r = w->done;
        w->done = r->next;
        if (r->slot != UCPXU_SLOT_ABANDONED) {
            release(r);
        }
    }
    ucp_worker_destroy(w->worker);
    free(w->events);
    /* Not w->share: Go's lock keeps a pointer to its yield word for as long as the Go
     * worker exists, closed or not (a call that finds it closed still takes the lock),
     * so Go frees it when that object is gone (ucpxu_share_release). */
    free(w);
}

void ucpxu_share_release(ucpxu_share_t *s)
{
    if (!s->kept) {
        free(s);
    }
}

ucs_status_t ucpxu_worker_address(ucpxu_worker_t *w, void **addr_p, size_t *len_p)
{
    ucp_address_t *addr;
    ucs_status_t st = ucp_worker_get_address(w->worker, &addr, len_p);
    *addr_p = addr;
    return st;
}

void ucpxu_worker_address_release(ucpxu_worker_t *w, void *addr)
{
    ucp_worker_release_address(w->worker, addr);
}

/* spin progresses until r is done or spins rounds pass (r NULL: once). */
static inline void spin(ucpxu_worker_t *w, ucpxu_req_t *r, unsigned spins)
{
    const uint32_t *yield = &w->share->yield;
    unsigned i;
    if (r == NULL) {
        ucpxu_progress(w);
        return;
    }
    for (i = 0; i < spins; i++) {
        if (__atomic_load_n(&r->done, __ATOMIC_ACQUIRE)) {
            return;
        }
        if (i > 0 && __atomic_load_n(yield, __ATOMIC_RELAXED)) {
            return; /* an issuer waits for the lock */
        }
        ucpxu_progress(w);
    }
}

int ucpxu_wait(uintptr_t wp, uintptr_t req, unsigned spins, int own)
{
    ucpxu_worker_t *w = W(wp);
    ucpxu_req_t *r = PTR(req);
    int got = 0;
    spin(w, r, spins);
    if (own && r != NULL && __atomic_load_n(&r->done, __ATOMIC_ACQUIRE)) {
        got = take_own(w, r, &w->own);
    }
    reap(w);
    return got;
}

size_t ucpxu_drain(uintptr_t wp)
{
    ucpxu_worker_t *w = W(wp);
    ucpxu_event_t *out = w->out;
    size_t n, i;
    q_lock(w);
    n = w->nevents < UCPXU_EVENT_BATCH ? w->nevents : UCPXU_EVENT_BATCH;
    memcpy(out, w->events, n * sizeof(*out));
    memmove(w->events, w->events + n, (w->nevents - n) * sizeof(*out));
    w->nevents -= n;
    q_unlock(w);
    for (i = 0; i < n; i++) {
        if (out[i].type == UCPX_EV_REQ_DONE) {
            ucpxu_req_t *r = out[i].ptr;
            out[i].status = r->status;
            out[i].tag = r->sender_tag;
            out[i].length = r->length;
            out[i].id = r->slot;
            release(r);
            out[i].ptr = NULL;
        }
    }
    return n;
}

static int make_sockaddr(const uint8_t *ip, int ip_len, int port, struct sockaddr_storage *ss,
                         socklen_t *len)
{
    memset(ss, 0, sizeof(*ss));
    if (ip_len == 4) {
        struct sockaddr_in *in = (struct sockaddr_in*)ss;
        in->sin_family = AF_INET;
        in->sin_port = htons((uint16_t)port);
        memcpy(&in->sin_addr, ip, 4);
        *len = sizeof(*in);
        return 0;
    }
    if (ip_len == 16) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6*)ss;
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
        memcpy(&in6->sin6_addr, ip, 16);
        *len = sizeof(*in6);
        return 0;
    }
    return -1;
}

static void ep_common(ucpxu_worker_t *w, ucp_ep_params_t *p, int err_mode_peer)
{
    p->field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p->err_mode = err_mode_peer ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    p->err_handler.cb = ep_err_cb;
    p->err_handler.arg = w;
}

ucs_status_t ucpxu_ep_create_sockaddr(ucpxu_worker_t *w, const uint8_t *ip, int ip_len, int port,
                                     int err_mode_peer, ucp_ep_h *ep_p)
{
    ucp_ep_params_t p = {0};
    struct sockaddr_storage ss;
    socklen_t len;

    if (make_sockaddr(ip, ip_len, port, &ss, &len) != 0) {
        return UCS_ERR_INVALID_ADDR;
    }
    p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    p.sockaddr.addr = (struct sockaddr*)&ss;
    p.sockaddr.addrlen = len;
    ep_common(w, &p, err_mode_peer);
    return ucp_ep_create(w->worker, &p, ep_p);
}

ucs_status_t ucpxu_ep_create_worker(ucpxu_worker_t *w, const void *worker_addr, int err_mode_peer,
                                   ucp_ep_h *ep_p)
{
    ucp_ep_params_t p = {0};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    p.address = worker_addr;
    ep_common(w, &p, err_mode_peer);
    return ucp_ep_create(w->worker, &p, ep_p);
}

ucs_status_t ucpxu_ep_create_conn(ucpxu_worker_t *w, ucp_conn_request_h req, int err_mode_peer,
                                 ucp_ep_h *ep_p)
{
    ucp_ep_params_t p = {0};
    p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
    p.conn_request = req;
    ep_common(w, &p, err_mode_peer);
    return ucp_ep_create(w->worker, &p, ep_p);
}

void *ucpxu_ep_close(uintptr_t w, uintptr_t ep, int force, uint32_t flags)
{
    ucp_request_param_t p = {0};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = (flags & UCPXU_NOTIFY) ? send_cb_ev : send_cb;
    p.user_data = W(w);
    if (force) {
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    }
    return ucp_ep_close_nbx((ucp_ep_h)ep, &p);
}

ucs_status_t ucpxu_listener_create(ucpxu_worker_t *w, const uint8_t *ip, int ip_len, int port,
                                  ucpxu_cb_arg_t *arg, ucp_listener_h *l_p)
{
    ucp_listener_params_t p = {0};
    struct sockaddr_storage ss;
    socklen_t len;

    if (make_sockaddr(ip, ip_len, port, &ss, &len) != 0) {
        return UCS_ERR_INVALID_ADDR;
    }
    p.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    p.sockaddr.addr = (struct sockaddr*)&ss;
    p.sockaddr.addrlen = len;
    p.conn_handler.cb = conn_cb;
    p.conn_handler.arg = arg;
    return ucp_listener_create(w->worker, &p, l_p);
}

static int sockaddr_parts(const struct sockaddr_storage *ss, uint8_t *ip16, int *ip_len,
                          int *port)
{
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in*)ss;
        memcpy(ip16, &in->sin_addr, 4);
        *ip_len = 4;
        *port = ntohs(in->sin_port);
        return 0;
    }
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6*)ss;
        memcpy(ip16, &in6->sin6_addr, 16);
        *ip_len = 16;
        *port = ntohs(in6->sin6_port);
        return 0;
    }
    return -1;
}

ucs_status_t ucpxu_listener_port(ucp_listener_h l, int *port_p)
{
    ucp_listener_attr_t attr = {0};
    uint8_t ip[16];
    int ip_len;
    ucs_status_t st;

    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    st = ucp_listener_query(l, &attr);
    if (st != UCS_OK) {
        return st;
    }
    return sockaddr_parts(&attr.sockaddr, ip, &ip_len, port_p) ? UCS_ERR_INVALID_ADDR : UCS_OK;
}

ucs_status_t ucpxu_conn_request_addr(ucp_conn_request_h r, uint8_t *ip16, int *ip_len, int *port)
{
    ucp_conn_request_attr_t attr = {0};
    ucs_status_t st;
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    st = ucp_conn_request_query(r, &attr);
    if (st != UCS_OK) {
        return st;
    }
    return sockaddr_parts(&attr.client_address, ip16, ip_len, port) ? UCS_ERR_INVALID_ADDR
                                                                     : UCS_OK;
}

ucs_status_t ucpxu_listener_reject(ucp_listener_h l, ucp_conn_request_h r)
{
    return ucp_listener_reject(l, r);
}

/* fill sets the fields every data operation shares. */
static inline void fill(ucp_request_param_t *p, ucpxu_worker_t *w, uint32_t flags, int mem_type,
                        uintptr_t memh)
{
    p->op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                      (flags & ~UCPXU_NOTIFY);
    p->user_data = w;
    if (mem_type >= 0) {
        p->op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
        p->memory_type = (ucs_memory_type_t)mem_type;
    }
    if (memh != 0) {
        p->op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        p->memh = (ucp_mem_h)memh;
    }
}

static inline int is_req(void *ret) { return ret != NULL && !UCS_PTR_IS_ERR(ret); }

/* settle waits (spins rounds at most) for the request an operation returned and reaps;
 * once it completed, its result is in *out and the status pointer is returned. */
static void *settle(ucpxu_worker_t *w, void *ret, unsigned spins, ucpxu_result_t *out)
{
    ucpxu_req_t *r = ret;
    if (spins == 0) {
        return ret;
    }
    if (is_req(ret)) {
        spin(w, r, spins);
        if (__atomic_load_n(&r->done, __ATOMIC_ACQUIRE)) {
            ucs_status_t st = r->status;
            take_own(w, r, out);
            ret = UCS_STATUS_PTR(st);
        }
    }
    reap(w);
    return ret;
}

static inline void *tag_send(ucpxu_worker_t *w, uintptr_t ep, uintptr_t buf, size_t len,
                             uint64_t tag, uint32_t flags, int mem_type, uintptr_t memh)
{
    ucp_request_param_t p;
    fill(&p, w, flags, mem_type, memh);
    p.cb.send = (flags & UCPXU_NOTIFY) ? send_cb_ev : send_cb;
    return ucp_tag_send_nbx((ucp_ep_h)ep, PTR(buf), len, ucpxu_send_tag(w, tag), &p);
}

void *ucpxu_tag_send(uintptr_t w, uintptr_t ep, uintptr_t buf, size_t len, uint64_t tag,
                    uint32_t flags, int mem_type, uintptr_t memh, unsigned spins)
{
    void *ret = tag_send(W(w), ep, buf, len, tag, flags, mem_type, memh);
    return settle(W(w), ret, spins, &W(w)->own);
}

/* tag_recv posts a receive. UCX 1.13 does not fill recv_info when a receive completes
 * in place (an unexpected eager message), so it asks for the callback instead and turns
 * a completion inside the call back into an immediate one, with the result in w->own. */
static void *tag_recv(ucpxu_worker_t *w, uintptr_t buf, size_t len, uint64_t tag, uint64_t mask,
                      uint32_t flags, int mem_type, uintptr_t memh)
{
    ucp_request_param_t p;
    ucpxu_req_t *r;
    ucs_status_t st;
    void *ret;

    fill(&p, w, flags | UCP_OP_ATTR_FLAG_NO_IMM_CMPL, mem_type, memh);
    p.cb.recv = (flags & UCPXU_NOTIFY) ? tag_recv_cb_ev : tag_recv_cb;
    ret = ucpxu_post_recv(w, PTR(buf), len, tag, mask, &p);
    if (!is_req(ret) || (flags & UCP_OP_ATTR_FLAG_NO_IMM_CMPL)) {
        return ret;
    }
    r = ret;
    if (!__atomic_load_n(&r->done, __ATOMIC_ACQUIRE)) {
        return ret;
    }
    /* Completed inside the call. */
    if (flags & UCPXU_NOTIFY) {
        /* Its event is the last one queued (progress did not run in between): take it
         * back, as UCX runs no callback for an immediate completion. */
        q_lock(w);
        if (w->nevents > 0 && w->events[w->nevents - 1].ptr == ret) {
            w->nevents--;
            q_unlock(w);
        } else {
            q_unlock(w);
            return ret; /* not found (cannot happen): let the event complete it */
        }
        fill_result(&w->own, r);
        st = r->status;
        release(r);
        return UCS_STATUS_PTR(st);
    }
    st = r->status;
    take_own(w, r, &w->own);
    return UCS_STATUS_PTR(st);
}

void *ucpxu_tag_recv(uintptr_t w, uintptr_t buf, size_t len, uint64_t tag, uint64_t mask,
                    uint32_t flags, int mem_type, uintptr_t memh, unsigned spins)
{
    void *ret = tag_recv(W(w), buf, len, tag, mask, flags, mem_type, memh);
    return settle(W(w), ret, spins, &W(w)->own);
}

void *ucpxu_tag_send_recv(uintptr_t wp, uintptr_t ep, uintptr_t sbuf, size_t slen, uint64_t stag,
                         uintptr_t rbuf, size_t rlen, uint64_t rtag, uint64_t rmask,
                         uint32_t flags, unsigned spins)
{
    ucpxu_worker_t *w = W(wp);
    const uint32_t *yield = &w->share->yield;
    void *sret, *rret;
    ucpxu_req_t *sr, *rr;
    unsigned i;

    flags &= ~UCPXU_NOTIFY;
    sret = tag_send(w, ep, sbuf, slen, stag, flags, UCS_MEMORY_TYPE_HOST, 0);
    w->send_req = sret;
    if (UCS_PTR_IS_ERR(sret)) {
        /* No receive posted: reported canceled, not NULL (a receive that completed in the
         * call, whose reply Go returns): w->own holds an older call's result. */
        return UCS_STATUS_PTR(UCS_ERR_CANCELED);
    }
    rret = tag_recv(w, rbuf, rlen, rtag, rmask, flags, UCS_MEMORY_TYPE_HOST, 0);
    sr = is_req(sret) ? sret : NULL;
    rr = is_req(rret) ? rret : NULL;
    /* Check before each progress call and after the last: a request left behind must
     * not be done, or reap would find it on the done list before Go tracks it. */
    for (i = 0; spins > 0; i++) {
        if (rr != NULL && __atomic_load_n(&rr->done, __ATOMIC_ACQUIRE)) {
            rret = UCS_STATUS_PTR(rr->status);
            take_own(w, rr, &w->own);
            rr = NULL;
        }
        if (sr != NULL && __atomic_load_n(&sr->done, __ATOMIC_ACQUIRE)) {
            sret = UCS_STATUS_PTR(sr->status);
            take_own(w, sr, &w->own2);
            sr = NULL;
        }
        if ((rr == NULL && sr == NULL) || i == spins ||
            (i > 0 && __atomic_load_n(yield, __ATOMIC_RELAXED))) {
            break;
        }
        ucpxu_progress(w);
    }
    if (spins > 0) {
        reap(w);
    }
    w->send_req = sret;
    return rret;
}

void *ucpxu_am_send(uintptr_t w, uintptr_t ep, unsigned id, uintptr_t header, size_t header_len,
                   uintptr_t buf, size_t len, uint32_t flags, uint32_t am_flags, int mem_type,
                   uintptr_t memh)
{
    ucp_request_param_t p;
    fill(&p, W(w), flags, mem_type, memh);
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = am_flags;
    p.cb.send = (flags & UCPXU_NOTIFY) ? send_cb_ev : send_cb;
    return ucp_am_send_nbx((ucp_ep_h)ep, id, PTR(header), header_len, PTR(buf), len, &p);
}

void *ucpxu_am_recv_data(uintptr_t w, uintptr_t desc, uintptr_t buf, size_t len, uint32_t flags,
                        int mem_type, uintptr_t memh)
{
    ucp_request_param_t p;
    void *ret;
    size_t length = len;
    fill(&p, W(w), flags, mem_type, memh);
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_RECV_INFO;
    p.cb.recv_am = (flags & UCPXU_NOTIFY) ? am_data_cb_ev : am_data_cb;
    p.recv_info.length = &length;
    ret = ucp_am_recv_data_nbx(W(w)->worker, PTR(desc), PTR(buf), len, &p);
    if (ret == NULL) {
        W(w)->own.length = length;
    }
    return ret;
}

void *ucpxu_put(uintptr_t w, uintptr_t ep, uintptr_t buf, size_t len, uint64_t raddr,
               uintptr_t rkey, uint32_t flags, int mem_type, uintptr_t memh)
{
    ucp_request_param_t p;
    fill(&p, W(w), flags, mem_type, memh);
    p.cb.send = (flags & UCPXU_NOTIFY) ? send_cb_ev : send_cb;
    return ucp_put_nbx((ucp_ep_h)ep, PTR(buf), len, raddr, (ucp_rkey_h)rkey, &p);
}

void *ucpxu_get(uintptr_t w, uintptr_t ep, uintptr_t buf, size_t len, uint64_t raddr,
               uintptr_t rkey, uint32_t flags, int mem_type, uintptr_t memh)
{
    ucp_request_param_t p;
    fill(&p, W(w), flags, mem_type, memh);
    p.cb.send = (flags & UCPXU_NOTIFY) ? send_cb_ev : send_cb;
    return ucp_get_nbx((ucp_ep_h)ep, PTR(buf), len, raddr, (ucp_rkey_h)rkey, &p);
}

void *ucpxu_atomic(uintptr_t w, uintptr_t ep, int op, uintptr_t operand, size_t size,
                  uintptr_t reply, uint64_t raddr, uintptr_t rkey, uint32_t flags)
{
    ucp_request_param_t p;
    fill(&p, W(w), flags, -1, 0);
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    p.datatype = ucp_dt_make_contig(size);
    p.cb.send = (flags & UCPXU_NOTIFY) ? send_cb_ev : send_cb;
    if (reply != 0) {
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_REPLY_BUFFER;
        p.reply_buffer = PTR(reply);
    }
    return ucp_atomic_op_nbx((ucp_ep_h)ep, (ucp_atomic_op_t)op, PTR(operand), 1, raddr,
                             (ucp_rkey_h)rkey, &p);
}

void *ucpxu_ep_flush(uintptr_t w, uintptr_t ep, uint32_t flags)
{
    ucp_request_param_t p;
    fill(&p, W(w), flags, -1, 0);
    p.cb.send = (flags & UCPXU_NOTIFY) ? send_cb_ev : send_cb;
    return ucp_ep_flush_nbx((ucp_ep_h)ep, &p);
}

void *ucpxu_worker_flush(uintptr_t w, uint32_t flags)
{
    ucp_request_param_t p;
    fill(&p, W(w), flags, -1, 0);
    p.cb.send = (flags & UCPXU_NOTIFY) ? send_cb_ev : send_cb;
    return ucp_worker_flush_nbx(W(w)->worker, &p);
}

void ucpxu_cancel(uintptr_t w, uintptr_t req) { ucp_request_cancel(W(w)->worker, PTR(req)); }

/* ucpxu_abandon hands back a request Go gives up on as its worker closes (UCX never
 * completed it: a close or flush toward a peer that does not progress). UCX frees it
 * when it completes, and ucp_worker_destroy then finds it released instead of
 * asserting; the worker's destruction does not free it again (stopping a chain there
 * progresses the worker, which can complete it onto the done list). */
void ucpxu_abandon(uintptr_t w, uintptr_t req)
{
    ucpxu_req_t *r = PTR(req);
    (void)w;
    r->slot = UCPXU_SLOT_ABANDONED;
    ucp_request_free(r);
}

ucs_status_t ucpxu_arm(uintptr_t w) { return ucp_worker_arm(W(w)->worker); }

ucs_status_t ucpxu_signal(uintptr_t w) { return ucp_worker_signal(W(w)->worker); }

ucs_status_t ucpxu_fence(uintptr_t w) { return ucp_worker_fence(W(w)->worker); }

static void ref_send_cb(void *request, ucs_status_t status, void *user_data)
{
    ucpxu_req_t *r = request;
    r->status = status;
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
}

static void ref_recv_cb(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                        void *user_data)
{
    ref_send_cb(request, status, user_data);
}

/* ref_wait progresses until the operation ret completes and frees it. */
static ucs_status_t ref_wait(ucp_worker_h worker, void *ret)
{
    ucpxu_req_t *r = ret;
    ucs_status_t st;
    if (ret == NULL) {
        return UCS_OK;
    }
    if (UCS_PTR_IS_ERR(ret)) {
        return UCS_PTR_STATUS(ret);
    }
    while (!__atomic_load_n(&r->done, __ATOMIC_ACQUIRE)) {
        ucp_worker_progress(worker);
    }
    st = r->status;
    r->done = 0;
    ucp_request_free(r);
    return st;
}

ucs_status_t ucpxu_ref_pingpong(uintptr_t wp, uintptr_t ep, uintptr_t sbuf, uintptr_t rbuf,
                                size_t len, uint64_t n, int initiator)
{
    ucp_worker_h worker = W(wp)->worker;
    ucp_request_param_t sp = {0}, rp = {0};
    ucp_tag_recv_info_t info;
    uint64_t stag = initiator ? 1 : 2, rtag = initiator ? 2 : 1, i;
    ucs_status_t st;

    sp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    sp.cb.send = ref_send_cb;
    sp.memory_type = UCS_MEMORY_TYPE_HOST;
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_MEMORY_TYPE |
                      UCP_OP_ATTR_FIELD_RECV_INFO;
    rp.cb.recv = ref_recv_cb;
    rp.memory_type = UCS_MEMORY_TYPE_HOST;
    rp.recv_info.tag_info = &info;
    for (i = 0; i < n; i++) {
        void *rr;
        if (initiator) {
            st = ref_wait(worker, ucp_tag_send_nbx((ucp_ep_h)ep, PTR(sbuf), len, stag, &sp));
            if (st != UCS_OK) {
                return st;
            }
        }
        rr = ucp_tag_recv_nbx(worker, PTR(rbuf), len, rtag, (uint64_t)-1, &rp);
        st = ref_wait(worker, rr);
        if (st != UCS_OK) {
            return st;
        }
        if (!initiator) {
            st = ref_wait(worker, ucp_tag_send_nbx((ucp_ep_h)ep, PTR(sbuf), len, stag, &sp));
            if (st != UCS_OK) {
                return st;
            }
        }
    }
    return UCS_OK;
}

ucs_status_t ucpxu_set_am_handler(ucpxu_worker_t *w, unsigned id, ucpxu_cb_arg_t *arg, int enable)
{
    ucp_am_handler_param_t p = {0};
    p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                   UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    p.id = id;
    /* WHOLE_MSG: deliver each message once, assembled; PERSISTENT_DATA: let us
     * keep eager data (zero copy) by returning UCS_INPROGRESS. */
    p.flags = UCP_AM_FLAG_WHOLE_MSG | UCP_AM_FLAG_PERSISTENT_DATA;
    p.cb = enable ? am_cb : NULL;
    p.arg = arg;
    return ucp_worker_set_am_recv_handler(w->worker, &p);
}

ucs_status_t ucpxu_mem_map(ucp_context_h ctx, void *addr, size_t len, int allocate, int mem_type,
                          ucp_mem_h *memh_p, void **addr_p, size_t *len_p)
{
    ucp_mem_map_params_t p = {0};
    ucp_mem_attr_t attr = {0};
    ucs_status_t st;

    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                   UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    p.address = addr;
    p.length = len;
    p.flags = allocate ? UCP_MEM_MAP_ALLOCATE : 0;
    if (mem_type >= 0) {
        p.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
        p.memory_type = (ucs_memory_type_t)mem_type;
    }
    st = ucp_mem_map(ctx, &p, memh_p);
    if (st != UCS_OK) {
        return st;
    }
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    st = ucp_mem_query(*memh_p, &attr);
    if (st != UCS_OK) {
        ucp_mem_unmap(ctx, *memh_p);
        return st;
    }
    *addr_p = attr.address;
    *len_p = attr.length;
    return UCS_OK;
}

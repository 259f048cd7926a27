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
static void push(ucpxu_worker_t *w, const ucpxu_event_t *ev)
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

static void req_complete(void *request, ucs_status_t status, uint64_t tag, size_t length,
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
    push((ucpxu_worker_t*)user_data, &ev);
}

static void send_cb(void *request, ucs_status_t status, void *user_data)
{
    req_complete(request, status, 0, 0, user_data);
}

static void tag_recv_cb(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                        void *user_data)
{
    req_complete(request, status, info ? info->sender_tag : 0, info ? info->length : 0,
                 user_data);
}

static void am_data_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
    req_complete(request, status, 0, length, user_data);
}

static void ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    ucpxu_event_t ev = {0};
    ev.type = UCPX_EV_EP_ERROR;
    ev.status = status;
    ev.ptr = ep;
    push((ucpxu_worker_t*)arg, &ev);
}

static void conn_cb(ucp_conn_request_h conn_request, void *arg)
{
    ucpxu_cb_arg_t *a = arg;
    ucpxu_event_t ev = {0};
    ev.type = UCPX_EV_CONN_REQ;
    ev.ptr = conn_request;
    ev.id = a->id;
    push(a->w, &ev);
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
    push(a->w, &ev);
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

ucs_status_t ucpxu_worker_create(ucp_context_h ctx, int wakeup, ucpxu_worker_t **w_p)
{
    ucp_worker_params_t params = {0};
    ucpxu_worker_t *w = calloc(1, sizeof(*w));
    ucs_status_t st;

    if (w == NULL) {
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
        free(w);
        return st;
    }
    *w_p = w;
    return UCS_OK;
}

void ucpxu_worker_destroy(ucpxu_worker_t *w)
{
    size_t i;
    /* Events not drained by Go still own memory. */
    for (i = 0; i < w->nevents; i++) {
        ucpxu_event_t *ev = &w->events[i];
        if (ev->type == UCPX_EV_REQ_DONE) {
            ucp_request_free(ev->ptr);
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
    ucp_worker_destroy(w->worker);
    free(w->events);
    free(w);
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

size_t ucpxu_progress(ucpxu_worker_t *w, void *req, unsigned max_spins)
{
    unsigned i;
    if (req == NULL) {
        ucp_worker_progress(w->worker);
        return w->nevents;
    }
    for (i = 0; i < max_spins; i++) {
        if (__atomic_load_n(&((ucpxu_req_t*)req)->done, __ATOMIC_ACQUIRE)) {
            break;
        }
        ucp_worker_progress(w->worker);
    }
    return w->nevents;
}

size_t ucpxu_progress_drain(ucpxu_worker_t *w, void *req, unsigned max_spins, ucpxu_event_t *out,
                           size_t max)
{
    if (ucpxu_progress(w, req, max_spins) == 0) {
        return 0;
    }
    return ucpxu_drain(w, out, max);
}

size_t ucpxu_drain(ucpxu_worker_t *w, ucpxu_event_t *out, size_t max)
{
    size_t n, i;
    q_lock(w);
    n = w->nevents < max ? w->nevents : max;
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
            r->done = 0; /* the request memory is recycled by UCX */
            ucp_request_free(r);
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

void *ucpxu_ep_close(ucpxu_worker_t *w, ucp_ep_h ep, int force)
{
    ucp_request_param_t p = {0};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = send_cb;
    p.user_data = w;
    if (force) {
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    }
    return ucp_ep_close_nbx(ep, &p);
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
                        ucp_mem_h memh)
{
    p->op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | flags;
    p->user_data = w;
    if (mem_type >= 0) {
        p->op_attr_mask |= UCP_OP_ATTR_FIELD_MEMORY_TYPE;
        p->memory_type = (ucs_memory_type_t)mem_type;
    }
    if (memh != NULL) {
        p->op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        p->memh = memh;
    }
}

void *ucpxu_tag_send(ucpxu_worker_t *w, ucp_ep_h ep, const void *buf, size_t len, uint64_t tag,
                    uint32_t flags, int mem_type, ucp_mem_h memh)
{
    ucp_request_param_t p;
    fill(&p, w, flags, mem_type, memh);
    p.cb.send = send_cb;
    return ucp_tag_send_nbx(ep, buf, len, tag, &p);
}

void *ucpxu_tag_recv(ucpxu_worker_t *w, void *buf, size_t len, uint64_t tag, uint64_t mask,
                    uint32_t flags, int mem_type, ucp_mem_h memh, ucp_tag_recv_info_t *info)
{
    ucp_request_param_t p;
    ucpxu_req_t *r;
    ucs_status_t st;
    void *ret;

    /* UCX 1.13 does not fill recv_info when a receive completes in place (an
     * unexpected eager message), so ask for the callback instead and turn an
     * in-call completion back into an immediate one here. */
    fill(&p, w, flags | UCP_OP_ATTR_FLAG_NO_IMM_CMPL, mem_type, memh);
    p.cb.recv = tag_recv_cb;
    ret = ucp_tag_recv_nbx(w->worker, buf, len, tag, mask, &p);
    if (UCS_PTR_IS_ERR(ret) || ret == NULL || (flags & UCP_OP_ATTR_FLAG_NO_IMM_CMPL)) {
        return ret;
    }
    r = ret;
    if (!r->done) {
        return ret;
    }
    /* Completed inside the call: its event is the last one queued (progress did
     * not run in between). Take it back and complete in place. */
    q_lock(w);
    if (w->nevents > 0 && w->events[w->nevents - 1].ptr == ret) {
        w->nevents--;
    }
    q_unlock(w);
    info->sender_tag = r->sender_tag;
    info->length = r->length;
    st = r->status;
    r->done = 0;
    ucp_request_free(ret);
    return UCS_STATUS_PTR(st);
}

void *ucpxu_am_send(ucpxu_worker_t *w, ucp_ep_h ep, unsigned id, const void *header,
                   size_t header_len, const void *buf, size_t len, uint32_t flags,
                   uint32_t am_flags, int mem_type, ucp_mem_h memh)
{
    ucp_request_param_t p;
    fill(&p, w, flags, mem_type, memh);
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = am_flags;
    p.cb.send = send_cb;
    return ucp_am_send_nbx(ep, id, header, header_len, buf, len, &p);
}

void *ucpxu_am_recv_data(ucpxu_worker_t *w, void *desc, void *buf, size_t len, uint32_t flags,
                        int mem_type, ucp_mem_h memh, size_t *len_p)
{
    ucp_request_param_t p;
    fill(&p, w, flags, mem_type, memh);
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_RECV_INFO;
    p.cb.recv_am = am_data_cb;
    p.recv_info.length = len_p;
    return ucp_am_recv_data_nbx(w->worker, desc, buf, len, &p);
}

void *ucpxu_put(ucpxu_worker_t *w, ucp_ep_h ep, const void *buf, size_t len, uint64_t raddr,
               ucp_rkey_h rkey, uint32_t flags, int mem_type, ucp_mem_h memh)
{
    ucp_request_param_t p;
    fill(&p, w, flags, mem_type, memh);
    p.cb.send = send_cb;
    return ucp_put_nbx(ep, buf, len, raddr, rkey, &p);
}

void *ucpxu_get(ucpxu_worker_t *w, ucp_ep_h ep, void *buf, size_t len, uint64_t raddr,
               ucp_rkey_h rkey, uint32_t flags, int mem_type, ucp_mem_h memh)
{
    ucp_request_param_t p;
    fill(&p, w, flags, mem_type, memh);
    p.cb.send = send_cb;
    return ucp_get_nbx(ep, buf, len, raddr, rkey, &p);
}

void *ucpxu_atomic(ucpxu_worker_t *w, ucp_ep_h ep, int op, const void *operand, size_t size,
                  void *reply, uint64_t raddr, ucp_rkey_h rkey, uint32_t flags)
{
    ucp_request_param_t p;
    fill(&p, w, flags, -1, NULL);
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    p.datatype = ucp_dt_make_contig(size);
    p.cb.send = send_cb;
    if (reply != NULL) {
        p.op_attr_mask |= UCP_OP_ATTR_FIELD_REPLY_BUFFER;
        p.reply_buffer = reply;
    }
    return ucp_atomic_op_nbx(ep, (ucp_atomic_op_t)op, operand, 1, raddr, rkey, &p);
}

void *ucpxu_ep_flush(ucpxu_worker_t *w, ucp_ep_h ep)
{
    ucp_request_param_t p;
    fill(&p, w, 0, -1, NULL);
    p.cb.send = send_cb;
    return ucp_ep_flush_nbx(ep, &p);
}

void *ucpxu_worker_flush(ucpxu_worker_t *w)
{
    ucp_request_param_t p;
    fill(&p, w, 0, -1, NULL);
    p.cb.send = send_cb;
    return ucp_worker_flush_nbx(w->worker, &p);
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

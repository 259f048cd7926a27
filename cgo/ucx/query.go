package ucx

/*
#include "glue.h"

static size_t ucpxu_max_am_header(ucpxu_worker_t *w) {
    ucp_worker_attr_t attr;
    attr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
    if (ucp_worker_query(w->worker, &attr) != UCS_OK) {
        return 0;
    }
    return attr.max_am_header;
}
*/
import "C"

import "runtime"

// MaxAmHeader is the largest active-message header the worker's transports carry
// (ucp_worker_attr_t.max_am_header); UCX aborts on a larger one. 0 if unknown.
func (w *Worker) MaxAmHeader() int {
	n := int(C.ucpxu_max_am_header(w.w))
	runtime.KeepAlive(w)
	return n
}

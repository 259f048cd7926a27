package ucp

// Fence orders the worker's RMA and atomic operations (ucp_worker_fence): those
// issued after it are carried out at their targets after those issued before it, on
// every endpoint of the worker. It waits for nothing; UCX may keep an operation
// issued after the fence in the worker's queue until the earlier ones completed, so
// the worker must go on being progressed until they left.
func (w *Worker) Fence() error {
	const op = "worker_fence"
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed.Load() {
		return opErr(op, ErrClosed, "")
	}
	if err := statusErr(w.raw.Fence()); err != nil {
		return opErr(op, err, "")
	}
	return nil
}

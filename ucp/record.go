package ucp

import "github.com/ucpx/ucpx/stream/streamcore"

// RecordEvent records ev on the stream of the operation's Stream condition at a point
// the stream reaches only once the operation has completed, so a stream ucpx never saw
// (another library's, a framework's) can wait for it with its own cuStreamWaitEvent: the
// pattern of a PyTorch ProcessGroup backend (MPICH #7612). ev may be an adopted raw
// CUevent (stream.WrapCUDAEvent). An operation without a Stream condition has no stream
// to record on: ErrInvalidParam.
func (r *Request) RecordEvent(ev streamcore.Event) error {
	if r == nil {
		return opErr("record_event", ErrInvalidParam, "nil request")
	}
	if ev == nil {
		return opErr("record_event", ErrInvalidParam, "nil event")
	}
	if r.cop == nil {
		return opErr("record_event", ErrInvalidParam, "%s has no condition: no stream to record on", r.op)
	}
	return opErr("record_event", r.cop.RecordEvent(ev), "%s", r.op)
}

// Package cabi connects the C ABI (capi/libucpx) to the parts of ucp that users must
// not call: sharing a worker with C callers that reach UCX without entering Go, and
// resuming in Go the blocking calls those callers could not finish in C
// (cgo/ucx/fast.h). ucp fills these in at init; the C ABI is their only caller.
package cabi

import (
	"context"
	"unsafe"
)

var (
	// ShareWorker makes w (a *ucp.Worker nobody else uses yet) shareable with C
	// callers and returns its record for ucpxu_fast_tag_recv.
	ShareWorker func(w any) (unsafe.Pointer, error)
	// ShareEndpoint returns the record of ep (a *ucp.Endpoint of a shared worker) for
	// ucpxu_fast_tag_send and ucpxu_fast_tag_send_recv.
	ShareEndpoint func(ep any) (unsafe.Pointer, error)
	// ResumeTagSend, ResumeTagRecv and ResumeTagSendRecv finish a fast call that
	// returned UCPXU_FAST_GO: rec is its record, ret its status pointer; the worker is
	// still held and is let go here. They return what ucp's TagSend, TagRecv and
	// TagSendRecv return.
	ResumeTagSend     func(ctx context.Context, rec, ret unsafe.Pointer, buf []byte, tag uint64) error
	ResumeTagRecv     func(ctx context.Context, rec, ret unsafe.Pointer, buf []byte, tag, mask uint64) (int, uint64, error)
	ResumeTagSendRecv func(ctx context.Context, rec, ret unsafe.Pointer, sbuf []byte, stag uint64, rbuf []byte, rtag, rmask uint64) (int, uint64, error)
	// Progress is w's Progress (w a *ucp.Worker) that also says whether w is closed
	// (an error matching ucp.ErrClosed): ucpx_worker_progress fails on a closed worker,
	// where Worker.Progress only returns 0 (a C loop on its result spun for good).
	Progress func(w any) (int, error)
)

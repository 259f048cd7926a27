package main

/*
#include "internal.h"
*/
import "C"

import (
	"errors"
	"unsafe"

	"github.com/ucpx/ucpx/internal/cabi"
	"github.com/ucpx/ucpx/ucp"
)

// The blocking tag calls (no request handle: the latency path). ucpx_tag_send_wait,
// ucpx_tag_recv_wait and ucpx_tag_sendrecv are C (fast.c): a call that completes
// inside it never enters Go. What it cannot finish in C it hands to a resume below,
// with the worker still held; a handle without a record, bad arguments or a worker
// it could not take go the whole way here (the ucpxi_tag_* calls).

// recvStatus returns a receive's status, and its length and sender tag through
// length and senderTag (either may be NULL): also for a truncated message, whose
// length is the message's.
func recvStatus(n int, tag uint64, err error, length *C.size_t, senderTag *C.uint64_t) C.int {
	if err != nil && !errors.Is(err, ucp.ErrMessageTruncated) && !errors.Is(err, ucp.ErrSendIncomplete) {
		return status(err)
	}
	if length != nil {
		*length = C.size_t(n)
	}
	if senderTag != nil {
		*senderTag = C.uint64_t(tag)
	}
	return status(err)
}

//export ucpxi_tag_send_wait
func ucpxi_tag_send_wait(eh C.ucpx_handle_t, buf unsafe.Pointer, n C.size_t, tag C.uint64_t, ms C.int) C.int {
	ep, err := get[*ucp.Endpoint](eh, "endpoint")
	if err != nil {
		return status(err)
	}
	b, err := buffer(buf, n)
	if err != nil {
		return status(err)
	}
	ctx, cancel := timeoutCtx(ms)
	defer cancel()
	return status(ep.TagSend(ctx, b, uint64(tag)))
}

//export ucpxi_tag_recv_wait
func ucpxi_tag_recv_wait(wh C.ucpx_handle_t, buf unsafe.Pointer, n C.size_t, tag, mask C.uint64_t, ms C.int, length *C.size_t, senderTag *C.uint64_t) C.int {
	w, err := get[*ucp.Worker](wh, "worker")
	if err != nil {
		return status(err)
	}
	b, err := buffer(buf, n)
	if err != nil {
		return status(err)
	}
	ctx, cancel := timeoutCtx(ms)
	defer cancel()
	got, stag, err := w.TagRecv(ctx, b, uint64(tag), uint64(mask))
	return recvStatus(got, stag, err, length, senderTag)
}

//export ucpxi_tag_sendrecv
func ucpxi_tag_sendrecv(eh C.ucpx_handle_t, sbuf unsafe.Pointer, sn C.size_t, stag C.uint64_t, rbuf unsafe.Pointer, rn C.size_t, rtag, rmask C.uint64_t, ms C.int, length *C.size_t, senderTag *C.uint64_t) C.int {
	ep, err := get[*ucp.Endpoint](eh, "endpoint")
	if err != nil {
		return status(err)
	}
	sb, err := buffer(sbuf, sn)
	if err != nil {
		return status(err)
	}
	rb, err := buffer(rbuf, rn)
	if err != nil {
		return status(err)
	}
	ctx, cancel := timeoutCtx(ms)
	defer cancel()
	got, tag, err := ep.TagSendRecv(ctx, sb, uint64(stag), rb, uint64(rtag), uint64(rmask))
	return recvStatus(got, tag, err, length, senderTag)
}

// The resumes' buffers were checked by the C call (it takes the Go path for bad ones).

//export ucpxi_tag_send_resume
func ucpxi_tag_send_resume(rec, ret, buf unsafe.Pointer, n C.size_t, tag C.uint64_t, ms C.int) C.int {
	ctx, cancel := timeoutCtx(ms)
	defer cancel()
	return status(cabi.ResumeTagSend(ctx, rec, ret, ucp.DeviceBuffer(uintptr(buf), int(n)), uint64(tag)))
}

//export ucpxi_tag_recv_resume
func ucpxi_tag_recv_resume(rec, ret, buf unsafe.Pointer, n C.size_t, tag, mask C.uint64_t, ms C.int, length *C.size_t, senderTag *C.uint64_t) C.int {
	ctx, cancel := timeoutCtx(ms)
	defer cancel()
	got, stag, err := cabi.ResumeTagRecv(ctx, rec, ret, ucp.DeviceBuffer(uintptr(buf), int(n)), uint64(tag), uint64(mask))
	return recvStatus(got, stag, err, length, senderTag)
}

//export ucpxi_tag_sendrecv_resume
func ucpxi_tag_sendrecv_resume(rec, ret, sbuf unsafe.Pointer, sn C.size_t, stag C.uint64_t, rbuf unsafe.Pointer, rn C.size_t, rtag, rmask C.uint64_t, ms C.int, length *C.size_t, senderTag *C.uint64_t) C.int {
	ctx, cancel := timeoutCtx(ms)
	defer cancel()
	got, tag, err := cabi.ResumeTagSendRecv(ctx, rec, ret, ucp.DeviceBuffer(uintptr(sbuf), int(sn)), uint64(stag),
		ucp.DeviceBuffer(uintptr(rbuf), int(rn)), uint64(rtag), uint64(rmask))
	return recvStatus(got, tag, err, length, senderTag)
}

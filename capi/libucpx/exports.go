package main

/*
#include "ucpx.h"
*/
import "C"

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/internal/cabi"
	"github.com/ucpx/ucpx/internal/errs"
	"github.com/ucpx/ucpx/prepare"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// The objects behind handles: *ucp.Context, *ucp.Worker, *ucp.Endpoint, *ucp.MemH,
// *ucp.Rkey, *cond, *request and *prepare.Request.

// cond is a stream condition on a caller's CUDA stream.
type cond struct {
	c *condition.Condition
	s stream.Stream // the borrowed CUstream
}

// request is an operation's request and the condition it was given (for RecordEvent).
type request struct {
	r    *ucp.Request
	cond *cond
}

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errs.InvalidParam)...)
}

// buffer is the C memory at p as a slice for the ucp calls (never Go memory, so
// nothing is pinned and the GC never looks at it).
func buffer(p unsafe.Pointer, n C.size_t) ([]byte, error) {
	if int(n) < 0 {
		return nil, invalid("length %d", uint64(n))
	}
	if p == nil && n > 0 {
		return nil, invalid("NULL buffer of %d bytes", uint64(n))
	}
	b := ucp.DeviceBuffer(uintptr(p), int(n))
	if b == nil && n > 0 {
		// A range that wraps around the address space: DeviceBuffer gives nil, which
		// the operations took for an empty buffer (a send of 0 bytes, UCPX_OK).
		return nil, invalid("buffer %p of %d bytes wraps around the address space", p, uint64(n))
	}
	return b, nil
}

// clearHandle sets *out to 0 where out is given: a call that fails returns no handle,
// whatever the caller's variable held (a request may still come with an error: issued).
func clearHandle(out *C.ucpx_handle_t) {
	if out != nil {
		*out = 0
	}
}

// outBuffer is buffer for an operation that returns a request handle through out.
func outBuffer(p unsafe.Pointer, n C.size_t, out *C.ucpx_handle_t) ([]byte, error) {
	b, err := buffer(p, n)
	if err == nil && out == nil {
		err = invalid("NULL output pointer")
	}
	return b, err
}

// created stores o, the result of a create call, as the handle *out (out was checked).
func created(o any, err error, out *C.ucpx_handle_t) C.int {
	if err != nil {
		return status(err)
	}
	*out = put(o)
	return C.UCPX_OK
}

// destroy removes handle h, which must be a T, and closes its object. A Close that
// timed out or found the object busy leaves it in place (MemH.Close: the memory stays
// registered until every importer acknowledged; Endpoint.Close: the flush goes on):
// the handle is put back, so that the caller can call again, as UCPX_ERR_TIMEOUT and
// UCPX_ERR_BUSY promise. Before, it was gone, and the retry got
// UCPX_ERR_INVALID_HANDLE while the memory stayed registered until the context closed.
func destroy[T interface{ Close() error }](h C.ucpx_handle_t, kind string) C.int {
	o, err := take[T](h, kind)
	if err != nil {
		return status(err)
	}
	err = o.Close()
	switch {
	case errors.Is(err, ucp.ErrClosed): // closed with its parent, or by an earlier call: freed, fine
		return C.UCPX_OK
	case errors.Is(err, ucp.ErrTimedOut), errors.Is(err, ucp.ErrBusy):
		putBack(h, o)
	}
	return status(err)
}

// hexOut writes b hex-encoded through putString, or returns err.
func hexOut(b []byte, err error, buf *C.char, n C.size_t, needed *C.size_t) C.int {
	if err != nil {
		return status(err)
	}
	return status(putString(hex.EncodeToString(b), buf, n, needed))
}

// setBool writes ok as 1 or 0 through p, if p is not NULL.
func setBool(p *C.int, ok bool) {
	if p != nil {
		*p = 0
		if ok {
			*p = 1
		}
	}
}

func memType(t C.int) (ucp.MemoryType, error) {
	switch t {
	case C.UCPX_MEMORY_UNKNOWN, C.UCPX_MEMORY_HOST, C.UCPX_MEMORY_CUDA, C.UCPX_MEMORY_CUDA_MANAGED:
		return ucp.MemoryType(t), nil
	}
	return 0, invalid("memory type %d", int(t))
}

// timeoutCtx bounds a wait by ms milliseconds, or none for ms < 0 (then without an
// allocation: the blocking calls are the latency path).
func timeoutCtx(ms C.int) (context.Context, context.CancelFunc) {
	if ms < 0 {
		return context.Background(), func() {}
	}
	return context.WithTimeout(context.Background(), time.Duration(ms)*time.Millisecond)
}

// ---- Context and worker

//export ucpx_context_create
func ucpx_context_create(out *C.ucpx_handle_t) C.int {
	clearHandle(out)
	if out == nil {
		return status(invalid("NULL output pointer"))
	}
	c, err := ucp.NewContext(ucp.ContextParams{})
	return created(c, err, out)
}

//export ucpx_context_destroy
func ucpx_context_destroy(h C.ucpx_handle_t) C.int {
	return destroy[*ucp.Context](h, "context")
}

//export ucpx_worker_create
func ucpx_worker_create(ch C.ucpx_handle_t, flags C.int, out *C.ucpx_handle_t) C.int {
	clearHandle(out)
	c, err := get[*ucp.Context](ch, "context")
	if err != nil {
		return status(err)
	}
	if out == nil || flags&^(C.UCPX_WORKER_PROGRESS_THREAD|C.UCPX_WORKER_NO_WAKEUP) != 0 {
		return status(invalid("flags %#x or NULL output pointer", int(flags)))
	}
	w, err := c.NewWorker(ucp.WorkerParams{
		ProgressThread: flags&C.UCPX_WORKER_PROGRESS_THREAD != 0,
		NoWakeup:       flags&C.UCPX_WORKER_NO_WAKEUP != 0,
	})
	if err != nil {
		return status(err)
	}
	return createdFast(w, cabi.ShareWorker, out)
}

// createdFast stores o, a new worker or endpoint, as the handle *out with the record
// share gives it for the blocking calls in C; o is closed if that fails.
func createdFast[T interface{ Close() error }](o T, share func(any) (unsafe.Pointer, error), out *C.ucpx_handle_t) C.int {
	rec, err := share(o)
	if err != nil {
		_ = o.Close()
		return status(err)
	}
	*out = putFast(o, rec)
	return C.UCPX_OK
}

//export ucpx_worker_destroy
func ucpx_worker_destroy(h C.ucpx_handle_t) C.int {
	return destroy[*ucp.Worker](h, "worker")
}

//export ucpx_worker_address
func ucpx_worker_address(h C.ucpx_handle_t, buf *C.char, n C.size_t, needed *C.size_t) C.int {
	w, err := get[*ucp.Worker](h, "worker")
	if err != nil {
		return status(err)
	}
	addr, err := w.Address()
	return hexOut(addr, err, buf, n, needed)
}

//export ucpx_worker_progress
func ucpx_worker_progress(h C.ucpx_handle_t, count *C.int) C.int {
	w, err := get[*ucp.Worker](h, "worker")
	if err != nil {
		return status(err)
	}
	n, err := cabi.Progress(w)
	if count != nil {
		*count = C.int(n)
	}
	return status(err) // UCPX_ERR_CLOSED once the worker (or its context) was destroyed
}

// ---- Endpoints

//export ucpx_ep_create
func ucpx_ep_create(wh C.ucpx_handle_t, address *C.char, flags C.int, out *C.ucpx_handle_t) C.int {
	clearHandle(out)
	w, err := get[*ucp.Worker](wh, "worker")
	if err != nil {
		return status(err)
	}
	if address == nil || out == nil || flags&^1 != 0 {
		return status(invalid("NULL address or output pointer, or flags %#x", int(flags)))
	}
	addr, err := hex.DecodeString(C.GoString(address))
	if err != nil {
		return status(fmt.Errorf("worker address string: %v: %w", err, ucp.ErrInvalidAddr))
	}
	ep, err := w.ConnectAddress(addr, &ucp.EndpointParams{NoPeerErrorHandling: flags&1 == 0})
	if err != nil {
		return status(err)
	}
	return createdFast(ep, cabi.ShareEndpoint, out)
}

//export ucpx_ep_destroy
func ucpx_ep_destroy(h C.ucpx_handle_t) C.int {
	return destroy[*ucp.Endpoint](h, "endpoint")
}

// ---- Memory and remote keys

//export ucpx_mem_map
func ucpx_mem_map(ch C.ucpx_handle_t, addr unsafe.Pointer, n C.size_t, mt C.int, out *C.ucpx_handle_t) C.int {
	clearHandle(out)
	c, err := get[*ucp.Context](ch, "context")
	if err != nil {
		return status(err)
	}
	t, err := memType(mt)
	if err != nil {
		return status(err)
	}
	if out == nil || addr == nil || n == 0 {
		return status(invalid("NULL address or output pointer, or length 0"))
	}
	m, err := c.MemMapPtr(uintptr(addr), int(n), t)
	return created(m, err, out)
}

//export ucpx_mem_unmap
func ucpx_mem_unmap(h C.ucpx_handle_t) C.int {
	return destroy[*ucp.MemH](h, "memory")
}

//export ucpx_rkey_pack
func ucpx_rkey_pack(h C.ucpx_handle_t, buf *C.char, n C.size_t, needed *C.size_t) C.int {
	m, err := get[*ucp.MemH](h, "memory")
	if err != nil {
		return status(err)
	}
	packed, err := m.PackRkey()
	return hexOut(packed, err, buf, n, needed)
}

//export ucpx_rkey_unpack
func ucpx_rkey_unpack(eh C.ucpx_handle_t, packed *C.char, out *C.ucpx_handle_t) C.int {
	clearHandle(out)
	ep, err := get[*ucp.Endpoint](eh, "endpoint")
	if err != nil {
		return status(err)
	}
	if packed == nil || out == nil {
		return status(invalid("NULL key or output pointer"))
	}
	b, err := hex.DecodeString(C.GoString(packed))
	if err != nil {
		return status(invalid("remote key string: %v", err))
	}
	rk, err := ep.UnpackRkey(b)
	return created(rk, err, out)
}

//export ucpx_rkey_region
func ucpx_rkey_region(h C.ucpx_handle_t, base *C.uint64_t, n *C.size_t) C.int {
	rk, err := get[*ucp.Rkey](h, "remote key")
	if err != nil {
		return status(err)
	}
	if base != nil {
		*base = C.uint64_t(rk.Base())
	}
	if n != nil {
		*n = C.size_t(rk.Len())
	}
	return C.UCPX_OK
}

//export ucpx_rkey_destroy
func ucpx_rkey_destroy(h C.ucpx_handle_t) C.int {
	return destroy[*ucp.Rkey](h, "remote key")
}

// ---- Conditions on a caller's CUDA stream

// cudaBackend is device 0's CUDA backend, opened by the first condition and kept for
// the process: the conditions' signal words come from it.
var cudaBackend struct {
	once sync.Once
	b    stream.Backend
	err  error
}

func openCUDA() (stream.Backend, error) {
	cudaBackend.once.Do(func() { cudaBackend.b, cudaBackend.err = stream.Open(stream.CUDA) })
	return cudaBackend.b, cudaBackend.err
}

//export ucpx_cuda_condition_create
func ucpx_cuda_condition_create(raw C.uintptr_t, out *C.ucpx_handle_t) C.int {
	clearHandle(out)
	if raw == 0 || out == nil {
		return status(invalid("NULL stream (the legacy default stream cannot be wrapped) or output pointer"))
	}
	b, err := openCUDA()
	if err != nil {
		return status(err)
	}
	s, err := stream.WrapCUDAStream(uintptr(raw))
	if err != nil {
		return status(err)
	}
	cs, _ := stream.CUDAStream(s)
	bctx, _, _ := stream.CUDAContext(b)
	if cs.Context().Handle() != bctx.Handle() {
		return status(errors.Join(fmt.Errorf("stream %#x is not of device 0's primary context: %w", uintptr(raw), ucp.ErrUnsupported), s.Close()))
	}
	c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: s})
	if err != nil {
		return status(errors.Join(err, s.Close()))
	}
	*out = put(&cond{c: c, s: s})
	return C.UCPX_OK
}

//export ucpx_condition_record_event
func ucpx_condition_record_event(h C.ucpx_handle_t, ev C.uintptr_t) C.int {
	c, err := get[*cond](h, "condition")
	if err != nil {
		return status(err)
	}
	e, err := stream.WrapCUDAEvent(c.s, uintptr(ev))
	if err != nil {
		return status(err)
	}
	defer e.Close() // borrowed: only the wrapper goes
	return status(c.c.RecordEvent(e))
}

//export ucpx_condition_destroy
func ucpx_condition_destroy(h C.ucpx_handle_t) C.int {
	c, err := take[*cond](h, "condition")
	if err != nil {
		return status(err)
	}
	if err := c.c.Destroy(); err != nil {
		if errors.Is(err, ucp.ErrBusy) || !c.c.Destroyed() {
			// Still there (operations pending, its stream not synchronized): so is the
			// handle, for another call.
			putBack(h, c)
			return status(err)
		}
		// Destroyed despite the error: the borrowed stream's wrapper goes too (it
		// leaked when only BUSY was told apart).
		return status(errors.Join(err, c.s.Close()))
	}
	return status(c.s.Close())
}

// ---- Operations

// param builds the RequestParam of an operation.
func param(mt, flags C.int, ch C.ucpx_handle_t) (*ucp.RequestParam, *cond, error) {
	t, err := memType(mt)
	if err != nil {
		return nil, nil, err
	}
	if flags&^C.UCPX_OP_NONBLOCKING_ENQUEUE != 0 {
		return nil, nil, invalid("flags %#x", int(flags))
	}
	c, err := optional[*cond](ch, "condition")
	if err != nil {
		return nil, nil, err
	}
	p := &ucp.RequestParam{MemoryType: t}
	if c != nil {
		p.Condition = c.c
	}
	if flags&C.UCPX_OP_NONBLOCKING_ENQUEUE != 0 {
		if c == nil {
			return nil, nil, invalid("UCPX_OP_NONBLOCKING_ENQUEUE without a condition")
		}
		p.Flags |= ucp.NonBlockingEnqueue
	}
	return p, c, nil
}

// issued stores the request of an operation; r may come with an error about work
// after its trigger (the operation still runs): the handle is returned with it.
func issued(r *ucp.Request, c *cond, err error, out *C.ucpx_handle_t) C.int {
	if r != nil {
		*out = put(&request{r: r, cond: c})
	}
	return status(err)
}

//export ucpx_tag_send
func ucpx_tag_send(eh C.ucpx_handle_t, buf unsafe.Pointer, n C.size_t, tag C.uint64_t, mt C.int, ch C.ucpx_handle_t, flags C.int, out *C.ucpx_handle_t) C.int {
	clearHandle(out)
	ep, err := get[*ucp.Endpoint](eh, "endpoint")
	if err != nil {
		return status(err)
	}
	b, err := outBuffer(buf, n, out)
	if err != nil {
		return status(err)
	}
	p, c, err := param(mt, flags, ch)
	if err != nil {
		return status(err)
	}
	r, err := ep.TagSendNbx(b, uint64(tag), p)
	return issued(r, c, err, out)
}

//export ucpx_tag_recv
func ucpx_tag_recv(wh C.ucpx_handle_t, buf unsafe.Pointer, n C.size_t, tag, mask C.uint64_t, mt C.int, ch C.ucpx_handle_t, flags C.int, out *C.ucpx_handle_t) C.int {
	clearHandle(out)
	w, err := get[*ucp.Worker](wh, "worker")
	if err != nil {
		return status(err)
	}
	b, err := outBuffer(buf, n, out)
	if err != nil {
		return status(err)
	}
	p, c, err := param(mt, flags, ch)
	if err != nil {
		return status(err)
	}
	r, err := w.TagRecvNbx(b, uint64(tag), uint64(mask), p)
	return issued(r, c, err, out)
}

func rma(put bool, eh C.ucpx_handle_t, buf unsafe.Pointer, n C.size_t, raddr C.uint64_t, rh C.ucpx_handle_t, mt C.int, ch C.ucpx_handle_t, flags C.int, out *C.ucpx_handle_t) C.int {
	ep, err := get[*ucp.Endpoint](eh, "endpoint")
	if err != nil {
		return status(err)
	}
	rk, err := get[*ucp.Rkey](rh, "remote key")
	if err != nil {
		return status(err)
	}
	b, err := outBuffer(buf, n, out)
	if err != nil {
		return status(err)
	}
	p, c, err := param(mt, flags, ch)
	if err != nil {
		return status(err)
	}
	var r *ucp.Request
	if put {
		r, err = ep.PutNbx(b, uint64(raddr), rk, p)
	} else {
		r, err = ep.GetNbx(b, uint64(raddr), rk, p)
	}
	return issued(r, c, err, out)
}

//export ucpx_put
func ucpx_put(eh C.ucpx_handle_t, buf unsafe.Pointer, n C.size_t, raddr C.uint64_t, rh C.ucpx_handle_t, mt C.int, ch C.ucpx_handle_t, flags C.int, out *C.ucpx_handle_t) C.int {
	clearHandle(out)
	return rma(true, eh, buf, n, raddr, rh, mt, ch, flags, out)
}

//export ucpx_get
func ucpx_get(eh C.ucpx_handle_t, buf unsafe.Pointer, n C.size_t, raddr C.uint64_t, rh C.ucpx_handle_t, mt C.int, ch C.ucpx_handle_t, flags C.int, out *C.ucpx_handle_t) C.int {
	clearHandle(out)
	return rma(false, eh, buf, n, raddr, rh, mt, ch, flags, out)
}

//export ucpx_ep_flush
func ucpx_ep_flush(eh C.ucpx_handle_t, out *C.ucpx_handle_t) C.int {
	clearHandle(out)
	ep, err := get[*ucp.Endpoint](eh, "endpoint")
	if err != nil {
		return status(err)
	}
	if out == nil {
		return status(invalid("NULL output pointer"))
	}
	r, err := ep.FlushNbx(nil)
	return issued(r, nil, err, out)
}

// ---- Requests

//export ucpx_request_test
func ucpx_request_test(h C.ucpx_handle_t, done *C.int) C.int {
	r, err := get[*request](h, "request")
	if err != nil {
		return status(err)
	}
	ok, err := r.r.Test()
	setBool(done, ok)
	return status(err)
}

//export ucpx_request_wait
func ucpx_request_wait(h C.ucpx_handle_t, ms C.int) C.int {
	r, err := get[*request](h, "request")
	if err != nil {
		return status(err)
	}
	ctx, cancel := timeoutCtx(ms)
	defer cancel()
	return status(r.r.Wait(ctx))
}

//export ucpx_request_info
func ucpx_request_info(h C.ucpx_handle_t, length *C.size_t, tag *C.uint64_t) C.int {
	r, err := get[*request](h, "request")
	if err != nil {
		return status(err)
	}
	if !r.r.Done() {
		return status(fmt.Errorf("request info: the operation is pending: %w", ucp.ErrBusy))
	}
	if length != nil {
		*length = C.size_t(r.r.Length())
	}
	if tag != nil {
		*tag = C.uint64_t(r.r.SenderTag())
	}
	return C.UCPX_OK
}

//export ucpx_request_record_event
func ucpx_request_record_event(h C.ucpx_handle_t, ev C.uintptr_t) C.int {
	r, err := get[*request](h, "request")
	if err != nil {
		return status(err)
	}
	if r.cond == nil {
		return status(invalid("request without a condition: no stream to record the event on"))
	}
	e, err := stream.WrapCUDAEvent(r.cond.s, uintptr(ev))
	if err != nil {
		return status(err)
	}
	defer e.Close() // borrowed: only the wrapper goes
	return status(r.r.RecordEvent(e))
}

//export ucpx_request_cancel
func ucpx_request_cancel(h C.ucpx_handle_t) C.int {
	r, err := get[*request](h, "request")
	if err != nil {
		return status(err)
	}
	r.r.Cancel()
	return C.UCPX_OK
}

//export ucpx_request_free
func ucpx_request_free(h C.ucpx_handle_t) C.int {
	_, err := take[*request](h, "request")
	return status(err)
}

// ---- Prepared partitioned operations

func pinit(send bool, wh, eh C.ucpx_handle_t, buf unsafe.Pointer, n C.size_t, parts C.int, tag C.uint64_t, out *C.ucpx_handle_t) C.int {
	w, err := get[*ucp.Worker](wh, "worker")
	if err != nil {
		return status(err)
	}
	ep, err := get[*ucp.Endpoint](eh, "endpoint")
	if err != nil {
		return status(err)
	}
	b, err := outBuffer(buf, n, out)
	if err != nil {
		return status(err)
	}
	p := prepare.Params{Peer: ep, Tag: uint64(tag), Partitions: int(parts)}
	var r *prepare.Request
	if send {
		r, err = prepare.PsendInit(w, b, p)
	} else {
		r, err = prepare.PrecvInit(w, b, p)
	}
	return created(r, err, out)
}

//export ucpx_psend_init
func ucpx_psend_init(wh, eh C.ucpx_handle_t, buf unsafe.Pointer, n C.size_t, parts C.int, tag C.uint64_t, out *C.ucpx_handle_t) C.int {
	clearHandle(out)
	return pinit(true, wh, eh, buf, n, parts, tag, out)
}

//export ucpx_precv_init
func ucpx_precv_init(wh, eh C.ucpx_handle_t, buf unsafe.Pointer, n C.size_t, parts C.int, tag C.uint64_t, out *C.ucpx_handle_t) C.int {
	clearHandle(out)
	return pinit(false, wh, eh, buf, n, parts, tag, out)
}

// maxPrepareAll bounds one ucpx_prepare_all's array (a larger n is a caller's bug,
// and the array is read before anything else is checked).
const maxPrepareAll = 1 << 20

//export ucpx_prepare_all
func ucpx_prepare_all(hs *C.ucpx_handle_t, n C.size_t, ms C.int) C.int {
	if hs == nil && n > 0 {
		return status(invalid("NULL request array"))
	}
	if uint64(n) > maxPrepareAll {
		return status(invalid("%d requests (at most %d)", uint64(n), uint64(maxPrepareAll)))
	}
	reqs := make([]*prepare.Request, 0, int(n))
	for _, h := range unsafe.Slice(hs, int(n)) {
		r, err := get[*prepare.Request](h, "partitioned request")
		if err != nil {
			return status(err)
		}
		reqs = append(reqs, r)
	}
	ctx, cancel := timeoutCtx(ms)
	defer cancel()
	return status(prepare.PrepareAll(ctx, reqs...))
}

//export ucpx_pstart
func ucpx_pstart(h C.ucpx_handle_t) C.int {
	r, err := get[*prepare.Request](h, "partitioned request")
	if err != nil {
		return status(err)
	}
	return status(r.Start())
}

//export ucpx_pready
func ucpx_pready(h C.ucpx_handle_t, p C.int) C.int {
	r, err := get[*prepare.Request](h, "partitioned request")
	if err != nil {
		return status(err)
	}
	return status(r.Pready(int(p)))
}

//export ucpx_parrived
func ucpx_parrived(h C.ucpx_handle_t, p C.int, arrived *C.int) C.int {
	r, err := get[*prepare.Request](h, "partitioned request")
	if err != nil {
		return status(err)
	}
	ok, err := r.Parrived(int(p))
	setBool(arrived, ok)
	return status(err)
}

//export ucpx_pwait
func ucpx_pwait(h C.ucpx_handle_t, ms C.int) C.int {
	r, err := get[*prepare.Request](h, "partitioned request")
	if err != nil {
		return status(err)
	}
	ctx, cancel := timeoutCtx(ms)
	defer cancel()
	return status(r.Wait(ctx))
}

//export ucpx_pfree
func ucpx_pfree(h C.ucpx_handle_t) C.int {
	r, err := get[*prepare.Request](h, "partitioned request")
	if err != nil {
		return status(err)
	}
	err = r.Free()
	if errors.Is(err, prepare.ErrBusy) {
		return status(err) // nothing changed: the handle stays, usable meanwhile too
	}
	if derr := drop(h, r, "partitioned request"); derr != nil {
		return status(derr) // another thread freed it first
	}
	return status(err)
}

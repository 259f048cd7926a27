// Package ucx is the raw cgo layer over Debian's UCX 1.13 (libucp): one Go function
// per C helper in glue.c, handles as small Go structs holding C pointers, statuses as
// Status. It holds no policy: locking, lifetimes, pinning and errors belong to package ucp.
//
// Callbacks from UCX never enter Go. A completion without a Go callback only fills
// its request, which the waiting call reads and frees or a later progressing call
// reaps (Reaped); the rest goes to a per-worker event queue that Drain copies out; see
// glue.h. Handles and buffers cross into C as uintptr_t (no cgo pointer check per
// argument): the callers keep the Go memory behind them alive (runtime.KeepAlive here)
// and in place (the Go heap does not move objects; pending buffers are pinned).
package ucx

/*
#cgo pkg-config: ucx
#cgo LDFLAGS: -lucp -lucs
#include <stdlib.h>
#include "glue.h"
*/
import "C"

import (
	"runtime"
	"sync/atomic"
	"unsafe"
)

// Status is a ucs_status_t.
type Status int32

// Status values of UCX 1.13 (ucs/type/status.h).
const (
	OK                  Status = C.UCS_OK
	InProgress          Status = C.UCS_INPROGRESS
	ErrNoMessage        Status = C.UCS_ERR_NO_MESSAGE
	ErrNoResource       Status = C.UCS_ERR_NO_RESOURCE
	ErrIOError          Status = C.UCS_ERR_IO_ERROR
	ErrNoMemory         Status = C.UCS_ERR_NO_MEMORY
	ErrInvalidParam     Status = C.UCS_ERR_INVALID_PARAM
	ErrUnreachable      Status = C.UCS_ERR_UNREACHABLE
	ErrInvalidAddr      Status = C.UCS_ERR_INVALID_ADDR
	ErrNotImplemented   Status = C.UCS_ERR_NOT_IMPLEMENTED
	ErrMessageTruncated Status = C.UCS_ERR_MESSAGE_TRUNCATED
	ErrNoProgress       Status = C.UCS_ERR_NO_PROGRESS
	ErrBufferTooSmall   Status = C.UCS_ERR_BUFFER_TOO_SMALL
	ErrNoElem           Status = C.UCS_ERR_NO_ELEM
	ErrSomeConnectsFail Status = C.UCS_ERR_SOME_CONNECTS_FAILED
	ErrNoDevice         Status = C.UCS_ERR_NO_DEVICE
	ErrBusy             Status = C.UCS_ERR_BUSY
	ErrCanceled         Status = C.UCS_ERR_CANCELED
	ErrShmemSegment     Status = C.UCS_ERR_SHMEM_SEGMENT
	ErrAlreadyExists    Status = C.UCS_ERR_ALREADY_EXISTS
	ErrOutOfRange       Status = C.UCS_ERR_OUT_OF_RANGE
	ErrTimedOut         Status = C.UCS_ERR_TIMED_OUT
	ErrExceedsLimit     Status = C.UCS_ERR_EXCEEDS_LIMIT
	ErrUnsupported      Status = C.UCS_ERR_UNSUPPORTED
	ErrRejected         Status = C.UCS_ERR_REJECTED
	ErrNotConnected     Status = C.UCS_ERR_NOT_CONNECTED
	ErrConnectionReset  Status = C.UCS_ERR_CONNECTION_RESET
	ErrFirstLinkFailure Status = C.UCS_ERR_FIRST_LINK_FAILURE
	ErrLastLinkFailure  Status = C.UCS_ERR_LAST_LINK_FAILURE
	ErrFirstEPFailure   Status = C.UCS_ERR_FIRST_ENDPOINT_FAILURE
	ErrEndpointTimeout  Status = C.UCS_ERR_ENDPOINT_TIMEOUT
	ErrLastEPFailure    Status = C.UCS_ERR_LAST_ENDPOINT_FAILURE
	errLast             Status = C.UCS_ERR_LAST
)

// statusPtrErrBoundary is UCS_PTR_IS_ERR's threshold: (uintptr)UCS_ERR_LAST.
var statusPtrErrBoundary = func() uintptr { v := int64(errLast); return uintptr(v) }()

// String is UCX's own text for the status.
func (s Status) String() string { return C.GoString(C.ucs_status_string(C.ucs_status_t(s))) }

// Feature bits of ucp_params_t.features.
const (
	FeatureTag    uint64 = C.UCP_FEATURE_TAG
	FeatureRMA    uint64 = C.UCP_FEATURE_RMA
	FeatureAMO32  uint64 = C.UCP_FEATURE_AMO32
	FeatureAMO64  uint64 = C.UCP_FEATURE_AMO64
	FeatureWakeup uint64 = C.UCP_FEATURE_WAKEUP
	FeatureAM     uint64 = C.UCP_FEATURE_AM
)

// Operation attribute flags (ucp_op_attr_t).
const (
	OpNoImmCmpl    uint32 = C.UCP_OP_ATTR_FLAG_NO_IMM_CMPL
	OpFastCmpl     uint32 = C.UCP_OP_ATTR_FLAG_FAST_CMPL
	OpForceImmCmpl uint32 = C.UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL
	OpMultiSend    uint32 = C.UCP_OP_ATTR_FLAG_MULTI_SEND
)

// AM send flags and receive attributes.
const (
	AmSendReply uint32 = C.UCP_AM_SEND_FLAG_REPLY
	AmSendEager uint32 = C.UCP_AM_SEND_FLAG_EAGER
	AmSendRndv  uint32 = C.UCP_AM_SEND_FLAG_RNDV

	AmRecvReplyEP uint64 = C.UCP_AM_RECV_ATTR_FIELD_REPLY_EP
	AmRecvData    uint64 = C.UCP_AM_RECV_ATTR_FLAG_DATA
	AmRecvRndv    uint64 = C.UCP_AM_RECV_ATTR_FLAG_RNDV
	AmRecvCopied  uint64 = C.UCPX_AM_COPIED
)

// Atomic opcodes (ucp_atomic_op_t).
const (
	AtomicAdd   = C.UCP_ATOMIC_OP_ADD
	AtomicSwap  = C.UCP_ATOMIC_OP_SWAP
	AtomicCswap = C.UCP_ATOMIC_OP_CSWAP
	AtomicAnd   = C.UCP_ATOMIC_OP_AND
	AtomicOr    = C.UCP_ATOMIC_OP_OR
	AtomicXor   = C.UCP_ATOMIC_OP_XOR
)

// Memory types (ucs_memory_type_t).
const (
	MemHost        = C.UCS_MEMORY_TYPE_HOST
	MemCUDA        = C.UCS_MEMORY_TYPE_CUDA
	MemCUDAManaged = C.UCS_MEMORY_TYPE_CUDA_MANAGED
	MemROCm        = C.UCS_MEMORY_TYPE_ROCM
	MemROCmManaged = C.UCS_MEMORY_TYPE_ROCM_MANAGED
	MemLast        = C.UCS_MEMORY_TYPE_LAST
)

// Event types of the worker queue.
const (
	EvReqDone  = C.UCPX_EV_REQ_DONE
	EvEPError  = C.UCPX_EV_EP_ERROR
	EvConnReq  = C.UCPX_EV_CONN_REQ
	EvAmRecv   = C.UCPX_EV_AM_RECV
	EvCutOff   = C.UCPX_EV_CUT_OFF
	EventBatch = C.UCPXU_EVENT_BATCH
	// ReapBatch is the most results one call reaps.
	ReapBatch = C.UCPXU_REAP_MAX
)

// Notify, in an operation's flags, sends its completion through the event queue (a Go
// callback waits for it) instead of the done list. UCX never sees it.
const Notify uint32 = C.UCPXU_NOTIFY

// Version returns the UCX library version.
func Version() (major, minor, release uint) {
	var a, b, c C.uint
	C.ucp_get_version(&a, &b, &c)
	return uint(a), uint(b), uint(c)
}

// Context is a ucp_context_h.
type Context struct {
	h        C.ucp_context_h
	features uint64 // what Init asked for
}

// Init creates a context. cfg holds UCX configuration overrides (name without the UCX_ prefix).
func Init(features uint64, cfg map[string]string, estimatedEPs int) (*Context, Status) {
	kv := make([]*C.char, 0, 2*len(cfg))
	for k, v := range cfg {
		kv = append(kv, C.CString(k), C.CString(v))
	}
	defer func() {
		for _, p := range kv {
			C.free(unsafe.Pointer(p))
		}
	}()
	var arr **C.char
	if len(kv) > 0 {
		// C memory, so the array itself may be handed over.
		a := (*[1 << 20]*C.char)(C.malloc(C.size_t(len(kv)) * C.size_t(unsafe.Sizeof(kv[0]))))
		copy(a[:len(kv)], kv)
		arr = &a[0]
		defer C.free(unsafe.Pointer(arr))
	}
	c := &Context{features: features}
	st := C.ucpxu_init(C.uint64_t(features), arr, C.int(len(kv)/2), C.size_t(estimatedEPs), &c.h)
	if st != C.UCS_OK {
		return nil, Status(st)
	}
	return c, OK
}

// Cleanup destroys the context.
func (c *Context) Cleanup() { C.ucp_cleanup(c.h) }

// MemoryTypes is the bitmap of ucs_memory_type_t the context can communicate from.
func (c *Context) MemoryTypes() uint64 { return uint64(C.ucpxu_context_mem_types(c.h)) }

// Print writes UCX's description of the context to stdout (ucp_context_print_info).
func (c *Context) Print() { C.ucp_context_print_info(c.h, C.stdout) }

// MemH is a ucp_mem_h.
type MemH struct{ h C.ucp_mem_h }

// MemMap registers (or, with allocate, allocates and registers) memory.
func (c *Context) MemMap(addr unsafe.Pointer, length int, allocate bool, memType int) (*MemH, unsafe.Pointer, int, Status) {
	m := &MemH{}
	var outAddr unsafe.Pointer
	var outLen C.size_t
	st := C.ucpxu_mem_map(c.h, addr, C.size_t(length), cbool(allocate), C.int(memType), &m.h, &outAddr, &outLen)
	if st != C.UCS_OK {
		return nil, nil, 0, Status(st)
	}
	return m, outAddr, int(outLen), OK
}

// Addr converts an integer address of memory Go does not manage (C, pinned host or
// device memory) into a pointer for UCX. Pointer arithmetic from nil, not a cgo call
// (tens of nanoseconds, twice per call of the C ABI's blocking tag calls): such
// memory is outside Go's heap, which is all the pointer rules protect.
func Addr(a uintptr) unsafe.Pointer { return unsafe.Add(unsafe.Pointer(nil), a) }

// MemUnmap releases the registration (and the memory if it was allocated).
func (c *Context) MemUnmap(m *MemH) Status { return Status(C.ucp_mem_unmap(c.h, m.h)) }

// RkeyPack packs the remote key of m; the bytes are copied into Go memory.
func (c *Context) RkeyPack(m *MemH) ([]byte, Status) {
	var buf unsafe.Pointer
	var n C.size_t
	st := C.ucp_rkey_pack(c.h, m.h, &buf, &n)
	if st != C.UCS_OK {
		return nil, Status(st)
	}
	out := C.GoBytes(buf, C.int(n))
	C.ucp_rkey_buffer_release(buf)
	return out, OK
}

// Worker is a ucpxu_worker_t: a ucp_worker_h plus its event queue, its done list and
// the results its calls leave in C memory, which Go reads without a call.
type Worker struct {
	w   *C.ucpxu_worker_t
	h   C.uintptr_t // w, as the calls take it
	res *[ReapBatch]Result
}

// Result is the result of one completed request (ucpxu_result_t).
type Result struct {
	Slot   uint64
	Tag    uint64
	Length uint64
	Status int64
}

// NewWorker creates a worker in serialized thread mode.
func (c *Context) NewWorker(wakeup bool) (*Worker, Status) {
	w := &Worker{}
	st := C.ucpxu_worker_create(c.h, cbool(wakeup), cbool(c.features&FeatureAM != 0), &w.w)
	if st != C.UCS_OK {
		return nil, Status(st)
	}
	w.h = C.uintptr_t(uintptr(unsafe.Pointer(w.w)))
	w.res = (*[ReapBatch]Result)(unsafe.Pointer(&w.w.reaped[0]))
	// The share (YieldWord) outlives Destroy: callers keep its address for as long
	// as they hold w, and a call on a closed worker still touches it.
	runtime.AddCleanup(w, func(s *C.ucpxu_share_t) { C.ucpxu_share_release(s) }, w.w.share)
	return w, OK
}

// Destroy destroys the worker; undrained events and unreaped requests are released.
func (w *Worker) Destroy() { C.ucpxu_worker_destroy(w.w) }

// Address returns the worker address bytes.
func (w *Worker) Address() ([]byte, Status) {
	var p unsafe.Pointer
	var n C.size_t
	st := C.ucpxu_worker_address(w.w, &p, &n)
	if st != C.UCS_OK {
		return nil, Status(st)
	}
	out := C.GoBytes(p, C.int(n))
	C.ucpxu_worker_address_release(w.w, p)
	return out, OK
}

// TagBits is how many low bits of a tag are the user's; the bits above carry the
// sender's source id.
const TagBits = C.UCPXU_TAG_BITS

// PullBit marks a tag message whose payload is a pull descriptor (ucp's tagpull.go):
// sends keep it, receives report it with the sender's source bits.
const PullBit = uint64(1) << 63

// SetUnmatched sets this worker's source id (below 1<<(63-TagBits)), which its sends
// carry, and turns the unmatched-data ledger on with limit bytes per source (0: off).
func (w *Worker) SetUnmatched(limit uint64, source uint64) {
	C.ucpxu_um_set(w.h, C.uint64_t(limit), C.uint64_t(source))
}

// UnmatchedHeld is what the ledger charges source now (messages taken from UCX's
// unexpected queue and not matched yet).
func (w *Worker) UnmatchedHeld(source uint64) uint64 {
	return uint64(C.ucpxu_um_held(w.h, C.unsigned(source)))
}

// TakeUnmatched takes every unexpected message into the ledger's queue now, as a look
// that found them sitting does (tests).
func (w *Worker) TakeUnmatched() { C.ucpxu_um_take_all(w.w) }

// UnmatchedCounts: messages the ledger took from UCX's queue, and discarded (of
// sources cut off), since the worker was made.
func (w *Worker) UnmatchedCounts() (taken, discarded uint64) {
	return uint64(w.w.um.taken), uint64(w.w.um.discarded)
}

// EventFD returns the worker's wakeup file descriptor.
func (w *Worker) EventFD() (int, Status) {
	var fd C.int
	st := C.ucp_worker_get_efd(w.w.worker, &fd)
	return int(fd), Status(st)
}

// Arm arms the event fd; ErrBusy means events are pending and progress is needed.
func (w *Worker) Arm() Status { return Status(C.ucpxu_arm(w.h)) }

// Signal wakes up a thread blocked on the event fd. UCX allows it from any thread.
func (w *Worker) Signal() Status { return Status(C.ucpxu_signal(w.h)) }

// Fence orders the RMA and atomic operations issued before it before those issued
// after it, at their targets (ucp_worker_fence).
func (w *Worker) Fence() Status { return Status(C.ucpxu_fence(w.h)) }

// Pending is the number of queued events, read without a cgo call.
func (w *Worker) Pending() int { return int(w.w.nevents) }

// Unreaped is the number of completed requests on the done list, read without a call.
func (w *Worker) Unreaped() int { return int(w.w.ndone) }

// Wait progresses until req (nil: none) completes or maxSpins rounds pass (nil: once).
// With own, a completed req's result is taken into Own and req is freed; it reports
// whether that happened. Other completed requests are reaped into Reaped.
func (w *Worker) Wait(req unsafe.Pointer, maxSpins uint, own bool) bool {
	return C.ucpxu_wait(w.h, C.uintptr_t(uintptr(req)), C.uint(maxSpins), cbool(own)) != 0
}

// Progress progresses once and reaps.
func (w *Worker) Progress() { C.ucpxu_wait(w.h, 0, 1, 0) }

// YieldWord is the worker's yield word: while it is nonzero the calls that spin
// (Wait, the fused calls) return after at most one progress call. Update it with
// sync/atomic only; it lives as long as this Worker value is reachable, Destroy or
// not (for ever, once shared).
func (w *Worker) YieldWord() *uint32 { return (*uint32)(unsafe.Pointer(&w.w.share.yield)) }

// Share makes the worker's words outlive it and returns its owner word, which C
// callers of fast.h take to call UCX on the worker: from now on whoever calls UCX on
// it must hold that word (sync/atomic: 0 free, 1 held).
func (w *Worker) Share() *uint32 { return (*uint32)(unsafe.Pointer(C.ucpxu_share_keep(w.w))) }

// Fast is a record of fast.h: a worker or endpoint that C callers reach without Go.
type Fast struct{ f *C.ucpxu_fast_t }

// NewFast makes the record of ep (nil: of the worker itself) for a shared worker. obj
// is a runtime/cgo.Handle of the Go object that resumes the C calls; spins the fused
// calls' progress rounds. Call with the owner word held; nil when out of memory.
func (w *Worker) NewFast(ep *EP, obj uintptr, spins uint) *Fast {
	var e C.uintptr_t
	if ep != nil {
		e = ep.u()
	}
	f := C.ucpxu_fast_new(w.w, e, C.uintptr_t(obj), C.uint(spins))
	if f == nil {
		return nil
	}
	return &Fast{f}
}

// FastAt is the record at p (a pointer C passed back).
func FastAt(p unsafe.Pointer) *Fast { return &Fast{(*C.ucpxu_fast_t)(p)} }

// Ptr is the record's address, for C.
func (f *Fast) Ptr() unsafe.Pointer { return unsafe.Pointer(f.f) }

// Object is the handle NewFast was given.
func (f *Fast) Object() uintptr { return uintptr(C.ucpxu_fast_go(f.f)) }

// What the fast calls return (UCPXU_FAST_*).
const (
	FastDone = C.UCPXU_FAST_DONE
	FastGo   = C.UCPXU_FAST_GO
	FastNone = C.UCPXU_FAST_NONE
)

// TagSendRecv is ucpxu_fast_tag_send_recv, the C callers' blocking call, from Go (the
// C ABI calls it from C): code is FastDone (n and tag are the received message's),
// FastGo (the worker is held: resume with ret) or FastNone. The buffers stay in use
// while an operation is pending.
func (f *Fast) TagSendRecv(sbuf unsafe.Pointer, sn int, stag uint64, rbuf unsafe.Pointer, rn int, rtag, rmask uint64) (code, n int, tag uint64, ret unsafe.Pointer) {
	var l C.size_t
	var t C.uint64_t
	code = int(C.ucpxu_fast_tag_send_recv(f.f, sbuf, C.size_t(sn), C.uint64_t(stag), rbuf, C.size_t(rn), C.uint64_t(rtag), C.uint64_t(rmask), &l, &t, &ret))
	return code, int(l), uint64(t), ret
}

// TagSend is ucpxu_fast_tag_send from Go; see TagSendRecv.
func (f *Fast) TagSend(buf unsafe.Pointer, n int, tag uint64) (code int, ret unsafe.Pointer) {
	code = int(C.ucpxu_fast_tag_send(f.f, buf, C.size_t(n), C.uint64_t(tag), &ret))
	return code, ret
}

// TagRecv is ucpxu_fast_tag_recv from Go; see TagSendRecv.
func (f *Fast) TagRecv(buf unsafe.Pointer, n int, tag, mask uint64) (code, got int, senderTag uint64, ret unsafe.Pointer) {
	var l C.size_t
	var t C.uint64_t
	code = int(C.ucpxu_fast_tag_recv(f.f, buf, C.size_t(n), C.uint64_t(tag), C.uint64_t(mask), &l, &t, &ret))
	return code, int(l), uint64(t), ret
}

// Retire makes the record unusable: C callers take the Go path from now on. Call with
// the owner word held. The record's memory is never freed.
func (f *Fast) Retire() { C.ucpxu_fast_retire(f.f) }

// Reap moves completed requests into Reaped without progressing.
func (w *Worker) Reap() { C.ucpxu_reap(w.h) }

// TakeReaped returns the results the last progressing call reaped, once: a later
// call returns them no more. They stay valid until the next call into C.
func (w *Worker) TakeReaped() []Result {
	n := int(w.w.nreaped)
	if n == 0 {
		return nil
	}
	w.w.nreaped = 0
	return w.res[:n:n]
}

// Result must have ucpxu_result_t's layout.
var _ = [1]struct{}{}[unsafe.Sizeof(Result{})-C.sizeof_ucpxu_result_t]

// Own is the result of the request the last call waited on or posted, once completed.
func (w *Worker) Own() (st Status, tag uint64, length int) {
	o := &w.w.own
	return Status(o.status), uint64(o.tag), int(o.length)
}

// OwnSend is the send's result of the last TagSendRecv, once completed.
func (w *Worker) OwnSend() Status { return Status(w.w.own2.status) }

// SendReq is the send's status pointer of the last TagSendRecv.
func (w *Worker) SendReq() unsafe.Pointer { return w.w.send_req }

// Progressed is the sum of what ucp_worker_progress returned in this worker's progress
// calls (the remote operations UCX applied for peers included); safe without the lock.
func (w *Worker) Progressed() uint64 {
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&w.w.progressed)))
}

// Event is one drained event; see ucpxu_event_t.
type Event struct {
	Type      int
	Status    Status
	Ptr       unsafe.Pointer
	ID        uint64
	Tag       uint64
	Length    int
	Header    unsafe.Pointer
	HeaderLen int
	ReplyEP   unsafe.Pointer
	Flags     uint64
}

// Drain moves up to EventBatch events into out and returns them.
func (w *Worker) Drain(out []Event) []Event {
	n := int(C.ucpxu_drain(w.h))
	for i := 0; i < n; i++ {
		e := &w.w.out[i]
		out = append(out, Event{
			Type: int(e._type), Status: Status(e.status), Ptr: e.ptr, ID: uint64(e.id),
			Tag: uint64(e.tag), Length: int(e.length), Header: e.header,
			HeaderLen: int(e.header_len), ReplyEP: e.reply_ep, Flags: uint64(e.flags),
		})
	}
	return out
}

// SetSlot records which Go request waits on the UCX request req.
func SetSlot(req unsafe.Pointer, slot uint64) { (*C.ucpxu_req_t)(req).slot = C.uint64_t(slot) }

// Free releases C memory handed out with an event (AM header, copied AM data).
func Free(p unsafe.Pointer) { C.free(p) }

// CallbackArg is C memory identifying a listener or AM handler to its C callback.
type CallbackArg struct{ a *C.ucpxu_cb_arg_t }

// NewCallbackArg allocates an argument block for id.
func (w *Worker) NewCallbackArg(id uint64) *CallbackArg {
	a := (*C.ucpxu_cb_arg_t)(C.calloc(1, C.sizeof_ucpxu_cb_arg_t))
	a.w = w.w
	a.id = C.uint64_t(id)
	return &CallbackArg{a: a}
}

// Free releases the argument block.
func (a *CallbackArg) Free() { C.free(unsafe.Pointer(a.a)) }

// EP is a ucp_ep_h.
type EP struct{ h C.ucp_ep_h }

// Ptr is the raw handle, used as a map key to find the Go endpoint of an event.
func (e *EP) Ptr() unsafe.Pointer { return unsafe.Pointer(e.h) }

// ConnectSockaddr creates a client-server endpoint to ip:port.
func (w *Worker) ConnectSockaddr(ip []byte, port int, peerErr bool) (*EP, Status) {
	e := &EP{}
	st := C.ucpxu_ep_create_sockaddr(w.w, (*C.uint8_t)(unsafe.Pointer(&ip[0])), C.int(len(ip)), C.int(port), cbool(peerErr), &e.h)
	return e, Status(st)
}

// ConnectAddress creates an endpoint to a worker address (C memory or pinned).
func (w *Worker) ConnectAddress(addr []byte, peerErr bool) (*EP, Status) {
	e := &EP{}
	ca := C.CBytes(addr)
	defer C.free(ca)
	st := C.ucpxu_ep_create_worker(w.w, ca, cbool(peerErr), &e.h)
	return e, Status(st)
}

// ConnRequest is a ucp_conn_request_h.
type ConnRequest struct{ h C.ucp_conn_request_h }

// ConnRequestFromEvent wraps the handle of a UCPX_EV_CONN_REQ event.
func ConnRequestFromEvent(p unsafe.Pointer) *ConnRequest {
	return &ConnRequest{h: C.ucp_conn_request_h(p)}
}

// Accept creates the server-side endpoint of a connection request.
func (w *Worker) Accept(r *ConnRequest, peerErr bool) (*EP, Status) {
	e := &EP{}
	st := C.ucpxu_ep_create_conn(w.w, r.h, cbool(peerErr), &e.h)
	return e, Status(st)
}

// RemoteAddr is the client's IP and port.
func (r *ConnRequest) RemoteAddr() ([]byte, int, Status) {
	var ip [16]byte
	var n, port C.int
	st := C.ucpxu_conn_request_addr(r.h, (*C.uint8_t)(unsafe.Pointer(&ip[0])), &n, &port)
	if st != C.UCS_OK {
		return nil, 0, Status(st)
	}
	return append([]byte(nil), ip[:n]...), int(port), OK
}

// Close starts closing the endpoint; the result is a status pointer. Its completion
// goes to the done list.
func (w *Worker) Close(e *EP, force bool) unsafe.Pointer {
	return C.ucpxu_ep_close(w.h, e.u(), cbool(force), 0)
}

// Listener is a ucp_listener_h.
type Listener struct{ h C.ucp_listener_h }

// Listen creates a listener on ip:port (port 0 picks one).
func (w *Worker) Listen(ip []byte, port int, arg *CallbackArg) (*Listener, Status) {
	l := &Listener{}
	st := C.ucpxu_listener_create(w.w, (*C.uint8_t)(unsafe.Pointer(&ip[0])), C.int(len(ip)), C.int(port), arg.a, &l.h)
	return l, Status(st)
}

// Port is the port the listener is bound to.
func (l *Listener) Port() (int, Status) {
	var p C.int
	st := C.ucpxu_listener_port(l.h, &p)
	return int(p), Status(st)
}

// Reject refuses a connection request.
func (l *Listener) Reject(r *ConnRequest) Status { return Status(C.ucpxu_listener_reject(l.h, r.h)) }

// Destroy destroys the listener.
func (l *Listener) Destroy() { C.ucp_listener_destroy(l.h) }

// Rkey is a ucp_rkey_h.
type Rkey struct{ h C.ucp_rkey_h }

// RkeyUnpack unpacks a packed remote key for use on e.
func (e *EP) RkeyUnpack(packed []byte) (*Rkey, Status) {
	r := &Rkey{}
	cb := C.CBytes(packed)
	defer C.free(cb)
	st := C.ucp_ep_rkey_unpack(e.h, cb, &r.h)
	return r, Status(st)
}

// Destroy releases the rkey.
func (r *Rkey) Destroy() { C.ucp_rkey_destroy(r.h) }

func memh(m *MemH) C.uintptr_t {
	if m == nil {
		return 0
	}
	return C.uintptr_t(uintptr(unsafe.Pointer(m.h)))
}

func (e *EP) u() C.uintptr_t         { return C.uintptr_t(uintptr(unsafe.Pointer(e.h))) }
func (r *Rkey) u() C.uintptr_t       { return C.uintptr_t(uintptr(unsafe.Pointer(r.h))) }
func u(p unsafe.Pointer) C.uintptr_t { return C.uintptr_t(uintptr(p)) }

// The operations take Go buffers as unsafe.Pointer and hand them to C as integers:
// runtime.KeepAlive keeps them alive for the call (the caller pins what stays pending).

// TagSend posts ucp_tag_send_nbx; with spins it also waits up to spins progress rounds
// for the send to complete (then the result is OK or an error, never a request).
func (w *Worker) TagSend(e *EP, buf unsafe.Pointer, n int, tag uint64, flags uint32, memType int, m *MemH, spins uint) unsafe.Pointer {
	r := C.ucpxu_tag_send(w.h, e.u(), u(buf), C.size_t(n), C.uint64_t(tag), C.uint32_t(flags), C.int(memType), memh(m), C.uint(spins))
	runtime.KeepAlive(buf)
	return r
}

// TagRecv posts ucp_tag_recv_nbx (with spins, as TagSend). On completion in the call
// Own holds the result.
func (w *Worker) TagRecv(buf unsafe.Pointer, n int, tag, mask uint64, flags uint32, memType int, m *MemH, spins uint) unsafe.Pointer {
	r := C.ucpxu_tag_recv(w.h, u(buf), C.size_t(n), C.uint64_t(tag), C.uint64_t(mask), C.uint32_t(flags), C.int(memType), memh(m), C.uint(spins))
	runtime.KeepAlive(buf)
	return r
}

// TagSendRecv sends sbuf, posts the receive of the reply into rbuf and waits up to
// spins progress rounds for both. It returns the receive's status pointer (Own once
// complete); SendReq is the send's (OwnSend once complete).
func (w *Worker) TagSendRecv(e *EP, sbuf unsafe.Pointer, sn int, stag uint64, rbuf unsafe.Pointer, rn int, rtag, rmask uint64, flags uint32, spins uint) unsafe.Pointer {
	r := C.ucpxu_tag_send_recv(w.h, e.u(), u(sbuf), C.size_t(sn), C.uint64_t(stag), u(rbuf), C.size_t(rn), C.uint64_t(rtag), C.uint64_t(rmask), C.uint32_t(flags), C.uint(spins))
	runtime.KeepAlive(sbuf)
	runtime.KeepAlive(rbuf)
	return r
}

// RecvInfo is the sender tag and length of the last TagRecv that completed in the call.
func (w *Worker) RecvInfo() (uint64, int) {
	_, tag, n := w.Own()
	return tag, n
}

// RecvLength is the length of the last AmRecvData that completed in the call.
func (w *Worker) RecvLength() int { return int(w.w.own.length) }

// AmSend posts ucp_am_send_nbx.
func (w *Worker) AmSend(e *EP, id uint, header unsafe.Pointer, headerLen int, buf unsafe.Pointer, n int, flags, amFlags uint32, memType int, m *MemH) unsafe.Pointer {
	r := C.ucpxu_am_send(w.h, e.u(), C.uint(id), u(header), C.size_t(headerLen), u(buf), C.size_t(n), C.uint32_t(flags), C.uint32_t(amFlags), C.int(memType), memh(m))
	runtime.KeepAlive(header)
	runtime.KeepAlive(buf)
	return r
}

// AmRecvData posts ucp_am_recv_data_nbx for a rendezvous descriptor.
func (w *Worker) AmRecvData(desc, buf unsafe.Pointer, n int, flags uint32, memType int, m *MemH) unsafe.Pointer {
	r := C.ucpxu_am_recv_data(w.h, u(desc), u(buf), C.size_t(n), C.uint32_t(flags), C.int(memType), memh(m))
	runtime.KeepAlive(buf)
	return r
}

// AmDataRelease releases a kept AM data descriptor.
func (w *Worker) AmDataRelease(desc unsafe.Pointer) { C.ucp_am_data_release(w.w.worker, desc) }

// SetAmHandler installs (or with enable false, removes) the AM handler for id.
func (w *Worker) SetAmHandler(id uint, arg *CallbackArg, enable bool) Status {
	var a *C.ucpxu_cb_arg_t
	if arg != nil {
		a = arg.a
	}
	return Status(C.ucpxu_set_am_handler(w.w, C.uint(id), a, cbool(enable)))
}

// Put posts ucp_put_nbx.
func (w *Worker) Put(e *EP, buf unsafe.Pointer, n int, raddr uint64, r *Rkey, flags uint32, memType int, m *MemH) unsafe.Pointer {
	p := C.ucpxu_put(w.h, e.u(), u(buf), C.size_t(n), C.uint64_t(raddr), r.u(), C.uint32_t(flags), C.int(memType), memh(m))
	runtime.KeepAlive(buf)
	return p
}

// Get posts ucp_get_nbx.
func (w *Worker) Get(e *EP, buf unsafe.Pointer, n int, raddr uint64, r *Rkey, flags uint32, memType int, m *MemH) unsafe.Pointer {
	p := C.ucpxu_get(w.h, e.u(), u(buf), C.size_t(n), C.uint64_t(raddr), r.u(), C.uint32_t(flags), C.int(memType), memh(m))
	runtime.KeepAlive(buf)
	return p
}

// Atomic posts ucp_atomic_op_nbx on one element of size 4 or 8 bytes; operand and
// reply are C memory.
func (w *Worker) Atomic(e *EP, op int, operand unsafe.Pointer, size int, reply unsafe.Pointer, raddr uint64, r *Rkey, flags uint32) unsafe.Pointer {
	return C.ucpxu_atomic(w.h, e.u(), C.int(op), u(operand), C.size_t(size), u(reply), C.uint64_t(raddr), r.u(), C.uint32_t(flags))
}

// FlushEP posts ucp_ep_flush_nbx.
func (w *Worker) FlushEP(e *EP, flags uint32) unsafe.Pointer {
	return C.ucpxu_ep_flush(w.h, e.u(), C.uint32_t(flags))
}

// Flush posts ucp_worker_flush_nbx.
func (w *Worker) Flush(flags uint32) unsafe.Pointer {
	return C.ucpxu_worker_flush(w.h, C.uint32_t(flags))
}

// RefPingPong runs n round trips of a tag ping-pong of size bytes in C alone (see
// ucpxu_ref_pingpong), in one call: the reference the benchmarks compare ucpx with.
// The caller serialises the worker and keeps the buffers in place during the call.
func (w *Worker) RefPingPong(e *EP, sbuf, rbuf unsafe.Pointer, size int, n uint64, initiator bool) Status {
	st := C.ucpxu_ref_pingpong(w.h, e.u(), u(sbuf), u(rbuf), C.size_t(size), C.uint64_t(n), cbool(initiator))
	runtime.KeepAlive(sbuf)
	runtime.KeepAlive(rbuf)
	return Status(st)
}

// Cancel cancels a pending request.
func (w *Worker) Cancel(req unsafe.Pointer) { C.ucpxu_cancel(w.h, u(req)) }

// Abandon hands back a request UCX never completed, as the worker closes: UCX frees it
// when it completes (ucp_worker_destroy asserts on one not released).
func (w *Worker) Abandon(req unsafe.Pointer) { C.ucpxu_abandon(w.h, u(req)) }

// PtrStatus decodes a ucs_status_ptr_t: (nil, OK) done, (nil, err) failed, (req, InProgress) pending.
func PtrStatus(p unsafe.Pointer) (unsafe.Pointer, Status) {
	u := uintptr(p)
	switch {
	case u == 0:
		return nil, OK
	case u >= statusPtrErrBoundary:
		return nil, Status(int64(u))
	default:
		return p, InProgress
	}
}

// Malloc returns zeroed C memory; Free releases it.
func Malloc(n int) unsafe.Pointer { return C.calloc(1, C.size_t(n)) }

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// Chain kinds of operation (ucpxu_chain_add).
const (
	ChainSend = C.UCPXU_CHAIN_SEND
	ChainRecv = C.UCPXU_CHAIN_RECV
	// ChainTimes is how many iteration end times a chain keeps (the last ones).
	ChainTimes = C.UCPXU_CHAIN_TIMES
)

// Chain is a ucpxu_chain_t: operations in steps, each step posted from the completion
// callback of the step before it (see glue.h). Every call needs the worker's lock.
type Chain struct {
	c *C.ucpxu_chain_t
	h C.uintptr_t
}

// TakeChainWake reports (and clears) that a chain with a parked waiter ended in a
// progress call since the last look; read without a call.
func (w *Worker) TakeChainWake() bool {
	if w.w.chain_wake == 0 {
		return false
	}
	w.w.chain_wake = 0
	return true
}

// ChainsEPClosed marks the sends of w's chains on e (being closed): they are not
// posted again and fail with ErrCanceled.
func (w *Worker) ChainsEPClosed(e *EP) { C.ucpxu_chains_ep_closed(w.w, e.u()) }

// NewChain makes an empty chain on w; nil if out of memory.
func (w *Worker) NewChain() *Chain {
	c := C.ucpxu_chain_new(w.h)
	if c == nil {
		return nil
	}
	return &Chain{c: c, h: C.uintptr_t(uintptr(unsafe.Pointer(c)))}
}

// Add appends an operation (ChainSend on e, ChainRecv) to step (the last or a new one).
// buf must stay alive and in place while the chain exists.
func (c *Chain) Add(step, kind int, e *EP, buf unsafe.Pointer, n int, tag, mask uint64, memType int, m *MemH) Status {
	var ep C.uintptr_t
	if e != nil {
		ep = e.u()
	}
	return Status(C.ucpxu_chain_add(c.h, C.int(step), C.int(kind), ep, u(buf), C.size_t(n), C.uint64_t(tag), C.uint64_t(mask), C.int(memType), memh(m)))
}

// Start posts step 0 of the first of repeat iterations; keepGoing: a failed operation
// does not stop the run.
func (c *Chain) Start(repeat uint64, keepGoing bool) Status {
	return Status(C.ucpxu_chain_start(c.h, C.uint64_t(repeat), cbool(keepGoing)))
}

// CancelOp cancels operation i if it is posted and pending.
func (c *Chain) CancelOp(i int) { C.ucpxu_chain_cancel_op(c.h, C.int(i)) }

// op is operation i (0 <= i < Ops()).
func (c *Chain) op(i int) *C.ucpxu_chain_op_t { return &unsafe.Slice(c.c.ops, c.c.nops)[i] }

// OpStatus is operation i's last completion status in the current or last run (OK
// if it succeeded or has not completed in it), and whether it is a send whose
// endpoint was closed.
func (c *Chain) OpStatus(i int) (st Status, epClosed bool) {
	op := c.op(i)
	return Status(op.status), op.ep_closed != 0
}

// Wait progresses until the chain stops or spins rounds pass, then reaps; it reports
// whether the chain still runs.
func (c *Chain) Wait(spins uint) bool { return C.ucpxu_chain_wait(c.h, C.uint(spins)) != 0 }

// Running reports whether the chain runs, read without a call.
func (c *Chain) Running() bool { return c.c.running != 0 }

// Paused reports whether the run stopped for pulled messages and was not resumed or
// ended yet: it has not ended (Start refuses it).
func (c *Chain) Paused() bool { return c.c.paused != 0 }

// SetParked tells the chain a waiter sleeps on the event fd: its end signals the worker.
func (c *Chain) SetParked(p bool) { c.c.parked = cbool(p) }

// Stop cancels the pending operations and progresses up to rounds; it returns how many
// are still pending. A paused run is not resumed after it.
func (c *Chain) Stop(rounds uint) int { return int(C.ucpxu_chain_stop(c.h, C.uint(rounds))) }

// Free releases the chain (not running).
func (c *Chain) Free() { C.ucpxu_chain_free(c.h) }

// Detached reports whether the chain's worker was destroyed.
func (c *Chain) Detached() bool { return c.c.w == nil }

// Result is the chain's state: iterations completed and the first error.
func (c *Chain) Result() (iters uint64, st Status) {
	return uint64(c.c.iters), Status(c.c.status)
}

// RecvInfo is the sender tag and length of the last message operation i received.
func (c *Chain) RecvInfo(i int) (uint64, int) {
	op := c.op(i)
	return uint64(op.recv_tag), int(op.recv_len)
}

// PullInfo is operation i's pulled message, if it got one the run paused for: its
// status, sender tag (with the source bits) and length.
func (c *Chain) PullInfo(i int) (pulled bool, st Status, tag uint64, n int) {
	op := c.op(i)
	return op.pull != 0, Status(op.recv_status), uint64(op.recv_tag), int(op.recv_len)
}

// Pulls is the number of receives whose pulled message Go has yet to pull (the run
// pauses while it is not 0).
func (c *Chain) Pulls() int { return int(c.c.npull) }

// Ops is the number of operations of the chain.
func (c *Chain) Ops() int { return int(c.c.nops) }

// Pulled records Go's pull of operation i's message.
func (c *Chain) Pulled(i int, st Status, n int) {
	C.ucpxu_chain_pulled(c.h, C.int(i), C.int(st), C.size_t(n))
}

// Resume goes on with a run paused for pulls; it reports whether it runs.
func (c *Chain) Resume() bool { return C.ucpxu_chain_resume(c.h) != 0 }

// Times returns the end tick counts of the last min(iters, ChainTimes) iterations in
// order, and the ticks per nanosecond over the run (start to end).
func (c *Chain) Times() ([]uint64, float64) {
	n := uint64(c.c.iters)
	k := min(n, ChainTimes)
	out := make([]uint64, 0, k)
	for i := n - k; i < n; i++ {
		out = append(out, uint64(c.c.times[i%ChainTimes]))
	}
	perNs := 1.0
	if dns := float64(c.c.ns1 - c.c.ns0); dns > 0 && c.c.tsc1 > c.c.tsc0 {
		perNs = float64(c.c.tsc1-c.c.tsc0) / dns
	}
	return out, perNs
}

package ucp

import (
	"encoding/binary"
	"errors"
	"math"
	"unsafe"

	"github.com/ucpx/ucpx/cgo/ucx"
	"github.com/ucpx/ucpx/protocol"
)

// DeviceBuffer presents n bytes at addr, memory Go does not manage (device memory from
// cuMemAlloc, pinned host or C memory), as a slice to pass to nbx calls (nil for a
// zero address or length, or a range that wraps). Go code must never index it: for
// device memory that faults. With a Stream condition on a CUDA
// backend, device memory is staged when UCX has no CUDA transport.
func DeviceBuffer(addr uintptr, n int) []byte {
	if addr == 0 || n <= 0 || addr+uintptr(n) < addr {
		return nil // nothing, or a range that wraps around the address space
	}
	return unsafe.Slice((*byte)(ucx.Addr(addr)), n)
}

// bufPtr is the address UCX gets for a Go slice (nil for an empty one).
func bufPtr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

func (p *RequestParam) memType() int {
	if p.MemoryType == MemoryUnknown {
		return -1
	}
	return int(p.MemoryType)
}

func (p *RequestParam) check(op string, c *Context) error {
	if err := p.checkCommon(op, c); err != nil {
		return err
	}
	if p.MemoryType > MemoryHost && p.Condition == nil && !c.SupportsMemoryType(p.MemoryType) && !(p.MemoryType == MemoryCUDA && c.ipc != nil) {
		// UCX would touch device memory from the CPU. A Stream condition on a CUDA
		// stream stages it instead, and so does ContextParams.Device (devstage.go).
		return opErr(op, ErrUnsupported, "%s memory: UCX here has no transport for it; enqueue it with a Stream condition on a CUDA stream (staging), use a device region of a same-host peer (CUDA IPC), or use host memory", p.MemoryType)
	}
	return nil
}

// checkCommon is check without the memory-type rule (the CUDA IPC path moves device
// memory itself).
func (p *RequestParam) checkCommon(op string, c *Context) error {
	if p.Chain != nil && op != "tag_send_nbx" && op != "tag_recv_nbx" {
		return opErr(op, ErrUnsupported, "RequestParam.Chain: chains hold tag sends and receives")
	}
	if p.Request != nil {
		if err := p.checkReuse(op); err != nil {
			return err
		}
	}
	if p.Flags&^knownOpFlags != 0 {
		// Other bits of ucp_op_attr_t name fields of the request parameters (a request
		// to use, a datatype, a reply buffer) that UCX would read from memory ucpx
		// never filled.
		return opErr(op, ErrInvalidParam, "unknown RequestParam.Flags %#x", uint32(p.Flags&^knownOpFlags))
	}
	if !p.MemoryType.known() {
		return opErr(op, ErrInvalidParam, "unknown RequestParam.MemoryType %d", int(p.MemoryType))
	}
	if p.AmFlags&^knownAmFlags != 0 {
		return opErr(op, ErrInvalidParam, "unknown RequestParam.AmFlags %#x", uint32(p.AmFlags&^knownAmFlags))
	}
	if p.Staging > protocol.PreferPull {
		return opErr(op, ErrInvalidParam, "unknown RequestParam.Staging %v", p.Staging)
	}
	if p.MemH != nil && p.MemH.closed {
		return opErr(op, ErrClosed, "RequestParam.MemH")
	}
	if p.MemH != nil && p.MemH.ctx != c {
		return opErr(op, ErrInvalidParam, "RequestParam.MemH belongs to another context")
	}
	return nil
}

func param(p *RequestParam) *RequestParam {
	if p == nil {
		return &defaultParam
	}
	return p
}

// TagSendNbx sends buf with tag (ucp_tag_send_nbx), at most MaxTag. buf must stay
// untouched until the returned Request is done.
func (ep *Endpoint) TagSendNbx(buf []byte, tag uint64, p *RequestParam) (*Request, error) {
	if ep == nil {
		return nil, opErr("tag_send_nbx", ErrInvalidParam, "nil endpoint")
	}
	p = param(p)
	if err := p.check("tag_send_nbx", ep.w.ctx); err != nil {
		return nil, err
	}
	if err := checkTag("tag_send_nbx", tag); err != nil {
		return nil, err
	}
	if p.Chain != nil {
		return nil, ep.w.chainAdd("tag_send_nbx", p, ucx.ChainSend, ep, buf, tag, ^uint64(0))
	}
	if p.Condition != nil {
		reissue := func(_ int, b []byte, ip *RequestParam) (*Request, error) { return ep.TagSendNbx(b, tag, ip) }
		if ep.tagPullable(p, buf, true) {
			// Issued at the trigger as a send without a condition: the receiver pulls.
			return ep.w.submitDirect("tag_send_nbx", p, buf, false, reissue)
		}
		return ep.w.submit("tag_send_nbx", p, buf, protocol.Out, false, reissue)
	}
	if ep.tagPullable(p, buf, false) {
		if r, ok, err := ep.tagPull("tag_send_nbx", buf, tag, p); ok {
			return r, err
		}
	}
	if ep.w.stagesPlain(p) {
		return ep.w.stagedPlain("tag_send_nbx", p, buf, protocol.Out, func(b []byte, ip *RequestParam) (*Request, error) {
			return ep.TagSendNbx(b, tag, ip)
		})
	}
	w := ep.w
	w.lockIssue()
	defer w.mu.Unlock()
	if err := ep.usableLocked("tag_send_nbx"); err != nil {
		return nil, err
	}
	ptr := w.raw.TagSend(ep.raw, bufPtr(buf), len(buf), tag, p.flags(), p.memType(), p.MemH.rawOrNil(), 0)
	return ep.sent(w.postLocked("tag_send_nbx", ptr, p, nil, bufPtr(buf)))
}

// TagRecvNbx receives a message whose tag matches tag under mask (sender_tag & mask ==
// tag & mask, over the low TagBits bits) into buf (ucp_tag_recv_nbx). A longer message completes with
// ErrMessageTruncated. Length and SenderTag report what arrived.
func (w *Worker) TagRecvNbx(buf []byte, tag, mask uint64, p *RequestParam) (*Request, error) {
	if w == nil {
		return nil, opErr("tag_recv_nbx", ErrInvalidParam, "nil worker")
	}
	p = param(p)
	if err := p.check("tag_recv_nbx", w.ctx); err != nil {
		return nil, err
	}
	if err := p.Peer.sameWorker("tag_recv_nbx", w); err != nil {
		return nil, err
	}
	if err := checkTag("tag_recv_nbx", tag); err != nil {
		return nil, err
	}
	if p.Chain != nil {
		return nil, w.chainAdd("tag_recv_nbx", p, ucx.ChainRecv, nil, buf, tag, mask)
	}
	if p.Condition != nil {
		return w.submit("tag_recv_nbx", p, buf, protocol.In, false, func(_ int, b []byte, ip *RequestParam) (*Request, error) {
			return w.TagRecvNbx(b, tag, mask, ip)
		})
	}
	if w.stagesPlain(p) {
		return w.stagedPlain("tag_recv_nbx", p, buf, protocol.In, func(b []byte, ip *RequestParam) (*Request, error) {
			return w.TagRecvNbx(b, tag, mask, ip)
		})
	}
	w.lockIssue()
	pulled := false
	defer func() {
		if !pulled {
			w.mu.Unlock()
			return
		}
		// The pull starts here: the call may come from a goroutine that drives no
		// progress (the engine's issue) while every other sleeps.
		w.unlockDeferred()
	}()
	if w.closed.Load() {
		return nil, opErr("tag_recv_nbx", ErrClosed, "")
	}
	if p.Peer != nil {
		if err := p.Peer.usableLocked("tag_recv_nbx"); err != nil {
			return nil, err
		}
	}
	ptr := w.raw.TagRecv(bufPtr(buf), len(buf), tag, mask, p.flags(), p.memType(), p.MemH.rawOrNil(), 0)
	r, err := w.postLocked("tag_recv_nbx", ptr, p, func(r *Request) {
		r.tag, r.length = w.raw.RecvInfo()
	}, bufPtr(buf))
	switch {
	case err == nil && r.done.Load() && r.tag&ucx.PullBit != 0:
		// Completed in the call with a pulled message: pending until the data is here.
		r.done.Store(false)
		r.cb, r.notify = p.Callback, p.Callback != nil
		r.setRecvBuf(w.ctx, buf, p.pullDev)
		w.pullArrivedLocked(r, ucx.OK, r.length, r.tag)
		pulled = true
	case err == nil:
		r.setRecvBuf(w.ctx, buf, p.pullDev)
	case errors.Is(err, ErrMessageTruncated):
		if tag, _ := w.raw.RecvInfo(); tag&ucx.PullBit != 0 {
			w.owePullTruncLocked(splitPullTag(tag)) // the call fails; its sender is answered
			pulled = true
		}
	}
	if err == nil && p.Peer != nil && !r.done.Load() {
		r.peer = p.Peer
		p.Peer.recvs[r] = struct{}{}
	}
	if err != nil {
		err = opErr("tag_recv_nbx", err, "len %d tag %#x mask %#x", len(buf), tag, mask)
	}
	return r, err
}

// PutNbx writes buf to raddr in the peer's memory described by rkey (ucp_put_nbx).
// The range must lie inside the region the rkey was packed for.
func (ep *Endpoint) PutNbx(buf []byte, raddr uint64, rkey *Rkey, p *RequestParam) (*Request, error) {
	if ep == nil {
		return nil, opErr("put_nbx", ErrInvalidParam, "nil endpoint")
	}
	return ep.rma("put_nbx", buf, raddr, rkey, p, true)
}

// GetNbx reads len(buf) bytes from raddr in the peer's memory into buf (ucp_get_nbx).
func (ep *Endpoint) GetNbx(buf []byte, raddr uint64, rkey *Rkey, p *RequestParam) (*Request, error) {
	if ep == nil {
		return nil, opErr("get_nbx", ErrInvalidParam, "nil endpoint")
	}
	return ep.rma("get_nbx", buf, raddr, rkey, p, false)
}

func (ep *Endpoint) rma(op string, buf []byte, raddr uint64, rkey *Rkey, p *RequestParam, put bool) (*Request, error) {
	p = param(p)
	direct := rkey != nil && rkey.ipc != nil
	if direct {
		if err := p.checkCommon(op, ep.w.ctx); err != nil {
			return nil, err
		}
	} else if err := p.check(op, ep.w.ctx); err != nil {
		return nil, err
	}
	shared := put && !direct && rkey.sharedStore(p)
	if p.Condition == nil && ep.w.fenceBinds(direct || shared) {
		if err := rkey.checkRange(op, ep, raddr, len(buf)); err != nil {
			return nil, err
		}
		if r, ok := ep.w.fenced(op, p, direct || shared, func(ip *RequestParam) (*Request, error) { return ep.rma(op, buf, raddr, rkey, ip, put) }); ok {
			return r, nil
		}
	}
	if direct {
		return ep.rmaIPC(op, buf, raddr, rkey, p, put)
	}
	if p.Condition != nil {
		// The range is checked at the call: a bad one would otherwise fail only when
		// the stream gets there.
		if err := rkey.checkRange(op, ep, raddr, len(buf)); err != nil {
			return nil, err
		}
		dir := protocol.In
		if put {
			dir = protocol.Out
		}
		return ep.w.submit(op, p, buf, dir, true, func(off int, b []byte, ip *RequestParam) (*Request, error) {
			return ep.rma(op, b, raddr+uint64(off), rkey, ip, put)
		})
	}
	if ep.w.stagesPlain(p) {
		dir := protocol.In
		if put {
			dir = protocol.Out
		}
		return ep.w.stagedPlain(op, p, buf, dir, func(b []byte, ip *RequestParam) (*Request, error) {
			return ep.rma(op, b, raddr, rkey, ip, put)
		})
	}
	w := ep.w
	w.lockIssue()
	defer w.mu.Unlock()
	if err := ep.usableLocked(op); err != nil {
		return nil, err
	}
	if err := rkey.checkLocked(op, ep, raddr, len(buf)); err != nil {
		return nil, err
	}
	if shared {
		rkey.storeShared(raddr, buf) // lands at once: done in place
		return w.postLocked(op, nil, p, nil)
	}
	var ptr unsafe.Pointer
	if put {
		ptr = w.raw.Put(ep.raw, bufPtr(buf), len(buf), raddr, rkey.raw, p.flags(), p.memType(), p.MemH.rawOrNil())
	} else {
		ptr = w.raw.Get(ep.raw, bufPtr(buf), len(buf), raddr, rkey.raw, p.flags(), p.memType(), p.MemH.rawOrNil())
	}
	r, err := ep.sent(w.postLocked(op, ptr, p, nil, bufPtr(buf)))
	if err != nil {
		return nil, opErr(op, unwrapOp(err), "len %d raddr %#x", len(buf), raddr)
	}
	return r, nil
}

// AtomicOp is a ucp_atomic_op_t.
type AtomicOp int

const (
	AtomicAdd  AtomicOp = ucx.AtomicAdd
	AtomicSwap AtomicOp = ucx.AtomicSwap
	// AtomicCswap stores Swap if the remote value equals Operand.
	AtomicCswap AtomicOp = ucx.AtomicCswap
	AtomicAnd   AtomicOp = ucx.AtomicAnd
	AtomicOr    AtomicOp = ucx.AtomicOr
	AtomicXor   AtomicOp = ucx.AtomicXor
)

// AtomicParam describes one remote atomic operation on a 32- or 64-bit word.
type AtomicParam struct {
	Op AtomicOp
	// Size is 4 or 8 (bytes); 0 means 8.
	Size int
	// Operand: the value to add/and/or/xor/swap in, or the compare value of Cswap.
	// With Size 4 it must fit 32 bits (ErrInvalidParam otherwise): a wider value
	// would be truncated, so Cswap would compare, and Add add, another value.
	Operand uint64
	// Swap is the value Cswap stores when the comparison holds; with Size 4 it must
	// fit 32 bits, as Operand.
	Swap uint64
	// Fetch asks for the remote value before the operation (always on for Swap/Cswap).
	Fetch bool
}

// AtomicNbx performs an atomic operation on the word at raddr (ucp_atomic_op_nbx).
// With fetch, Request.Fetched reports the previous remote value once done.
func (ep *Endpoint) AtomicNbx(a AtomicParam, raddr uint64, rkey *Rkey, p *RequestParam) (*Request, error) {
	const op = "atomic_op_nbx"
	if ep == nil {
		return nil, opErr(op, ErrInvalidParam, "nil endpoint")
	}
	p = param(p)
	if err := p.check(op, ep.w.ctx); err != nil {
		return nil, err
	}
	if a.Size == 0 {
		a.Size = 8
	}
	if a.Size != 4 && a.Size != 8 {
		return nil, opErr(op, ErrInvalidParam, "size %d (want 4 or 8)", a.Size)
	}
	if a.Op < AtomicAdd || a.Op > AtomicXor {
		return nil, opErr(op, ErrInvalidParam, "op %d", a.Op)
	}
	// A 32-bit word takes 32-bit values: a wider one would reach UCX truncated.
	if a.Size == 4 && a.Operand > math.MaxUint32 {
		return nil, opErr(op, ErrInvalidParam, "operand %#x wider than size 4", a.Operand)
	}
	if a.Size == 4 && a.Op == AtomicCswap && a.Swap > math.MaxUint32 {
		return nil, opErr(op, ErrInvalidParam, "swap %#x wider than size 4", a.Swap)
	}
	if raddr%uint64(a.Size) != 0 {
		return nil, opErr(op, ErrInvalidParam, "raddr %#x not aligned to %d", raddr, a.Size)
	}
	if p.Condition == nil && ep.w.fenceBinds(false) {
		if err := rkey.checkRange(op, ep, raddr, a.Size); err != nil {
			return nil, err
		}
		if r, ok := ep.w.fenced(op, p, false, func(ip *RequestParam) (*Request, error) { return ep.AtomicNbx(a, raddr, rkey, ip) }); ok {
			return r, nil
		}
	}
	if p.Condition != nil {
		if err := rkey.checkRange(op, ep, raddr, a.Size); err != nil {
			return nil, err
		}
		return ep.w.submit(op, p, nil, protocol.NoBuffer, false, func(_ int, _ []byte, ip *RequestParam) (*Request, error) {
			return ep.AtomicNbx(a, raddr, rkey, ip)
		})
	}
	w := ep.w
	w.lockIssue()
	defer w.mu.Unlock()
	if err := ep.usableLocked(op); err != nil {
		return nil, err
	}
	if err := rkey.checkLocked(op, ep, raddr, a.Size); err != nil {
		return nil, err
	}
	return ep.atomicLocked(op, a, raddr, rkey, p)
}

// atomicLocked issues a checked atomic operation. Caller holds w.mu.
func (ep *Endpoint) atomicLocked(op string, a AtomicParam, raddr uint64, rkey *Rkey, p *RequestParam) (*Request, error) {
	w := ep.w
	fetch := a.Fetch || a.Op == AtomicSwap || a.Op == AtomicCswap
	// Operand and reply live in C memory: UCX reads/writes them after the call returns.
	mem := ucx.Malloc(16)
	put := func(off uintptr, v uint64) {
		if a.Size == 4 {
			*(*uint32)(unsafe.Add(mem, off)) = uint32(v)
		} else {
			*(*uint64)(unsafe.Add(mem, off)) = v
		}
	}
	put(0, a.Operand)
	var reply unsafe.Pointer
	if fetch {
		reply = unsafe.Add(mem, 8)
		if a.Op == AtomicCswap {
			put(8, a.Swap)
		}
	}
	read := func(r *Request) {
		if fetch && r.err == nil {
			b := unsafe.Slice((*byte)(unsafe.Add(mem, 8)), 8)
			if a.Size == 4 {
				r.fetched = uint64(binary.NativeEndian.Uint32(b))
			} else {
				r.fetched = binary.NativeEndian.Uint64(b)
			}
		}
		ucx.Free(mem)
	}
	ptr := w.raw.Atomic(ep.raw, int(a.Op), mem, a.Size, reply, raddr, rkey.raw, p.flags())
	r, err := ep.sent(w.postLocked(op, ptr, p, read))
	switch {
	case err != nil:
		ucx.Free(mem)
		return nil, opErr(op, unwrapOp(err), "raddr %#x", raddr)
	case !r.done.Load():
		r.finish = read
	}
	return r, nil
}

// Fetched is the remote value before an atomic operation with fetch semantics.
func (r *Request) Fetched() uint64 {
	if r == nil {
		return 0
	}
	if r.cop != nil {
		if in := r.issued(); in != nil {
			return in.fetched
		}
	}
	return r.fetched
}

// FlushNbx completes all operations issued on the endpoint, locally and remotely
// (ucp_ep_flush_nbx).
func (ep *Endpoint) FlushNbx(p *RequestParam) (*Request, error) {
	if ep == nil {
		return nil, opErr("ep_flush_nbx", ErrInvalidParam, "nil endpoint")
	}
	p = param(p)
	if err := p.check("ep_flush_nbx", ep.w.ctx); err != nil {
		return nil, err
	}
	if p.Condition != nil {
		return ep.w.submit("ep_flush_nbx", p, nil, protocol.NoBuffer, false, func(_ int, _ []byte, ip *RequestParam) (*Request, error) {
			return ep.FlushNbx(ip)
		})
	}
	w := ep.w
	w.lockIssue()
	defer w.mu.Unlock()
	if err := ep.usableLocked("ep_flush_nbx"); err != nil {
		return nil, err
	}
	r, err := ep.sent(w.postLocked("ep_flush_nbx", w.raw.FlushEP(ep.raw, p.flags()), p, nil))
	if err == nil && w.ipcBusyLocked() {
		r = w.flushIPCLocked("ep_flush_nbx", r, ep, p)
	}
	return r, err
}

// FlushNbx completes all operations issued on every endpoint of the worker
// (ucp_worker_flush_nbx).
func (w *Worker) FlushNbx(p *RequestParam) (*Request, error) {
	if w == nil {
		return nil, opErr("worker_flush_nbx", ErrInvalidParam, "nil worker")
	}
	p = param(p)
	if err := p.check("worker_flush_nbx", w.ctx); err != nil {
		return nil, err
	}
	if p.Condition != nil {
		return w.submit("worker_flush_nbx", p, nil, protocol.NoBuffer, false, func(_ int, _ []byte, ip *RequestParam) (*Request, error) {
			return w.FlushNbx(ip)
		})
	}
	w.lockIssue()
	defer w.mu.Unlock()
	if w.closed.Load() {
		return nil, opErr("worker_flush_nbx", ErrClosed, "")
	}
	r, err := w.postLocked("worker_flush_nbx", w.raw.Flush(p.flags()), p, nil)
	if err == nil && w.ipcBusyLocked() {
		r = w.flushIPCLocked("worker_flush_nbx", r, nil, p)
	}
	return r, err
}

func unwrapOp(err error) error {
	if e, ok := err.(*OpError); ok {
		return e.Err
	}
	return err
}

func (m *MemH) rawOrNil() *ucx.MemH {
	if m == nil {
		return nil
	}
	return m.raw
}

// Rkey is an unpacked remote key (ucp_rkey_h) for one endpoint.
type Rkey struct {
	ep  *Endpoint
	raw *ucx.Rkey // nil for a device region mapped by CUDA IPC
	ipc *rkeyIPC  // the mapping of such a region
	// shared: a peer's shared signal words mapped here (sharedwords.go); set once
	// after UnpackRkey mapped them, under ep.w.mu.
	shared *rkeyIPC
	// addressed: DeviceAddress handed out an address (under ep.w.mu).
	addressed bool
	base      uint64
	length    uint64
	closed    bool // under ep.w.mu
	// exporter and keyID name the region for revocation (revoke.go); revoked: its
	// owner revoked it (under ep.w.mu).
	exporter [idLen]byte
	keyID    uint64
	revoked  bool
	// pull: the entry of a key unpacked for pulls (ampull.go; under ep.w.mu).
	pull *pullKey
}

// UnpackRkey unpacks a remote key produced by the peer's MemH.PackRkey. Bytes that are
// not such a key give ErrInvalidParam, and a key that fails its MAC (forged, altered,
// sealed under another auth key) or that another peer than ep's packed gives ErrAuth:
// nothing unsealed reaches UCX, never a crash inside it.
func (ep *Endpoint) UnpackRkey(packed []byte) (*Rkey, error) {
	if ep == nil {
		return nil, opErr("ep_rkey_unpack", ErrInvalidParam, "nil endpoint")
	}
	return ep.unpackRkey(packed)
}

// Base and Len describe the remote region the key grants access to.
func (r *Rkey) Base() uint64 {
	if r == nil {
		return 0
	}
	return r.base
}

// Len is the length of the remote region.
func (r *Rkey) Len() int {
	if r == nil {
		return 0
	}
	return int(r.length)
}

func (r *Rkey) checkLocked(op string, ep *Endpoint, raddr uint64, n int) error {
	if err := r.liveLocked(op); err != nil {
		return err
	}
	return r.checkRange(op, ep, raddr, n)
}

// liveLocked checks what may change after unpacking: the key's Close and its
// revocation (checkRange checked the rest at the call).
func (r *Rkey) liveLocked(op string) error {
	if r != nil && r.closed {
		return opErr(op, ErrClosed, "rkey")
	}
	if r != nil && r.revoked {
		return opErr(op, ErrRevoked, "rkey of [%#x, +%d)", r.base, r.length)
	}
	return nil
}

// checkRange checks what never changes after unpacking: the endpoint and the region.
func (r *Rkey) checkRange(op string, ep *Endpoint, raddr uint64, n int) error {
	switch {
	case r == nil:
		return opErr(op, ErrInvalidParam, "nil rkey")
	case r.ep != ep:
		return opErr(op, ErrInvalidParam, "rkey was unpacked for %s, not %s", r.ep, ep)
	case raddr < r.base || uint64(n) > r.length || raddr-r.base > r.length-uint64(n):
		return opErr(op, ErrOutOfRange, "[%#x, +%d) outside remote region [%#x, +%d)", raddr, n, r.base, r.length)
	}
	return nil
}

// Close destroys the rkey: operations on it then fail with ErrClosed. A second Close
// returns ErrClosed.
//
// UCX wants a key destroyed only after the operations on it completed. Close does not
// wait, but a key mapped here (a device region by CUDA IPC, shared Signals) keeps its
// mapping, and its exporter keeps counting it (its MemH.Close waits for it), until
// the copies issued on the key's endpoint before Close completed (as the worker's
// progress finds them done) and the mapping is unmapped: a copy still queued never
// writes into memory its owner freed.
func (r *Rkey) Close() error {
	if r == nil {
		return opErr("rkey_destroy", ErrInvalidParam, "nil key")
	}
	w := r.ep.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if r.closed {
		return opErr("rkey_destroy", ErrClosed, "")
	}
	if r.ipc == nil && r.shared == nil {
		r.destroyLocked()
		r.releasedLocked()
		return nil
	}
	r.closed = true
	if f := w.flushIPCLocked("rkey_destroy", completedRequest, r.ep, &defaultParam); f != completedRequest {
		f.finish = func(*Request) { r.retireLocked() }
	} else {
		r.retireLocked()
	}
	return nil
}

// retireLocked ends a closed mapped key once no copy uses it: it unmaps, then drops the
// key and tells the exporter. The key stays in w.rkeys until then, so that a
// revocation meanwhile waits for the unmap before it acknowledges.
func (r *Rkey) retireLocked() {
	w := r.ep.w
	xs := r.takeMappingsLocked()
	go func() { // off the lock: the unmap may wait for the device
		for _, x := range xs {
			x.release(w.ctx)
		}
		w.mu.Lock()
		if _, ok := w.rkeys[r]; ok { // else the worker's Close destroyed it
			r.destroyLocked()
			r.releasedLocked()
		}
		w.unlockDeferred()
	}()
}

func (r *Rkey) destroyLocked() {
	r.closed = true
	if r.raw != nil {
		r.raw.Destroy()
	}
	r.releaseIPCLocked()
	delete(r.ep.w.rkeys, r)
	live.rkeys.Add(-1)
}

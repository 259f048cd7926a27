package ucp

import (
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"time"

	"github.com/ucpx/ucpx/cgo/ucx"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/internal/backoff"
	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream/streamcore"
)

// The same-host device path (CUDA IPC). UCX here has no CUDA transport, so device
// memory between processes of one host travels by the copy engine: a device region
// (MemMapPtr with MemoryCUDA) packs its CUDA IPC handle into its sealed remote key; a
// same-host peer's UnpackRkey maps the allocation once (protocol.IPCImporter, keyed by
// peer, base, size and buffer id) and its puts and gets on that key become
// cuMemcpyAsync copies into or out of the mapping:
//
//   - under a Stream condition on a stream of the context's device, the copy is
//     enqueued on that stream itself (stream order is the condition's order; no proxy
//     on the data path) and the Request completes when an event recorded after it does;
//   - with no condition, on the worker's own stream of that device;
//   - under other conditions (kernel-triggered, graph, host streams) the engine issues
//     it, at the trigger, as the call with no condition.
//
// A Request of the path completes when its copy is done: the data is then in the
// peer's memory (remote completion, so a flush has only the copies before it to wait
// for). Revoking the key (the exporter's MemH.Close) flushes and then unmaps before it
// acknowledges; a failed peer's mappings are dropped once the copies into them ended.

// ctxIPC is a context's side of the path (nil without ContextParams.Device).
type ctxIPC struct {
	dev streamcore.DeviceIPC
	exp *protocol.IPCExporter
	imp *protocol.IPCImporter
}

func newCtxIPC(b streamcore.Backend) (*ctxIPC, error) {
	d, ok := b.(streamcore.DeviceIPC)
	if !ok {
		return nil, opErr("init", ErrInvalidParam, "ContextParams.Device: a %v backend cannot map device memory across processes (open a CUDA backend with package stream)", b.Kind())
	}
	return &ctxIPC{dev: d, exp: protocol.NewIPCExporter(d), imp: protocol.NewIPCImporter(d)}, nil
}

// ipcPeer names a peer context for the importer.
func ipcPeer(id [idLen]byte) protocol.IPCPeer {
	return protocol.IPCPeer(binary.LittleEndian.Uint64(id[:8]))
}

// An IPC region's rkey payload: eight zero bytes (where UCX's packed key has its
// nonzero map of memory domains) and then the protocol.IPCMessage exporting the
// allocation.
const ipcPayloadMark = 8

func ipcPayload(m protocol.IPCMessage) []byte {
	b, _ := m.AppendBinary(make([]byte, ipcPayloadMark, ipcPayloadMark+96))
	return b
}

// isIPCPayload tells an IPC payload from UCX's.
func isIPCPayload(p []byte) bool {
	return len(p) >= ipcPayloadMark && binary.LittleEndian.Uint64(p) == 0
}

// decodeIPCPayload checks an IPC payload against the region it grants.
func decodeIPCPayload(p []byte, base, length uint64) (protocol.IPCMessage, error) {
	m, err := protocol.DecodeIPCMessage(p[ipcPayloadMark:])
	if err != nil {
		return m, err
	}
	a := m.Alloc
	if m.Kind != protocol.IPCExport || base < a.Base || length > a.Size || base-a.Base > a.Size-length {
		return protocol.IPCMessage{}, opErr("ep_rkey_unpack", ErrInvalidParam, "device region [%#x,+%d) outside its allocation [%#x,+%d)", base, length, a.Base, a.Size)
	}
	return m, nil
}

// mapDevice registers device memory for the IPC path: no UCX registration (UCX here
// cannot use it), the allocation's handle made now, on the caller's goroutine.
func (c *Context) mapDevice(m *MemH, addr uintptr, length int) error {
	_, msg, err := c.ipc.exp.Describe(addr, length)
	if err != nil {
		return opErr("mem_map", err, "device memory %#x (+%d)", addr, length)
	}
	err = c.register(func() error {
		m.ipcExport = &msg
		m.addr, m.length = ucx.Addr(addr), length
		m.keyID = newKeyID()
		m.importers = map[[idLen]byte]*importer{}
		c.memhs[m] = struct{}{}
		live.memhs.Add(1)
		return nil
	})
	if err != nil {
		c.ipc.exp.Forget(msg.Alloc) // the Describe's hold: no region keeps it
	}
	return err
}

// forgetDevice gives a released device region's hold on its allocation's export back
// (the last one drops it: the export cache holds the allocations of open regions). The
// peers that had the handle are the region's importers, and the revocation told them
// already (they unmapped before acknowledging): Describe sends no IPCExport of its own,
// so Forget names no peer to send IPCInvalidate to.
func (c *Context) forgetDevice(m *MemH) {
	if m.ipcExport != nil {
		c.ipc.exp.Forget(m.ipcExport.Alloc)
	}
}

// rkeyIPC is an unpacked device region of a same-host peer, mapped here.
type rkeyIPC struct {
	mapped uintptr // the region's base in this process
	peer   protocol.IPCPeer
	alloc  protocol.IPCAllocation
	// gone is made when the mapping reference is taken for its release (under w.mu),
	// and closed once the release is done.
	gone chan struct{}
	// unmap: shared signal words (sharedwords.go) are unmapped, not released to
	// the importer; host is their address for this process's CPU.
	unmap func() error
	host  uintptr
}

// unpackIPC maps the allocation of an IPC key (a driver call: the caller's goroutine,
// no lock held).
func (ep *Endpoint) unpackIPC(k rkeyInfo) (*rkeyIPC, error) {
	const op = "ep_rkey_unpack"
	c := ep.w.ctx
	if c.ipc == nil {
		return nil, opErr(op, ErrUnsupported, "the key is of a device region: set ContextParams.Device to map it (CUDA IPC)")
	}
	if reach := ep.Reach(c.ipc.dev.CanAccessPeer); !reach.IPC() {
		return nil, opErr(op, ErrUnsupported, "the key is of a device region that CUDA IPC cannot reach from here (%v); UCX here has no CUDA transport", reach)
	}
	peer := ipcPeer(k.sender)
	if err := c.ipc.imp.Handle(peer, *k.ipc); err != nil {
		return nil, opErr(op, err, "mapping the peer's device region")
	}
	ref := protocol.IPCRef{Alloc: k.ipc.Alloc, Offset: k.base - k.ipc.Alloc.Base}
	p, err := c.ipc.imp.Resolve(peer, ref, int(k.length))
	if err != nil {
		_ = c.ipc.imp.Release(peer, k.ipc.Alloc)
		return nil, opErr(op, err, "")
	}
	return &rkeyIPC{mapped: p, peer: peer, alloc: k.ipc.Alloc}, nil
}

// releaseIPCLocked gives the key's mapping reference back, off the caller's goroutine
// (cuIpcCloseMemHandle may wait for the device; the caller may be the engine).
func (r *Rkey) releaseIPCLocked() {
	if xs := r.takeMappingsLocked(); len(xs) > 0 {
		c := r.ep.w.ctx
		go func() {
			for _, x := range xs {
				x.release(c)
			}
		}()
	}
}

// ipcRequest is what one IPC operation allocates.
type ipcRequest struct {
	Request
	wait ipcWait
}

// newIPCRequest makes the Request of an IPC or staged device operation (the caller's,
// RequestParam.Request, when given).
func (w *Worker) newIPCRequest(op string, p *RequestParam) (*Request, *ipcWait) {
	r := p.Request
	var x *ipcWait
	if r == nil {
		both := &ipcRequest{}
		r, x = &both.Request, &both.wait
	} else {
		x = &ipcWait{}
	}
	r.reset(w, op, p.Callback)
	r.ipc = x
	x.evRes = p.evRes
	return r, x
}

// ipcWait is what an IPC Request waits for: its copy's event, or (a flush) the
// requests before it.
type ipcWait struct {
	ev   streamcore.Event
	deps []*Request
	ep   *Endpoint
	// then, when set, runs (under the worker's lock) once ev or deps are done, with
	// their result: it may start the next step (setting ev or deps again) and reports
	// whether the request is finished, with the result (devstage.go). held: a step is
	// being started outside the lock (nothing to poll yet); failed: it failed.
	then   func(x *ipcWait, err error) (bool, error)
	q      *ipcQueue // the stream queue of a copy
	flush  bool      // a flush: deps are the requests it waits for
	held   bool
	failed error
	length int
	tag    uint64
	// pullSend: a send whose receiver pulls (ampull.go, tagpull.go), which a flush
	// does not wait for (UCX's flushes do not wait for message sends either);
	// tagged, sentTag, pullSeq: a pulled tag send, its tag and its number among the
	// sends of that tag to that worker (tagpull.go).
	pullSend bool
	tagged   bool
	sentTag  uint64
	pullSeq  uint64
	// evRes: the event reserved for the engine's issue of this operation
	// (RequestParam.evRes), while its event is taken from what the pool keeps for it
	// (takeIPCEventLocked) or until it takes one; nil otherwise.
	evRes *eventReservation
}

// after makes x wait for in, then run done with in's result and finish with it (the
// common single step of then).
func (x *ipcWait) after(in *Request, done func(err error)) {
	x.deps = []*Request{in}
	x.then = func(_ *ipcWait, err error) (bool, error) {
		done(err)
		return true, err
	}
}

// rmaIPC moves an RMA on a same-host device region by the copy engine. The region
// has no UCX registration: a device region's key always takes this path (through the
// staging workspace under StageAlways, see ipcIssue).
func (ep *Endpoint) rmaIPC(op string, buf []byte, raddr uint64, rkey *Rkey, p *RequestParam, put bool) (*Request, error) {
	if err := rkey.checkRange(op, ep, raddr, len(buf)); err != nil {
		return nil, err
	}
	check := func() error { return rkey.liveLocked(op) }
	if len(buf) == 0 && p.Condition == nil {
		return ep.ipcEmpty(op, p, check)
	}
	declared := declaredDevice(p)
	enqueue := func(s streamcore.Stream, stage uintptr, uncaptured bool) error {
		if len(buf) == 0 {
			return nil
		}
		dst, src := rkey.ipc.mapped+uintptr(raddr-rkey.base), uintptr(bufPtr(buf))
		if !put {
			dst, src = src, dst
		}
		return ep.ipcCopy(declared, s, dst, src, len(buf), stage, uncaptured)
	}
	reissue := func(off int, b []byte, ip *RequestParam) (*Request, error) {
		return ep.rma(op, b, raddr+uint64(off), rkey, ip, put)
	}
	return ep.ipcIssue(op, p, buf, check, enqueue, reissue)
}

// ipcEmpty is a zero-length IPC operation without a Condition: nothing to copy, but
// the checks of one that copies (a closed or revoked key, an endpoint not usable)
// fail it as they would, and its Request is made as the UCX path's: the caller's
// RequestParam.Request, done at once, or under NoImmediateCompletion a pending one
// that the next progress completes, running its Callback.
func (ep *Endpoint) ipcEmpty(op string, p *RequestParam, check func() error) (*Request, error) {
	w := ep.w
	w.lockIssue()
	defer w.mu.Unlock()
	if err := ep.usableLocked(op); err != nil {
		return nil, err
	}
	if err := check(); err != nil {
		return nil, err
	}
	if p.Flags&NoImmediateCompletion == 0 {
		return w.postLocked(op, nil, p, nil)
	}
	if p.Request != nil {
		if err := p.Request.checkReusable(op); err != nil {
			return nil, err
		}
	}
	r, _ := w.newIPCRequest(op, p) // no event, no deps: the next poll completes it
	w.trackIPCLocked(r)
	return r, nil
}

// ipcCopy copies n bytes from src to dst in stream order: a declared device buffer
// by a device-to-device copy (the driver looks neither side up; on one device, by the
// backend's copy kernel where that is faster), others by Stream.Copy; or (stage set)
// in two hops through the staging buffer at stage, pinned host memory, by Stream.Copy
// since one side of each hop is host memory. uncaptured (a declared device buffer, no
// stage): a device-to-device copy that checks for stream capture in the same driver
// call, and enqueues nothing but returns errStreamCapturing under capture.
func (ep *Endpoint) ipcCopy(declared bool, s streamcore.Stream, dst, src uintptr, n int, stage uintptr, uncaptured bool) error {
	dev := ep.w.ctx.ipc.dev
	switch {
	case uncaptured:
		captured, err := dev.CopyDeviceUncaptured(s, dst, src, n, ep.sameDevice)
		if err == nil && captured {
			err = errStreamCapturing
		}
		return err
	case stage != 0:
		if err := s.Copy(stage, src, n); err != nil {
			return err
		}
		return s.Copy(dst, stage, n)
	case declared:
		return dev.CopyDevice(s, dst, src, n, ep.sameDevice)
	}
	return s.Copy(dst, src, n)
}

// declaredDevice reports whether the caller said the buffer is device memory.
func declaredDevice(p *RequestParam) bool {
	return p.MemoryType == MemoryCUDA || (p.MemH != nil && p.MemH.memType == MemoryCUDA)
}

// putSignalIPC is PutSignalNbx (its arguments checked) on device regions of a
// same-host peer: the copy, then
// a 64-bit stream write of the signal word in the peer's mapped memory, in stream
// order (the write lands after the copy). Set and Store are the same write; Add has
// no stream operation and is refused.
func (ep *Endpoint) putSignalIPC(op string, buf []byte, raddr uint64, rkey *Rkey, sig Signal, p *RequestParam) (*Request, error) {
	switch {
	case rkey.ipc == nil || sig.Rkey.signalAddr(sig.Addr) == 0:
		return nil, opErr(op, ErrUnsupported, "the data is a device region of a same-host peer (CUDA IPC) and the signal word is neither a device region nor shared Signals of that peer: a stream cannot reach it")
	case sig.Op == SignalAdd:
		return nil, opErr(op, ErrUnsupported, "SignalAdd on a device word: streams write, they do not add; use SignalSet or SignalStore with a growing value")
	}
	dev := ep.w.ctx.ipc.dev
	declared := declaredDevice(p)
	check := func() error {
		if err := rkey.liveLocked(op); err != nil {
			return err
		}
		return sig.Rkey.liveLocked(op)
	}
	sigAddr := sig.Rkey.signalAddr(sig.Addr)
	enqueue := func(s streamcore.Stream, stage uintptr, uncaptured bool) error {
		if len(buf) > 0 {
			if err := ep.ipcCopy(declared, s, rkey.ipc.mapped+uintptr(raddr-rkey.base), uintptr(bufPtr(buf)), len(buf), stage, uncaptured); err != nil {
				return err
			}
		}
		return dev.WriteValueAt(s, sigAddr, sig.Value)
	}
	reissue := func(off int, b []byte, ip *RequestParam) (*Request, error) {
		return ep.PutSignalNbx(b, raddr, rkey, sig, ip)
	}
	return ep.ipcIssue(op, p, buf, check, enqueue, reissue)
}

// ipcIssue runs enqueue (the copy, and a flag) in stream order where the condition
// says, and returns the Request that completes when that work is done:
//
//   - no condition: on the worker's stream of the device;
//   - a Stream condition whose stream can copy device memory: on that stream (with
//     NonBlockingEnqueue on the worker's stream, after the condition's stream got
//     there, so the condition's stream does not wait for it);
//   - any other condition: the engine calls reissue at the trigger, which comes back
//     here with no condition.
//
// Under StageAlways enqueue copies through a pinned buffer of the device's pool (its
// stage argument), lent here, counted in StagingStats and given back when the Request
// completes (its finish); for the engine's call at the trigger it is reserved at the
// submit (submitDirect), for the operation's life, so the engine allocates nothing; a
// capturing stream is not staged (a graph would reuse a buffer given back after the
// capture). check runs under the worker's lock (the keys' revocation).
func (ep *Endpoint) ipcIssue(op string, p *RequestParam, buf []byte, check func() error, enqueue ipcEnqueue, reissue func(off int, b []byte, ip *RequestParam) (*Request, error)) (*Request, error) {
	w := ep.w
	staged := len(buf) > 0 && p.Staging.Or(w.ctx.protocol.Staging) == protocol.StageAlways
	cond := p.Condition
	var s streamcore.Stream
	uncaptured := false
	if cond != nil {
		if cond.Category() != condition.Stream || !w.onIPCDevice(cond.Backend()) {
			return w.submitDirect(op, p, buf, staged, reissue)
		}
		s = cond.Stream()
		// The copy of a declared device buffer on the stream itself looks at capture
		// in its own driver call (ipcCopy); anything else asks first. Under capture
		// the Request made for it is dropped (a Condition never carries a caller's
		// RequestParam.Request).
		uncaptured = !staged && p.Flags&NonBlockingEnqueue == 0 && len(buf) > 0 && declaredDevice(p)
		if !uncaptured {
			capturing, err := s.Capturing()
			if err != nil {
				return nil, opErr(op, err, "")
			}
			if capturing {
				return ep.ipcCapture(op, p, s, check, enqueue)
			}
		}
	}
	r, err := ep.ipcIssueOn(op, p, buf, s, staged, uncaptured, check, enqueue)
	if errors.Is(err, errStreamCapturing) {
		return ep.ipcCapture(op, p, s, check, enqueue)
	}
	return r, err
}

// ipcEnqueue enqueues an IPC operation's stream work on s (see ipcIssue).
type ipcEnqueue func(s streamcore.Stream, stage uintptr, uncaptured bool) error

// errStreamCapturing: an uncaptured copy found its stream capturing, and enqueued
// nothing (ipcIssue takes the capture path).
var errStreamCapturing = errors.New("stream capturing")

// ipcIssueOn is ipcIssue's enqueue outside capture: on s (nil: the worker's stream).
func (ep *Endpoint) ipcIssueOn(op string, p *RequestParam, buf []byte, s streamcore.Stream, staged, uncaptured bool, check func() error, enqueue ipcEnqueue) (*Request, error) {
	w := ep.w
	var side streamcore.Stream
	if s == nil || p.Flags&NonBlockingEnqueue != 0 {
		var err error
		if side, err = w.ipcSideStream(); err != nil {
			return nil, opErr(op, err, "")
		}
	}
	var stage uintptr
	release := func() {}
	if staged {
		mem, give, err := w.devicePool().LendReserved(p.stageRes, len(buf), &w.staging) // the engine's issue: reserved at the submit
		if err != nil {
			return nil, opErr(op, err, "staging memory")
		}
		stage, release = mem.Addr(), give
	}
	r, x := w.newIPCRequest(op, p)
	x.ep = ep
	if staged {
		r.finish = func(*Request) { release() } // the copies are done
	}
	if len(buf) > 0 && !declaredDevice(p) {
		// Go memory stays put until the copy is done (declared device memory is not
		// Go's, and pinning costs a finalizer).
		r.pin.Pin(&buf[0])
		r.pinned = true
	}
	w.lockIssue()
	defer w.mu.Unlock()
	fail := func(err error) (*Request, error) {
		r.unpinIPC(nil)
		release()
		return nil, err
	}
	if err := ep.usableLocked(op); err != nil {
		return fail(err)
	}
	if err := check(); err != nil {
		return fail(err)
	}
	on := s
	if on == nil {
		on = side
	} else if side != nil {
		// Non-blocking: the copy waits for the stream's point on the worker's stream.
		ev, err := w.takeIPCEventLocked(nil)
		if err == nil {
			if err = s.Record(ev); err == nil {
				err = side.WaitEvent(ev)
			}
			w.putIPCEvent(nil, ev) // a wait holds the record it saw: the event may be recorded again
		}
		if err != nil {
			return fail(opErr(op, err, ""))
		}
		on = side
	}
	if err := enqueue(on, stage, uncaptured); err != nil {
		if errors.Is(err, errStreamCapturing) {
			return fail(err) // nothing enqueued: the capture path takes over
		}
		return fail(opErr(op, err, ""))
	}
	// The Request completes with an event recorded after the copy: one of its own on
	// the worker's stream, with a Callback (nobody may have to ask), and every
	// ipcMarkEvery-th copy of a stream; the others complete with the next event
	// recorded after them on their stream (pollIPCLocked records one when it finds
	// the newest copy without), which saves a driver call on most copies.
	q := w.ipcQueueLocked(on)
	x.q = q
	if side != nil || p.Callback != nil || q.sinceMark >= ipcMarkEvery-1 {
		if err := w.markIPCLocked(q, x); err != nil {
			return fail(opErr(op, err, ""))
		}
	} else {
		q.sinceMark++
	}
	q.reqs = append(q.reqs, r)
	return r, nil
}

// ipcMarkEvery: at least every so many copies of a stream record an event.
const ipcMarkEvery = 8

// markIPCLocked records an event on q's stream for x (the newest copy of q).
func (w *Worker) markIPCLocked(q *ipcQueue, x *ipcWait) error {
	ev, err := w.takeIPCEventLocked(x)
	if err != nil {
		return err
	}
	if err := q.s.Record(ev); err != nil {
		w.putIPCEvent(x, ev)
		return err
	}
	x.ev = ev
	q.sinceMark = 0
	return nil
}

// takeIPCEventLocked takes an event from the pool, or makes one (a driver call that
// does not wait for any stream) where the pool has none beyond those kept for
// reservations. The event of x (nil for none), an operation whose event was reserved
// (x.evRes, devstage.go), is one of those kept, taken with no driver call.
func (w *Worker) takeIPCEventLocked(x *ipcWait) (streamcore.Event, error) {
	n := len(w.ipcEvents)
	if x != nil && x.evRes != nil {
		if res := x.evRes; res.held && !res.using && n > 0 {
			res.using = true
			w.ipcEvKept--
			ev := w.ipcEvents[n-1]
			w.ipcEvents = w.ipcEvents[:n-1]
			return ev, nil
		}
		x.evRes = nil // not its reserved event: its return credits nothing
	}
	if n > w.ipcEvKept {
		ev := w.ipcEvents[n-1]
		w.ipcEvents = w.ipcEvents[:n-1]
		return ev, nil
	}
	return w.ctx.ipc.dev.NewEvent()
}

// ipcSideStream is the worker's own stream of the device, made on first use.
func (w *Worker) ipcSideStream() (streamcore.Stream, error) {
	w.mu.Lock()
	s := w.ipcStream
	w.mu.Unlock()
	if s != nil {
		return s, nil
	}
	ns, err := w.ctx.ipc.dev.NewStream()
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	if w.ipcStream == nil && !w.closed.Load() {
		w.ipcStream, ns = ns, nil
	}
	s = w.ipcStream
	w.mu.Unlock()
	if ns != nil {
		_ = ns.Close()
	}
	if s == nil {
		return nil, ErrClosed
	}
	return s, nil
}

// ipcCapture records the copy (and flag) into the graph the stream is capturing: they
// become a memcpy node and memop nodes that every launch runs, with no proxy and no
// host call. The Request is done at once: the call's work is the recording; each
// launch's data is in place for the work captured after it. The buffers are baked
// into the graph: they must outlive it (device or C memory, never Go memory).
// Non-blocking enqueue has no meaning in a graph and is refused, as for other
// captured operations.
func (ep *Endpoint) ipcCapture(op string, p *RequestParam, s streamcore.Stream, check func() error, enqueue ipcEnqueue) (*Request, error) {
	if p.Flags&NonBlockingEnqueue != 0 {
		return nil, opErr(op, ErrInvalidParam, "NonBlockingEnqueue under stream capture: a relaunched graph has nothing to wait on later")
	}
	w := ep.w
	w.mu.Lock()
	err := ep.usableLocked(op)
	if err == nil {
		err = check()
	}
	if err == nil {
		if err = enqueue(s, 0, false); err != nil {
			err = opErr(op, err, "recording into the captured graph")
		}
	}
	w.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if p.Callback != nil {
		p.Callback(completedRequest)
	}
	return completedRequest, nil
}

// unpinIPC undoes what rmaIPC set up for a copy that was not enqueued.
func (r *Request) unpinIPC(ev streamcore.Event) {
	if r.pinned {
		r.pin.Unpin()
		r.pinned = false
	}
	x := r.ipc
	r.ipc = nil
	r.w.putIPCEvent(x, ev)
}

// onIPCDevice reports whether streams of b can run the copies: b is of the kind of
// the context's device backend (CUDA: unified addressing makes the mapping usable
// from any stream of the process; a host stream could not copy device memory).
func (w *Worker) onIPCDevice(b streamcore.Backend) bool {
	return b != nil && b.Kind() == w.ctx.ipc.dev.Kind()
}

// ipcResources returns an event (from the worker's pool; x's reserved one if it has
// one) and the worker's own stream of the device, made on first use: on the caller's
// goroutine.
func (w *Worker) ipcResources(x *ipcWait) (streamcore.Event, streamcore.Stream, error) {
	side, err := w.ipcSideStream()
	if err != nil {
		return nil, nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	ev, err := w.takeIPCEventLocked(x)
	return ev, side, err
}

// putIPCEvent gives ev, taken for x (nil for none), back to the pool; the pool keeps
// it again for x's reservation if x took its reserved event and the reservation is
// still held. Caller holds w.mu.
func (w *Worker) putIPCEvent(x *ipcWait, ev streamcore.Event) {
	if ev == nil {
		return
	}
	w.ipcEvents = append(w.ipcEvents, ev)
	if x != nil && x.evRes != nil {
		x.evRes.endUseLocked()
		x.evRes = nil
	}
}

// ipcQueue is the IPC requests of one stream, in enqueue order: a stream runs its
// work in order, so they complete in order and only the oldest needs polling.
type ipcQueue struct {
	s    streamcore.Stream
	reqs []*Request
	// sinceMark counts the copies enqueued since the last one with an event.
	sinceMark int
}

// holds reports whether q has a copy of ep's (of any endpoint's for nil).
func (q *ipcQueue) holds(ep *Endpoint) bool {
	for _, r := range q.reqs {
		if ep == nil || r.ipc.ep == ep {
			return true
		}
	}
	return false
}

// ipcQueueLocked is s's queue, made on first use.
func (w *Worker) ipcQueueLocked(s streamcore.Stream) *ipcQueue {
	for _, q := range w.ipcQueues {
		if q.s == s {
			return q
		}
	}
	q := &ipcQueue{s: s}
	w.ipcQueues = append(w.ipcQueues, q)
	return q
}

// trackIPCLocked records a pending flush or staged operation (polled whole; copies
// go to their stream's queue).
func (w *Worker) trackIPCLocked(r *Request) {
	w.ipcPending = append(w.ipcPending, r)
}

// ipcBusyLocked reports whether IPC requests are pending (polling drops a queue once
// it is empty).
func (w *Worker) ipcBusyLocked() bool { return len(w.ipcQueues) > 0 || len(w.ipcPending) > 0 }

// ipcPollsLocked reports whether pending IPC work needs polling: copies, and the
// steps of staged operations and pulls, but not a pulled send waiting for its
// receiver's word (an active message, which the event fd shows).
func (w *Worker) ipcPollsLocked() bool {
	if len(w.ipcQueues) > 0 {
		return true
	}
	for _, r := range w.ipcPending {
		if x := r.ipc; !(x.pullSend && x.held) {
			return true
		}
	}
	return false
}

// eachIPCLocked calls fn on every pending IPC request.
func (w *Worker) eachIPCLocked(fn func(r *Request)) {
	for _, q := range w.ipcQueues {
		for _, r := range q.reqs {
			fn(r)
		}
	}
	for _, r := range w.ipcPending {
		fn(r)
	}
}

// pollIPCLocked completes the IPC requests whose copies (or, for a flush, whose
// predecessors; for a staged operation, whose last step) are done: the oldest of each
// stream's queue until one is pending, and the others all. cuEventQuery does not wait.
func (w *Worker) pollIPCLocked() int {
	n := 0
	queues := w.ipcQueues[:0]
	for _, q := range w.ipcQueues {
		n += w.pollQueueLocked(q)
		if len(q.reqs) > 0 {
			queues = append(queues, q)
		}
	}
	clear(w.ipcQueues[len(queues):])
	w.ipcQueues = queues
	kept := w.ipcPending[:0]
	for _, r := range w.ipcPending {
		if w.stepIPCLocked(r) {
			n++
			continue
		}
		kept = append(kept, r)
	}
	clear(w.ipcPending[len(kept):])
	w.ipcPending = kept
	return n
}

// pollQueueLocked completes q's copies up to the newest whose event is done (those
// before it ran before it on the stream), and makes sure the newest copy has an event,
// so that every copy completes without anybody asking.
func (w *Worker) pollQueueLocked(q *ipcQueue) int {
	n, done := 0, 0
	for i := 0; i < len(q.reqs); i++ {
		x := q.reqs[i].ipc
		if x.ev == nil {
			continue
		}
		ok, err := x.poll()
		if !ok {
			break
		}
		for _, r := range q.reqs[done : i+1] {
			w.completeIPCLocked(r, err)
			n++
		}
		done = i + 1
	}
	clear(q.reqs[:done])
	q.reqs = q.reqs[done:]
	if k := len(q.reqs); k > 0 && q.reqs[k-1].ipc.ev == nil {
		_ = w.markIPCLocked(q, q.reqs[k-1].ipc) // failing, the next poll tries again
	}
	if len(q.reqs) == 0 {
		q.sinceMark = 0
	}
	return n
}

// stepIPCLocked advances r (its next step, if the current one is done) and completes
// it when it is finished; it reports whether it completed.
func (w *Worker) stepIPCLocked(r *Request) bool {
	x := r.ipc
	done, err := x.poll()
	if done && x.then != nil {
		then := x.then
		x.then = nil
		done, err = then(x, err)
	}
	if !done {
		return false
	}
	w.completeIPCLocked(r, err)
	return true
}

// issueLaterLocked holds x's Request pending while issue runs on the goroutine that
// drove progress (outside the lock), then makes it follow the Request issue returned;
// finish runs under the lock once that is done, or with nil once issue failed (x then
// completes with the failure). Caller holds w.mu.
func (w *Worker) issueLaterLocked(x *ipcWait, issue func() (*Request, error), finish func(in *Request)) {
	x.held = true
	w.deferred = append(w.deferred, func() {
		in, err := issue()
		w.mu.Lock()
		defer w.mu.Unlock()
		x.held = false
		if err != nil {
			x.failed = err
			finish(nil)
			return
		}
		x.after(in, func(error) { finish(in) })
	})
}

// completeIPCLocked completes a pending IPC request with err (or its peer's failure).
func (w *Worker) completeIPCLocked(r *Request, err error) {
	x := r.ipc
	if err == nil && x.ep != nil && x.ep.err != nil {
		err = x.ep.err // the copy ran, but the peer it was for is gone
	}
	ev := x.ev
	r.completeLocked(err, x.length, x.tag)
	w.putIPCEvent(x, ev)
}

func (x *ipcWait) poll() (bool, error) {
	switch {
	case x.failed != nil:
		return true, x.failed
	case x.held:
		return false, nil
	}
	if x.ev != nil {
		return x.ev.Query()
	}
	var first error
	for _, d := range x.deps {
		if !d.done.Load() {
			return false, nil
		}
		if first == nil {
			first = d.err
		}
	}
	return true, first
}

// flushIPCLocked makes flush (UCX's flush request of ep, or of the worker when ep is
// nil) also wait for the copies issued before it.
func (w *Worker) flushIPCLocked(op string, flush *Request, ep *Endpoint, p *RequestParam) *Request {
	// The newest copy of each stream that holds one of ep's completes after all of them.
	var deps []*Request
	for _, q := range w.ipcQueues {
		if len(q.reqs) == 0 || !q.holds(ep) {
			continue
		}
		newest := q.reqs[len(q.reqs)-1]
		if newest.ipc.ev == nil {
			_ = w.markIPCLocked(q, newest.ipc) // failing, the next poll marks it
		}
		deps = append(deps, newest)
	}
	for _, r := range w.ipcPending {
		if (ep == nil || r.ipc.ep == ep) && !r.ipc.pullSend {
			deps = append(deps, r)
		}
	}
	if len(deps) == 0 {
		return flush
	}
	if flush != completedRequest && !flush.done.Load() {
		deps = append(deps, flush)
	}
	r := &Request{}
	r.reset(w, op, p.Callback)
	if flush != completedRequest && flush.cb != nil {
		flush.cb = nil // the user's callback belongs to the combined request
	}
	r.ipc = &ipcWait{deps: deps, flush: true}
	w.trackIPCLocked(r)
	return r
}

// waitIPC waits for an IPC request: it polls (the copy engine signals nothing the
// worker's event descriptor would show), spinning for internal/backoff's spin phase.
func (w *Worker) waitIPC(ctx context.Context, r *Request) error {
	start := time.Now()
	for {
		w.progressFor(nil, 1)
		if r.done.Load() {
			return r.err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		// A copy signals nothing, but the UCX step of a staged operation (a message
		// moving in many fragments, each needing a progress call) does: sleep on the
		// worker's events.
		backoff.PauseOn(start, func() { _ = w.WaitForEvents(ctx, time.Millisecond) })
	}
}

// ipcPeerFailed drops a failed peer's mappings once the copies into them are done
// (those of keys that handed out an address go when the key is closed).
func (ep *Endpoint) ipcPeerFailedLocked() {
	c := ep.w.ctx
	if c.ipc == nil || !ep.peerKnown {
		return
	}
	w := ep.w
	var pending []*Request
	w.eachIPCLocked(func(r *Request) {
		if r.ipc.ep == ep {
			pending = append(pending, r)
		}
	})
	// A key whose DeviceAddress was handed out keeps its mappings until it is
	// closed: graph nodes and kernels may still copy through them (the caller's
	// work, which ucpx cannot wait for).
	var rel []*rkeyIPC
	for rk := range w.rkeys {
		if rk.ep == ep && !rk.addressed {
			rel = append(rel, rk.takeMappingsLocked()...)
		}
	}
	go func() {
		for _, r := range pending {
			_ = r.Wait(context.Background())
		}
		for _, x := range rel {
			x.release(c)
		}
	}()
}

// closeIPCLocked releases the worker's stream and events (Worker.Close, after the
// pending copies were waited for).
func (w *Worker) closeIPCLocked() []func() {
	var out []func()
	if s := w.ipcStream; s != nil {
		w.ipcStream = nil
		out = append(out, func() { _ = s.Close() })
	}
	for _, ev := range w.ipcEvents {
		out = append(out, func() { _ = ev.Close() })
	}
	w.ipcEvents = nil
	return out
}

// unpackRkeyIPC is UnpackRkey for a device region's key (checked and authenticated
// already): map it, then record the import as UnpackRkey does.
func (ep *Endpoint) unpackRkeyIPC(k rkeyInfo) (*Rkey, error) {
	x, err := ep.unpackIPC(k)
	if err != nil {
		return nil, err
	}
	w := ep.w
	w.mu.Lock()
	if err := ep.usableLocked("ep_rkey_unpack"); err != nil {
		w.mu.Unlock()
		_ = w.ctx.ipc.imp.Release(x.peer, x.alloc)
		return nil, err
	}
	return ep.addRkeyUnlock(&Rkey{ep: ep, ipc: x, base: k.base, length: k.length, exporter: k.sender, keyID: k.keyID})
}

// Device reports whether the key is of a device region that CUDA IPC mapped here
// (its puts and gets are copy-engine copies).
func (r *Rkey) Device() bool {
	if r == nil {
		return false
	}
	return r.ipc != nil
}

// DeviceAddress is where n bytes at the peer's address raddr are mapped in this
// process, for work that moves data without ucpx on the path: memcpy and memop nodes
// of a CUDA graph, a kernel's stores (device/ucpx_signal.cuh's ucpx_put_signal). The
// key is of a device region, or of a same-host peer's Signals that were mapped here
// (shared words: the device address of this process's mapping of them). The
// address is valid while the key is open and not revoked and the peer alive; an
// operation through it is the caller's to order (ucpx sees none of it). A key of other
// host memory gives ErrUnsupported. Once an address was handed out, a failed peer's
// mappings of the key stay until the key is closed (close it after the work through
// them), where other keys' are dropped once ucpx's own copies into them ended.
func (r *Rkey) DeviceAddress(raddr uint64, n int) (uintptr, error) {
	const op = "rkey_device_address"
	if r == nil {
		return 0, opErr(op, ErrInvalidParam, "nil key")
	}
	w := r.ep.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if r.ipc == nil && r.shared == nil {
		return 0, opErr(op, ErrUnsupported, "not the key of a device region mapped by CUDA IPC, nor of shared Signals mapped here")
	}
	if err := r.checkLocked(op, r.ep, raddr, n); err != nil {
		return 0, err
	}
	if err := r.ep.usableLocked(op); err != nil {
		return 0, err
	}
	r.addressed = true
	return r.signalAddr(raddr), nil
}

// submitDirect hands an IPC operation to the engine, which issues it (as the call
// without a condition) at the trigger; the plan stages nothing. staged: the call at the
// trigger copies through the device's pool, from a buffer reserved now.
func (w *Worker) submitDirect(op string, p *RequestParam, buf []byte, staged bool, issue func(off int, buf []byte, p *RequestParam) (*Request, error)) (*Request, error) {
	return w.submitTransfer(op, p, buf, protocol.Out, false, true, staged, issue)
}

// ipcWaitOnStream orders s after an IPC copy, or after the copies a flush waits for.
// A device operation staged with no condition is waited for on the host, as every
// operation without a condition is.
func (w *Worker) ipcWaitOnStream(r *Request, s streamcore.Stream) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if r.done.Load() {
		return nil
	}
	x := r.ipc
	copies := []*Request{r}
	switch {
	case x.flush:
		copies = copies[:0]
		for _, d := range x.deps {
			if d.done.Load() {
				continue
			}
			if d.ipc == nil || d.ipc.q == nil {
				return opErr("wait_on_stream", ErrInvalidParam, "%s waits for UCX's flush or a staged operation too: wait on the host", r.op)
			}
			copies = append(copies, d)
		}
	case x.q == nil:
		return opErr("wait_on_stream", ErrInvalidParam, "%s has no condition: wait on the host", r.op)
	}
	for _, c := range copies {
		ev, err := w.eventAfterLocked(c)
		if err == nil {
			err = s.WaitEvent(ev)
		}
		if err != nil {
			return opErr("wait_on_stream", err, "%s", r.op)
		}
	}
	return nil
}

// eventAfterLocked is the first event recorded after the pending copy r on its
// stream: its own, a later copy's, or one recorded now on the newest copy.
func (w *Worker) eventAfterLocked(r *Request) (streamcore.Event, error) {
	q := r.ipc.q
	after := false
	for _, o := range q.reqs {
		after = after || o == r
		if after && o.ipc.ev != nil {
			return o.ipc.ev, nil
		}
	}
	newest := q.reqs[len(q.reqs)-1].ipc
	if err := w.markIPCLocked(q, newest); err != nil {
		return nil, err
	}
	return newest.ev, nil
}

// heldKeyID names an imported key: its exporter and the key id sealed into it.
type heldKeyID struct {
	exporter [idLen]byte
	keyID    uint64
}

// abandonIPCLocked is Worker.Close's part for the IPC copies still pending past its
// bound, called before it fails them: nothing says they will not still run, so the
// mappings they may write into (those of every mapped key of the worker, closed or
// not) are taken from their release here, and released only once the copies' events
// say they ran, by a goroutine that polls them (cuEventQuery does not wait). Where a
// pending copy has no event, nothing can say so: the mappings stay (leaked). Until
// the release, the keys stay counted at their exporters (Close tells no release of
// them), and a revocation of one acknowledges only after it (Context.limbo): the
// exporter does not free memory a queued copy still writes into. It returns the keys
// whose release it took over.
func (w *Worker) abandonIPCLocked() map[*Rkey]bool {
	if !w.ipcBusyLocked() {
		return nil
	}
	var evs []streamcore.Event
	sure := true
	for _, q := range w.ipcQueues {
		if k := len(q.reqs); k > 0 { // a stream's copies run in order: its newest ends last
			if ev := q.reqs[k-1].ipc.ev; ev != nil {
				evs = append(evs, ev) // pending requests have events of their own
			} else {
				sure = false
			}
		}
	}
	for _, r := range w.ipcPending {
		switch x := r.ipc; {
		case x.ev != nil:
			evs = append(evs, x.ev)
		case x.held && !x.pullSend: // a step being started: it may have enqueued a copy
			sure = false
		}
	}
	type kept struct {
		rk *Rkey
		xs []*rkeyIPC
	}
	var keys []kept
	out := make(map[*Rkey]bool)
	for rk := range w.rkeys {
		if xs := rk.takeMappingsLocked(); len(xs) > 0 {
			keys = append(keys, kept{rk, xs})
			out[rk] = true
		}
	}
	if len(keys) == 0 {
		return nil
	}
	c := w.ctx
	gone := make(chan struct{})
	c.limboMu.Lock()
	if c.limbo == nil {
		c.limbo = make(map[heldKeyID][]chan struct{})
	}
	for _, k := range keys {
		id := heldKeyID{k.rk.exporter, k.rk.keyID}
		c.limbo[id] = append(c.limbo[id], gone)
	}
	c.limboMu.Unlock()
	if !sure {
		return out // leaked: the mappings stay, and so does the exporters' count of them
	}
	go func() {
		for _, ev := range evs {
			for {
				// An error (a failed device): the copy will not run either.
				if done, err := ev.Query(); done || err != nil {
					break
				}
				time.Sleep(time.Millisecond)
			}
		}
		for _, ev := range evs {
			_ = ev.Close()
		}
		for _, k := range keys {
			for _, x := range k.xs {
				x.release(c)
			}
		}
		c.limboMu.Lock()
		for _, k := range keys {
			id := heldKeyID{k.rk.exporter, k.rk.keyID}
			l := slices.DeleteFunc(c.limbo[id], func(g chan struct{}) bool { return g == gone })
			if len(l) == 0 {
				delete(c.limbo, id)
			} else {
				c.limbo[id] = l
			}
		}
		c.limboMu.Unlock()
		close(gone)
		// Now the keys are released: tell their exporters as Close would have (one
		// elsewhere is told nothing, the worker's endpoints are gone: it revokes, and
		// this context acknowledges).
		var notes []func()
		w.mu.Lock()
		for _, k := range keys {
			if note := k.rk.releaseNoteLocked(); note != nil {
				notes = append(notes, note)
			}
		}
		w.mu.Unlock()
		runDeferred(notes)
	}()
	return out
}

package ucp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ucpx/ucpx/cgo/ucx"
	"github.com/ucpx/ucpx/protocol"
)

// EndpointParams configures an endpoint.
type EndpointParams struct {
	// ErrorHandler runs once when the peer fails (UCP_ERR_HANDLING_MODE_PEER), on the
	// goroutine that drove progress, without worker locks held. Pending operations on
	// the endpoint complete with the error as well; the endpoint is unusable afterwards.
	ErrorHandler func(ep *Endpoint, err error)
	// NoPeerErrorHandling selects UCP_ERR_HANDLING_MODE_NONE: a failed peer is not
	// reported, and transports without failure detection may be used. In UCX 1.13 that
	// is what enables shared memory (sysv/posix/cma): with peer error handling UCX picks
	// only tcp. Waits stay bounded by their context either way.
	NoPeerErrorHandling bool
}

// Endpoint is a ucp_ep_h: a connection to one peer worker.
type Endpoint struct {
	w      *Worker
	raw    *ucx.EP
	params EndpointParams
	name   string
	// Under w.mu.
	err    error // the peer failure, once reported
	closed bool
	recvs  map[*Request]struct{} // receives with RequestParam.Peer == this endpoint
	// failureHooks run once the peer fails or the application closes the endpoint
	// (OnFailure), in the order they were added.
	failureHooks []*failureHook
	// peer is who the endpoint reaches, as authenticated by the handshake or the
	// sealed worker address (peerKnown); UnpackRkey accepts only its keys.
	peer      peerInfo
	peerKnown bool
	// sameDevice: the peer's device is this process's (protocol.ReachSameDevice), so
	// IPC copies may run as the backend's copy kernel.
	sameDevice bool
	// rawClosed: the UCX endpoint was closed already (a watched peer died).
	rawClosed bool
	watch     *pidWatch // same-host peer watching, nil if none
	source    uint64    // the peer's source id (unmatched.go), when peerKnown
	// pullKeys: the peer's keys of pulled messages, unpacked (ampull.go; under w.mu).
	pullKeys map[string]*pullKey
	pullUses uint64 // uses of its pull keys so far (ampull.go; under w.mu)
	// internal: made by the worker itself to answer pulls (tagpull.go): nobody else
	// can close it.
	internal bool
	// pullHello: this worker's address went to the peer ahead of a pulled tag
	// message (tagpull.go; under w.mu).
	pullHello bool
	// replyHello: this worker's address went to the peer ahead of the first AmReply
	// message on the endpoint (ReplyEndpoint).
	replyHello atomic.Bool
	// fast: the endpoint's record for C callers (cshare.go; under w.mu), retired
	// once the endpoint is no longer usable.
	fast *ucx.Fast
}

func (ep *Endpoint) String() string {
	if ep == nil {
		return "ep(<nil>)"
	}
	return "ep(" + ep.name + ")"
}

// Worker returns the worker the endpoint belongs to.
func (ep *Endpoint) Worker() *Worker {
	if ep == nil {
		return nil
	}
	return ep.w
}

// Err reports the peer failure, if any.
func (ep *Endpoint) Err() error {
	if ep == nil {
		return opErr("endpoint", ErrInvalidParam, "nil endpoint")
	}
	ep.w.mu.Lock()
	defer ep.w.mu.Unlock()
	return ep.err
}

func (w *Worker) addEndpointLocked(raw *ucx.EP, p *EndpointParams, name string, peer *peerInfo) *Endpoint {
	ep := &Endpoint{w: w, raw: raw, name: name, recvs: map[*Request]struct{}{}}
	if p != nil {
		ep.params = *p
	}
	if peer != nil {
		ep.peer, ep.peerKnown = *peer, true
		ep.source = sourceOf(w.ctx.trust, peer.id, peer.addr)
		ep.peer.addr = nil
		ep.sameDevice = ep.Reach(nil) == protocol.ReachSameDevice
	}
	w.eps[raw.Ptr()] = ep
	live.endpoints.Add(1)
	return ep
}

func resolveTCP(addr string) ([]byte, int, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, 0, fmt.Errorf("%v: %w", err, ErrInvalidAddr)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return nil, 0, fmt.Errorf("port %q: %w", portStr, ErrInvalidAddr)
	}
	if host == "" {
		return net.IPv4zero.To4(), port, nil
	}
	ips, err := net.LookupIP(host)
	if err != nil || len(ips) == 0 {
		return nil, 0, fmt.Errorf("resolve %q: %v: %w", host, err, ErrUnreachable)
	}
	if v4 := ips[0].To4(); v4 != nil {
		return v4, port, nil
	}
	return ips[0].To16(), port, nil
}

// Connect creates a client endpoint to a listener at addr ("host:port") and waits
// until the connection is established or fails (ctx bounds the wait). It first runs
// the authenticated handshake over TCP (README, "Trust model"): a server that does not
// hold this context's auth key, or requires one this context lacks, gives an error
// matching ErrAuth, and nothing else was exchanged. Then the endpoint is created from
// the server's worker address and wired up. A port nobody listens on gives an error
// that matches ErrPeerFailed (usually ErrConnectionReset or ErrUnreachable). The
// peer's worker must be progressed meanwhile.
func (w *Worker) Connect(ctx context.Context, addr string, p *EndpointParams) (*Endpoint, error) {
	if w == nil {
		return nil, opErr("ep_create", ErrInvalidParam, "nil worker")
	}
	if ctx == nil {
		return nil, opErr("ep_create", ErrInvalidParam, "nil context")
	}
	ip, port, err := resolveTCP(addr)
	if err != nil {
		return nil, opErr("ep_create", err, "connect %s", addr)
	}
	if port == 0 {
		return nil, opErr("ep_create", ErrInvalidAddr, "connect %s: port 0", addr)
	}
	self, err := w.selfInfo()
	if err != nil {
		return nil, opErr("ep_create", err, "connect %s", addr)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(net.IP(ip).String(), strconv.Itoa(port)))
	if err != nil {
		if ctx.Err() != nil {
			return nil, opErr("ep_create", ctx.Err(), "connect %s", addr)
		}
		return nil, opErr("ep_create", fmt.Errorf("%v: %w", err, ErrConnectionReset), "connect %s", addr)
	}
	peer, err := w.clientHandshake(ctx, conn, &self)
	_ = conn.Close()
	if err != nil {
		return nil, opErr("ep_create", err, "connect %s", addr)
	}
	w.mu.Lock()
	if w.closed.Load() {
		w.mu.Unlock()
		return nil, opErr("ep_create", ErrClosed, "connect %s", addr)
	}
	raw, st := w.raw.ConnectAddress(peer.addr, p == nil || !p.NoPeerErrorHandling)
	if err := statusErr(st); err != nil {
		w.mu.Unlock()
		return nil, opErr("ep_create", err, "connect %s", addr)
	}
	ep := w.addEndpointLocked(raw, p, addr, &peer)
	w.mu.Unlock()

	// A flush completes once wire-up has finished, or fails if the peer is not there.
	req, err := ep.FlushNbx(nil)
	if err == nil {
		err = req.Wait(ctx)
	}
	if err != nil {
		_ = ep.closeWith(true, time.Second)
		return nil, opErr("ep_create", err, "connect %s", addr)
	}
	ep.startWatch()
	return ep, nil
}

// clientHandshake runs the client's side of the handshake on conn within ctx.
func (w *Worker) clientHandshake(ctx context.Context, conn net.Conn, self *peerInfo) (peerInfo, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(handshakeTimeout)
	}
	_ = conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	h := &handshake{t: w.ctx.trust, rw: conn}
	peer, err := h.client(self)
	if err == nil {
		err = h.readDecision()
	}
	if err != nil && ctx.Err() != nil {
		return peerInfo{}, fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return peer, err
}

// selfInfo is what the handshake and Address tell peers about this worker.
func (w *Worker) selfInfo() (peerInfo, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed.Load() {
		return peerInfo{}, ErrClosed
	}
	a, st := w.raw.Address()
	if err := statusErr(st); err != nil {
		return peerInfo{}, err
	}
	t := w.ctx.trust
	return peerInfo{id: t.id, pid: t.pid, boot: t.boot, host: t.host, addr: a}, nil
}

// ConnectAddress creates an endpoint to a worker address obtained from the peer's
// Worker.Address. Bytes that are not such an address give ErrInvalidAddr; an address
// sealed under another auth key (or forged, or altered) also matches ErrAuth. Nothing
// unsealed reaches UCX.
func (w *Worker) ConnectAddress(addr []byte, p *EndpointParams) (*Endpoint, error) {
	if w == nil {
		return nil, opErr("ep_create", ErrInvalidParam, "nil worker")
	}
	peer, err := openAddress(w.ctx.trust.seal, addr)
	if err != nil {
		return nil, opErr("ep_create", fmt.Errorf("%w: %w", ErrInvalidAddr, err), "worker address of %d bytes", len(addr))
	}
	w.mu.Lock()
	if w.closed.Load() {
		w.mu.Unlock()
		return nil, opErr("ep_create", ErrClosed, "")
	}
	ep, err := w.connectLocked(&peer, p, "worker-address", "worker address")
	w.mu.Unlock()
	if err != nil {
		return nil, err
	}
	ep.startWatch()
	return ep, nil
}

// connectLocked makes an endpoint to peer (an opened sealed address), named name; what
// says whose address it is in errors. The caller holds w.mu, has checked that the
// worker is open, and starts the endpoint's watch once it let go (startWatch takes
// w.mu).
func (w *Worker) connectLocked(peer *peerInfo, p *EndpointParams, name, what string) (*Endpoint, error) {
	raw, st := w.raw.ConnectAddress(peer.addr, p == nil || !p.NoPeerErrorHandling)
	if err := statusErr(st); err != nil {
		return nil, opErr("ep_create", err, "%s", what)
	}
	return w.addEndpointLocked(raw, p, name, peer), nil
}

// usableLocked returns the error an operation on ep must fail with, if any.
// sameWorker checks that ep (RequestParam.Peer, nil allowed) belongs to w: a receive
// is tied to the peer's failure through the peer's worker.
func (ep *Endpoint) sameWorker(op string, w *Worker) error {
	if ep != nil && ep.w != w {
		return opErr(op, ErrInvalidParam, "RequestParam.Peer %s belongs to another worker", ep)
	}
	return nil
}

func (ep *Endpoint) usableLocked(op string) error {
	if ep.err != nil && ep.internal && !ep.w.closed.Load() {
		// Closed by the worker because its peer failed: its holders (reply endpoints)
		// see the failure.
		return opErr(op, ep.err, "%s", ep)
	}
	if ep.closed || ep.w.closed.Load() {
		return opErr(op, ErrClosed, "%s", ep)
	}
	if ep.err != nil {
		return opErr(op, ep.err, "%s", ep)
	}
	return nil
}

// failLocked handles the peer failure reported by UCX.
func (ep *Endpoint) failLocked(st error) {
	if ep.err != nil || ep.closed {
		return
	}
	ep.err = st
	retireFast(&ep.fast)
	ep.ipcPeerFailedLocked()
	ep.w.failPullsLocked(ep, st)
	for r := range ep.recvs {
		if r.req != nil {
			ep.w.raw.Cancel(r.req)
		}
	}
	if h := ep.params.ErrorHandler; h != nil {
		ep.w.deferred = append(ep.w.deferred, func() { h(ep, st) })
	}
	ep.queueFailureHooksLocked(st)
}

// queueFailureHooksLocked queues the OnFailure hooks to run with err once w.mu is let
// go (unlockDeferred), and drops them: each runs once. Caller holds w.mu.
func (ep *Endpoint) queueFailureHooksLocked(err error) {
	for _, h := range ep.failureHooks {
		ep.w.deferred = append(ep.w.deferred, func() { h.fn(ep, err) })
	}
	ep.failureHooks = nil
}

// failureHook is one OnFailure function (a pointer, so that its remover finds it).
type failureHook struct{ fn func(*Endpoint, error) }

// OnFailure adds fn to what runs once the endpoint can no longer reach the peer: the
// peer fails (besides EndpointParams.ErrorHandler; err is the failure), on the
// goroutine that drove progress, or the application closes the endpoint (CloseNbx,
// Close; err matches ErrClosed), on the closing goroutine before the call returns.
// It runs without worker locks held, once: layers above ucp (prepared operations)
// release what waits on the peer. If the peer failed or the endpoint was closed
// already (its worker's Close closes it too), fn runs now. remove takes fn back (it
// does not run later; idempotent): a layer that adds a hook per object removes it
// when the object goes, or the endpoint keeps every one. A nil endpoint or fn adds
// nothing.
func (ep *Endpoint) OnFailure(fn func(ep *Endpoint, err error)) (remove func()) {
	if ep == nil || fn == nil {
		return func() {}
	}
	w := ep.w
	h := &failureHook{fn: fn}
	w.mu.Lock()
	err := ep.err
	if err == nil && ep.closed {
		err = ep.closedErr()
	}
	if err == nil {
		ep.failureHooks = append(ep.failureHooks, h)
	}
	w.mu.Unlock()
	if err != nil {
		fn(ep, err)
		return func() {}
	}
	return hookRemover(w, &ep.failureHooks, h)
}

// CloseNbx starts closing the endpoint (ucp_ep_close_nbx): flush mode completes
// outstanding operations first; force mode drops them and completes them with an
// error. The endpoint is unusable as soon as the call returns.
func (ep *Endpoint) CloseNbx(force bool) (*Request, error) {
	if ep == nil {
		return nil, opErr("ep_close_nbx", ErrInvalidParam, "nil endpoint")
	}
	ep.w.mu.Lock()
	req, err := ep.closeNbxLocked(force)
	ep.w.unlockDeferred() // the failure hooks the close queued
	return req, err
}

// closeNbxLocked is CloseNbx with w.mu held. The failure hooks it queues run once the
// caller let go of w.mu (unlockDeferred).
func (ep *Endpoint) closeNbxLocked(force bool) (*Request, error) {
	w := ep.w
	if ep.closed || w.closed.Load() {
		return nil, opErr("ep_close_nbx", ErrClosed, "%s", ep)
	}
	if force && ep.params.NoPeerErrorHandling && ep.err == nil {
		// UCX refuses force mode without peer error handling (and would leave the
		// endpoint open): refuse it here, before anything changes.
		return nil, opErr("ep_close_nbx", ErrInvalidParam, "%s: force close needs peer error handling (EndpointParams.NoPeerErrorHandling is set); close in flush mode", ep)
	}
	if ep.err != nil && !ep.params.NoPeerErrorHandling {
		force = true // UCX requires force mode on a failed endpoint
	}
	ep.markClosedLocked()
	// Nothing more reaches the peer through ep: what waits on the peer (a prepared
	// operation's iteration) ends, as it would had the peer failed.
	if len(ep.failureHooks) > 0 {
		ep.queueFailureHooksLocked(ep.closedErr())
	}
	if ep.rawClosed {
		return completedRequest, nil
	}
	ep.rawClosed = true
	if ep.err != nil && ep.params.NoPeerErrorHandling {
		// A watched peer died: nothing answers a flush, and UCX refuses force mode
		// here. The worker's destruction releases the UCX endpoint.
		return completedRequest, nil
	}
	return w.postLocked("ep_close_nbx", w.raw.Close(ep.raw, force), &defaultParam, nil)
}

// closedErr is what the failure hooks of an endpoint the application closed get.
func (ep *Endpoint) closedErr() error {
	return opErr("ep_close_nbx", ErrClosed, "%s was closed", ep)
}

func (ep *Endpoint) markClosedLocked() {
	ep.dropPullKeysLocked() // first: releases still reach the peer
	ep.closed = true
	if ep.raw != nil {
		ep.w.raw.ChainsEPClosed(ep.raw) // a chain's completion must not post on it
	}
	retireFast(&ep.fast)
	if ep.watch != nil {
		ep.watch.stop()
	}
	delete(ep.w.eps, ep.raw.Ptr())
	live.endpoints.Add(-1)
}

// Close closes the endpoint gracefully (flush). A flush that has not finished after
// 5 s (a peer that is dead or does not progress) is given up: Close returns ErrTimedOut,
// the endpoint is closed for ucpx, and UCX's close request is released with the worker.
// A second Close returns ErrClosed.
func (ep *Endpoint) Close() error {
	if ep == nil {
		return opErr("ep_close_nbx", ErrInvalidParam, "nil endpoint")
	}
	return ep.closeWith(false, 5*time.Second)
}

func (ep *Endpoint) closeWith(force bool, timeout time.Duration) error {
	req, err := ep.CloseNbx(force)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err = req.Wait(ctx)
	if err != nil && ctx.Err() != nil {
		// UCX cannot cancel a close; one that ends later completes the request, and the
		// worker's Close releases one that never does.
		req.Cancel()
		return opErr("ep_close_nbx", ErrTimedOut, "%s: flush did not finish in %v", ep, timeout)
	}
	if err != nil && errors.Is(err, ErrPeerFailed) {
		return nil // the peer is gone: closing is all that could be done
	}
	return err
}

// forceCloseLocked is Close from Worker.Close: no waiting (the worker drains after).
func (ep *Endpoint) forceCloseLocked() {
	if ep.closed {
		return
	}
	ep.markClosedLocked()
	if !ep.rawClosed {
		ep.rawClosed = true
		// Without peer error handling UCX refuses force mode; the worker's destruction,
		// which follows, releases such an endpoint.
		if !ep.params.NoPeerErrorHandling {
			_, _ = ep.w.postLocked("ep_close_nbx", ep.w.raw.Close(ep.raw, true), &defaultParam, nil)
		}
	}
}

// HostIdentity is where this context runs as its peers learn it: the boot, the IPC
// namespace and ContextParams.DeviceUUID (protocol.LocalHostIdentity; zero fields
// where /proc does not tell).
func (c *Context) HostIdentity() protocol.HostIdentity {
	if c == nil {
		return protocol.HostIdentity{}
	}
	return c.trust.host
}

// Reach says whether CUDA IPC can carry device buffers to the endpoint's peer
// (protocol.IPCReach), from the identities the two sides exchanged when it was made.
// peerAccess reports whether this process's device can access the device with the
// peer's UUID (cuDeviceCanAccessPeer); nil means it cannot. An endpoint whose peer
// is not authenticated (a reply endpoint UCX made) gives ReachNone.
func (ep *Endpoint) Reach(peerAccess func(peerDevice [16]byte) bool) protocol.Reach {
	if ep == nil {
		return protocol.ReachNone
	}
	// peer and peerKnown are set before the endpoint is published, never after.
	if !ep.peerKnown {
		return protocol.ReachNone
	}
	return protocol.IPCReach(ep.w.ctx.trust.host, ep.peer.host, peerAccess)
}

package ucp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ucpx/ucpx/cgo/ucx"
)

// The listener is a Go TCP listener, not UCX's sockaddr listener: a connecting peer
// first proves it holds the context's auth key (the handshake in auth.go), and only
// then are worker addresses exchanged and endpoints created from them. A peer without
// the key never reaches UCX with a byte it chose.

// ListenerParams configures Listen.
type ListenerParams struct {
	// ConnHandler, if set, receives each authenticated connection request on a
	// goroutine of the listener (without worker locks held); it must Accept or Reject
	// it. Without a handler, requests queue for Listener.Accept.
	ConnHandler func(*ConnRequest)
	// AllowUnauthenticated lets a context without an auth key listen on an address
	// that is not loopback: then anyone who can reach the port can connect, and use
	// every rkey this process hands out. Without it such a Listen fails.
	AllowUnauthenticated bool
}

const (
	// handshakeTimeout bounds a server-side handshake once the client's hello arrived
	// (and a client's without a ctx deadline): a peer that stalls is dropped.
	handshakeTimeout = 10 * time.Second
	// helloTimeout bounds the wait for the client's hello, which has a fixed size and
	// which a client sends as soon as it read the server's: a connection that sends
	// nothing does not hold a handshake slot for long.
	helloTimeout = time.Second
	// maxHandshakes bounds the handshakes in progress per listener, and maxBacklog the
	// authenticated requests waiting for Accept; connections beyond are closed. When
	// every handshake slot is taken, a new connection evicts the oldest one still
	// waiting for its hello (idle connections cannot lock the key's holders out); one
	// past its hello is never evicted (honest clients on a slow path do not evict each
	// other), and the new connection is closed instead.
	maxHandshakes = 64
	maxBacklog    = 128
	// acceptRetryMin and acceptRetryMax bound the pause after a failed accept(2) (the
	// process at its descriptor limit: EMFILE, ENFILE; ENOBUFS, ...): doubling, as
	// net/http's Server does. The clients wait in the kernel's backlog meanwhile.
	acceptRetryMin = 5 * time.Millisecond
	acceptRetryMax = time.Second
	// acceptPollMin and acceptPollMax bound the sleeps of an Accept that cannot park
	// on the worker's event fd (a worker without wakeup): doubling while none comes.
	acceptPollMin = time.Millisecond
	acceptPollMax = 16 * time.Millisecond
)

// Listener accepts authenticated client-server connections on a TCP address.
type Listener struct {
	w       *Worker
	ln      net.Listener
	id      uint64
	port    int
	handler func(*ConnRequest)
	stop    chan struct{} // closed by Close: ends a pause of serve or Accept
	// Under cmu: conns are the connections in a handshake or waiting for a decision,
	// closed by Close; shaking those whose handshake's goroutine runs (at most
	// maxHandshakes).
	cmu     sync.Mutex
	conns   map[net.Conn]struct{}
	shaking map[*hsConn]struct{}
	stopped bool // under cmu: Close began, new connections are dropped
	// nref counts connections dropped before their peer proved the key.
	nref atomic.Int64
	wg   sync.WaitGroup
	// Under w.mu.
	backlog []*ConnRequest
	closed  bool
}

// ConnRequest is a pending, authenticated connection from a client.
type ConnRequest struct {
	l    *Listener
	conn net.Conn
	h    *handshake
	peer peerInfo
	done bool // under l.w.mu
}

// Listen creates a listener on addr ("host:port"; port 0 picks a free port). Without
// an auth key (ContextParams.AuthKey, UCPX_AUTH_KEY_FILE) only loopback addresses are
// allowed, unless p.AllowUnauthenticated.
func (w *Worker) Listen(addr string, p *ListenerParams) (*Listener, error) {
	if w == nil {
		return nil, opErr("listener_create", ErrInvalidParam, "nil worker")
	}
	ip, port, err := resolveTCP(addr)
	if err != nil {
		return nil, opErr("listener_create", err, "listen %s", addr)
	}
	if p == nil {
		p = &ListenerParams{}
	}
	if !w.ctx.trust.keyed && !net.IP(ip).IsLoopback() && !p.AllowUnauthenticated {
		return nil, opErr("listener_create", ErrInvalidParam,
			"listen %s: without an auth key anyone who reaches this address could connect and use this process's memory; "+
				"set ContextParams.AuthKey or %s (`ucpx keygen` writes a key file), listen on 127.0.0.1, "+
				"or set ListenerParams.AllowUnauthenticated to accept that", addr, AuthKeyFileEnv)
	}
	w.mu.Lock()
	if w.closed.Load() {
		w.mu.Unlock()
		return nil, opErr("listener_create", ErrClosed, "listen %s", addr)
	}
	w.mu.Unlock()
	ln, err := net.Listen("tcp", net.JoinHostPort(net.IP(ip).String(), strconv.Itoa(port)))
	if err != nil {
		return nil, opErr("listener_create", fmt.Errorf("%v: %w", err, ErrIO), "listen %s", addr)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed.Load() {
		_ = ln.Close()
		return nil, opErr("listener_create", ErrClosed, "listen %s", addr)
	}
	w.nextID++
	l := &Listener{
		w: w, ln: ln, id: w.nextID, port: ln.Addr().(*net.TCPAddr).Port, handler: p.ConnHandler,
		stop: make(chan struct{}), conns: map[net.Conn]struct{}{}, shaking: map[*hsConn]struct{}{},
	}
	w.listeners[l.id] = l
	live.listeners.Add(1)
	l.wg.Add(1)
	go l.serve()
	return l, nil
}

// Port is the TCP port the listener is bound to.
func (l *Listener) Port() int {
	if l == nil {
		return 0
	}
	return l.port
}

// Addr is "host:port" for clients on this machine to connect to.
func (l *Listener) Addr() string {
	if l == nil {
		return ""
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(l.port))
}

// Refused is how many connections were dropped before their peer proved it holds the
// auth key (or because too many handshakes were in progress).
func (l *Listener) Refused() int {
	if l == nil {
		return 0
	}
	return int(l.nref.Load())
}

// hsConn is a connection in its server-side handshake. Until the client's hello has
// arrived it may be evicted for a newer connection (maxHandshakes).
type hsConn struct {
	net.Conn
	l     *Listener
	since time.Time // accepted
	n     int       // bytes read, up to the hello's (the handshake's goroutine only)
	// Under l.cmu.
	hello   bool // the client's hello arrived
	evicted bool
}

// Read reads from the connection; the read that completes the client's hello makes
// the connection one that is never evicted, with the whole handshake's deadline.
func (c *hsConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.n < hsClientHello {
		c.n += n
		if c.n >= hsClientHello {
			c.l.cmu.Lock()
			c.hello = !c.evicted
			c.l.cmu.Unlock()
			_ = c.Conn.SetDeadline(time.Now().Add(handshakeTimeout))
		}
	}
	return n, err
}

func (l *Listener) serve() {
	defer l.wg.Done()
	var pause time.Duration
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || l.stopping() {
				return
			}
			// Anything else passes (EMFILE, ENFILE, ENOBUFS, ...): one failed accept
			// ended serving for good, and later clients waited for nothing.
			pause = min(max(2*pause, acceptRetryMin), acceptRetryMax)
			t := time.NewTimer(pause)
			select {
			case <-t.C:
			case <-l.stop:
				t.Stop()
				return
			}
			continue
		}
		pause = 0
		c := &hsConn{Conn: nc, l: l, since: time.Now()}
		l.cmu.Lock()
		if l.stopped {
			l.cmu.Unlock()
			_ = nc.Close()
			continue
		}
		if len(l.shaking) >= maxHandshakes && !l.evictLocked() {
			l.cmu.Unlock()
			l.nref.Add(1)
			_ = nc.Close()
			continue
		}
		l.shaking[c] = struct{}{}
		l.conns[c] = struct{}{}
		l.cmu.Unlock()
		l.wg.Add(1)
		go func() {
			r := l.handshake(c)
			l.wg.Done() // before the handler: it may close the listener
			if r != nil {
				// A handler that panics (recovered: RecoveredPanics) or calls
				// runtime.Goexit before deciding would leave the peer waiting: the
				// request is rejected (a no-op once decided).
				returned := false
				defer func() {
					if !returned {
						_ = r.Reject()
					}
				}()
				runRecovered(func() { l.handler(r); returned = true })
			}
		}()
	}
}

// stopping reports whether Close began.
func (l *Listener) stopping() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

// evictLocked closes the oldest connection still waiting for its client's hello and
// frees its handshake slot (its goroutine ends on the closed connection, counted in
// Refused). It reports whether there was one. Caller holds cmu.
func (l *Listener) evictLocked() bool {
	var oldest *hsConn
	for c := range l.shaking {
		if !c.hello && (oldest == nil || c.since.Before(oldest.since)) {
			oldest = c
		}
	}
	if oldest == nil {
		return false
	}
	oldest.evicted = true
	delete(l.shaking, oldest)
	delete(l.conns, oldest)
	_ = oldest.Conn.Close()
	return true
}

func (l *Listener) forget(c net.Conn) {
	l.cmu.Lock()
	delete(l.conns, c)
	l.cmu.Unlock()
}

// handshake authenticates one connection and queues its request, or returns it for
// the listener's handler.
func (l *Listener) handshake(c *hsConn) *ConnRequest {
	defer func() {
		l.cmu.Lock()
		delete(l.shaking, c)
		l.cmu.Unlock()
	}()
	self, err := l.w.selfInfo()
	if err != nil {
		l.forget(c)
		_ = c.Close()
		return nil
	}
	// Until the hello arrived (hsConn.Read extends it then).
	_ = c.SetDeadline(c.since.Add(helloTimeout))
	h := &handshake{t: l.w.ctx.trust, rw: c}
	peer, err := h.server(&self)
	if err != nil {
		if errors.Is(err, ErrAuth) {
			l.nref.Add(1)
		}
		l.forget(c)
		_ = c.Close()
		return nil
	}
	// The client waits for the decision as long as its own deadline allows.
	_ = c.SetDeadline(time.Time{})
	r := &ConnRequest{l: l, conn: c, h: h, peer: peer}
	w := l.w
	w.mu.Lock()
	if l.closed || w.closed.Load() || l.handler == nil && len(l.backlog) >= maxBacklog {
		w.mu.Unlock()
		_ = r.finish(false)
		return nil
	}
	if l.handler != nil {
		w.mu.Unlock()
		return r
	}
	l.backlog = append(l.backlog, r)
	w.mu.Unlock()
	_ = w.Signal() // wake an Accept parked on the event fd
	return nil
}

// Accept drives the worker's progress until an authenticated connection request
// arrives (when the listener has no ConnHandler), then accepts it. Meanwhile it parks
// on the worker's event fd as Request.Wait does: a request queued, an event of the
// worker, ctx's end and the listener's or worker's Close wake it.
func (l *Listener) Accept(ctx context.Context, p *EndpointParams) (*Endpoint, error) {
	if l == nil {
		return nil, opErr("listener_accept", ErrInvalidParam, "nil listener")
	}
	if ctx == nil {
		return nil, opErr("listener_accept", ErrInvalidParam, "nil context")
	}
	w := l.w
	bound := parkBound{parkBoundMin}
	poll := time.Duration(0)
	busy := 0 // busy arms in a row
	for {
		w.mu.Lock()
		if l.closed || w.closed.Load() {
			w.mu.Unlock()
			return nil, opErr("listener_accept", ErrClosed, "")
		}
		w.progressLocked(nil, 1)
		var r *ConnRequest
		if len(l.backlog) > 0 {
			r = l.backlog[0]
			l.backlog = l.backlog[1:]
		}
		if r != nil {
			w.unlockDeferred()
			return r.Accept(p)
		}
		if err := ctx.Err(); err != nil {
			w.unlockDeferred()
			return nil, opErr("listener_accept", err, "")
		}
		if w.efd >= 0 && busy < parkTries && w.park.canSleep() {
			if w.armLocked() != ucx.OK {
				busy++ // events are pending: progress them
				w.unlockDeferred()
				continue
			}
			busy = 0
			// The handshake queues a request under w.mu and then wakes the parked
			// goroutines (Worker.Signal): this sleep begins before either.
			parked := monotonic()
			w.sleepUnlock(ctx, w.takeDeferredLocked(), time.Now().Add(bound.d))
			bound.expired(parked)
			poll = 0
			continue
		}
		// No event fd to sleep on, or arms that keep finding events: short sleeps.
		busy = 0
		w.unlockDeferred()
		poll = min(max(2*poll, acceptPollMin), acceptPollMax)
		t := time.NewTimer(poll)
		select {
		case <-t.C:
		case <-ctx.Done():
		case <-l.stop:
		}
		t.Stop()
	}
}

// RemoteAddr is the client's "ip:port".
func (r *ConnRequest) RemoteAddr() (string, error) {
	if r == nil {
		return "", opErr("conn_request_query", ErrInvalidParam, "nil conn request")
	}
	r.l.w.mu.Lock()
	defer r.l.w.mu.Unlock()
	if r.done {
		return "", opErr("conn_request_query", ErrClosed, "")
	}
	return r.conn.RemoteAddr().String(), nil
}

// finish tells the client the decision and drops the connection.
func (r *ConnRequest) finish(accept bool) error {
	_ = r.conn.SetDeadline(time.Now().Add(handshakeTimeout))
	err := r.h.writeDecision(accept)
	r.l.forget(r.conn)
	_ = r.conn.Close()
	return err
}

// Accept creates the server-side endpoint for the request (from the client's
// authenticated worker address) and tells the client.
func (r *ConnRequest) Accept(p *EndpointParams) (*Endpoint, error) {
	if r == nil {
		return nil, opErr("ep_create", ErrInvalidParam, "nil conn request")
	}
	w := r.l.w
	w.mu.Lock()
	if r.done || w.closed.Load() {
		w.mu.Unlock()
		return nil, opErr("ep_create", ErrClosed, "conn request already handled")
	}
	r.done = true
	raw, st := w.raw.ConnectAddress(r.peer.addr, p == nil || !p.NoPeerErrorHandling)
	if err := statusErr(st); err != nil {
		w.mu.Unlock()
		_ = r.finish(false)
		return nil, opErr("ep_create", err, "accept")
	}
	ep := w.addEndpointLocked(raw, p, "accepted "+r.conn.RemoteAddr().String(), &r.peer)
	w.mu.Unlock()
	if err := r.finish(true); err != nil {
		_ = ep.closeWith(true, time.Second)
		return nil, opErr("ep_create", err, "accept: the client left")
	}
	ep.startWatch()
	return ep, nil
}

// Reject refuses the request; the client's Connect fails with ErrRejected.
func (r *ConnRequest) Reject() error {
	if r == nil {
		return opErr("listener_reject", ErrInvalidParam, "nil conn request")
	}
	w := r.l.w
	w.mu.Lock()
	if r.done || r.l.closed || w.closed.Load() {
		w.mu.Unlock()
		return opErr("listener_reject", ErrClosed, "")
	}
	r.done = true
	w.mu.Unlock()
	_ = r.finish(false)
	return nil
}

// destroyLocked stops listening and drops queued requests and handshakes in progress;
// the goroutines end on their own.
func (l *Listener) destroyLocked() {
	if l.closed {
		return
	}
	l.closed = true
	close(l.stop)
	_ = l.ln.Close()
	for _, r := range l.backlog {
		if !r.done {
			r.done = true
			l.forget(r.conn)
			_ = r.conn.Close()
		}
	}
	l.backlog = nil
	l.cmu.Lock()
	l.stopped = true
	for c := range l.conns {
		_ = c.Close()
	}
	l.cmu.Unlock()
	delete(l.w.listeners, l.id)
	live.listeners.Add(-1)
	l.w.wakeParkedLocked() // an Accept parked on the worker finds the listener closed
}

// Close stops listening; queued requests are dropped (their clients' Connect fails).
// A second Close returns ErrClosed.
func (l *Listener) Close() error {
	if l == nil {
		return opErr("listener_destroy", ErrInvalidParam, "nil listener")
	}
	l.w.mu.Lock()
	if l.closed || l.w.closed.Load() {
		l.w.mu.Unlock()
		return opErr("listener_destroy", ErrClosed, "")
	}
	l.destroyLocked()
	l.w.mu.Unlock()
	l.wg.Wait()
	return nil
}

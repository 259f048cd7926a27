package ucp

import (
	"context"
	"net"
	"strconv"
	"time"

	"github.com/ucpx/ucpx/cgo/ucx"
)

// ListenerParams configures Listen.
type ListenerParams struct {
	// ConnHandler, if set, receives each connection request on the goroutine that drove
	// progress (without worker locks held); it must Accept or Reject it. Without a
	// handler, requests queue for Listener.Accept.
	ConnHandler func(*ConnRequest)
}

// Listener is a ucp_listener_h accepting client-server connections on a socket address.
type Listener struct {
	w       *Worker
	raw     *ucx.Listener
	arg     *ucx.CallbackArg
	id      uint64
	port    int
	handler func(*ConnRequest)
	// Under w.mu.
	backlog []*ConnRequest
	closed  bool
}

// ConnRequest is a pending connection from a client (ucp_conn_request_h).
type ConnRequest struct {
	l    *Listener
	raw  *ucx.ConnRequest
	done bool // under l.w.mu
}

// Listen creates a listener on addr ("host:port"; port 0 picks a free port).
func (w *Worker) Listen(addr string, p *ListenerParams) (*Listener, error) {
	ip, port, err := resolveTCP(addr)
	if err != nil {
		return nil, opErr("listener_create", err, "listen %s", addr)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed.Load() {
		return nil, opErr("listener_create", ErrClosed, "listen %s", addr)
	}
	w.nextID++
	l := &Listener{w: w, id: w.nextID}
	if p != nil {
		l.handler = p.ConnHandler
	}
	l.arg = w.raw.NewCallbackArg(l.id)
	raw, st := w.raw.Listen(ip, port, l.arg)
	if err := statusErr(st); err != nil {
		l.arg.Free()
		return nil, opErr("listener_create", err, "listen %s", addr)
	}
	l.raw = raw
	if l.port, st = raw.Port(); st != ucx.OK {
		raw.Destroy()
		l.arg.Free()
		return nil, opErr("listener_query", statusErr(st), "listen %s", addr)
	}
	w.listeners[l.id] = l
	live.listeners.Add(1)
	return l, nil
}

// Port is the TCP port the listener is bound to.
func (l *Listener) Port() int { return l.port }

// Addr is "host:port" for clients on this machine to connect to.
func (l *Listener) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(l.port)) }

func (l *Listener) deliverLocked(raw *ucx.ConnRequest) {
	r := &ConnRequest{l: l, raw: raw}
	if l.handler != nil {
		h := l.handler
		l.w.deferred = append(l.w.deferred, func() { h(r) })
		return
	}
	l.backlog = append(l.backlog, r)
}

// Accept drives the worker's progress until a connection request arrives (when the
// listener has no ConnHandler), then accepts it.
func (l *Listener) Accept(ctx context.Context, p *EndpointParams) (*Endpoint, error) {
	w := l.w
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
		cbs := w.takeDeferredLocked()
		w.mu.Unlock()
		runDeferred(cbs)
		if r != nil {
			return r.Accept(p)
		}
		if err := w.WaitForEvents(ctx, time.Millisecond); err != nil {
			return nil, opErr("listener_accept", err, "")
		}
	}
}

// RemoteAddr is the client's "ip:port".
func (r *ConnRequest) RemoteAddr() (string, error) {
	r.l.w.mu.Lock()
	defer r.l.w.mu.Unlock()
	if r.done {
		return "", opErr("conn_request_query", ErrClosed, "")
	}
	ip, port, st := r.raw.RemoteAddr()
	if err := statusErr(st); err != nil {
		return "", opErr("conn_request_query", err, "")
	}
	return net.JoinHostPort(net.IP(ip).String(), strconv.Itoa(port)), nil
}

// Accept creates the server-side endpoint for the request.
func (r *ConnRequest) Accept(p *EndpointParams) (*Endpoint, error) {
	w := r.l.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if r.done || w.closed.Load() {
		return nil, opErr("ep_create", ErrClosed, "conn request already handled")
	}
	r.done = true
	raw, st := w.raw.Accept(r.raw, p == nil || !p.NoPeerErrorHandling)
	if err := statusErr(st); err != nil {
		return nil, opErr("ep_create", err, "accept")
	}
	return w.addEndpointLocked(raw, p, "accepted"), nil
}

// Reject refuses the request; the client's Connect fails.
func (r *ConnRequest) Reject() error {
	w := r.l.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if r.done || r.l.closed || w.closed.Load() {
		return opErr("listener_reject", ErrClosed, "")
	}
	r.done = true
	return opErr("listener_reject", statusErr(r.l.raw.Reject(r.raw)), "")
}

func (l *Listener) destroyLocked() {
	if l.closed {
		return
	}
	l.closed = true
	for _, r := range l.backlog {
		if !r.done {
			r.done = true
			l.raw.Reject(r.raw)
		}
	}
	l.backlog = nil
	l.raw.Destroy()
	l.arg.Free()
	delete(l.w.listeners, l.id)
	live.listeners.Add(-1)
}

// Close stops listening; queued requests are rejected. A second Close returns ErrClosed.
func (l *Listener) Close() error {
	l.w.mu.Lock()
	defer l.w.mu.Unlock()
	if l.closed || l.w.closed.Load() {
		return opErr("listener_destroy", ErrClosed, "")
	}
	l.destroyLocked()
	return nil
}

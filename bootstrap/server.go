package bootstrap

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// Server is the rendezvous: the key-value store, the barrier and the roster of a job.
// Rank 0 of a Job serves one (New); Serve runs one on its own, for a launcher or a
// scheduler that keeps the rendezvous apart from the ranks.
type Server struct {
	ln   net.Listener
	key  []byte
	size int

	mu      sync.Mutex
	kv      map[string][]byte
	bytes   int
	waiters map[string][]waiter
	ranks   map[uint32]*sconn // joined and not yet gone
	gone    map[uint32]bool   // rank -> failed (true) or left with Bye (false)
	barrier map[uint64][]waiter
	conns   map[*sconn]struct{}
	// unjoined counts connections that have not joined yet (authenticating, or
	// authenticated without their hello): maxUnjoined bounds them.
	unjoined int
	closed   bool
	done     chan struct{} // closed when every rank joined and went (or Close)
	wg       sync.WaitGroup
}

// Store limits of a server: beyond them Set fails (codeFull).
const (
	maxStoreBytes = 256 << 20
	maxStoreKeys  = 1 << 20
	// maxPending bounds the unanswered requests (Waits, barriers) of one connection.
	maxPending = 4096
	// maxUnjoined bounds the connections that have not joined: past it a new one is
	// closed at once (as ucp's listener bounds its handshakes).
	maxUnjoined = 64
)

// helloTimeout bounds the time from a connection's acceptance to its hello (the
// handshake included).
var helloTimeout = 2 * handshakeTimeout

type waiter struct {
	c  *sconn
	id uint32
}

type sconn struct {
	c       net.Conn
	wmu     sync.Mutex
	rank    uint32
	joined  bool
	bye     bool
	pending int // requests not answered yet (under Server.mu)
}

// Serve starts a rendezvous for a job of size ranks on addr ("host:port"; port 0
// picks one, see Addr). With a nil key it refuses a non-loopback addr unless insecure.
func Serve(addr string, size int, key []byte, insecure bool) (*Server, error) {
	if size < 1 || size > MaxRanks {
		return nil, fmt.Errorf("bootstrap: job size %d (want 1..%d): %w", size, MaxRanks, ErrInvalidParam)
	}
	if key == nil && !insecure && !loopbackOnly(addr) {
		return nil, fmt.Errorf("bootstrap: rendezvous on %s without a key: set %s (ucpx launch writes one) or Options.Insecure to serve unauthenticated: %w", addr, EnvAuthKeyFile, ErrAuth)
	}
	if key != nil && len(key) < MinKeyLen {
		return nil, fmt.Errorf("bootstrap: key of %d bytes, want at least %d: %w", len(key), MinKeyLen, ErrInvalidParam)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: serve rendezvous on %s: %w", addr, err)
	}
	s := &Server{
		ln: ln, key: rendezvousKey(key), size: size,
		kv: map[string][]byte{}, waiters: map[string][]waiter{},
		ranks: map[uint32]*sconn{}, gone: map[uint32]bool{},
		barrier: map[uint64][]waiter{}, conns: map[*sconn]struct{}{},
		done: make(chan struct{}),
	}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Done is closed once every rank of the job has joined and gone (left or failed).
func (s *Server) Done() <-chan struct{} { return s.done }

// Close stops the server and drops every connection.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("bootstrap: server: %w", ErrClosed)
	}
	s.closed = true
	for c := range s.conns {
		_ = c.c.Close()
	}
	s.finishLocked()
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

func (s *Server) finishLocked() {
	select {
	case <-s.done:
	default:
		close(s.done)
	}
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		setKeepAlive(c)
		sc := &sconn{c: c}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = c.Close()
			return
		}
		if s.unjoined >= maxUnjoined {
			s.mu.Unlock()
			_ = c.Close()
			continue
		}
		s.unjoined++
		s.conns[sc] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(sc)
	}
}

// setKeepAlive makes a silent peer (a host whose link went down) noticed within
// about 4 s on an idle connection.
func setKeepAlive(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: time.Second, Interval: time.Second, Count: 3})
	}
}

func (s *Server) serve(c *sconn) {
	defer s.wg.Done()
	defer s.drop(c)
	deadline := time.Now().Add(helloTimeout)
	if err := serverHandshake(c.c, s.key); err != nil {
		return
	}
	_ = c.c.SetReadDeadline(deadline) // until the hello
	for {
		f, err := readFrame(c.c)
		if err != nil {
			if errors.Is(err, ErrProtocol) {
				c.send(&frame{op: opErr, code: codeInvalid, message: err.Error()})
			}
			return
		}
		if !s.handle(c, &f) {
			return
		}
		if !deadline.IsZero() {
			deadline = time.Time{}
			_ = c.c.SetReadDeadline(deadline) // joined: the hello was the first request
		}
	}
}

// handle answers one request; false ends the connection.
func (s *Server) handle(c *sconn, f *frame) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !c.joined && f.op != opHello {
		c.sendLocked(f.id, codeInvalid, 0, "first request must be hello")
		return false
	}
	if c.pending >= maxPending {
		c.sendLocked(f.id, codeInvalid, 0, fmt.Sprintf("more than %d requests unanswered", maxPending))
		return false
	}
	switch f.op {
	case opHello:
		if c.joined {
			c.sendLocked(f.id, codeInvalid, 0, "second hello")
			return false
		}
		if int(f.size) != s.size {
			c.sendLocked(f.id, codeInvalid, f.rank, fmt.Sprintf("job size %d, this rendezvous serves %d", f.size, s.size))
			return false
		}
		if _, taken := s.ranks[f.rank]; taken {
			c.sendLocked(f.id, codeTaken, f.rank, fmt.Sprintf("rank %d has joined already", f.rank))
			return false
		}
		if _, was := s.gone[f.rank]; was {
			c.sendLocked(f.id, codeTaken, f.rank, fmt.Sprintf("rank %d has left this job (rejoin a new one)", f.rank))
			return false
		}
		c.joined, c.rank = true, f.rank
		s.ranks[f.rank] = c
		s.unjoined--
		c.replyLocked(f.id, nil)
		// A rank that joins late still learns who failed before it came.
		for r, failed := range s.gone {
			if failed {
				c.sendFrameLocked(&frame{op: opFailed, rank: r})
			}
		}
	case opSet:
		old, had := s.kv[f.key]
		nb := s.bytes - len(old) + len(f.value)
		if !had {
			nb += len(f.key)
		}
		if nb > maxStoreBytes || (!had && len(s.kv) >= maxStoreKeys) {
			c.sendLocked(f.id, codeFull, 0, fmt.Sprintf("store full (%d keys, %d bytes)", len(s.kv), s.bytes))
			return true
		}
		s.kv[f.key], s.bytes = f.value, nb
		c.replyLocked(f.id, nil)
		for _, w := range s.waiters[f.key] {
			w.c.pending--
			w.c.replyLocked(w.id, f.value)
		}
		delete(s.waiters, f.key)
	case opGet:
		if v, ok := s.kv[f.key]; ok {
			c.replyLocked(f.id, v)
		} else if f.wait {
			c.pending++
			s.waiters[f.key] = append(s.waiters[f.key], waiter{c, f.id})
		} else {
			c.sendLocked(f.id, codeNotFound, 0, fmt.Sprintf("key %q not set", f.key))
		}
	case opBarrier:
		for r, failed := range s.gone {
			if failed {
				c.sendLocked(f.id, codeRank, r, fmt.Sprintf("rank %d failed", r))
				return true
			}
		}
		ws := append(s.barrier[f.gen], waiter{c, f.id})
		c.pending++
		if len(ws) < s.size {
			s.barrier[f.gen] = ws
			return true
		}
		delete(s.barrier, f.gen)
		for _, w := range ws {
			w.c.pending--
			w.c.replyLocked(w.id, nil)
		}
	case opBye:
		c.bye = true
		c.replyLocked(f.id, nil)
	default:
		c.sendLocked(f.id, codeInvalid, 0, fmt.Sprintf("op %d is not a request", f.op))
		return false
	}
	return true
}

// drop forgets a connection; a rank that went without Bye has failed: every rank is
// told and every barrier fails naming it.
func (s *Server) drop(c *sconn) {
	_ = c.c.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
	if !c.joined {
		s.unjoined-- // counted since its accept
	}
	for k, ws := range s.waiters {
		s.waiters[k] = without(ws, c)
		if len(s.waiters[k]) == 0 {
			delete(s.waiters, k)
		}
	}
	for g, ws := range s.barrier {
		s.barrier[g] = without(ws, c)
	}
	if !c.joined || s.ranks[c.rank] != c {
		return
	}
	delete(s.ranks, c.rank)
	failed := !c.bye
	s.gone[c.rank] = failed
	if failed && !s.closed {
		for o := range s.conns {
			if o.joined {
				o.sendFrameLocked(&frame{op: opFailed, rank: c.rank})
			}
		}
		for g, ws := range s.barrier {
			for _, w := range ws {
				w.c.pending--
				w.c.sendLocked(w.id, codeRank, c.rank, fmt.Sprintf("rank %d failed", c.rank))
			}
			delete(s.barrier, g)
		}
	}
	if len(s.gone) == s.size {
		s.finishLocked()
	}
}

func without(ws []waiter, c *sconn) []waiter {
	out := ws[:0]
	for _, w := range ws {
		if w.c != c {
			out = append(out, w)
		}
	}
	return out
}

// Writes happen under Server.mu, so frames of one connection never interleave; a
// peer that stops reading is cut off by the write deadline instead of stalling the
// server.
func (c *sconn) sendFrameLocked(f *frame) {
	c.send(f)
}

func (c *sconn) send(f *frame) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.c.Write(f.encode(nil)); err != nil {
		_ = c.c.Close()
	}
}

func (c *sconn) replyLocked(id uint32, v []byte) {
	c.send(&frame{op: opOK, id: id, value: v})
}

func (c *sconn) sendLocked(id uint32, code uint8, rank uint32, msg string) {
	c.send(&frame{op: opErr, id: id, code: code, rank: rank, message: msg})
}

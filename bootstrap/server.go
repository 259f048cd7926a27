package bootstrap

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
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
	writing map[*sconn]struct{} // connections whose writer runs (Close closes them, dropped or not)
	// unjoined: the connections that have not joined yet (authenticating, or
	// authenticated without their hello), in accept order; maxUnjoined bounds them. One
	// leaves it as it joins, goes or is evicted (its slot is free at once).
	unjoined []*sconn
	closed   bool
	done     chan struct{} // closed when every rank joined and went (or Close)
	wg       sync.WaitGroup
	// The package's maxPending, queueSoft, queueHard and writeTimeout, as Serve found
	// them.
	maxPending, queueSoft, queueHard int
	writeTimeout                     time.Duration
}

// Store limits of a server: beyond them Set fails (codeFull).
const (
	maxStoreBytes = 256 << 20
	maxStoreKeys  = 1 << 20
	// maxUnjoined bounds the connections that have not joined: past it the oldest one,
	// if it has waited evictUnjoinedAfter, is closed to make room (connections held open
	// and silent cannot keep ranks out for their handshake's timeout), else the new one
	// is closed at once (as ucp's listener bounds its handshakes) and its client tries
	// again (dial).
	maxUnjoined = 64
	// writeBatch bounds the bytes of one write (each gets writeTimeout).
	writeBatch = 4 << 20
)

var (
	// writeTimeout bounds one write to a peer: a peer that reads nothing for that long
	// is cut off (a rank: as failed).
	writeTimeout = 10 * time.Second
	// maxPending bounds the unanswered requests (Waits, barriers) of one connection;
	// a Wait withdrawn by its client (opCancel) no longer counts.
	maxPending = 4096
	// queueSoft: while more than this is queued for a connection, its requests are not
	// read (a peer that sends without reading throttles only itself).
	queueSoft = 4 << 20
	// queueHard bounds the memory a connection's queue holds of its own (answers'
	// headers, small values, failure notices; large values are the store's, shared):
	// past it the connection is dropped (a rank: as failed).
	queueHard = 64 << 20
)

// helloTimeout bounds the time from a connection's acceptance to its hello (the
// handshake included).
var helloTimeout = 2 * handshakeTimeout

// evictUnjoinedAfter: a connection still in its handshake this long after its accept
// gives its slot to a new one when every slot is taken. A rank's handshake takes a
// round trip.
var evictUnjoinedAfter = time.Second

type waiter struct {
	c  *sconn
	id uint32
}

type sconn struct {
	c        net.Conn
	accepted time.Time
	authed   bool // past the handshake (under Server.mu): kept until its hello's deadline
	rank     uint32
	joined   bool
	bye      bool
	pending  int               // requests not answered yet (under Server.mu)
	waits    map[uint32]string // id -> key of its Waits (under Server.mu)

	// The write queue: frames go out on the connection's writer goroutine, so no
	// peer's reading stalls the server or another peer.
	qmu     sync.Mutex
	qcond   sync.Cond // on qmu: frames queued, room made, closing
	q       []queued
	qbytes  int     // queued and being written
	qown    int     // of which the queue's own memory (queueHard)
	qclosed bool    // takes no more frames: the writer writes what is queued and closes c
	srv     *Server // its limits
}

func newSconn(c net.Conn, srv *Server) *sconn {
	sc := &sconn{c: c, accepted: time.Now(), waits: map[uint32]string{}, srv: srv}
	sc.qcond.L = &sc.qmu
	return sc
}

// Serve starts a rendezvous for a job of size ranks on addr ("host:port"; port 0
// picks one, see Addr). With a nil key it refuses a non-loopback addr unless insecure.
func Serve(addr string, size int, key []byte, insecure bool) (*Server, error) {
	if size < 1 || size > MaxRanks {
		return nil, fmt.Errorf("bootstrap: job size %d (want 1..%d): %w", size, MaxRanks, ErrInvalidParam)
	}
	if err := checkHostPort(addr, true); err != nil {
		return nil, err
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
		barrier: map[uint64][]waiter{}, writing: map[*sconn]struct{}{},
		done:       make(chan struct{}),
		maxPending: maxPending, queueSoft: queueSoft, queueHard: queueHard, writeTimeout: writeTimeout,
	}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// checkHostPort checks that addr is "host:port" with a port of 1..65535 (0 too when
// listening: the system picks one).
func checkHostPort(addr string, listen bool) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("bootstrap: address %q is not host:port: %v: %w", addr, err, ErrInvalidParam)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		if n, err = net.LookupPort("tcp", port); err != nil || port == "" {
			return fmt.Errorf("bootstrap: address %q: port %q is not a number or a service: %w", addr, port, ErrInvalidParam)
		}
	}
	if n < 0 || n > 65535 || (n == 0 && !listen) {
		return fmt.Errorf("bootstrap: address %q: port %d out of range: %w", addr, n, ErrInvalidParam)
	}
	return nil
}

// Addr is the address the server listens on ("" for a nil or zero Server).
func (s *Server) Addr() string {
	if s == nil || s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Done is closed once every rank of the job has joined and gone (left or failed), or
// the server closed; a nil or zero Server's is closed.
func (s *Server) Done() <-chan struct{} {
	if s == nil || s.done == nil {
		return closedChan
	}
	return s.done
}

// Close stops the server and drops every connection.
func (s *Server) Close() error {
	if s == nil || s.ln == nil || s.done == nil {
		return fmt.Errorf("bootstrap: server close: not a served Server: %w", ErrInvalidParam)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("bootstrap: server: %w", ErrClosed)
	}
	s.closed = true
	for c := range s.writing { // dropped ones too: their writers may still write
		_ = c.c.Close()
		c.finish()
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
		sc := newSconn(c, s)
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = c.Close()
			return
		}
		if len(s.unjoined) >= maxUnjoined && !s.evictOldestLocked() {
			s.mu.Unlock()
			_ = c.Close()
			continue
		}
		s.unjoined = append(s.unjoined, sc)
		s.writing[sc] = struct{}{}
		s.wg.Add(2)
		s.mu.Unlock()
		go s.serve(sc)
		go s.write(sc)
	}
}

// evictOldestLocked closes the oldest connection still in its handshake if it has
// waited evictUnjoinedAfter, and reports whether it did. Its serve goroutine then drops
// it. One past its handshake is on its way to its hello (a slow path takes a round
// trip or two): evicting it would make a crowd of ranks on such a path evict each
// other for good; its hello's deadline bounds it instead.
func (s *Server) evictOldestLocked() bool {
	for _, c := range s.unjoined {
		if time.Since(c.accepted) < evictUnjoinedAfter {
			return false // the rest are younger
		}
		if !c.authed {
			s.leaveUnjoinedLocked(c)
			_ = c.c.Close()
			return true
		}
	}
	return false
}

// leaveUnjoinedLocked takes c out of unjoined, if it is there.
func (s *Server) leaveUnjoinedLocked(c *sconn) {
	if i := slices.Index(s.unjoined, c); i >= 0 {
		s.unjoined = slices.Delete(s.unjoined, i, i+1)
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
	s.mu.Lock()
	c.authed = true
	s.mu.Unlock()
	_ = c.c.SetReadDeadline(deadline) // until the hello
	for {
		if !c.waitRoom() {
			return
		}
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
	if f.op == opCancel {
		// Withdraw a Wait; one already answered (or never made) is no error.
		if key, ok := c.waits[f.id]; ok {
			delete(c.waits, f.id)
			s.unwaitLocked(key, func(w waiter) bool { return w.c == c && w.id == f.id })
			c.pending--
		}
		return true
	}
	if c.pending >= s.maxPending {
		c.sendLocked(f.id, codeInvalid, 0, fmt.Sprintf("more than %d requests unanswered", s.maxPending))
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
		s.leaveUnjoinedLocked(c)
		c.replyLocked(f.id, []byte{featCancel})
		// A rank that joins late still learns who failed before it came.
		for r, failed := range s.gone {
			if failed {
				c.send(&frame{op: opFailed, rank: r})
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
			delete(w.c.waits, w.id)
			w.c.replyLocked(w.id, f.value)
		}
		delete(s.waiters, f.key)
	case opGet:
		if v, ok := s.kv[f.key]; ok {
			c.replyLocked(f.id, v)
		} else if f.wait {
			if _, dup := c.waits[f.id]; dup {
				// Its first Wait would stay among the key's waiters for good.
				c.sendLocked(f.id, codeInvalid, 0, fmt.Sprintf("request id %d is waiting already", f.id))
				return false
			}
			c.pending++
			c.waits[f.id] = f.key
			s.waiters[f.key] = append(s.waiters[f.key], waiter{c, f.id})
		} else {
			c.sendLocked(f.id, codeNotFound, 0, fmt.Sprintf("key %q not set", f.key))
		}
	case opBarrier:
		if r, failed, ok := s.goneRankLocked(); ok {
			c.sendGoneLocked(f.id, r, failed)
			return true
		}
		for _, w := range s.barrier[f.gen] {
			if w.c == c {
				// Only distinct ranks count: a rank's second arrival would release
				// the barrier for one that never came.
				c.sendLocked(f.id, codeInvalid, 0, fmt.Sprintf("rank %d is in barrier %d already", c.rank, f.gen))
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

// goneRankLocked names the lowest rank that has gone, preferring one that failed:
// a barrier cannot complete without it.
func (s *Server) goneRankLocked() (rank uint32, failed, ok bool) {
	for r, f := range s.gone {
		if !ok || (f && !failed) || (f == failed && r < rank) {
			rank, failed, ok = r, f, true
		}
	}
	return rank, failed, ok
}

// sendGoneLocked fails a barrier request: rank failed, or left the job.
func (c *sconn) sendGoneLocked(id, rank uint32, failed bool) {
	if failed {
		c.sendLocked(id, codeRank, rank, fmt.Sprintf("rank %d failed", rank))
	} else {
		c.sendLocked(id, codeLeft, rank, fmt.Sprintf("rank %d left the job", rank))
	}
}

// drop forgets a connection; a rank that went without Bye has failed: every rank is
// told. Once a rank has gone (failed or left), every barrier fails naming it.
func (s *Server) drop(c *sconn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c.finish() // the writer writes what is queued, then closes the connection
	s.leaveUnjoinedLocked(c)
	for _, k := range c.waits {
		s.unwaitLocked(k, func(w waiter) bool { return w.c == c })
	}
	clear(c.waits)
	for g, ws := range s.barrier {
		if s.barrier[g] = without(ws, c); len(s.barrier[g]) == 0 {
			delete(s.barrier, g)
		}
	}
	if !c.joined || s.ranks[c.rank] != c {
		return
	}
	delete(s.ranks, c.rank)
	failed := !c.bye
	s.gone[c.rank] = failed
	if !s.closed {
		if failed {
			for _, o := range s.ranks { // the joined connections
				o.send(&frame{op: opFailed, rank: c.rank})
			}
		}
		for g, ws := range s.barrier {
			for _, w := range ws {
				w.c.pending--
				w.c.sendGoneLocked(w.id, c.rank, failed)
			}
			delete(s.barrier, g)
		}
	}
	if len(s.gone) == s.size {
		s.finishLocked()
	}
}

// unwaitLocked takes the waiters gone reports out of key's (none left: the key too).
// Caller holds s.mu.
func (s *Server) unwaitLocked(key string, gone func(waiter) bool) {
	if ws := slices.DeleteFunc(s.waiters[key], gone); len(ws) > 0 {
		s.waiters[key] = ws
	} else {
		delete(s.waiters, key)
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

// send queues a frame for the connection's writer; past queueHard the connection is
// cut off (its reader then ends and drops it: a rank as failed).
func (c *sconn) send(f *frame) {
	c.queue(f.encode(nil), nil)
}

// queue adds a frame of own bytes and then shared ones (a stored value, never written
// in place: a Set stores a new slice). queueHard bounds the own bytes only: answers
// to the connection's own Waits share the store's value, so a burst of them (one Set
// answering many Waits of a reading peer) holds no memory of its own and cuts nobody
// off; the writer's deadline still cuts off a peer that stops reading.
func (c *sconn) queue(own, shared []byte) {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	if c.qclosed {
		return
	}
	if c.qown > 0 && c.qown+len(own) > c.srv.queueHard {
		c.qclosed, c.q = true, nil
		c.qcond.Broadcast()
		_ = c.c.Close()
		return
	}
	c.q = append(c.q, queued{own, len(own)})
	if len(shared) > 0 {
		c.q = append(c.q, queued{shared, 0})
	}
	c.qbytes += len(own) + len(shared)
	c.qown += len(own)
	c.qcond.Broadcast()
}

// queued is one piece of a connection's write queue; own is how many of its bytes are
// the queue's own memory (0 for a shared value).
type queued struct {
	b   []byte
	own int
}

// sharedValueFrom: an answer with a value this large queues the value by reference.
const sharedValueFrom = 4 << 10

// finish makes the writer write what is queued, then close the connection.
func (c *sconn) finish() {
	c.qmu.Lock()
	c.qclosed = true
	c.qcond.Broadcast()
	c.qmu.Unlock()
}

// waitRoom waits until the connection's queue is below queueSoft; false once the
// connection is closing.
func (c *sconn) waitRoom() bool {
	c.qmu.Lock()
	defer c.qmu.Unlock()
	for c.qbytes > c.srv.queueSoft && !c.qclosed {
		c.qcond.Wait()
	}
	return !c.qclosed
}

// write is a connection's writer: a peer that does not read for writeTimeout is cut
// off.
func (s *Server) write(c *sconn) {
	defer s.wg.Done()
	defer func() {
		_ = c.c.Close()
		s.mu.Lock()
		delete(s.writing, c)
		s.mu.Unlock()
	}()
	for {
		c.qmu.Lock()
		for len(c.q) == 0 && !c.qclosed {
			c.qcond.Wait()
		}
		// A batch of at most writeBatch bytes (or one piece) per writeTimeout.
		n, own, k := 0, 0, 0
		for k < len(c.q) && (k == 0 || n+len(c.q[k].b) <= writeBatch) {
			n += len(c.q[k].b)
			own += c.q[k].own
			k++
		}
		bufs := make(net.Buffers, k)
		for i := range k {
			bufs[i] = c.q[i].b
		}
		if c.q = c.q[k:]; len(c.q) == 0 {
			c.q = nil
		}
		c.qmu.Unlock()
		if len(bufs) == 0 {
			return // closing, all written
		}
		_ = c.c.SetWriteDeadline(time.Now().Add(s.writeTimeout))
		_, err := bufs.WriteTo(c.c)
		c.qmu.Lock()
		c.qbytes -= n
		c.qown -= own
		if err != nil {
			c.qclosed, c.q, c.qbytes, c.qown = true, nil, 0, 0
		}
		c.qcond.Broadcast()
		c.qmu.Unlock()
		if err != nil {
			return
		}
	}
}

func (c *sconn) replyLocked(id uint32, v []byte) {
	if len(v) < sharedValueFrom {
		c.send(&frame{op: opOK, id: id, value: v})
		return
	}
	c.queue(okHeader(id, len(v)), v) // the value by reference
}

func (c *sconn) sendLocked(id uint32, code uint8, rank uint32, msg string) {
	c.send(&frame{op: opErr, id: id, code: code, rank: rank, message: msg})
}

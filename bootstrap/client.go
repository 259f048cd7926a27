package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// Store is a job's key-value store on the rendezvous (the TCPStore habit): Set
// publishes, Get reads what is there, Wait blocks until a key is set. Keys are 1 to
// MaxKey bytes, values up to MaxValue; keys starting with "ucpx/" belong to the
// bootstrap. Safe for concurrent use. A wait that its context ends is withdrawn from
// the rendezvous, so a rank may poll with short deadlines for as long as it likes.
// Once its Job is closed, calls fail with ErrClosed; if the rendezvous goes away, with
// ErrRendezvousLost. A Store not made by a Job (the zero value) answers ErrInvalidParam.
type Store struct {
	c    net.Conn
	wmu  sync.Mutex
	mu   sync.Mutex
	next uint32
	reqs map[uint32]chan frame
	err  error // set once the connection is lost or closed
	dead chan struct{}
	// cancels: the rendezvous drops a withdrawn Wait (opCancel; its hello said so).
	cancels bool
	// onFailed runs (on the reader goroutine, so it must not block: the Job only
	// records the failure and queues OnFailure) for each rank the server says failed.
	onFailed func(rank int)
	size     int // the job's; a failure of a rank outside it is dropped
}

// newStore serves the protocol on c, a connection past its handshake.
func newStore(c net.Conn, size int, onFailed func(int)) *Store {
	s := &Store{c: c, reqs: map[uint32]chan frame{}, dead: make(chan struct{}), onFailed: onFailed, size: size}
	go s.read()
	return s
}

// errDropped marks a connection the rendezvous closed before this rank joined: before
// its greeting (too many connections not joined yet, maxUnjoined), during the
// handshake or before the hello's answer (evicted after evictUnjoinedAfter), so dial
// tries again.
var errDropped = errors.New("bootstrap: the rendezvous closed the connection before this rank joined")

// dial connects to the rendezvous, authenticates and joins as rank of size.
func dial(ctx context.Context, addr string, key []byte, rank, size int, onFailed func(int)) (*Store, error) {
	// Rank 0 may not serve yet, or may be busy with many joining ranks: retry until
	// ctx ends, as torchrun's agents do, soon at first (ranks start together) and at
	// most every 200 ms (with jitter, so that a crowd of ranks spreads out).
	for wait := 2 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		s, retry, err := join(ctx, addr, key, rank, size, onFailed)
		if err == nil {
			return s, nil
		}
		if ctx.Err() == nil && !retry {
			return nil, err // refused: authentication, not a rendezvous, the rank taken
		}
		jitter := time.Duration(rand.Int64N(int64(wait)/2 + 1))
		t := time.NewTimer(wait/2 + jitter)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w (last: %v)", ctxErr(ctx, "rendezvous "+addr), err)
		case <-t.C:
		}
	}
}

// join is one attempt of dial: connect, authenticate, say hello. retry: the attempt
// failed for a reason that may pass (no server yet, a connection the rendezvous closed
// before the rank joined: errDropped).
func join(ctx context.Context, addr string, key []byte, rank, size int, onFailed func(int)) (s *Store, retry bool, err error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, true, err
	}
	setKeepAlive(c)
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	err = clientHandshake(c, rendezvousKey(key))
	if stopped := stop(); !stopped || err != nil {
		_ = c.Close()
		if err == nil {
			err = ctx.Err()
		}
		return nil, errors.Is(err, errDropped), err
	}
	s = newStore(c, size, onFailed)
	v, err := s.call(ctx, &frame{op: opHello, rank: uint32(rank), size: uint32(size)})
	if err != nil {
		_ = s.close()
		// No answer (ErrRendezvousLost): the rendezvous dropped the connection before
		// the hello; a rank it had joined would have its answer.
		return nil, errors.Is(err, ErrRendezvousLost), err
	}
	s.mu.Lock()
	s.cancels = len(v) > 0 && v[0]&featCancel != 0
	s.mu.Unlock()
	return s, false, nil
}

func (s *Store) read() {
	var err error
	for {
		var f frame
		f, err = readFrame(s.c)
		if err != nil {
			break
		}
		if f.id == 0 {
			if f.op == opFailed && s.onFailed != nil && int64(f.rank) < int64(s.size) {
				s.onFailed(int(f.rank))
			}
			continue
		}
		s.mu.Lock()
		ch := s.reqs[f.id]
		delete(s.reqs, f.id)
		s.mu.Unlock()
		if ch != nil {
			ch <- f
		}
	}
	s.mu.Lock()
	if s.err == nil {
		s.err = fmt.Errorf("bootstrap: connection to the rendezvous lost: %v: %w", err, ErrRendezvousLost)
	}
	s.mu.Unlock()
	close(s.dead)
}

// call sends a request and waits for its answer; a Wait that ctx ends is withdrawn.
func (s *Store) call(ctx context.Context, f *frame) ([]byte, error) {
	ch, err := s.start(f)
	if err != nil {
		return nil, err
	}
	r, err := s.await(ctx, ch)
	if err != nil && r == nil {
		s.abandon(f)
	}
	return answer(r, err)
}

// errNoStore is what a Store that was not made by a Job answers.
func errNoStore(op string) error {
	return fmt.Errorf("bootstrap: store %s: not a Job's store: %w", op, ErrInvalidParam)
}

// start sends a request; its answer will come on the channel.
func (s *Store) start(f *frame) (chan frame, error) {
	if s.c == nil || s.dead == nil {
		return nil, errNoStore("request")
	}
	ch := make(chan frame, 1)
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		return nil, err
	}
	// Ids wrap after 2^32 requests: skip 0 (unsolicited frames) and any still
	// awaiting its answer (a Wait pending across the wrap).
	for {
		s.next++
		if _, live := s.reqs[s.next]; s.next != 0 && !live {
			break
		}
	}
	f.id = s.next
	s.reqs[f.id] = ch
	s.mu.Unlock()
	if err := s.write(f.encode(nil)); err != nil {
		s.forget(f.id)
		return nil, err
	}
	return ch, nil
}

func (s *Store) write(b []byte) error {
	s.wmu.Lock()
	_ = s.c.SetWriteDeadline(time.Now().Add(writeTimeout))
	_, err := s.c.Write(b)
	s.wmu.Unlock()
	if err != nil {
		_ = s.c.Close()
		return fmt.Errorf("bootstrap: rendezvous: %v: %w", err, ErrRendezvousLost)
	}
	return nil
}

func (s *Store) forget(id uint32) {
	s.mu.Lock()
	delete(s.reqs, id)
	s.mu.Unlock()
}

// abandon forgets a request nobody waits for any more; a Wait is withdrawn from the
// rendezvous, so abandoned Waits do not pile up there.
func (s *Store) abandon(f *frame) {
	s.mu.Lock()
	_, live := s.reqs[f.id]
	delete(s.reqs, f.id)
	cancels := s.cancels && s.err == nil
	s.mu.Unlock()
	if live && cancels && f.op == opGet && f.wait {
		_ = s.write((&frame{op: opCancel, id: f.id}).encode(nil))
	}
}

// await waits for the answer of a request: the frame, or (nil frame) the error of
// the connection's end or of ctx.
func (s *Store) await(ctx context.Context, ch chan frame) (*frame, error) {
	select {
	case r := <-ch:
		return &r, nil
	case <-s.dead:
		// The reader delivers a reply before it reports the connection's end: a
		// server that answers and then hangs up (a refused hello) is heard.
		select {
		case r := <-ch:
			return &r, nil
		default:
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		return nil, s.err
	case <-ctx.Done():
		select {
		case r := <-ch: // answered as ctx ended: the answer counts
			return &r, nil
		default:
		}
		return nil, ctxErr(ctx, "rendezvous")
	}
}

// answer turns a reply into the caller's result.
func answer(r *frame, err error) ([]byte, error) {
	if r == nil {
		return nil, err
	}
	if r.op == opOK {
		return r.value, nil
	}
	return nil, replyErr(r)
}

func replyErr(f *frame) error {
	switch f.code {
	case codeNotFound:
		return fmt.Errorf("bootstrap: %s: %w", f.message, ErrNotFound)
	case codeRank:
		return &RankError{Rank: int(f.rank), Err: fmt.Errorf("bootstrap: %s: %w", f.message, ErrRankFailed)}
	case codeLeft:
		return &RankError{Rank: int(f.rank), Err: fmt.Errorf("bootstrap: %s: %w", f.message, ErrClosed)}
	case codeTaken:
		return fmt.Errorf("bootstrap: %s: %w", f.message, ErrRankTaken)
	case codeFull:
		return fmt.Errorf("bootstrap: %s: %w", f.message, ErrStoreFull)
	}
	if f.op != opErr {
		return fmt.Errorf("bootstrap: unexpected reply op %d: %w", f.op, ErrProtocol)
	}
	return fmt.Errorf("bootstrap: rendezvous refused: %s: %w", f.message, ErrInvalidParam)
}

// Set stores value under key (replacing an earlier value) and wakes its waiters.
func (s *Store) Set(ctx context.Context, key string, value []byte) error {
	if s == nil {
		return fmt.Errorf("bootstrap: store set: nil store: %w", ErrInvalidParam)
	}
	if ctx == nil {
		return fmt.Errorf("bootstrap: store set: nil context: %w", ErrInvalidParam)
	}
	if err := checkKey(key); err != nil {
		return err
	}
	if len(value) > MaxValue {
		return fmt.Errorf("bootstrap: value of %d bytes (limit %d): %w", len(value), MaxValue, ErrInvalidParam)
	}
	_, err := s.call(ctx, &frame{op: opSet, key: key, value: value})
	return err
}

// Get returns the value of key, or an error matching ErrNotFound.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	if s == nil {
		return nil, fmt.Errorf("bootstrap: store get: nil store: %w", ErrInvalidParam)
	}
	if ctx == nil {
		return nil, fmt.Errorf("bootstrap: store get: nil context: %w", ErrInvalidParam)
	}
	if err := checkKey(key); err != nil {
		return nil, err
	}
	return s.call(ctx, &frame{op: opGet, key: key})
}

// Wait returns the value of key once some rank has set it; ctx bounds the wait.
func (s *Store) Wait(ctx context.Context, key string) ([]byte, error) {
	if s == nil {
		return nil, fmt.Errorf("bootstrap: store wait: nil store: %w", ErrInvalidParam)
	}
	if ctx == nil {
		return nil, fmt.Errorf("bootstrap: store wait: nil context: %w", ErrInvalidParam)
	}
	if err := checkKey(key); err != nil {
		return nil, err
	}
	return s.call(ctx, &frame{op: opGet, key: key, wait: true})
}

func (s *Store) bye(ctx context.Context) error {
	_, err := s.call(ctx, &frame{op: opBye})
	return err
}

// close ends the store on purpose: its calls (pending and later) fail with ErrClosed.
func (s *Store) close() error {
	if s == nil || s.c == nil || s.dead == nil {
		return nil
	}
	s.mu.Lock()
	if s.err == nil {
		s.err = fmt.Errorf("bootstrap: store: %w", ErrClosed)
	}
	s.mu.Unlock()
	err := s.c.Close()
	<-s.dead
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

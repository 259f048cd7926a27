package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// Store is a job's key-value store on the rendezvous (the TCPStore habit): Set
// publishes, Get reads what is there, Wait blocks until a key is set. Keys are 1 to
// MaxKey bytes, values up to MaxValue; keys starting with "ucpx/" belong to the
// bootstrap. Safe for concurrent use.
type Store struct {
	c    net.Conn
	wmu  sync.Mutex
	mu   sync.Mutex
	next uint32
	reqs map[uint32]chan frame
	err  error // set once the connection is lost
	dead chan struct{}
	// onFailed runs (on the reader goroutine) for each rank the server says failed.
	onFailed func(rank int)
	size     int // the job's; a failure of a rank outside it is dropped
}

// dial connects to the rendezvous, authenticates and joins as rank of size.
func dial(ctx context.Context, addr string, key []byte, rank, size int, onFailed func(int)) (*Store, error) {
	var d net.Dialer
	var c net.Conn
	var err error
	// Rank 0 may not serve yet: retry until ctx ends, as torchrun's agents do, soon
	// at first (ranks start together) and at most every 200 ms.
	for wait := 2 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		c, err = d.DialContext(ctx, "tcp", addr)
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("bootstrap: rendezvous %s: %v: %w", addr, err, ErrTimedOut)
		case <-time.After(wait):
		}
	}
	setKeepAlive(c)
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	err = clientHandshake(c, rendezvousKey(key))
	if !stop() || err != nil {
		_ = c.Close()
		if err == nil {
			err = fmt.Errorf("bootstrap: rendezvous %s: %w", addr, ErrTimedOut)
		}
		return nil, err
	}
	s := &Store{c: c, reqs: map[uint32]chan frame{}, dead: make(chan struct{}), onFailed: onFailed, size: size}
	go s.read()
	if _, err := s.call(ctx, &frame{op: opHello, rank: uint32(rank), size: uint32(size)}); err != nil {
		_ = s.close()
		return nil, err
	}
	return s, nil
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

// call sends a request and waits for its answer.
func (s *Store) call(ctx context.Context, f *frame) ([]byte, error) {
	ch := make(chan frame, 1)
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		return nil, err
	}
	s.next++
	if s.next == 0 {
		s.next = 1
	}
	f.id = s.next
	s.reqs[f.id] = ch
	s.mu.Unlock()
	forget := func() {
		s.mu.Lock()
		delete(s.reqs, f.id)
		s.mu.Unlock()
	}
	s.wmu.Lock()
	_ = s.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := s.c.Write(f.encode(nil))
	s.wmu.Unlock()
	if err != nil {
		forget()
		_ = s.c.Close()
		return nil, fmt.Errorf("bootstrap: rendezvous: %v: %w", err, ErrRendezvousLost)
	}
	answer := func(r frame) ([]byte, error) {
		if r.op == opOK {
			return r.value, nil
		}
		return nil, replyErr(&r)
	}
	select {
	case r := <-ch:
		return answer(r)
	case <-s.dead:
		// The reader delivers a reply before it reports the connection's end: a
		// server that answers and then hangs up (a refused hello) is heard.
		select {
		case r := <-ch:
			return answer(r)
		default:
		}
		forget()
		s.mu.Lock()
		defer s.mu.Unlock()
		return nil, s.err
	case <-ctx.Done():
		forget()
		return nil, fmt.Errorf("bootstrap: %v: %w", ctx.Err(), ErrTimedOut)
	}
}

func replyErr(f *frame) error {
	switch f.code {
	case codeNotFound:
		return fmt.Errorf("bootstrap: %s: %w", f.message, ErrNotFound)
	case codeRank:
		return &RankError{Rank: int(f.rank), Err: fmt.Errorf("bootstrap: %s: %w", f.message, ErrRankFailed)}
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

func (s *Store) close() error {
	err := s.c.Close()
	<-s.dead
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

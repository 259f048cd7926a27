package bootstrap

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// slowProxy forwards connections to addr, delaying each chunk by d: a slow or loaded
// path to rank 0.
func slowProxy(t *testing.T, addr string, d time.Duration) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", addr)
			if err != nil {
				_ = c.Close()
				continue
			}
			pipe := func(dst, src net.Conn) {
				b := make([]byte, 1<<16)
				for {
					n, err := src.Read(b)
					if n > 0 {
						time.Sleep(d)
						if _, werr := dst.Write(b[:n]); werr != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				_ = dst.Close()
				_ = src.Close()
			}
			go pipe(s, c)
			go pipe(c, s)
		}
	}()
	return ln.Addr().String()
}

// Ranks that the rendezvous evicts while they join (too many connections not joined
// for longer than evictUnjoinedAfter) try again, as doc.go promises: they gave up
// after their greeting ("connection to the rendezvous lost: EOF" at the hello,
// "handshake: EOF: protocol error"), 132 of 200 here.
func TestEvictedRanksJoinAgain(t *testing.T) {
	defer func(d time.Duration) { evictUnjoinedAfter = d }(evictUnjoinedAfter)
	evictUnjoinedAfter = 150 * time.Millisecond
	const size = 200
	srv, err := Serve("127.0.0.1:0", size, nil, false)
	require.NoError(t, err)
	defer srv.Close()
	addr := slowProxy(t, srv.Addr(), 60*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errs := make([]error, size)
	stores := make([]*Store, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Add(1)
		go func() { defer wg.Done(); stores[r], errs[r] = dial(ctx, addr, nil, r, size, nil) }()
	}
	wg.Wait()
	failed := 0
	for r, err := range errs {
		if err != nil {
			failed++
			assert.NoError(t, err, "rank %d", r)
		} else {
			_ = stores[r].close()
		}
	}
	require.Zero(t, failed, "of %d ranks", size)
}

// Request ids wrap after 2^32 requests: a Wait pending across the wrap lost its answer
// to the request that took its id again, and timed out with the key set.
func TestRequestIDsSkipPendingOnes(t *testing.T) {
	_, s, ctx := serveDial(t, 1, nil)
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	s.mu.Lock()
	s.next = 0 // the Wait takes id 1
	s.mu.Unlock()
	go func() { _, err := s.Wait(waitCtx, "k"); done <- err }()
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		_, pending := s.reqs[1]
		return pending
	}, 10*time.Second, time.Millisecond)
	s.mu.Lock()
	s.next = ^uint32(0) // as after 2^32 requests: the next id would be 1 again
	s.mu.Unlock()
	_, err := s.Get(ctx, "other")
	require.ErrorIs(t, err, ErrNotFound)
	require.NoError(t, s.Set(ctx, "k", []byte("v")))
	require.NoError(t, <-done, "the Wait pending across the wrap gets its answer")
}

// A rank repeating the id of one of its pending Waits is cut off: the server kept the
// first Wait among the key's waiters for good (its record was overwritten).
func TestDuplicateWaitIDIsRefused(t *testing.T) {
	srv, _, _ := serveDial(t, 2, nil)
	c := rawRank(t, srv, 1, 2)
	defer c.Close()
	var reqs []byte
	for range 2 {
		reqs = (&frame{op: opGet, id: 7, key: "never", wait: true}).encode(reqs)
	}
	_, err := c.Write(reqs)
	require.NoError(t, err)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	f, err := readFrame(c)
	require.NoError(t, err)
	require.Equal(t, opErr, f.op)
	require.Equal(t, uint8(codeInvalid), f.code)
	require.Contains(t, f.message, "waiting already")
	eventuallyLocked(t, srv, func() bool { return len(srv.waiters["never"]) == 0 })
}

package bootstrap

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/testenv"
	"github.com/ucpx/ucpx/ucp"
)

// rawRank joins srv as rank of size over a bare connection (no key) and reads the
// serveDial serves a job of size ranks on loopback (no key) and joins it as rank 0
// (onFailed as dial's); the server, the store and ctx (10 s) end with the test.
func serveDial(t *testing.T, size int, onFailed func(int)) (*Server, *Store, context.Context) {
	t.Helper()
	srv, err := Serve("127.0.0.1:0", size, nil, false)
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	s, err := dial(ctx, srv.Addr(), nil, 0, size, onFailed)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.close() })
	return srv, s, ctx
}

// sendGets writes n Gets of key on c (ids from 2), waiting ones with wait.
func sendGets(t *testing.T, c net.Conn, key string, n int, wait bool) {
	t.Helper()
	var reqs []byte
	for i := range n {
		reqs = (&frame{op: opGet, id: uint32(i + 2), key: key, wait: wait}).encode(reqs)
	}
	_, err := c.Write(reqs)
	require.NoError(t, err)
}

// eventuallyLocked is require.Eventually (5 s) of cond under the server's lock.
func eventuallyLocked(t *testing.T, srv *Server, cond func() bool) {
	t.Helper()
	require.Eventually(t, func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return cond()
	}, 5*time.Second, time.Millisecond)
}

// hello's reply; afterwards the test writes frames and reads nothing.
func rawRank(t *testing.T, srv *Server, rank, size int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", srv.Addr())
	require.NoError(t, err)
	require.NoError(t, clientHandshake(c, nil))
	_, err = c.Write((&frame{op: opHello, id: 1, rank: uint32(rank), size: uint32(size)}).encode(nil))
	require.NoError(t, err)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	f, err := readFrame(c)
	require.NoError(t, err)
	require.Equal(t, opOK, f.op)
	_ = c.SetReadDeadline(time.Time{})
	return c
}

// Rank 0 of a job that never forms gives up when its context ends, not after
// DefaultTimeout (its failure path waited for ranks that never came).
func TestNewRank0GivesUpWithItsContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		j, err := New(ctx, Config{Rank: 0, Size: 2, Rendezvous: freeAddr(t)}, nil)
		assert.Nil(t, j)
		done <- err
	}()
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrTimedOut)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorIs(t, err, ucp.ErrTimedOut)
		require.Less(t, time.Since(start), 5*time.Second)
	case <-time.After(10 * time.Second):
		t.Fatal("New of rank 0 did not return 10 s after its context ended")
	}
}

// Waits abandoned by their context are withdrawn from the rendezvous: a rank that
// polls with short deadlines many more times than maxPending stays in the job; a
// client that does not withdraw them is still cut off at maxPending.
func TestAbandonedWaitsDoNotPileUp(t *testing.T) {
	defer func(n int) { maxPending = n }(maxPending)
	maxPending = 8
	var failed []int
	var mu sync.Mutex
	srv, s0, ctx := serveDial(t, 2, func(r int) { mu.Lock(); failed = append(failed, r); mu.Unlock() })
	for i := 0; i < 5*maxPending; i++ {
		short, c := context.WithTimeout(ctx, time.Millisecond)
		_, err := s0.Wait(short, "never")
		c()
		require.ErrorIs(t, err, ErrTimedOut, "wait %d", i)
	}
	require.NoError(t, s0.Set(ctx, "k", []byte("v")))
	v, err := s0.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, []byte("v"), v)
	srv.mu.Lock()
	pending, waiters := srv.ranks[0].pending, len(srv.waiters)
	srv.mu.Unlock()
	require.Zero(t, pending)
	require.Zero(t, waiters)

	// A client that never withdraws its waits (an older one) still meets the limit.
	s1, err := dial(ctx, srv.Addr(), nil, 1, 2, nil)
	require.NoError(t, err)
	defer s1.close()
	s1.mu.Lock()
	s1.cancels = false
	s1.mu.Unlock()
	for i := 0; i <= maxPending; i++ {
		short, c := context.WithTimeout(ctx, time.Millisecond)
		_, err = s1.Wait(short, "never")
		c()
	}
	_, err = s1.Get(ctx, "k")
	require.ErrorIs(t, err, ErrRendezvousLost)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(failed) == 1 }, 5*time.Second, 5*time.Millisecond)
}

// A barrier abandoned by its context still arrived: the rank's next Barrier resumes
// it, so retrying with short deadlines neither piles up on the rendezvous nor puts
// the rank out of step with the others.
func TestAbandonedBarriersResume(t *testing.T) {
	defer func(n int) { maxPending = n }(maxPending)
	maxPending = 4
	jobs := startJob(t, 2, nil)
	defer closeAll(t, jobs)
	for i := 0; i < 5*maxPending; i++ {
		short, c := context.WithTimeout(context.Background(), time.Millisecond)
		err := jobs[1].Barrier(short)
		c()
		require.ErrorIs(t, err, ErrTimedOut, "barrier %d", i)
		require.ErrorIs(t, err, context.DeadlineExceeded)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for round := 0; round < 2; round++ {
		var wg sync.WaitGroup
		for _, j := range jobs {
			wg.Add(1)
			go func() { defer wg.Done(); assert.NoError(t, j.Barrier(ctx), "round %d", round) }()
		}
		wg.Wait()
	}
	require.Empty(t, jobs[0].Failed())
}

// OnFailure runs off the store's reader: it may use the Store and Barrier.
func TestOnFailureMayUseTheStore(t *testing.T) {
	var mu sync.Mutex
	var job0 *Job
	type result struct {
		set, barrier error
		order        []int
	}
	got := make(chan result, 1)
	jobs := startJob(t, 3, func(rank int) *Options {
		if rank != 0 {
			return nil
		}
		return &Options{OnFailure: func(r int, _ error) {
			mu.Lock()
			j := job0
			mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			res := result{order: []int{r}}
			res.set = j.Store().Set(ctx, "seen", []byte{byte(r)})
			if res.set == nil {
				_, res.set = j.Store().Get(ctx, "seen")
			}
			res.barrier = j.Barrier(ctx)
			got <- res
		}}
	})
	mu.Lock()
	job0 = jobs[0]
	mu.Unlock()
	require.NoError(t, jobs[2].store.c.Close()) // rank 2 vanishes
	select {
	case res := <-got:
		require.NoError(t, res.set)
		var re *RankError
		require.ErrorAs(t, res.barrier, &re)
		require.Equal(t, 2, re.Rank)
		require.ErrorIs(t, res.barrier, ErrRankFailed)
		require.ErrorIs(t, res.barrier, ucp.ErrPeerFailed)
	case <-time.After(10 * time.Second):
		t.Fatal("OnFailure did not finish")
	}
	closeAll(t, jobs[:2])
	_ = jobs[2].Close()
}

// OnFailure gets the failures in the order they were recorded, one call at a time.
func TestOnFailureInOrder(t *testing.T) {
	var mu sync.Mutex
	var order []int
	busy := false
	j := &Job{failed: map[int]error{}, opts: Options{OnFailure: func(r int, _ error) {
		mu.Lock()
		if busy {
			t.Error("OnFailure calls overlap")
		}
		busy = true
		mu.Unlock()
		time.Sleep(time.Millisecond)
		mu.Lock()
		busy = false
		order = append(order, r)
		mu.Unlock()
	}}}
	for r := 0; r < 20; r++ {
		j.markFailed(r, ErrRankFailed)
		j.markFailed(r, ErrRankFailed) // once per rank
	}
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(order) == 20 }, 5*time.Second, time.Millisecond)
	for i, r := range order {
		require.Equal(t, i, r)
	}
}

// No OnFailure call starts once Close began: failures queued behind a call under way
// are dropped, and later ones are not queued.
func TestOnFailureStopsAtClose(t *testing.T) {
	release := make(chan struct{})
	calls := make(chan int, 10)
	j := &Job{failed: map[int]error{}, eps: map[int]*ucp.Endpoint{}, opts: Options{OnFailure: func(r int, _ error) {
		calls <- r
		<-release
	}}}
	j.markFailed(1, ErrRankFailed)
	require.Equal(t, 1, <-calls) // under way
	j.markFailed(2, ErrRankFailed)
	require.NoError(t, j.Close())
	j.markFailed(3, ErrRankFailed)
	close(release)
	time.Sleep(20 * time.Millisecond)
	require.Empty(t, calls, "a call started after Close")
	require.Len(t, j.Failed(), 3, "Failed still lists them")
}

// More ranks than maxUnjoined connect at once: those turned away try again, and all
// join.
func TestManyRanksJoinAtOnce(t *testing.T) {
	const size = 300
	srv, err := Serve("127.0.0.1:0", size, nil, false)
	require.NoError(t, err)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Every slot for unjoined connections is taken as the ranks start: each of them
	// is turned away at first.
	var held []net.Conn
	for range maxUnjoined {
		c, err := net.Dial("tcp", srv.Addr())
		require.NoError(t, err)
		held = append(held, c)
	}
	eventuallyLocked(t, srv, func() bool { return len(srv.unjoined) == maxUnjoined })
	time.AfterFunc(200*time.Millisecond, func() {
		for _, c := range held {
			_ = c.Close()
		}
	})
	stores := make([]*Store, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Add(1)
		go func() { defer wg.Done(); stores[r], errs[r] = dial(ctx, srv.Addr(), nil, r, size, nil) }()
	}
	wg.Wait()
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	for _, s := range stores {
		_ = s.bye(ctx)
		require.NoError(t, s.close())
	}
	select {
	case <-srv.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not see every rank leave")
	}
}

// Once a rank has left (Job.Close), pending and later barriers fail at once naming
// it; the error matches ErrClosed and ErrRankFailed.
func TestBarrierAfterARankLeft(t *testing.T) {
	jobs := startJob(t, 3, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pending := make(chan error, 1)
	go func() { pending <- jobs[1].Barrier(ctx) }()
	require.Eventually(t, func() bool {
		jobs[0].server.mu.Lock()
		defer jobs[0].server.mu.Unlock()
		return len(jobs[0].server.barrier) == 1
	}, 5*time.Second, time.Millisecond)
	start := time.Now()
	require.NoError(t, jobs[2].Close())
	check := func(err error) {
		t.Helper()
		var re *RankError
		require.ErrorAs(t, err, &re)
		require.Equal(t, 2, re.Rank)
		require.ErrorIs(t, err, ErrClosed)
		require.ErrorIs(t, err, ErrRankFailed)
	}
	check(<-pending)
	check(jobs[0].Barrier(ctx))
	check(jobs[1].Barrier(ctx))
	require.Less(t, time.Since(start), 5*time.Second)
	require.Empty(t, jobs[0].Failed(), "a rank that left has not failed")
	closeAll(t, jobs[:2])
}

// Errors match the package's sentinels, the shared ones and the context's.
func TestErrorVocabulary(t *testing.T) {
	require.ErrorIs(t, ErrRankFailed, ucp.ErrPeerFailed)
	require.ErrorIs(t, &RankError{Rank: 1, Err: errors.New("x")}, ucp.ErrPeerFailed)
	require.ErrorIs(t, ErrAuth, ucp.ErrAuth)
	require.ErrorIs(t, ErrTimedOut, ucp.ErrTimedOut)
	require.ErrorIs(t, ErrCanceled, ucp.ErrCanceled)

	_, s, bg := serveDial(t, 1, nil)
	short, c := context.WithTimeout(bg, 10*time.Millisecond)
	_, err := s.Wait(short, "never")
	c()
	require.ErrorIs(t, err, ErrTimedOut)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, ucp.ErrTimedOut)
	canceled, c := context.WithCancel(bg)
	time.AfterFunc(10*time.Millisecond, c)
	_, err = s.Wait(canceled, "never")
	require.ErrorIs(t, err, ErrCanceled)
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, err, ucp.ErrCanceled)
	require.NotErrorIs(t, err, ErrTimedOut)
	require.NotContains(t, err.Error(), "timed out")
	// Dialing a rendezvous that never comes.
	short, c = context.WithTimeout(bg, 100*time.Millisecond)
	_, err = dial(short, freeAddr(t), nil, 0, 1, nil)
	c()
	require.ErrorIs(t, err, ErrTimedOut)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	for _, addr := range []string{"garbage", "127.0.0.1", "127.0.0.1:99999", "127.0.0.1:-1", "127.0.0.1:", "127.0.0.1:nosuchservice"} {
		_, err := Serve(addr, 1, nil, false)
		require.ErrorIs(t, err, ErrInvalidParam, "Serve(%q)", addr)
		require.NotErrorIs(t, err, ErrAuth, "Serve(%q)", addr)
	}
	for _, addr := range []string{"127.0.0.1:99999", "127.0.0.1:", "127.0.0.1:0", "garbage"} {
		_, err := New(bg, Config{Rank: 1, Size: 2, Rendezvous: addr}, nil)
		require.ErrorIs(t, err, ErrInvalidParam, "rendezvous %q", addr)
	}
	require.NoError(t, Config{Rank: 0, Size: 1, Rendezvous: "localhost:29500"}.check())
}

// A store closed on purpose says ErrClosed, to calls pending and later, not that the
// rendezvous was lost.
func TestStoreSaysClosedAfterClose(t *testing.T) {
	srv, err := Serve("127.0.0.1:0", 1, nil, false)
	require.NoError(t, err)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := dial(ctx, srv.Addr(), nil, 0, 1, nil)
	require.NoError(t, err)
	waiting := make(chan error, 1)
	go func() { _, err := s.Wait(ctx, "never"); waiting <- err }()
	eventuallyLocked(t, srv, func() bool { return len(srv.waiters) == 1 })
	require.NoError(t, s.close())
	err = <-waiting
	require.ErrorIs(t, err, ErrClosed)
	require.NotErrorIs(t, err, ErrRendezvousLost)

	jobs := startJob(t, 2, nil)
	closeAll(t, jobs)
	_, err = jobs[1].Store().Get(ctx, "k")
	require.ErrorIs(t, err, ErrClosed)
	require.NotErrorIs(t, err, ErrRendezvousLost)
}

// Zero values and nil receivers answer ErrInvalidParam or zero values: no panic.
func TestZeroValues(t *testing.T) {
	testenv.NilMethods(t, (*Server)(nil))
	testenv.ZeroArgs(t, nil, &Job{}, &Job{Size: 2}, &Store{}, &Server{})
	testenv.ExtremeArgs(t, nil, &Job{Size: 2}, &Store{}, &Server{})
	ctx := context.Background()
	require.ErrorIs(t, (&Job{}).Barrier(ctx), ErrInvalidParam)
	_, err := (&Job{Size: 2}).Endpoint(1)
	require.ErrorIs(t, err, ErrInvalidParam)
	_, err = (&Store{}).Get(ctx, "k")
	require.ErrorIs(t, err, ErrInvalidParam)
	require.ErrorIs(t, (&Store{}).Set(ctx, "k", nil), ErrInvalidParam)
	_, err = (&Store{}).Wait(ctx, "k")
	require.ErrorIs(t, err, ErrInvalidParam)
	require.ErrorIs(t, (&Server{}).Close(), ErrInvalidParam)
	var nilSrv *Server
	require.Equal(t, "", nilSrv.Addr())
	require.ErrorIs(t, nilSrv.Close(), ErrInvalidParam)
	<-nilSrv.Done()
	require.Equal(t, "", (&Server{}).Addr())
}

// A rank that stops reading does not stall the rendezvous for the others: its
// answers wait in its own queue, and its further requests are not read.
func TestSlowReaderDoesNotStallTheRendezvous(t *testing.T) {
	srv, s0, ctx := serveDial(t, 2, nil)
	require.NoError(t, s0.Set(ctx, "big", make([]byte, MaxValue)))
	raw := rawRank(t, srv, 1, 2)
	defer raw.Close()
	sendGets(t, raw, "big", 64, false) // 64 MiB of answers that nobody reads
	time.Sleep(300 * time.Millisecond) // the server answers into full buffers
	quick, c := context.WithTimeout(ctx, 3*time.Second)
	defer c()
	start := time.Now()
	for i := 0; i < 20; i++ {
		require.NoError(t, s0.Set(quick, "k", []byte{byte(i)}))
		v, err := s0.Get(quick, "k")
		require.NoError(t, err)
		require.Equal(t, []byte{byte(i)}, v)
	}
	require.Less(t, time.Since(start), 2*time.Second)
}

// One Set answering many Waits of a rank shares the value among their answers instead
// of copying it into the rank's queue once per Wait: a reading rank is never cut off
// by such a burst (it was, once the copies passed queueHard, on any link slower than
// loopback). A rank that stops reading is cut off as failed by the write deadline.
func TestBurstOfAnswersIsSharedAndSilentRankCutOff(t *testing.T) {
	defer func(n int, d time.Duration) { queueHard, writeTimeout = n, d }(queueHard, writeTimeout)
	queueHard, writeTimeout = 2<<20, 300*time.Millisecond
	failed := make(chan int, 2)
	srv, s0, ctx := serveDial(t, 2, func(r int) { failed <- r })
	raw := rawRank(t, srv, 1, 2) // never reads again
	defer raw.Close()
	const waits = 32
	sendGets(t, raw, "big", waits, true)
	eventuallyLocked(t, srv, func() bool { return len(srv.waiters["big"]) == waits })
	require.NoError(t, s0.Set(ctx, "big", make([]byte, MaxValue))) // 32 MiB of answers
	srv.mu.Lock()
	for c := range srv.writing {
		c.qmu.Lock()
		require.Less(t, c.qown, queueHard, "the answers copied the value")
		c.qmu.Unlock()
	}
	srv.mu.Unlock()
	select {
	case r := <-failed:
		require.Equal(t, 1, r, "the silent rank, once its writes stalled")
	case <-time.After(5 * time.Second):
		t.Fatal("the rank that stopped reading was not cut off")
	}
	require.NoError(t, s0.Set(ctx, "still", []byte("serving")))
}

// Close does not wait on the writer of a connection already dropped (its peer
// half-closed and reads nothing): it closes that connection too (it waited one write
// deadline per batch queued).
func TestCloseDoesNotWaitForDroppedWriters(t *testing.T) {
	srv, s0, ctx := serveDial(t, 2, func(int) {})
	raw := rawRank(t, srv, 1, 2)
	defer raw.Close()
	sendGets(t, raw, "big", 40, true)
	eventuallyLocked(t, srv, func() bool { return len(srv.waiters["big"]) == 40 })
	require.NoError(t, s0.Set(ctx, "big", make([]byte, MaxValue)))
	require.NoError(t, raw.(*net.TCPConn).CloseWrite())
	time.Sleep(50 * time.Millisecond) // the server reads the end and drops the rank
	start := time.Now()
	require.NoError(t, srv.Close())
	require.Less(t, time.Since(start), 3*time.Second)
}

// A value queued by reference goes out as the frame encode would write whole.
func TestOKHeaderMatchesEncode(t *testing.T) {
	for _, n := range []int{0, 1, sharedValueFrom, MaxValue} {
		v := make([]byte, n)
		for i := range v {
			v[i] = byte(i)
		}
		require.Equal(t, (&frame{op: opOK, id: 77, value: v}).encode(nil), append(okHeader(77, n), v...), "%d bytes", n)
	}
}

// A rank that arrives twice at one barrier counts once: the barrier waits for the rank
// that has not come.
func TestDuplicateBarrierArrivalCountsOnce(t *testing.T) {
	srv, s, ctx := serveDial(t, 3, nil)
	c := rawRank(t, srv, 1, 3)
	defer c.Close()
	done := make(chan error, 1)
	go func() { _, err := s.call(ctx, &frame{op: opBarrier, gen: 1}); done <- err }()
	var b []byte
	b = (&frame{op: opBarrier, id: 2, gen: 1}).encode(b)
	b = (&frame{op: opBarrier, id: 3, gen: 1}).encode(b)
	_, err := c.Write(b)
	require.NoError(t, err)
	select {
	case err := <-done:
		t.Fatalf("a barrier of 3 ranks completed (err %v) with ranks 0 and 1 arrived (rank 1 twice)", err)
	case <-time.After(300 * time.Millisecond):
	}
	c2 := rawRank(t, srv, 2, 3)
	defer c2.Close()
	_, err = c2.Write((&frame{op: opBarrier, id: 2, gen: 1}).encode(nil))
	require.NoError(t, err)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the barrier did not complete once rank 2 came")
	}
}

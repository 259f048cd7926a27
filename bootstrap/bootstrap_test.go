package bootstrap

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/testenv"

	"github.com/ucpx/ucpx/ucp"
)

// freeAddr returns a loopback address nobody listens on now.
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// startJob runs New for every rank on its own goroutine and returns the jobs by rank.
func startJob(t *testing.T, size int, opts func(rank int) *Options) []*Job {
	t.Helper()
	addr := freeAddr(t)
	jobs := make([]*Job, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for r := 0; r < size; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var o *Options
			if opts != nil {
				o = opts(r)
			}
			jobs[r], errs[r] = New(ctx, Config{Rank: r, Size: size, Rendezvous: addr}, o)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	return jobs
}

func closeAll(t *testing.T, jobs []*Job) {
	t.Helper()
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Add(1)
		go func() { defer wg.Done(); assert.NoError(t, j.Close()) }()
	}
	wg.Wait()
}

// Four ranks pass a checksummed token around a ring over lazily created endpoints;
// each rank opens exactly the one endpoint it sends on.
func TestRingOverLazyEndpoints(t *testing.T) {
	const size = 4
	key := NewKey()
	jobs := startJob(t, size, func(int) *Options { return &Options{Key: key} })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	sums := make([]uint64, size)
	for r, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			right, err := j.Endpoint((r + 1) % size)
			require.NoError(t, err)
			buf := make([]byte, 8)
			var sum uint64
			for round := 0; round < 10; round++ {
				recv, err := j.Worker().TagRecvNbx(buf, uint64(round), ^uint64(0), nil)
				require.NoError(t, err)
				out := binary.LittleEndian.AppendUint64(nil, uint64(round*100+r))
				send, err := right.TagSendNbx(out, uint64(round), nil)
				require.NoError(t, err)
				require.NoError(t, send.Wait(ctx))
				require.NoError(t, recv.Wait(ctx))
				got := binary.LittleEndian.Uint64(buf)
				require.Equal(t, uint64(round*100+(r+size-1)%size), got, "rank %d round %d", r, round)
				sum += got
			}
			sums[r] = sum
			require.NoError(t, j.Barrier(ctx))
		}()
	}
	wg.Wait()
	for r, j := range jobs {
		assert.Equal(t, uint64(4500+10*((r+size-1)%size)), sums[r])
		j.mu.Lock()
		assert.Len(t, j.eps, 1, "rank %d opened endpoints to %v", r, j.eps)
		j.mu.Unlock()
	}
	closeAll(t, jobs)
}

func TestStoreSetGetWait(t *testing.T) {
	jobs := startJob(t, 2, nil)
	defer closeAll(t, jobs)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := jobs[0].Store().Get(ctx, "k")
	require.ErrorIs(t, err, ErrNotFound)
	got := make(chan []byte)
	go func() {
		v, err := jobs[1].Store().Wait(ctx, "k")
		assert.NoError(t, err)
		got <- v
	}()
	require.NoError(t, jobs[0].Store().Set(ctx, "k", []byte("value")))
	require.Equal(t, []byte("value"), <-got)
	v, err := jobs[1].Store().Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, []byte("value"), v)

	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = jobs[1].Store().Wait(short, "never")
	cancelShort()
	require.ErrorIs(t, err, ErrTimedOut)

	require.ErrorIs(t, jobs[0].Store().Set(ctx, "", nil), ErrInvalidParam)
	require.ErrorIs(t, jobs[0].Store().Set(ctx, string(make([]byte, MaxKey+1)), nil), ErrInvalidParam)
	require.ErrorIs(t, jobs[0].Store().Set(ctx, "big", make([]byte, MaxValue+1)), ErrInvalidParam)
	require.NoError(t, jobs[0].Store().Set(ctx, "max", make([]byte, MaxValue)))
	v, err = jobs[1].Store().Get(ctx, "max")
	require.NoError(t, err)
	require.Len(t, v, MaxValue)
	_, err = jobs[0].Endpoint(2)
	require.ErrorIs(t, err, ErrInvalidParam)
	_, err = jobs[0].Endpoint(-1)
	require.ErrorIs(t, err, ErrInvalidParam)
}

func TestConfigChecks(t *testing.T) {
	ctx := context.Background()
	for _, c := range []Config{
		{Rank: 0, Size: 0, Rendezvous: "127.0.0.1:1"},
		{Rank: 2, Size: 2, Rendezvous: "127.0.0.1:1"},
		{Rank: -1, Size: 2, Rendezvous: "127.0.0.1:1"},
		{Rank: 0, Size: MaxRanks + 1, Rendezvous: "127.0.0.1:1"},
		{Rank: 0, Size: 1, Rendezvous: "no-port"},
	} {
		_, err := New(ctx, c, nil)
		require.ErrorIs(t, err, ErrInvalidParam, "%+v", c)
	}
	t.Setenv(EnvRank, "x")
	t.Setenv(EnvSize, "2")
	_, err := FromEnv(ctx, nil)
	require.ErrorIs(t, err, ErrInvalidParam)
	t.Setenv(EnvAuthKeyFile, "/nonexistent/key")
	t.Setenv(EnvRank, "0")
	t.Setenv(EnvRendezvous, "127.0.0.1:1")
	_, err = FromEnv(ctx, nil)
	require.ErrorIs(t, err, ErrInvalidParam)
	// Without a key, rank 0 refuses to serve on a non-loopback address.
	_, err = Serve("0.0.0.0:0", 2, nil, false)
	require.ErrorIs(t, err, ErrAuth)
	_, err = Serve("127.0.0.1:0", 2, []byte("short"), false)
	require.ErrorIs(t, err, ErrInvalidParam)
}

// A process without the key, or with another one, cannot join; nor can a keyed
// process join a rendezvous that cannot prove it holds the key.
func TestAuthentication(t *testing.T) {
	key := NewKey()
	srv, err := Serve("127.0.0.1:0", 2, key, false)
	require.NoError(t, err)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = dial(ctx, srv.Addr(), nil, 1, 2, nil)
	require.ErrorIs(t, err, ErrAuth)
	_, err = dial(ctx, srv.Addr(), NewKey(), 1, 2, nil)
	require.ErrorIs(t, err, ErrAuth)
	open, err := Serve("127.0.0.1:0", 2, nil, false)
	require.NoError(t, err)
	defer open.Close()
	_, err = dial(ctx, open.Addr(), key, 1, 2, nil)
	require.ErrorIs(t, err, ErrAuth)
	s, err := dial(ctx, srv.Addr(), key, 1, 2, nil)
	require.NoError(t, err)
	require.NoError(t, s.Set(ctx, "a", []byte("b")))
	// The same rank twice, or a rank of another job size, is refused.
	_, err = dial(ctx, srv.Addr(), key, 1, 2, nil)
	require.ErrorIs(t, err, ErrRankTaken)
	_, err = dial(ctx, srv.Addr(), key, 0, 3, nil)
	require.ErrorIs(t, err, ErrInvalidParam)
	require.NoError(t, s.close())
}

// Garbage on the rendezvous port (before and after the handshake) closes that
// connection only; the server keeps serving the job.
func TestGarbageDoesNotDisturbTheJob(t *testing.T) {
	srv, err := Serve("127.0.0.1:0", 1, nil, false)
	require.NoError(t, err)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raw := func(b []byte, handshake bool) {
		c, err := net.Dial("tcp", srv.Addr())
		require.NoError(t, err)
		defer c.Close()
		if handshake {
			require.NoError(t, clientHandshake(c, nil))
		}
		_, _ = c.Write(b)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 4096)
		for {
			if _, err := c.Read(buf); err != nil {
				var ne net.Error
				require.False(t, errors.As(err, &ne) && ne.Timeout(), "server kept a garbage connection open")
				return
			}
		}
	}
	raw([]byte("GET / HTTP/1.0\r\n\r\n"+string(make([]byte, 100))), false)
	raw([]byte{0xff, 0xff, 0xff, 0xff, 1}, true)                                    // length over MaxFrame
	raw([]byte{0, 0, 0, 9, byte(opSet), 0, 0, 0, 1, 0xff, 0xff, 0, 0}, true)        // key length past the frame
	raw((&frame{op: opSet, id: 1, key: "k", value: []byte("v")}).encode(nil), true) // before hello
	raw((&frame{op: opHello, id: 1, rank: 0, size: 1}).encode((&frame{op: opOK, id: 2}).encode(nil)), true)
	s, err := dial(ctx, srv.Addr(), nil, 0, 1, nil)
	require.NoError(t, err)
	require.NoError(t, s.Set(ctx, "still", []byte("serving")))
	require.NoError(t, s.close())
}

// A rank that goes without leaving fails the others' barrier with a RankError naming
// it, and every rank hears of it.
func TestRankFailureReachesBarrierAndOnFailure(t *testing.T) {
	var mu sync.Mutex
	heard := map[int][]int{}
	jobs := startJob(t, 3, func(rank int) *Options {
		return &Options{OnFailure: func(r int, err error) {
			mu.Lock()
			heard[rank] = append(heard[rank], r)
			mu.Unlock()
			assert.ErrorIs(t, err, ErrRankFailed)
		}}
	})
	// Rank 2 vanishes: its connection closes with no goodbye.
	require.NoError(t, jobs[2].store.c.Close())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := jobs[1].Barrier(ctx)
	var re *RankError
	require.ErrorAs(t, err, &re)
	require.Equal(t, 2, re.Rank)
	require.ErrorIs(t, err, ErrRankFailed)
	require.Eventually(t, func() bool { return fmt.Sprint(jobs[0].Failed()) == "[2]" }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, []int{2}, jobs[1].Failed())
	// OnFailure runs on the job's own goroutine, soon after Failed lists the rank.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprint(heard) == fmt.Sprint(map[int][]int{0: {2}, 1: {2}})
	}, 10*time.Second, 5*time.Millisecond)
	closeAll(t, jobs[:2])
	_ = jobs[2].Close()
}

// callersWorkerJob is a job of one rank on a worker the test made (closed with the
// test).
func callersWorkerJob(t *testing.T) (*ucp.Worker, *Job) {
	uctx, err := ucp.NewContext(ucp.ContextParams{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = uctx.Close() })
	w, err := uctx.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	jobs := startJob(t, 1, func(int) *Options { return &Options{Worker: w} })
	return w, jobs[0]
}

// A job can use a worker the caller made; Close leaves it open.
func TestCallersWorker(t *testing.T) {
	w, job := callersWorkerJob(t)
	jobs := []*Job{job}
	require.Same(t, w, jobs[0].Worker())
	ep, err := jobs[0].Endpoint(0)
	require.NoError(t, err)
	r, ok := jobs[0].RankOf(ep)
	require.True(t, ok)
	require.Equal(t, 0, r)
	require.NoError(t, jobs[0].Close())
	require.ErrorIs(t, jobs[0].Close(), ErrClosed)
	_, err = w.Address()
	require.NoError(t, err, "the caller's worker stays open")
}

// An endpoint whose dial ends after Close began is closed, not handed out: Close
// closed the endpoints it saw, and on the caller's worker nothing else would close it.
func TestEndpointDialedDuringClose(t *testing.T) {
	_, j := callersWorkerJob(t)
	dialed, release := make(chan struct{}), make(chan struct{})
	defer func(f func()) { afterConnect = f }(afterConnect)
	afterConnect = func() { close(dialed); <-release }
	type result struct {
		ep  *ucp.Endpoint
		err error
	}
	got := make(chan result, 1)
	go func() { ep, err := j.Endpoint(0); got <- result{ep, err} }()
	<-dialed
	closed := make(chan error, 1)
	go func() { closed <- j.Close() }()
	require.Eventually(t, func() bool { j.mu.Lock(); defer j.mu.Unlock(); return j.closed }, 5*time.Second, time.Millisecond)
	close(release)
	r := <-got
	require.ErrorIs(t, r.err, ErrClosed)
	require.Nil(t, r.ep)
	require.NoError(t, <-closed)
}

// The handles a failed Join returns are nil; their methods answer ErrInvalidParam (or a
// zero value) instead of crashing.
func TestNilJobAndStore(t *testing.T) {
	testenv.NilMethods(t, (*Job)(nil), (*Store)(nil))
	var j *Job
	ctx := context.Background()
	require.Nil(t, j.Worker())
	require.Nil(t, j.Store())
	require.ErrorIs(t, j.Barrier(ctx), ErrInvalidParam)
	ep, err := j.Endpoint(0)
	require.Nil(t, ep)
	require.ErrorIs(t, err, ErrInvalidParam)
	rank, ok := j.RankOf(nil)
	require.False(t, ok)
	require.Zero(t, rank)
	require.Empty(t, j.Failed())
	require.ErrorIs(t, j.FailedErr(0), ErrInvalidParam)
	require.ErrorIs(t, j.Close(), ErrInvalidParam)
	var s *Store
	require.ErrorIs(t, s.Set(ctx, "k", nil), ErrInvalidParam)
	v, err := s.Get(ctx, "k")
	require.Nil(t, v)
	require.ErrorIs(t, err, ErrInvalidParam)
	v, err = s.Wait(ctx, "k")
	require.Nil(t, v)
	require.ErrorIs(t, err, ErrInvalidParam)
}

// The rendezvous's word that a rank failed counts only for ranks of the job: a frame
// naming another rank (a broken or hostile server) reaches neither the job's failed
// set nor OnFailure.
func TestFailedRankOutsideTheJobIsDropped(t *testing.T) {
	client, server := net.Pipe()
	defer server.Close()
	got := make(chan int, 4)
	s := newStore(client, 4, func(r int) { got <- r })
	defer s.close()
	for _, r := range []uint32{1000, 4, 1 << 31, 3} {
		f := frame{op: opFailed, rank: r}
		_, err := server.Write(f.encode(nil))
		require.NoError(t, err)
	}
	select {
	case r := <-got:
		require.Equal(t, 3, r)
	case <-time.After(10 * time.Second):
		t.Fatal("the failure of rank 3 was not reported")
	}
	require.Empty(t, got)
}

// Connections that have not joined are bounded: past maxUnjoined a new one is closed
// at once, the slots come back as those connections go, and an authenticated
// connection that sends no hello is closed after helloTimeout.
func TestUnjoinedConnectionsAreBounded(t *testing.T) {
	defer func(d time.Duration) { helloTimeout = d }(helloTimeout)
	helloTimeout = 300 * time.Millisecond
	key := NewKey()
	s, err := Serve("127.0.0.1:0", 2, key, false)
	require.NoError(t, err)
	defer s.Close()
	// greeted reports whether the server sent its handshake greeting on c (a refused
	// connection is closed with nothing sent).
	greeted := func(c net.Conn) bool {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		var b [1]byte
		n, _ := c.Read(b[:])
		return n == 1
	}
	var held []net.Conn
	for range maxUnjoined {
		c, err := net.Dial("tcp", s.Addr())
		require.NoError(t, err)
		held = append(held, c)
		require.True(t, greeted(c))
	}
	extra, err := net.Dial("tcp", s.Addr())
	require.NoError(t, err)
	require.False(t, greeted(extra), "connection %d was served", maxUnjoined+1)
	_ = extra.Close()
	for _, c := range held {
		_ = c.Close()
	}
	// The slots come back: an authenticated client that never says hello is served,
	// then dropped after helloTimeout.
	var c net.Conn
	require.Eventually(t, func() bool {
		if c, err = net.Dial("tcp", s.Addr()); err != nil {
			return false
		}
		if clientHandshake(c, rendezvousKey(key)) != nil {
			_ = c.Close()
			return false
		}
		return true
	}, 10*time.Second, 20*time.Millisecond)
	defer c.Close()
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Read(make([]byte, 1))
	require.Error(t, err)
	require.Less(t, time.Since(start), 5*time.Second, "the server kept a connection without hello")
}

// Connections held open and silent in every unjoined slot keep no rank out for their
// handshake's timeout: once they have waited evictUnjoinedAfter, a new connection takes
// the oldest one's slot.
func TestSilentConnectionsGiveWayToRanks(t *testing.T) {
	defer func(d time.Duration) { evictUnjoinedAfter = d }(evictUnjoinedAfter)
	evictUnjoinedAfter = 200 * time.Millisecond
	key := NewKey()
	srv, err := Serve("127.0.0.1:0", 1, key, false)
	require.NoError(t, err)
	defer srv.Close()
	var held []net.Conn
	for range maxUnjoined {
		c, err := net.Dial("tcp", srv.Addr())
		require.NoError(t, err)
		held = append(held, c)
	}
	defer func() {
		for _, c := range held {
			_ = c.Close()
		}
	}()
	eventuallyLocked(t, srv, func() bool { return len(srv.unjoined) == maxUnjoined })
	time.Sleep(2 * evictUnjoinedAfter)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	st, err := dial(ctx, srv.Addr(), key, 0, 1, nil)
	require.NoError(t, err, "a rank kept out by silent connections")
	require.Less(t, time.Since(start), 2*time.Second)
	_ = st.bye(ctx)
	require.NoError(t, st.close())
	srv.mu.Lock()
	defer srv.mu.Unlock()
	require.LessOrEqual(t, len(srv.unjoined), maxUnjoined, "the bound holds")
}

// A live job, its store, and the same closed, answer zero arguments (nil contexts,
// rank 0, empty keys) with errors or zero values: no panic, no hang.
func TestJobTakesZeroArguments(t *testing.T) {
	jobs := startJob(t, 2, nil)
	testenv.ZeroArgs(t, map[string]bool{"Close": true}, jobs[0], jobs[0].Store(), jobs[1])
	testenv.ExtremeArgs(t, map[string]bool{"Close": true}, jobs[0], jobs[0].Store(), jobs[1])
	closeAll(t, jobs)
	testenv.ZeroArgs(t, nil, jobs[0], jobs[0].Store())
}

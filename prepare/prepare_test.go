package prepare_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/testenv"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/prepare"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

type link struct {
	ctxS, ctxR *ucp.Context
	s, r       *ucp.Worker
	toR, toS   *ucp.Endpoint // the sender's endpoint to the receiver, and back
}

// shmLink connects two workers by worker address (shared memory).
func shmLink(t testing.TB) *link { return addressLink(t, ucp.ContextParams{}) }

// addressLink is shmLink with both contexts made with cp.
func addressLink(t testing.TB, cp ucp.ContextParams) *link {
	t.Helper()
	l := &link{}
	var err error
	l.ctxS, err = ucp.NewContext(cp)
	require.NoError(t, err)
	l.ctxR, err = ucp.NewContext(cp)
	require.NoError(t, err)
	l.s, err = l.ctxS.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	l.r, err = l.ctxR.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	as, err := l.s.Address()
	require.NoError(t, err)
	ar, err := l.r.Address()
	require.NoError(t, err)
	l.toR, err = l.s.ConnectAddress(ar, &ucp.EndpointParams{NoPeerErrorHandling: true})
	require.NoError(t, err)
	l.toS, err = l.r.ConnectAddress(as, &ucp.EndpointParams{NoPeerErrorHandling: true})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = l.ctxS.Close()
		_ = l.ctxR.Close()
	})
	return l
}

// tcpLink connects two workers through a listener (tcp, peer error handling).
func tcpLink(t testing.TB) *link {
	t.Helper()
	l := &link{}
	var err error
	cfg := map[string]string{"TLS": "tcp"}
	l.ctxS, err = ucp.NewContext(ucp.ContextParams{Config: cfg})
	require.NoError(t, err)
	l.ctxR, err = ucp.NewContext(ucp.ContextParams{Config: cfg})
	require.NoError(t, err)
	l.s, err = l.ctxS.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	l.r, err = l.ctxR.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	lis, err := l.r.Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	accepted := make(chan error, 1)
	connected := make(chan struct{})
	go func() {
		var err error
		l.toS, err = lis.Accept(ctx, nil)
		accepted <- err
		for {
			select {
			case <-connected:
				return
			default:
				l.r.Progress()
			}
		}
	}()
	l.toR, err = l.s.Connect(ctx, lis.Addr(), nil)
	close(connected)
	require.NoError(t, err)
	require.NoError(t, <-accepted)
	require.NoError(t, lis.Close())
	t.Cleanup(func() {
		_ = l.ctxS.Close()
		_ = l.ctxR.Close()
	})
	return l
}

func links(t *testing.T, f func(t *testing.T, l *link)) {
	t.Run("shm", func(t *testing.T) { f(t, shmLink(t)) })
	t.Run("tcp", func(t *testing.T) { f(t, tcpLink(t)) })
}

func fill(buf []byte, iter int) {
	for i := range buf {
		buf[i] = byte(iter*31 + i*7)
	}
}

func checkFilled(buf []byte, iter int) error {
	for i := range buf {
		if want := byte(iter*31 + i*7); buf[i] != want {
			return fmt.Errorf("iteration %d: byte %d is %d, want %d", iter, i, buf[i], want)
		}
	}
	return nil
}

// pair makes a send and a receive request over l and prepares them together.
func pair(t testing.TB, l *link, n, sparts, rparts int, tag uint64) (send, recv *prepare.Request, sbuf, rbuf []byte) {
	return pairWith(t, l, n, sparts, rparts, tag, func(p prepare.Params) prepare.Params { return p })
}

// pairWith is pair with both requests' Params passed through mod.
func pairWith(t testing.TB, l *link, n, sparts, rparts int, tag uint64, mod func(prepare.Params) prepare.Params) (send, recv *prepare.Request, sbuf, rbuf []byte) {
	t.Helper()
	sbuf, rbuf = make([]byte, n), make([]byte, n)
	var err error
	send, err = prepare.PsendInit(l.s, sbuf, mod(prepare.Params{Peer: l.toR, Tag: tag, Partitions: sparts}))
	require.NoError(t, err)
	recv, err = prepare.PrecvInit(l.r, rbuf, mod(prepare.Params{Peer: l.toS, Tag: tag, Partitions: rparts}))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// One call progresses both workers.
	require.NoError(t, prepare.PrepareAll(ctx, send, recv))
	t.Cleanup(func() {
		_ = send.Free()
		_ = recv.Free()
	})
	return send, recv, sbuf, rbuf
}

// iterate runs iterations with the sender making partitions ready in order (from
// order(iter)), the receiver checking every byte after Wait.
func iterate(t testing.TB, send, recv *prepare.Request, sbuf, rbuf []byte, iters int, order func(iter int) []int) {
	t.Helper()
	// Generous: a hang is what this bound catches, and -race on a loaded 2-core
	// machine takes several milliseconds per iteration.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second+time.Duration(iters)*30*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	recvErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		recvErr <- func() error {
			for i := 1; i <= iters; i++ {
				if err := recv.Start(); err != nil {
					return err
				}
				if err := recv.Wait(ctx); err != nil {
					return err
				}
				if err := checkFilled(rbuf, i); err != nil {
					return err
				}
			}
			return nil
		}()
	}()
	for i := 1; i <= iters; i++ {
		require.NoError(t, send.Start())
		fill(sbuf, i)
		for _, p := range order(i) {
			require.NoError(t, send.Pready(p))
		}
		if err := send.Wait(ctx); err != nil {
			select {
			case rerr := <-recvErr: // the receiver stopped first: its error is the cause
				require.NoError(t, rerr, "receiver")
			default:
			}
			require.NoError(t, err, "iteration %d", i)
		}
	}
	wg.Wait()
	require.NoError(t, <-recvErr)
}

func inOrder(n int) func(int) []int {
	return func(int) []int {
		ps := make([]int, n)
		for i := range ps {
			ps[i] = i
		}
		return ps
	}
}

// partCase is one request pair's shape and schedule: n bytes, sp send and rp receive
// partitions, made ready in order(sp)(iteration), for iters iterations.
type partCase struct {
	name      string
	n, sp, rp int
	order     func(n int) func(int) []int
	iters     int
}

// runPready runs the case through Pready on a pair made with mod (nil: as is),
// checking every byte and the counters: one match each, before and after.
func (tc partCase) runPready(t *testing.T, l *link, tag uint64, mod func(prepare.Params) prepare.Params) {
	send, recv, sbuf, rbuf := tc.pair(t, l, tag, mod)
	require.Equal(t, uint64(1), send.Stats().TagMatches)
	require.Equal(t, uint64(1), recv.Stats().TagMatches)
	iterate(t, send, recv, sbuf, rbuf, tc.iters, tc.order(tc.sp))
	tc.checkStats(t, send, recv)
}

// runTwins runs the case through the device handles' host twins.
func (tc partCase) runTwins(t *testing.T, l *link, tag uint64, mod func(prepare.Params) prepare.Params) {
	send, recv, sbuf, rbuf := tc.pair(t, l, tag, mod)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := 1; i <= tc.iters; i++ {
		require.NoError(t, twinIteration(ctx, send, recv, sbuf, rbuf, i, tc.order(tc.sp)(i)))
	}
	tc.checkStats(t, send, recv)
	require.NoError(t, send.Free())
	require.NoError(t, recv.Free())
}

func (tc partCase) pair(t *testing.T, l *link, tag uint64, mod func(prepare.Params) prepare.Params) (send, recv *prepare.Request, sbuf, rbuf []byte) {
	if mod == nil {
		return pair(t, l, tc.n, tc.sp, tc.rp, tag)
	}
	return pairWith(t, l, tc.n, tc.sp, tc.rp, tag, mod)
}

// checkStats: matching stayed off the critical path (still one match each), every
// iteration completed on both sides, every partition moved once per iteration.
func (tc partCase) checkStats(t *testing.T, send, recv *prepare.Request) {
	require.Equal(t, uint64(1), send.Stats().TagMatches)
	require.Equal(t, uint64(1), recv.Stats().TagMatches)
	require.Equal(t, uint64(tc.iters), send.Stats().Iterations)
	require.Equal(t, uint64(tc.iters), recv.Stats().Iterations)
	require.Equal(t, uint64(tc.iters*tc.sp), send.Stats().Puts)
}

// random makes partitions ready in a random order per iteration (seeded).
func random(seed uint64) func(n int) func(int) []int {
	return func(n int) func(int) []int {
		return func(iter int) []int { return rand.New(rand.NewPCG(uint64(iter), seed)).Perm(n) }
	}
}

// reverse makes partitions ready from the last to the first.
func reverse(n int) func(int) []int {
	return func(int) []int {
		ps := make([]int, n)
		for i := range ps {
			ps[i] = n - 1 - i
		}
		return ps
	}
}

func TestPartitionedPready(t *testing.T) {
	links(t, func(t *testing.T, l *link) {
		for _, tc := range []partCase{
			{"1", 64, 1, 1, inOrder, 20},
			{"8x4k", 8 << 10 * 4, 8, 8, inOrder, 20},
			{"64 reverse", 64 * 128, 64, 64, reverse, 10},
			{"1024 random", 1024 * 16, 1024, 1024, random(1), 5},
			{"send 8 recv 4", 8 * 512, 8, 4, inOrder, 10},
			{"send 4 recv 8", 8 * 512, 4, 8, inOrder, 10},
			{"send 3 recv 6", 6 * 100, 3, 6, inOrder, 10},
		} {
			t.Run(tc.name, func(t *testing.T) { tc.runPready(t, l, 7, nil) })
		}
	})
}

// A sender that stops calling anything once its Wait returned (its buffer may be
// reused) still delivers its iterations, and its worker's drainer takes the
// receiver's acks. Over tcp an ack is an emulated put that lands only with the
// sender's progress: it is late for the lazy drainer's delay, and from then on the
// registry drains at once (without a drainer the registry never turns eager: the
// assertion fails).
func TestSenderStopsAfterWait(t *testing.T) {
	links(t, func(t *testing.T, l *link) {
		send, recv, sbuf, rbuf := pair(t, l, 8*4096, 8, 8, 3)
		senderWaitsFirst(t, send, recv, sbuf, rbuf, 3)
		if strings.HasSuffix(t.Name(), "tcp") {
			require.Eventually(t, func() bool { return prepare.DrainsEagerly(send) }, 10*time.Second, time.Millisecond,
				"a late ack makes the registry drain at once")
		}
	})
}

// senderWaitsFirst runs n iterations of 8 partitions, each waited for on the sender
// before the receiver: the sender's Wait returns before the receiver sent its ack, and
// then nothing progresses the sender's worker until the next iteration.
func senderWaitsFirst(t *testing.T, send, recv *prepare.Request, sbuf, rbuf []byte, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := 1; i <= n; i++ {
		require.NoError(t, recv.Start())
		require.NoError(t, send.Start())
		fill(sbuf, i)
		require.NoError(t, send.PreadyRange(0, 7))
		require.NoError(t, send.Wait(ctx))
		require.NoError(t, recv.Wait(ctx), "iteration %d", i)
		require.NoError(t, checkFilled(rbuf, i))
	}
}

// Partitions made ready before the receiver started their iteration move once it
// does, while the sender calls nothing more on the request and nobody progresses its
// worker (MPI's Pready does not wait): the worker's registry moves them. Two
// iterations, the second one too after the first was waited for.
func TestPreadyMovesWithoutFurtherCalls(t *testing.T) {
	links(t, func(t *testing.T, l *link) {
		const parts = 8
		send, recv, sbuf, rbuf := pair(t, l, parts*512, parts, parts, 5)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for i := 1; i <= 2; i++ {
			require.NoError(t, send.Start())
			fill(sbuf, i)
			require.NoError(t, send.PreadyRange(0, parts-1))
			time.Sleep(5 * time.Millisecond) // the receiver is late: the partitions wait
			require.NoError(t, recv.Start())
			for p := 0; p < parts; p++ {
				require.Eventually(t, func() bool {
					ok, err := recv.Parrived(p)
					require.NoError(t, err)
					return ok
				}, 10*time.Second, 50*time.Microsecond, "iteration %d: partition %d did not arrive", i, p)
			}
			require.NoError(t, checkFilled(rbuf, i))
			require.Equal(t, uint64(i*parts), send.Stats().Puts, "iteration %d", i)
			require.NoError(t, recv.Wait(ctx))
			require.NoError(t, send.Wait(ctx))
		}
	})
}

// A sender's WaitOnStream holds its stream until every partition moved — those made
// ready before the receiver's readiness, and one made ready only after the call —
// with no further host call on the request: a host function behind it reuses the
// buffer, and the receiver still gets the iteration's bytes. Over tcp, a receiver
// that dies releases the stream too.
func TestSenderWaitOnStream(t *testing.T) {
	links(t, func(t *testing.T, l *link) {
		const parts = 8
		send, recv, sbuf, rbuf := pair(t, l, parts*512, parts, parts, 6)
		b := stream.NewHostBackend()
		defer b.Close()
		s, err := b.NewStream()
		require.NoError(t, err)
		defer s.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for i := 1; i <= 3; i++ {
			require.NoError(t, send.Start())
			fill(sbuf, i)
			require.NoError(t, send.PreadyRange(0, parts-2))
			require.NoError(t, send.WaitOnStream(s))
			var reused atomic.Bool
			require.NoError(t, s.LaunchHostFunc(func() {
				reused.Store(true)
				fill(sbuf, 100+i) // the buffer may be reused
			}))
			time.Sleep(5 * time.Millisecond)
			require.False(t, reused.Load(), "iteration %d: the stream went on before the receiver was ready", i)
			require.NoError(t, recv.Start())
			time.Sleep(5 * time.Millisecond)
			require.False(t, reused.Load(), "iteration %d: the stream went on before the last partition was ready", i)
			require.NoError(t, send.Pready(parts-1))
			require.NoError(t, s.Synchronize())
			require.True(t, reused.Load())
			require.NoError(t, recv.Wait(ctx))
			require.NoError(t, checkFilled(rbuf, i), "iteration %d", i)
			require.NoError(t, send.Wait(ctx))
		}
		// Every partition issued before the call (the receiver was ready): the stream
		// waits on the puts themselves.
		require.NoError(t, recv.Start())
		require.NoError(t, send.Start())
		fill(sbuf, 4)
		require.NoError(t, send.PreadyRange(0, parts-1))
		require.NoError(t, send.WaitOnStream(s))
		require.NoError(t, s.LaunchHostFunc(func() { fill(sbuf, 104) }))
		require.NoError(t, s.Synchronize())
		require.NoError(t, recv.Wait(ctx))
		require.NoError(t, checkFilled(rbuf, 4))
		require.NoError(t, send.Wait(ctx))
		require.NoError(t, send.WaitOnStream(s), "no iteration in flight: returns at once")
		require.NoError(t, s.Synchronize())
		if !strings.HasSuffix(t.Name(), "tcp") {
			return
		}
		require.NoError(t, send.Start())
		require.NoError(t, send.Pready(0))
		require.NoError(t, send.WaitOnStream(s))
		require.NoError(t, l.r.Close()) // the receiver's worker goes away
		require.NoError(t, syncWithin(t, s, 20*time.Second, "the stream still waits for a dead receiver"),
			"released, not failed: Wait reports the failure")
		require.ErrorIs(t, send.Wait(ctx), ucp.ErrPeerFailed)
	})
}

// An eager registry goes lazy again after its eager drains: one late ack does not
// keep a drainer running beside every later iteration. The sender waits before the
// receiver, so each of its iterations completes before its ack and is drained.
func TestDrainerRelaxes(t *testing.T) {
	l := shmLink(t)
	send, recv, sbuf, rbuf := pair(t, l, 8*256, 8, 8, 4)
	const eager = 3
	prepare.MakeEager(send, eager)
	before := prepare.Relaxed(send)
	senderWaitsFirst(t, send, recv, sbuf, rbuf, eager+2)
	require.Greater(t, prepare.Relaxed(send), before, "the registry never went lazy again")
}

// Many iterations: every partition of every iteration checksummed.
func TestPartitionedManyIterations(t *testing.T) {
	l := shmLink(t)
	send, recv, sbuf, rbuf := pair(t, l, 8*64, 8, 8, 1)
	iters := 10000
	if testing.Short() {
		iters = 1000
	}
	iterate(t, send, recv, sbuf, rbuf, iters, inOrder(8))
}

// Requests of the same peer and tag match in the order of their init, whatever order
// they are prepared in: two senders and two receivers are made interleaved and
// prepared together in reverse order, then again (PrepareAll is idempotent: no second
// match). A mismatch would fail the first iteration (the buffer sizes differ).
func TestPartitionedMatchByInitOrder(t *testing.T) {
	l := shmLink(t)
	sb1, sb2, rb1, rb2 := make([]byte, 256), make([]byte, 512), make([]byte, 256), make([]byte, 512)
	s1, err := prepare.PsendInit(l.s, sb1, prepare.Params{Peer: l.toR, Tag: 3, Partitions: 4})
	require.NoError(t, err)
	s2, err := prepare.PsendInit(l.s, sb2, prepare.Params{Peer: l.toR, Tag: 3, Partitions: 2})
	require.NoError(t, err)
	r1, err := prepare.PrecvInit(l.r, rb1, prepare.Params{Peer: l.toS, Tag: 3, Partitions: 4})
	require.NoError(t, err)
	r2, err := prepare.PrecvInit(l.r, rb2, prepare.Params{Peer: l.toS, Tag: 3, Partitions: 8})
	require.NoError(t, err)
	reqs := []*prepare.Request{r2, s2, r1, s1}
	t.Cleanup(func() {
		for _, r := range reqs {
			_ = r.Free()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, prepare.PrepareAll(ctx, reqs...))
	require.NoError(t, prepare.PrepareAll(ctx, reqs...), "a second prepare phase")
	for _, r := range reqs {
		require.Equal(t, uint64(1), r.Stats().TagMatches, "matched once")
	}
	iterate(t, s1, r1, sb1, rb1, 3, inOrder(4))
	iterate(t, s2, r2, sb2, rb2, 3, inOrder(2))
	// StartAll starts every request of a list: one iteration of both pairs at once.
	require.NoError(t, prepare.StartAll(r1, r2))
	require.NoError(t, prepare.StartAll(s2, s1))
	fill(sb1, 4)
	fill(sb2, 4)
	require.NoError(t, s1.PreadyRange(0, 3))
	require.NoError(t, s2.PreadyRange(0, 1))
	for _, r := range reqs {
		require.NoError(t, r.Wait(ctx))
	}
	require.NoError(t, checkFilled(rb1, 4))
	require.NoError(t, checkFilled(rb2, 4))
	for _, r := range reqs {
		require.Equal(t, uint64(1), r.Stats().TagMatches, "no matching after the prepare phase")
	}
}

// Registered buffers (Params.MemH, from MemAlloc) on both sides, over shm and tcp:
// the puts use the caller's registration; every byte of every iteration is checked.
// A registration that does not cover the buffer is refused at init.
func TestPartitionedRegisteredBuffers(t *testing.T) {
	links(t, func(t *testing.T, l *link) {
		const n = 8 * 1024
		smem, err := l.ctxS.MemAlloc(n + 64)
		require.NoError(t, err)
		defer smem.Close()
		rmem, err := l.ctxR.MemAlloc(n)
		require.NoError(t, err)
		defer rmem.Close()
		sbuf, rbuf := smem.Bytes()[64:], rmem.Bytes()
		_, err = prepare.PsendInit(l.s, make([]byte, n), prepare.Params{Peer: l.toR, Tag: 8, Partitions: 8, MemH: smem})
		require.ErrorIs(t, err, ucp.ErrInvalidParam, "a registration not covering the buffer")
		send, err := prepare.PsendInit(l.s, sbuf, prepare.Params{Peer: l.toR, Tag: 8, Partitions: 8, MemH: smem})
		require.NoError(t, err)
		defer send.Free()
		recv, err := prepare.PrecvInit(l.r, rbuf, prepare.Params{Peer: l.toS, Tag: 8, Partitions: 4, MemH: rmem})
		require.NoError(t, err)
		defer recv.Free()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		require.NoError(t, prepare.PrepareAll(ctx, send, recv))
		iterate(t, send, recv, sbuf, rbuf, 20, reverse(8))
	})
}

// Early bird: with one partition held back, every other partition is reported
// arrived before it, and Wait does not complete until it comes.
func TestPartitionedEarlyBird(t *testing.T) {
	t.Run("direct", func(t *testing.T) { earlyBird(t, 9, 5, nil) })
	// Staged: through the landed words, with the held partition on another stream.
	t.Run("staged", func(t *testing.T) { earlyBird(t, 33, 11, prepare.Staged) })
}

func earlyBird(t *testing.T, tag uint64, held int, mod func(prepare.Params) prepare.Params) {
	l := shmLink(t)
	const parts, size = 16, 256
	send, recv, sbuf, rbuf := partCase{n: parts * size, sp: parts, rp: parts}.pair(t, l, tag, mod)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, recv.Start())
	require.NoError(t, send.Start())
	fill(sbuf, 1)
	for p := range parts {
		if p != held {
			require.NoError(t, send.Pready(p))
		}
	}
	for p := range parts {
		if p == held {
			continue
		}
		require.Eventually(t, func() bool {
			_, _ = send.Test()
			ok, err := recv.Parrived(p)
			require.NoError(t, err)
			return ok
		}, 10*time.Second, 10*time.Microsecond, "partition %d", p)
		require.Equal(t, sbuf[p*size:(p+1)*size], rbuf[p*size:(p+1)*size], "partition %d", p)
	}
	ok, err := recv.Parrived(held)
	require.NoError(t, err)
	require.False(t, ok, "the held partition arrived")
	done, err := recv.Test()
	require.NoError(t, err)
	require.False(t, done)
	require.NoError(t, send.Pready(held))
	go func() { _ = send.Wait(ctx) }()
	require.NoError(t, recv.Wait(ctx))
	require.NoError(t, checkFilled(rbuf, 1))
}

func TestPartitionedBadInput(t *testing.T) {
	l := shmLink(t)
	_, err := prepare.PsendInit(l.s, make([]byte, 10), prepare.Params{Peer: l.toR, Partitions: 3})
	require.ErrorIs(t, err, ucp.ErrInvalidParam, "unequal partitions")
	_, err = prepare.PsendInit(l.s, make([]byte, 8), prepare.Params{Peer: l.toR, Partitions: 0})
	require.ErrorIs(t, err, ucp.ErrInvalidParam, "no partitions")
	_, err = prepare.PsendInit(l.s, nil, prepare.Params{Peer: l.toR, Partitions: 1})
	require.ErrorIs(t, err, ucp.ErrInvalidParam, "an empty buffer")
	require.ErrorContains(t, err, "empty buffer")
	_, err = prepare.PsendInit(l.s, make([]byte, 8), prepare.Params{Peer: l.toS, Partitions: 1})
	require.ErrorIs(t, err, ucp.ErrInvalidParam, "peer of another worker")
	_, err = prepare.PrecvInit(l.r, make([]byte, 8), prepare.Params{Peer: l.toS, Partitions: 1, MemoryType: 42})
	require.ErrorIs(t, err, ucp.ErrInvalidParam, "a memory type outside UCX's list")
	_, err = prepare.PrecvInit(l.r, make([]byte, 8), prepare.Params{Peer: l.toS, Partitions: 1, MemoryType: ucp.MemoryROCm})
	require.ErrorIs(t, err, ucp.ErrUnsupported, "a ROCm buffer")

	send, recv, sbuf, _ := pair(t, l, 4*64, 4, 4, 11)
	require.ErrorIs(t, send.Pready(0), ucp.ErrInvalidParam, "before Start")
	_, err = recv.Parrived(0)
	require.ErrorIs(t, err, ucp.ErrInvalidParam, "parrived before Start")
	require.NoError(t, send.Start())
	require.NoError(t, recv.Start())
	require.ErrorIs(t, send.Pready(4), ucp.ErrInvalidParam, "out of range")
	require.ErrorIs(t, send.Pready(-1), ucp.ErrInvalidParam, "negative")
	require.ErrorIs(t, send.PreadyList([]int{1, 1}), ucp.ErrInvalidParam, "twice in one list")
	fill(sbuf, 1)
	require.NoError(t, send.Pready(1))
	require.ErrorIs(t, send.Pready(1), ucp.ErrInvalidParam, "twice")
	require.ErrorIs(t, send.Start(), ucp.ErrInvalidParam, "start while incomplete")
	require.ErrorIs(t, recv.Start(), ucp.ErrInvalidParam, "start while incomplete")
	_, err = recv.Parrived(4)
	require.ErrorIs(t, err, ucp.ErrInvalidParam, "parrived out of range")
	require.ErrorIs(t, recv.Pready(0), ucp.ErrInvalidParam, "pready on a receive")
	_, err = send.Parrived(0)
	require.ErrorIs(t, err, ucp.ErrInvalidParam, "parrived on a send")
	require.ErrorIs(t, send.Free(), ucp.ErrBusy, "free in flight")
	require.NoError(t, send.PreadyRange(2, 3))
	require.NoError(t, send.Pready(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() { _ = send.Wait(ctx) }()
	require.NoError(t, recv.Wait(ctx))
}

// Pready in stream order: a host stream makes each partition ready after it filled it;
// the receiver's stream waits for each partition before reading it.
func TestPartitionedOnStreams(t *testing.T) {
	links(t, func(t *testing.T, l *link) {
		t.Run("direct", func(t *testing.T) { partitionedOnStreams(t, l, func(p prepare.Params) prepare.Params { return p }) })
		// Staged: the partition's copy to the host copy runs on the caller's stream.
		t.Run("staged", func(t *testing.T) { partitionedOnStreams(t, l, prepare.Staged) })
	})
}

func partitionedOnStreams(t *testing.T, l *link, mod func(prepare.Params) prepare.Params) {
	b, err := stream.Open(stream.Host)
	require.NoError(t, err)
	defer b.Close()
	const parts, size, iters = 8, 1024, 20
	sbuf, rbuf := make([]byte, parts*size), make([]byte, parts*size)
	send, err := prepare.PsendInit(l.s, sbuf, mod(prepare.Params{Peer: l.toR, Tag: 5, Partitions: parts, Backend: b}))
	require.NoError(t, err)
	defer send.Free()
	recv, err := prepare.PrecvInit(l.r, rbuf, mod(prepare.Params{Peer: l.toS, Tag: 5, Partitions: parts, Backend: b}))
	require.NoError(t, err)
	defer recv.Free()
	ss, err := b.NewStream()
	require.NoError(t, err)
	defer ss.Close()
	rs, err := b.NewStream()
	require.NoError(t, err)
	defer rs.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// One call progresses both workers.
	require.NoError(t, prepare.PrepareAll(ctx, send, recv))
	onStreamIterations(ctx, t, send, recv, sbuf, rbuf, ss, rs, parts, size, iters)
	require.Equal(t, uint64(iters), recv.Stats().Iterations)
}

// PreadyNode in a host graph: each launch is an iteration of the graph's partitions,
// with no host call per launch on the sending side.
func TestPartitionedHostGraph(t *testing.T) {
	l, b := hostLink(t)
	const parts, size = 4, 512
	launches := 1000
	if testing.Short() {
		launches = 100
	}
	sbuf, rbuf := make([]byte, parts*size), make([]byte, parts*size)
	send, err := prepare.PsendInit(l.s, sbuf, prepare.Params{Peer: l.toR, Tag: 8, Partitions: parts, Backend: b})
	require.NoError(t, err)
	recv, err := prepare.PrecvInit(l.r, rbuf, prepare.Params{Peer: l.toS, Tag: 8, Partitions: parts, Backend: b})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// One call progresses both workers.
	require.NoError(t, prepare.PrepareAll(ctx, send, recv))

	hostGraphLaunches(t, b, send, recv, sbuf, rbuf, parts, size, launches)
	require.NoError(t, send.Free())
	require.NoError(t, recv.Free())
	require.Equal(t, uint64(1), send.Stats().TagMatches)
}

// A handshake that reaches the peer before the peer made any prepared request (its
// worker drops active messages it has no handler for) is sent again: the prepare
// phase still completes.
func TestPrepareHandshakeBeforePeerInit(t *testing.T) {
	l := shmLink(t)
	sbuf, rbuf := make([]byte, 256), make([]byte, 256)
	send, err := prepare.PsendInit(l.s, sbuf, prepare.Params{Peer: l.toR, Tag: 4, Partitions: 2})
	require.NoError(t, err)
	defer send.Free()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sent := make(chan error, 1)
	go func() { sent <- prepare.PrepareAll(ctx, send) }()
	for deadline := time.Now().Add(100 * time.Millisecond); time.Now().Before(deadline); {
		l.r.Progress() // the first handshake arrives here before any receive request exists
	}
	recv, err := prepare.PrecvInit(l.r, rbuf, prepare.Params{Peer: l.toS, Tag: 4, Partitions: 2})
	require.NoError(t, err)
	defer recv.Free()
	require.NoError(t, prepare.PrepareAll(ctx, recv))
	require.NoError(t, <-sent)
	require.Equal(t, uint64(1), recv.Stats().TagMatches)
	iterate(t, send, recv, sbuf, rbuf, 3, inOrder(2))
}

// hostGraphLaunches builds a host graph that fills each partition with the launch
// number and makes it ready with PreadyNode, launches it launches times on a stream
// of b, and checks every launch's data at the receiver (which Starts and Waits once
// per launch).
func hostGraphLaunches(t *testing.T, b stream.Backend, send, recv *prepare.Request, sbuf, rbuf []byte, parts, size, launches int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	g := graph.NewHost()
	launch := 0
	for p := range parts {
		part := sbuf[p*size : (p+1)*size]
		produce, err := g.AddTask(nil, func() error { fill(part, launch+p); return nil })
		require.NoError(t, err)
		_, err = send.PreadyNode(g, []condition.Node{produce}, p)
		require.NoError(t, err)
	}
	exec, s := instantiateOn(t, g, b)
	recvDone := make(chan error, 1)
	go func() {
		for i := 1; i <= launches; i++ {
			if err := recv.Start(); err != nil {
				recvDone <- err
				return
			}
			if err := recv.Wait(ctx); err != nil {
				recvDone <- err
				return
			}
			for p := range parts {
				if err := checkFilled(rbuf[p*size:(p+1)*size], i+p); err != nil {
					recvDone <- err
					return
				}
			}
		}
		recvDone <- nil
	}()
	for i := 1; i <= launches; i++ {
		require.NoError(t, s.LaunchHostFunc(func() { launch = i }))
		require.NoError(t, exec.Launch(s))
	}
	require.NoError(t, <-recvDone)
	require.NoError(t, s.Synchronize())
}

// onStreamIterations runs iterations with every partition made ready in stream order
// on ss (after a fill on ss, last partition first) and seen arriving in stream order
// on rs, where its bytes are checked.
func onStreamIterations(ctx context.Context, t *testing.T, send, recv *prepare.Request, sbuf, rbuf []byte, ss, rs stream.Stream, parts, size, iters int) {
	t.Helper()
	for i := 1; i <= iters; i++ {
		require.NoError(t, recv.Start())
		require.NoError(t, send.Start())
		bad := make(chan error, parts)
		for p := parts - 1; p >= 0; p-- {
			part := sbuf[p*size : (p+1)*size]
			require.NoError(t, ss.LaunchHostFunc(func() { fill(part, i+p) }))
			require.NoError(t, send.PreadyOnStream(ss, p))
			require.NoError(t, recv.ArrivedOnStream(rs, p))
			got := rbuf[p*size : (p+1)*size]
			require.NoError(t, rs.LaunchHostFunc(func() { bad <- checkFilled(got, i+p) }))
		}
		require.NoError(t, rs.Synchronize())
		for range parts {
			require.NoError(t, <-bad)
		}
		require.NoError(t, recv.Wait(ctx))
		require.NoError(t, send.Wait(ctx))
	}
}

// The Request of a failed PsendInit or PrecvInit is nil: its methods report that
// instead of crashing.
func TestNilRequestMethods(t *testing.T) {
	testenv.NilMethods(t, (*prepare.Request)(nil))
	var r *prepare.Request
	require.Nil(t, r.Worker())
	require.Zero(t, r.Partitions())
	require.Equal(t, prepare.Stats{}, r.Stats())
	b := stream.NewHostBackend()
	defer b.Close()
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	for name, err := range map[string]error{
		"Start":           r.Start(),
		"Pready":          r.Pready(0),
		"PreadyRange":     r.PreadyRange(0, 1),
		"PreadyList":      r.PreadyList([]int{0}),
		"PreadyOnStream":  r.PreadyOnStream(s, 0),
		"ArrivedOnStream": r.ArrivedOnStream(s, 0),
		"Wait":            r.Wait(context.Background()),
		"WaitOnStream":    r.WaitOnStream(s),
		"Free":            r.Free(),
	} {
		require.ErrorIs(t, err, prepare.ErrInvalidParam, name)
	}
	_, err = r.Parrived(0)
	require.ErrorIs(t, err, prepare.ErrInvalidParam)
	_, err = r.Test()
	require.ErrorIs(t, err, prepare.ErrInvalidParam)
	_, err = r.DeviceHandle()
	require.ErrorIs(t, err, prepare.ErrInvalidParam)
	_, err = r.PreadyNode(graph.NewHost(), nil, 0)
	require.ErrorIs(t, err, prepare.ErrInvalidParam)
}

// A peer sending handshakes no request asks for (a faulty or hostile one) does not
// grow the process without bound, and an honest pair still matches afterwards.
func TestForgedHandshakesAreBounded(t *testing.T) {
	l := shmLink(t)
	pair(t, l, 64, 2, 2, 0x51) // the receiver's worker has its handshake handler now
	// The forged handshakes must not expire before they are counted.
	defer prepare.FreezeEarlyClock(l.r)()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const forged = prepare.MaxEarly + 904
	param := &ucp.RequestParam{AmFlags: ucp.AmReply | ucp.AmEager}
	for i := 0; i < forged; i++ {
		r, err := l.toR.AmSendNbx(prepare.HandshakeAM, nil, prepare.ForgedHandshake(0x7000_0000+uint64(i), 512), param)
		require.NoError(t, err)
		for done := false; !done; {
			done, err = r.Test()
			require.NoError(t, err)
			l.s.Progress()
			l.r.Progress()
		}
	}
	// The pair's handshakes travel behind the forged ones: once it is prepared, every
	// forged one was delivered.
	send, recv, sbuf, rbuf := pair(t, l, 256, 4, 2, 0x52)
	n, bytes := prepare.EarlyHeld(l.r)
	require.LessOrEqual(t, n, prepare.MaxEarly, "handshakes held for requests never made")
	require.Greater(t, n, 0)
	require.LessOrEqual(t, bytes, prepare.MaxEarlyBytes)
	iterate(t, send, recv, sbuf, rbuf, 3, func(int) []int { return []int{3, 2, 1, 0} })
	require.NoError(t, ctx.Err())
}

// A ready flag holding the failure value fails a PreadyNode launch with an error
// matching ErrPeerFailed, also when the value came from the peer's write alone (the
// request itself saw no failure).
func TestPreadyNodeForgedFailure(t *testing.T) {
	l, b := hostLink(t)
	send, _, _, _ := pairWith(t, l, 256, 2, 2, 0x53, onBackend(b))
	g := graph.NewHost()
	_, err := send.PreadyNode(g, nil, 0)
	require.NoError(t, err)
	exec, s := instantiateOn(t, g, b)
	prepare.ForgeFailedFlag(send, 0)
	require.NoError(t, exec.Launch(s))
	err = s.Synchronize()
	require.ErrorIs(t, err, ucp.ErrPeerFailed)
	require.NotContains(t, err.Error(), "%!w")
}

// instantiateOn instantiates g and makes a stream of b to launch it on, both closed
// with the test.
func instantiateOn(t *testing.T, g *graph.Host, b stream.Backend) (*graph.HostExec, stream.Stream) {
	t.Helper()
	exec, err := g.Instantiate()
	require.NoError(t, err)
	t.Cleanup(func() { _ = exec.Close() })
	s, err := b.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return exec, s
}

// PreadyNode checks its arguments before the prepare phase, which waits for a peer
// that may never make its request: bad input fails at the call, not after the match.
func TestPreadyNodeBadInputBeforePrepare(t *testing.T) {
	l, b := hostLink(t)
	send, err := prepare.PsendInit(l.s, make([]byte, 64), prepare.Params{Peer: l.toR, Tag: 0x54, Partitions: 4, Backend: b})
	require.NoError(t, err)
	defer send.Free()
	done := make(chan error, 3)
	go func() {
		g := graph.NewHost()
		_, err := send.PreadyNode(g, nil, 4)
		done <- err
		_, err = send.PreadyNode(g, nil, -1)
		done <- err
		_, err = send.PreadyNode(nil, nil, 0)
		done <- err
	}()
	for range 3 {
		select {
		case err := <-done:
			require.ErrorIs(t, err, ucp.ErrInvalidParam)
		case <-time.After(20 * time.Second):
			t.Fatal("PreadyNode with a bad argument waited for the peer")
		}
	}
}

// A prepared request answers zero arguments (nil streams, graphs, contexts, lists) with
// errors before its first Start, while started and once freed.
func TestRequestTakesZeroArguments(t *testing.T) {
	for _, stage := range []string{"fresh", "started", "freed"} {
		l := shmLink(t)
		send, recv, _, _ := pair(t, l, 4096, 4, 4, 7)
		switch stage {
		case "started":
			require.NoError(t, prepare.StartAll(send, recv))
		case "freed":
			require.NoError(t, send.Free())
			require.NoError(t, recv.Free())
		}
		skip := map[string]bool{"Free": stage != "freed"}
		testenv.ZeroArgs(t, skip, send, recv)
		testenv.ExtremeArgs(t, skip, send, recv)
	}
}

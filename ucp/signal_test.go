package ucp

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/protocol"
	"github.com/ucpx/ucpx/stream"
)

// shmPairWith is newShmPair with B's worker made with pb.
func shmPairWith(t testing.TB, pb WorkerParams) *pair { return addressPair(t, pb, true) }

// addressPair connects two workers by sealed worker address; b gets pb. Over shared
// memory, without peer error handling (UCX 1.13 then picks shm); else tcp.
func addressPair(t testing.TB, pb WorkerParams, shm bool) *pair {
	t.Helper()
	p := &pair{}
	var err error
	p.ctxA, err = NewContext(ContextParams{})
	require.NoError(t, err)
	p.ctxB, err = NewContext(ContextParams{})
	require.NoError(t, err)
	p.a, err = p.ctxA.NewWorker(WorkerParams{})
	require.NoError(t, err)
	p.b, err = p.ctxB.NewWorker(pb)
	require.NoError(t, err)
	t.Cleanup(func() { p.close(t) })
	addrA, err := p.a.Address()
	require.NoError(t, err)
	addrB, err := p.b.Address()
	require.NoError(t, err)
	ep := &EndpointParams{NoPeerErrorHandling: shm}
	p.epA, err = p.a.ConnectAddress(addrB, ep)
	require.NoError(t, err)
	p.epB, err = p.b.ConnectAddress(addrA, ep)
	require.NoError(t, err)
	return p
}

// target is B's side of a put-with-signal: a registered data region and signal words,
// with their keys unpacked at A.
type target struct {
	data    *MemH
	sigs    *Signals
	dataKey *Rkey
	sigKey  *Rkey
}

func newTarget(t testing.TB, p *pair, b stream.Backend, n, words int) *target {
	data, err := p.ctxB.MemAlloc(n)
	require.NoError(t, err)
	t.Cleanup(func() { _ = data.Close() })
	sigs, err := p.b.NewSignals(b, words)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sigs.Close() })
	dk, err := data.PackRkey()
	require.NoError(t, err)
	sk, err := sigs.PackRkey()
	require.NoError(t, err)
	tg := &target{data: data, sigs: sigs}
	tg.dataKey, err = p.epA.UnpackRkey(dk)
	require.NoError(t, err)
	tg.sigKey, err = p.epA.UnpackRkey(sk)
	require.NoError(t, err)
	return tg
}

// A put with signal: a stream of the target waits on the signal word and then reads
// the data, with no progress loop on the target (the waiting host stream drives the
// worker), and the data is there in every round.
func TestPutSignalOrdersDataBeforeSignal(t *testing.T) {
	pairs(t, func(t *testing.T, p *pair) {
		b := hostBackend(t)
		s, err := b.NewStream()
		require.NoError(t, err)
		defer s.Close()
		const n, rounds = 64 << 10, 50
		tg := newTarget(t, p, b, n, 2)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		src := make([]byte, n)
		for i := 1; i <= 2*rounds; i++ {
			op := SignalSet // then SignalStore, the plain put of the value
			if i > rounds {
				op = SignalStore
			}
			for j := range src {
				src[j] = byte(i*7 + j)
			}
			want := bytes.Clone(src)
			seen := make(chan bool, 1)
			require.NoError(t, s.WaitValue(tg.sigs.Word(0), uint64(i), stream.GEQ))
			require.NoError(t, s.LaunchHostFunc(func() { seen <- bytes.Equal(tg.data.Bytes(), want) }))
			r, err := p.epA.PutSignalNbx(src, tg.dataKey.Base(), tg.dataKey, Signal{Op: op, Value: uint64(i), Addr: tg.sigs.Addr(0), Rkey: tg.sigKey}, nil)
			require.NoError(t, err)
			require.NoError(t, r.Wait(ctx))
			select {
			case ok := <-seen:
				require.True(t, ok, "round %d (%v): the stream saw the signal before the data", i, op)
				require.Equal(t, uint64(i), tg.sigs.Word(0).Load(), "round %d (%v): the value written", i, op)
			case <-ctx.Done():
				t.Fatalf("round %d: the stream never saw the signal", i)
			}
		}
		// Add accumulates. The stream waits first: its executor progresses the target.
		require.NoError(t, s.WaitValue(tg.sigs.Word(1), 15, stream.EQ))
		for range 3 {
			r, err := p.epA.PutSignalNbx(nil, tg.dataKey.Base(), tg.dataKey, Signal{Op: SignalAdd, Value: 5, Addr: tg.sigs.Addr(1), Rkey: tg.sigKey}, nil)
			require.NoError(t, err)
			require.NoError(t, r.Wait(ctx))
		}
		require.NoError(t, s.Synchronize())
		require.Equal(t, uint64(15), tg.sigs.Word(1).Load())
	})
}

func TestPutSignalChecksAtTheCall(t *testing.T) {
	p := newShmPair(t)
	b := hostBackend(t)
	tg := newTarget(t, p, b, 64, 1)
	sig := Signal{Op: SignalSet, Value: 1, Addr: tg.sigs.Addr(0), Rkey: tg.sigKey}
	for _, tc := range []struct {
		name string
		buf  []byte
		sig  Signal
		want error
	}{
		{"data out of range", make([]byte, 65), sig, ErrOutOfRange},
		{"bad op", nil, Signal{Op: 9, Addr: sig.Addr, Rkey: sig.Rkey}, ErrInvalidParam},
		{"unaligned signal", nil, Signal{Op: SignalSet, Addr: sig.Addr + 4, Rkey: sig.Rkey}, ErrInvalidParam},
		{"signal out of range", nil, Signal{Op: SignalSet, Addr: sig.Addr + 8, Rkey: sig.Rkey}, ErrOutOfRange},
		{"signal key of the data", nil, Signal{Op: SignalSet, Addr: sig.Addr, Rkey: tg.dataKey}, ErrOutOfRange},
		{"nil signal key", nil, Signal{Op: SignalSet, Addr: sig.Addr}, ErrInvalidParam},
	} {
		_, err := p.epA.PutSignalNbx(tc.buf, tg.dataKey.Base(), tg.dataKey, tc.sig, nil)
		require.ErrorIs(t, err, tc.want, tc.name)
	}
	require.Zero(t, tg.sigs.Word(0).Load(), "nothing reached the target")
}

// A put with signal runs its Callback once, with the Request the call returned, once
// both parts completed: not once per part (the data's with a Request the caller never
// got). So does one enqueued with a Condition.
func TestPutSignalCallbackRunsOnce(t *testing.T) {
	p := newShmPair(t)
	b := hostBackend(t)
	tg := newTarget(t, p, b, 1<<20, 1)
	kc, fire := kernelCondition(t)
	want := uint64(0)
	for _, cond := range []bool{false, true} {
		for _, op := range []SignalOp{SignalAdd, SignalSet, SignalStore} {
			for _, n := range []int{0, 8, 1 << 20} {
				var calls atomic.Int32
				var got atomic.Pointer[Request]
				var doneAtCall atomic.Bool
				prm := &RequestParam{Flags: NoImmediateCompletion, Callback: func(r *Request) {
					calls.Add(1)
					got.Store(r)
					doneAtCall.Store(r.Done())
				}}
				if cond {
					prm.Condition = kc
				}
				want++
				v := want
				if op == SignalAdd {
					v = 1 // the word held want-1
				}
				r, err := p.epA.PutSignalNbx(make([]byte, n), tg.dataKey.Base(), tg.dataKey,
					Signal{Op: op, Value: v, Addr: tg.sigs.Addr(0), Rkey: tg.sigKey}, prm)
				require.NoError(t, err)
				if cond {
					fire()
				}
				p.wait(t, r)
				progressAll(t, 10*time.Second, func() bool {
					return tg.sigs.Word(0).Load() == want && calls.Load() > 0
				}, p.a, p.b)
				for range 100 {
					p.a.Progress()
					p.b.Progress()
				}
				what := fmt.Sprintf("condition %v, %v, %d bytes", cond, op, n)
				require.EqualValues(t, 1, calls.Load(), "%s: Callback runs once", what)
				require.Same(t, r, got.Load(), "%s: Callback gets the call's Request", what)
				require.True(t, doneAtCall.Load(), what)
				require.NoError(t, r.Err(), what)
			}
		}
	}
}

// A staged put with signal whose data completes in place while its signal is pending
// gives its staging memory back: the memory lent stays one buffer over many rounds.
func TestPutSignalStagedGivesMemoryBack(t *testing.T) {
	p := newShmPair(t)
	tg := newTarget(t, p, hostBackend(t), 64, 1)
	var first uint64
	for i := range 20 {
		r, err := p.epA.PutSignalNbx(make([]byte, 8), tg.dataKey.Base(), tg.dataKey,
			Signal{Op: SignalSet, Value: uint64(i), Addr: tg.sigs.Addr(0), Rkey: tg.sigKey},
			&RequestParam{Staging: protocol.StageAlways})
		require.NoError(t, err)
		p.wait(t, r)
		if i == 0 {
			first = p.a.StagingStats().HighWater
		}
	}
	st := p.a.StagingStats()
	require.EqualValues(t, 20, st.Parts)
	require.Equal(t, first, st.HighWater, "staging memory lent stays one buffer")
}

// targetAdd adds 1 to the target's first signal word from A with a fetching atomic,
// waits for it and returns the value it replaced.
func targetAdd(t testing.TB, p *pair, tg *target) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := p.epA.AtomicNbx(AtomicParam{Op: AtomicAdd, Operand: 1, Fetch: true}, tg.sigs.Addr(0), tg.sigKey, nil)
	require.NoError(t, err)
	require.NoError(t, r.Wait(ctx))
	return r.Fetched()
}

// A process that is only a target: with ProgressThread, a remote atomic on a signal
// word that a CUDA-like waiter polls (here the host, reading the word without any ucpx
// call) lands with no progress loop of the target's; idle, the thread parks.
func TestProgressThreadServesTarget(t *testing.T) {
	p := shmPairWith(t, WorkerParams{ProgressThread: true})
	b := hostBackend(t)
	tg := newTarget(t, p, b, 8, 1)
	for i := 1; i <= 20; i++ {
		require.Equal(t, uint64(i-1), targetAdd(t, p, tg))
	}
	require.Equal(t, uint64(20), tg.sigs.Word(0).Load())
	// Idle: the progress goroutine sits in WaitForEvents (poll on the event fd).
	deadline := time.Now().Add(5 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		if parkedProgressThread(stacks) {
			break
		}
		require.True(t, time.Now().Before(deadline), "progress thread still spinning while idle:\n%s", stacks)
		time.Sleep(10 * time.Millisecond)
	}
	// Close stops it.
	require.NoError(t, p.b.Close())
	// Close waits for the thread and its stop watcher; the runtime may still be
	// unwinding the last of them when the stacks are read, so allow it a moment.
	deadline = time.Now().Add(2 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "runProgressThread") {
			break
		}
		require.True(t, time.Now().Before(deadline), "progress thread outlived Close:\n%s", stacks)
		time.Sleep(time.Millisecond)
	}
}

// The progress thread counts UCX's own progress as activity: while a peer's emulated
// puts keep arriving (into memory UCX did not allocate: they complete nothing of the
// target's), it keeps polling instead of parking between them and waking for each.
func TestProgressThreadStaysWhilePeerWrites(t *testing.T) {
	// A spin time long against scheduling stalls of a loaded machine, so that only the
	// rule (not a starved peer) decides whether the target parks.
	const spin, run = 20 * time.Millisecond, 400 * time.Millisecond
	p := shmPairWith(t, WorkerParams{ProgressThread: true, SpinTime: spin})
	b := hostBackend(t)
	tg := newTarget(t, p, b, 8, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	src := make([]byte, 8)
	before := p.b.progress.parks.Load()
	start := time.Now()
	n := 0
	for time.Since(start) < run {
		n++
		binary.LittleEndian.PutUint64(src, uint64(n))
		r, err := p.epA.PutNbx(src, tg.sigs.Addr(0), tg.sigKey, nil)
		require.NoError(t, err)
		require.NoError(t, r.Wait(ctx))
		f, err := p.epA.FlushNbx(nil) // remote completion: the target applied the put
		require.NoError(t, err)
		require.NoError(t, f.Wait(ctx))
	}
	require.Equal(t, uint64(n), tg.sigs.Word(0).Load())
	parks := p.b.progress.parks.Load() - before
	// Parking whenever a spin time passes without a completion of its own would be
	// about one park per 20 ms (20 here).
	t.Logf("%d puts in %v, the target's progress thread parked %d times", n, time.Since(start), parks)
	require.LessOrEqual(t, parks, int64(5), "the target parked while its peer's puts kept arriving")
}

// Idle, the progress thread parks over tcp as over shared memory: UCX's progress
// reports nothing once nothing happens (it counts as activity, above). The peer
// progresses now and then, as a process with a progress thread of its own does (a
// peer that never does: TestProgressThreadIgnoresStaleReadiness).
func TestProgressThreadParksWhenIdle(t *testing.T) {
	for _, shm := range []bool{true, false} {
		p := addressPair(t, WorkerParams{ProgressThread: true, SpinTime: time.Millisecond}, shm)
		b := hostBackend(t)
		tg := newTarget(t, p, b, 8, 1)
		peer := make(chan struct{})
		peerDone := make(chan struct{})
		go func() {
			defer close(peerDone)
			for {
				select {
				case <-peer:
					return
				case <-time.After(time.Millisecond):
					p.a.Progress()
				}
			}
		}()
		// Counted before the add: the thread may park again before a count taken after
		// it, and then (rightly) stay parked. The add wakes a parked thread, which
		// parks again once idle.
		parks := p.b.progress.parks.Load()
		targetAdd(t, p, tg)
		require.Eventually(t, func() bool { return p.b.progress.parks.Load() > parks }, 5*time.Second, time.Millisecond,
			"shm %v: the idle progress thread never parked", shm)
		// Once the connection has settled (tcp's takes some milliseconds more), it
		// stays parked: nothing wakes it while nothing happens.
		time.Sleep(200 * time.Millisecond)
		parks = p.b.progress.parks.Load()
		time.Sleep(200 * time.Millisecond)
		require.LessOrEqual(t, p.b.progress.parks.Load()-parks, int64(2), "shm %v: the idle thread keeps waking", shm)
		close(peer)
		<-peerDone
	}
}

func parkedProgressThread(stacks string) bool {
	for _, g := range strings.Split(stacks, "\n\n") {
		if strings.Contains(g, "runProgressThread") && strings.Contains(g, "WaitForEvents") {
			return true
		}
	}
	return false
}

// Over tcp, a peer that never progresses can leave UCX's connection socket polling for
// writability: the worker's event fd stays readable with nothing for UCX to do, and a
// parked waiter would return at once, every time (a core spinning). The parker then
// waits for a new event, bounded, instead of that readiness.
func TestProgressThreadIgnoresStaleReadiness(t *testing.T) {
	stale := 0
	for i := 0; i < 4 && stale == 0; i++ {
		p := addressPair(t, WorkerParams{ProgressThread: true}, false)
		b := hostBackend(t)
		tg := newTarget(t, p, b, 8, 1)
		targetAdd(t, p, tg)
		// From here A never progresses.
		time.Sleep(100 * time.Millisecond)
		if !readable(uintptr(p.b.efd)) {
			continue // UCX left nothing ready: this pair shows nothing
		}
		stale++
		parks := p.b.progress.parks.Load()
		time.Sleep(500 * time.Millisecond)
		n := p.b.progress.parks.Load() - parks
		t.Logf("pair %d: the event fd stays readable; %d parks in 500 ms", i, n)
		// Honouring the readiness, a 100 µs spin between parks made ~4000.
		require.Less(t, n, int64(200), "a parked waiter returned at once on stale readiness")
		// A real event still wakes it: A's atomic lands (B's thread applies it) at once.
		require.Equal(t, uint64(1), targetAdd(t, p, tg))
	}
	if stale == 0 {
		t.Skip("UCX left no connection polling for writability in four pairs")
	}
}

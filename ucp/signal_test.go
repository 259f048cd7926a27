package ucp

import (
	"bytes"
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/stream"
)

// shmPairWith is newShmPair with B's worker made with pb.
func shmPairWith(t *testing.T, pb WorkerParams) *pair { return addressPair(t, pb, true) }

// addressPair connects two workers by sealed worker address; b gets pb. Over shared
// memory, without peer error handling (UCX 1.13 then picks shm); else tcp.
func addressPair(t *testing.T, pb WorkerParams, shm bool) *pair {
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

func newTarget(t *testing.T, p *pair, b stream.Backend, n, words int) *target {
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

// A process that is only a target: with ProgressThread, a remote atomic on a signal
// word that a CUDA-like waiter polls (here the host, reading the word without any ucpx
// call) lands with no progress loop of the target's; idle, the thread parks.
func TestProgressThreadServesTarget(t *testing.T) {
	p := shmPairWith(t, WorkerParams{ProgressThread: true})
	b := hostBackend(t)
	tg := newTarget(t, p, b, 8, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := 1; i <= 20; i++ {
		r, err := p.epA.AtomicNbx(AtomicParam{Op: AtomicAdd, Operand: 1, Fetch: true}, tg.sigs.Addr(0), tg.sigKey, nil)
		require.NoError(t, err)
		require.NoError(t, r.Wait(ctx))
		require.Equal(t, uint64(i-1), r.Fetched())
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
	buf := make([]byte, 1<<20)
	require.NotContains(t, string(buf[:runtime.Stack(buf, true)]), "runProgressThread")
}

func parkedProgressThread(stacks string) bool {
	for _, g := range strings.Split(stacks, "\n\n") {
		if strings.Contains(g, "runProgressThread") && strings.Contains(g, "WaitForEvents") {
			return true
		}
	}
	return false
}

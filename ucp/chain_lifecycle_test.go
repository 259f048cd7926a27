package ucp

import (
	"context"
	"reflect"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
)

// chainRunnerOf is ch's runner (nil before its first operation).
func chainRunnerOf(ch *condition.Chain) *chainRunner {
	f := reflect.ValueOf(ch).Elem().FieldByName("runner")
	v := reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem().Interface()
	r, _ := v.(*chainRunner)
	return r
}

// waitPaused waits until r's run paused for a pulled message.
func waitPaused(t *testing.T, r *chainRunner) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.w.mu.Lock()
		paused := r.raw.Pulls() > 0
		r.w.mu.Unlock()
		if paused {
			return
		}
		require.True(t, time.Now().Before(deadline), "the run never paused for its pulled message")
		time.Sleep(time.Millisecond)
	}
}

// echoChain is [receive tag 1 into in] [send in, tag 2] on p.b.
func echoChain(t *testing.T, p *pair, in []byte) *condition.Chain {
	ch, err := condition.NewChain(condition.ChainParam{})
	require.NoError(t, err)
	_, err = p.b.TagRecvNbx(in, 1, MaxTag, &RequestParam{Chain: ch})
	require.NoError(t, err)
	require.NoError(t, ch.Then())
	_, err = p.epB.TagSendNbx(in, 2, &RequestParam{Chain: ch})
	require.NoError(t, err)
	return ch
}

// A chain dropped without Destroy (idle, with a run under way, or after its worker
// closed) is destroyed when collected: its pinned buffers are let go (a
// runtime.Pinner collected while pinning killed the process at the next GC) and its C
// side is freed.
func TestChainDroppedWithoutDestroy(t *testing.T) {
	p := newPair(t, nil)
	var runners []*chainRunner
	drop := func(start, keep bool) {
		ch, err := condition.NewChain(condition.ChainParam{})
		require.NoError(t, err)
		_, err = p.b.TagRecvNbx(make([]byte, 64), 1, MaxTag, &RequestParam{Chain: ch})
		require.NoError(t, err)
		if start {
			require.NoError(t, ch.Start()) // its receive waits for a message that never comes
		}
		if keep { // to see it destroyed; one nothing keeps is there for the GC
			runners = append(runners, chainRunnerOf(ch))
		}
	}
	destroyed := func(r *chainRunner) bool {
		r.w.mu.Lock()
		defer r.w.mu.Unlock()
		return r.destroyed
	}
	collect := func(rs []*chainRunner) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for i := 0; ; i++ {
			runtime.GC() // the process survives it
			all := true
			for _, r := range rs {
				all = all && destroyed(r)
			}
			if all && i >= 3 {
				return
			}
			require.True(t, time.Now().Before(deadline), "a dropped chain was not destroyed")
			time.Sleep(10 * time.Millisecond)
		}
	}
	drop(false, false)
	drop(true, false)
	drop(false, true)
	drop(true, true)
	collect(runners)

	// Dropped after its worker closed: freed all the same.
	b2, err := p.ctxB.NewWorker(WorkerParams{})
	require.NoError(t, err)
	ch, err := condition.NewChain(condition.ChainParam{})
	require.NoError(t, err)
	_, err = b2.TagRecvNbx(make([]byte, 64), 1, MaxTag, &RequestParam{Chain: ch})
	require.NoError(t, err)
	last := chainRunnerOf(ch)
	require.NoError(t, b2.Close())
	ch = nil
	collect([]*chainRunner{last})
	p.close(t)
	require.True(t, Live().Zero(), "%+v", Live())
}

// A chained receive that matches a pulled message which arrived before the chain
// posted it (UCX completes such a receive in its call) pulls the data like any other:
// the chain forwards the data, not the descriptor, and the sender's send completes.
func TestChainRecvMatchesPulledMessageAlreadyHere(t *testing.T) {
	const n = 64 << 10
	p, ctx, src, _, data := pullSource(t, n, 21)
	sr, err := p.epA.TagSendNbx(DeviceBuffer(src.Ptr(), n), 1, devParam)
	require.NoError(t, err)
	// Let the descriptor arrive at b unexpected: b's progress takes it in.
	for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end); {
		p.b.Progress()
		time.Sleep(100 * time.Microsecond)
	}

	in := make([]byte, n)
	ch := echoChain(t, p, in)
	require.NoError(t, ch.Start())
	waited := make(chan error, 1)
	go func() { waited <- ch.Wait(ctx) }()
	echo := make([]byte, n)
	got, _, err := p.a.TagRecv(ctx, echo, 2, MaxTag)
	require.NoError(t, err)
	require.Equal(t, n, got)
	require.Equal(t, checksum(data), checksum(echo), "the chain forwarded what it pulled")
	require.NoError(t, <-waited)
	require.NoError(t, sr.Wait(ctx), "the sender's send completes once its data was pulled")
	require.NoError(t, ch.Destroy())
}

// Destroy of a run paused for pulls that are being copied (started by Test) waits
// for the copies: once it returned, nothing writes the chain's buffer.
func TestChainDestroyWaitsForPullsInFlight(t *testing.T) {
	const n = 4 << 20
	p, ctx, src, _, data := pullSource(t, n, 22)
	observed := 0
	for it := 0; it < 10 && observed < 5; it++ {
		ch, err := condition.NewChain(condition.ChainParam{})
		require.NoError(t, err)
		in := make([]byte, n)
		_, err = p.b.TagRecvNbx(in, 1, MaxTag, &RequestParam{Chain: ch})
		require.NoError(t, err)
		require.NoError(t, ch.Start())
		sr, err := p.epA.TagSendNbx(DeviceBuffer(src.Ptr(), n), 1, devParam)
		require.NoError(t, err)
		r := chainRunnerOf(ch)
		var pulls []*Request
		done := false
		for len(pulls) == 0 && !done {
			done, err = ch.Test()
			require.NoError(t, err)
			r.w.mu.Lock()
			for _, q := range r.pulling {
				pulls = append(pulls, q)
			}
			r.w.mu.Unlock()
		}
		if len(pulls) == 0 {
			// The pull started and finished within one Test: nothing to observe.
			require.NoError(t, ch.Destroy())
			require.NoError(t, sr.Wait(ctx))
			continue
		}
		observed++
		require.NoError(t, ch.Destroy())
		for _, q := range pulls {
			require.True(t, q.Done(), "iteration %d: Destroy returned while a pull still copied into the chain's buffer", it)
		}
		clear(in)
		time.Sleep(10 * time.Millisecond)
		require.Equal(t, checksum(make([]byte, n)), checksum(in), "iteration %d: written after Destroy", it)
		require.NoError(t, sr.Wait(ctx), "its data was pulled")
	}
	require.NotZero(t, observed, "no iteration had its pull under way when Destroy came")
	_ = data
}

// Destroy of a run paused for a pulled message nobody pulled yet answers its sender:
// the send completes (as for a receive too short for it), and the sender's later
// pulled sends of the tag are received and completed as usual.
func TestChainDestroyPausedAnswersSender(t *testing.T) {
	const n = 64 << 10
	p, ctx, src, _, data := pullSource(t, n, 23)
	ch, err := condition.NewChain(condition.ChainParam{})
	require.NoError(t, err)
	in := make([]byte, n)
	_, err = p.b.TagRecvNbx(in, 1, MaxTag, &RequestParam{Chain: ch})
	require.NoError(t, err)
	require.NoError(t, ch.Start())
	sr, err := p.epA.TagSendNbx(DeviceBuffer(src.Ptr(), n), 1, devParam)
	require.NoError(t, err)
	waitPaused(t, chainRunnerOf(ch))
	require.NoError(t, ch.Destroy())
	// b answers; a drives itself in the background.
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, sr.Wait(sctx), "the send completes (answered as a receive too short answers)")
	require.NotEqual(t, checksum(data), checksum(in), "the data was not pulled")

	sr, err = p.epA.TagSendNbx(DeviceBuffer(src.Ptr(), n), 1, devParam)
	require.NoError(t, err)
	host := make([]byte, n)
	rr, err := p.b.TagRecvNbx(host, 1, MaxTag, nil)
	require.NoError(t, err)
	require.NoError(t, rr.Wait(ctx))
	require.Equal(t, checksum(data), checksum(host))
	require.NoError(t, sr.Wait(ctx))
}

// A run paused for a pulled message has not ended: Start (and Enqueue) give ErrBusy,
// and waiting for the run then pulls the message, forwards it and completes its send.
func TestChainStartWhilePausedIsBusy(t *testing.T) {
	const n = 64 << 10
	p, ctx, src, _, data := pullSource(t, n, 24)
	in := make([]byte, n)
	ch := echoChain(t, p, in)
	require.NoError(t, ch.Start())
	sr, err := p.epA.TagSendNbx(DeviceBuffer(src.Ptr(), n), 1, devParam)
	require.NoError(t, err)
	waitPaused(t, chainRunnerOf(ch))
	require.ErrorIs(t, ch.Start(), condition.ErrBusy)
	_, err = p.b.TagRecvNbx(make([]byte, 8), 3, MaxTag, &RequestParam{Chain: ch})
	require.ErrorIs(t, err, condition.ErrBusy)
	require.ErrorIs(t, ch.Then(), condition.ErrBusy)
	require.Nil(t, ch.Err(), "no error while the run has not ended")

	waited := make(chan error, 1)
	go func() { waited <- ch.Wait(ctx) }()
	echo := make([]byte, n)
	got, _, err := p.a.TagRecv(ctx, echo, 2, MaxTag)
	require.NoError(t, err)
	require.Equal(t, n, got)
	require.Equal(t, checksum(data), checksum(echo))
	require.NoError(t, <-waited)
	require.NoError(t, sr.Wait(ctx), "the first message's send completes")
	require.Equal(t, uint64(1), ch.Iterations())
	require.NoError(t, ch.Destroy())
}

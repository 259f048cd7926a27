package bootstrap

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/ucp"
)

// closeWithin runs close and fails the test if it has not returned by a deadline far
// beyond any bound Close keeps (a hang, not a slow machine).
func closeWithin(t *testing.T, what string, close func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- close() }()
	select {
	case err := <-done:
		return err
	case <-time.After(2 * time.Minute):
		t.Fatalf("%s did not return", what)
		return nil
	}
}

// Job.Close on the caller's worker, with endpoints without peer error handling (the
// shared-memory setting): UCX leaves force mode undefined there and ucp refuses it,
// and Close used to ignore the refusal, so every endpoint stayed open (ucp.Live
// counted them) with Close saying nil. Now Close flushes them under one bound: the
// endpoint to a quiet live rank closes cleanly, those to a rank that stopped
// progressing and to one that died unseen (its worker gone, as for a peer on another
// host: no pidfd tells) cannot flush the sends queued on them, and Close says so with
// ErrTimedOut naming both, having closed all three for ucp anyway.
func TestCloseNoPeerErrorHandlingOnCallersWorker(t *testing.T) {
	baseLive := ucp.Live()
	baseGoroutines := runtime.NumGoroutine()
	uctx, err := ucp.NewContext(ucp.ContextParams{})
	require.NoError(t, err)
	w, err := uctx.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	const caller, quiet, stalled, dead = 1, 0, 2, 3
	jobs := startJob(t, 4, func(r int) *Options {
		o := &Options{EndpointParams: ucp.EndpointParams{NoPeerErrorHandling: true}}
		if r == caller {
			o.Worker = w
		}
		return o
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The quiet rank receives one message: its endpoint has nothing left to flush.
	toQuiet, err := jobs[caller].Endpoint(quiet)
	require.NoError(t, err)
	buf := make([]byte, 8)
	recv, err := jobs[quiet].Worker().TagRecvNbx(buf, 1, ^uint64(0), nil)
	require.NoError(t, err)
	send, err := toQuiet.TagSendNbx([]byte("quietone"), 1, nil)
	require.NoError(t, err)
	require.NoError(t, send.Wait(ctx))
	require.NoError(t, recv.Wait(ctx))

	// The stalled and the dead rank never progress their workers: sends beyond what
	// their queues hold stay pending on the caller's worker.
	var pending []*ucp.Request
	toStuck := map[int]*ucp.Endpoint{}
	for _, r := range []int{stalled, dead} {
		ep, err := jobs[caller].Endpoint(r)
		require.NoError(t, err)
		toStuck[r] = ep
		for i := 0; i < 256; i++ {
			req, err := ep.TagSendNbx(make([]byte, 64), 2, nil)
			require.NoError(t, err)
			pending = append(pending, req)
		}
		w.Progress()
		require.False(t, pending[len(pending)-1].Done(), "no send to rank %d is pending: its endpoint would flush", r)
	}
	require.Equal(t, baseLive.Endpoints+3, ucp.Live().Endpoints)
	// The dead rank's worker goes (it leaves the job; in one process no pidfd tells
	// the caller's endpoint, as none would across hosts).
	require.NoError(t, closeWithin(t, "the dead rank's Close", jobs[dead].Close))

	err = closeWithin(t, "Close", jobs[caller].Close)
	t.Logf("Close: %v", err)
	assert.Equal(t, baseLive.Endpoints, ucp.Live().Endpoints, "Close left the job's endpoints open")
	require.ErrorIs(t, err, ErrTimedOut, "Close said nothing of the endpoints it could not flush")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "ranks [2 3]")
	assert.NotContains(t, err.Error(), "rank 0")
	for r, ep := range map[int]*ucp.Endpoint{quiet: toQuiet, stalled: toStuck[stalled], dead: toStuck[dead]} {
		_, err := ep.TagSendNbx(make([]byte, 8), 3, nil)
		assert.ErrorIs(t, err, ucp.ErrClosed, "the endpoint to rank %d is still usable", r)
	}
	require.ErrorIs(t, jobs[caller].Close(), ErrClosed)
	_, err = w.Address()
	require.NoError(t, err, "the caller's worker stays open")

	var wg sync.WaitGroup
	for _, r := range []int{quiet, stalled} {
		wg.Add(1)
		go func() { defer wg.Done(); assert.NoError(t, jobs[r].Close(), "rank %d", r) }()
	}
	wg.Wait()
	// What UCX still held for the unflushed endpoints ends with the caller's worker.
	require.NoError(t, closeWithin(t, "the caller's worker's Close", w.Close))
	for _, req := range pending {
		assert.True(t, req.Done(), "a send outlived the worker")
	}
	require.NoError(t, uctx.Close())
	assert.Equal(t, baseLive, ucp.Live())
	for deadline := time.Now().Add(30 * time.Second); runtime.NumGoroutine() > baseGoroutines && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	assert.LessOrEqual(t, runtime.NumGoroutine(), baseGoroutines)
}

// An endpoint without peer error handling whose dial ends after Close began is
// closed too (it used to stay open: its force close was refused, and on the caller's
// worker nothing else closes it).
func TestNoPeerErrorHandlingEndpointDialedDuringClose(t *testing.T) {
	baseLive := ucp.Live()
	uctx, err := ucp.NewContext(ucp.ContextParams{})
	require.NoError(t, err)
	defer func() { require.NoError(t, uctx.Close()); assert.Equal(t, baseLive, ucp.Live()) }()
	w, err := uctx.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	j := startJob(t, 1, func(int) *Options {
		return &Options{Worker: w, EndpointParams: ucp.EndpointParams{NoPeerErrorHandling: true}}
	})[0]
	dialed, release := make(chan struct{}), make(chan struct{})
	defer func(f func()) { afterConnect = f }(afterConnect)
	afterConnect = func() { close(dialed); <-release }
	got := make(chan error, 1)
	go func() { _, err := j.Endpoint(0); got <- err }()
	<-dialed
	closed := make(chan error, 1)
	go func() { closed <- j.Close() }()
	require.Eventually(t, func() bool { j.mu.Lock(); defer j.mu.Unlock(); return j.closed }, 5*time.Second, time.Millisecond)
	close(release)
	require.ErrorIs(t, closeWithin(t, "Endpoint", func() error { return <-got }), ErrClosed)
	require.NoError(t, closeWithin(t, "Close", func() error { return <-closed }))
	assert.Equal(t, baseLive.Endpoints, ucp.Live().Endpoints, "the late endpoint stayed open")
}

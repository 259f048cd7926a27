package tests

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/internal/testenv"
	"github.com/ucpx/ucpx/internal/testenv/streamenv"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// envStickyChild marks the child process TestStickyErrorUnderFakeDriver runs: only
// there may the fake driver's context be made to fail.
const envStickyChild = "UCPX_TEST_STICKY_CHILD"

// gatedCUDACondition is, in the fake driver's child only, a CUDA stream held back by a
// gate word (store 1 to open it), a worker, and a Stream condition on the stream.
func gatedCUDACondition(t *testing.T) (stream.Stream, *stream.Word, *ucp.Worker, *condition.Condition) {
	if os.Getenv(envStickyChild) == "" {
		t.Skip("run by TestStickyErrorUnderFakeDriver against the fake driver")
	}
	b := streamenv.CUDABackend(t)
	s, err := b.NewStream()
	require.NoError(t, err)
	gate, err := b.AllocWords(1)
	require.NoError(t, err)
	require.NoError(t, s.WaitValue(gate.Word(0), 1, stream.GEQ))
	uctx, err := ucp.NewContext(ucp.ContextParams{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = uctx.Close() })
	w, err := uctx.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: s})
	require.NoError(t, err)
	return s, gate.Word(0), w, c
}

// A CUDA stream whose context met a sticky error (an illegal address) before it reached
// an operation's trigger runs nothing more: the operation fails with the stream's
// error instead of waiting for a trigger that never comes, and the condition can be
// destroyed. Only under the fake driver, which can be told its context died
// (FAKECUDA_STICKY); a real GPU's would stay dead for the rest of the process.
func TestFakeDriverStickyErrorBeforeTrigger(t *testing.T) {
	_, gate, w, c := gatedCUDACondition(t)
	r, err := w.TagRecvNbx(make([]byte, 8), 1, ^uint64(0), &ucp.RequestParam{Condition: c})
	require.NoError(t, err)
	t.Setenv("FAKECUDA_STICKY", "700") // CUDA_ERROR_ILLEGAL_ADDRESS
	gate.Store(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = r.Wait(ctx)
	require.Error(t, err)
	require.NotErrorIs(t, err, context.DeadlineExceeded, "the operation waited for a trigger a dead stream never stores")
	require.ErrorIs(t, c.Err(), err)
	require.NoError(t, c.Destroy(), "a condition of a dead stream is destroyed")
}

// A CUDA stream closed while an operation's trigger is still queued on it drains
// normally: the trigger is stored during the drain and the operation runs, rather than
// failing as if the stream had stopped.
func TestFakeDriverCloseWhileTriggerQueued(t *testing.T) {
	s, gate, w, c := gatedCUDACondition(t)
	addr, err := w.Address()
	require.NoError(t, err)
	ep, err := w.ConnectAddress(addr, &ucp.EndpointParams{NoPeerErrorHandling: true})
	require.NoError(t, err)
	buf := make([]byte, 8)
	r, err := w.TagRecvNbx(buf, 1, ^uint64(0), &ucp.RequestParam{Condition: c})
	require.NoError(t, err)
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }() // drains: the trigger is stored before it returns
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); {
		w.Progress()
		time.Sleep(time.Millisecond)
	}
	gate.Store(1)
	sr, err := ep.TagSendNbx([]byte("12345678"), 1, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, sr.Wait(ctx))
	require.NoError(t, <-closed, "the stream drained normally")
	require.NoError(t, r.Wait(ctx), "an operation whose trigger the stream stored before its normal close")
	require.Equal(t, "12345678", string(buf))
}

// TestStickyErrorUnderFakeDriver runs the fake-driver tests of this file against the
// fake driver.
func TestStickyErrorUnderFakeDriver(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a child process against the fake driver")
	}
	testenv.RunUnderFakeDriver(t, []string{"TestFakeDriverStickyErrorBeforeTrigger", "TestFakeDriverCloseWhileTriggerQueued"}, envStickyChild+"=1")
}

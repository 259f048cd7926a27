package tests

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/internal/testenv"
	"github.com/ucpx/ucpx/internal/testenv/streamenv"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// A Stream condition on a CUDA stream held back by a wait nobody answers takes
// condition.MaxPendingCUDA operations and refuses the next with ErrStreamFull (which
// matches ErrBusy) instead of enqueueing it: past a few thousand memops behind such a
// wait the driver's enqueue call blocks, and the caller with it. Once the stream moves
// on every operation completes, and the condition takes more.
func TestGPUStreamConditionDepth(t *testing.T) {
	b := streamenv.CUDABackend(t)
	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	gate, err := b.AllocWords(1)
	require.NoError(t, err)
	defer gate.Close()
	require.NoError(t, s.WaitValue(gate.Word(0), 1, stream.GEQ))

	var ws [2]*ucp.Worker
	for i := range ws {
		uctx, err := ucp.NewContext(ucp.ContextParams{})
		require.NoError(t, err)
		defer uctx.Close()
		ws[i], err = uctx.NewWorker(ucp.WorkerParams{})
		require.NoError(t, err)
	}
	addr, err := ws[1].Address()
	require.NoError(t, err)
	ep, err := ws[0].ConnectAddress(addr, &ucp.EndpointParams{NoPeerErrorHandling: true})
	require.NoError(t, err)
	c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: s})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = condition.MaxPendingCUDA
	received := make(chan error, 1)
	go func() { // the receiver takes every message, so no send waits for room
		in := make([]byte, 8)
		for range 2*n + 1 {
			r, err := ws[1].TagRecvNbx(in, 1, ^uint64(0), nil)
			if err == nil {
				err = r.Wait(ctx)
			}
			if err != nil {
				received <- err
				return
			}
		}
		received <- nil
	}()

	out := []byte("8 bytes!")
	var reqs []*ucp.Request
	enqueued := make(chan error, 1)
	go func() {
		for range 4 * n {
			r, err := ep.TagSendNbx(out, 1, &ucp.RequestParam{Condition: c})
			if err != nil {
				enqueued <- err
				return
			}
			reqs = append(reqs, r)
		}
		enqueued <- nil
	}()
	select {
	case err := <-enqueued:
		require.ErrorIs(t, err, condition.ErrStreamFull)
		require.ErrorIs(t, err, condition.ErrBusy)
		require.ErrorIs(t, err, ucp.ErrBusy)
	case <-time.After(time.Minute):
		require.FailNow(t, "an enqueue hung behind the closed gate")
	}
	require.Len(t, reqs, n)

	gate.Word(0).Store(1)
	for i, r := range reqs {
		require.NoError(t, r.Wait(ctx), "operation %d", i)
	}
	require.NoError(t, s.Synchronize())
	r, err := ep.TagSendNbx(out, 1, &ucp.RequestParam{Condition: c})
	require.NoError(t, err, "the condition takes operations again")
	require.NoError(t, r.Wait(ctx))
	require.NoError(t, s.Synchronize())

	// Groups count their operations one by one too: behind the closed gate again,
	// groups of one operation stop at the bound as single operations do.
	gate.Word(0).Store(0)
	require.NoError(t, s.WaitValue(gate.Word(0), 1, stream.GEQ))
	reqs = reqs[:0]
	go func() {
		for range 4 * n {
			if err := c.BeginGroup(); err != nil {
				enqueued <- err
				return
			}
			r, err := ep.TagSendNbx(out, 1, &ucp.RequestParam{Condition: c})
			if gerr := c.EndGroup(); err == nil {
				err = gerr
			}
			if err != nil {
				enqueued <- err
				return
			}
			reqs = append(reqs, r)
		}
		enqueued <- nil
	}()
	select {
	case err := <-enqueued:
		require.ErrorIs(t, err, condition.ErrStreamFull)
	case <-time.After(time.Minute):
		require.FailNow(t, "an enqueue of a group hung behind the closed gate")
	}
	require.Len(t, reqs, n)
	gate.Word(0).Store(1)
	for i, r := range reqs {
		require.NoError(t, r.Wait(ctx), "grouped operation %d", i)
	}
	require.NoError(t, <-received)
	require.NoError(t, s.Synchronize())
	require.NoError(t, c.Destroy())
}

// TestStreamDepthUnderFakeDriver runs TestGPUStreamConditionDepth against the fake
// driver (a CPU emulation of libcuda), so CI checks the bound's logic.
func TestStreamDepthUnderFakeDriver(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a child process against the fake driver")
	}
	testenv.RunUnderFakeDriver(t, []string{"TestGPUStreamConditionDepth"})
}

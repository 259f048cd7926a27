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

// The Stream conditions on a CUDA stream held back by a wait nobody answers take
// condition.MaxPendingCUDA operations together and refuse the next with ErrStreamFull (which
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
	// A second wrapper of s, for the last part: made now, while nothing holds s back
	// (WrapCUDAStream loads ucpx's kernels, and loading a module waits for the
	// context's streams).
	wrapped, err := stream.WrapCUDAStream(s.Handle())
	require.NoError(t, err)
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
		for range 3*n + 1 {
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
	send := func() (*ucp.Request, error) { return ep.TagSendNbx(out, 1, &ucp.RequestParam{Condition: c}) }
	reqs := fillUntilRefused(t, n, "single", send)
	gate.Word(0).Store(1)
	waitEach(t, ctx, reqs)
	require.NoError(t, s.Synchronize())
	r, err := send()
	require.NoError(t, err, "the condition takes operations again")
	require.NoError(t, r.Wait(ctx))
	require.NoError(t, s.Synchronize())

	// Groups count their operations one by one too: behind the closed gate again,
	// groups of one operation stop at the bound as single operations do.
	gate.Word(0).Store(0)
	require.NoError(t, s.WaitValue(gate.Word(0), 1, stream.GEQ))
	reqs = fillUntilRefused(t, n, "grouped", func() (*ucp.Request, error) {
		if err := c.BeginGroup(); err != nil {
			return nil, err
		}
		r, err := send()
		if gerr := c.EndGroup(); err == nil {
			err = gerr
		}
		return r, err
	})
	gate.Word(0).Store(1)
	waitEach(t, ctx, reqs)
	require.NoError(t, s.Synchronize())

	// The bound is the stream's, not the condition's: every condition's operations
	// wait in the stream's one queue. A second condition, on another wrapper of the
	// same CUDA stream, takes what the first left of the bound, and then neither
	// takes more.
	gate.Word(0).Store(0)
	require.NoError(t, s.WaitValue(gate.Word(0), 1, stream.GEQ))
	c2, err := condition.Create(condition.Param{Category: condition.Stream, Backend: b, Stream: wrapped})
	require.NoError(t, err)
	reqs = reqs[:0]
	for range n / 4 {
		r, err := send()
		require.NoError(t, err)
		reqs = append(reqs, r)
	}
	reqs = append(reqs, fillUntilRefused(t, n-n/4, "second condition", func() (*ucp.Request, error) {
		return ep.TagSendNbx(out, 1, &ucp.RequestParam{Condition: c2})
	})...)
	_, err = send()
	require.ErrorIs(t, err, condition.ErrStreamFull, "the first condition is refused too")
	gate.Word(0).Store(1)
	waitEach(t, ctx, reqs)
	require.NoError(t, <-received)
	require.NoError(t, s.Synchronize())
	require.NoError(t, c2.Destroy())
	require.NoError(t, wrapped.Close())
	require.NoError(t, c.Destroy())
}

// fillUntilRefused enqueues (on a goroutine, so that a hang fails the test) until
// enqueue is refused, and checks that it took n operations and was refused with
// ErrStreamFull, which matches condition's and ucp's ErrBusy.
func fillUntilRefused(t *testing.T, n int, what string, enqueue func() (*ucp.Request, error)) []*ucp.Request {
	t.Helper()
	var reqs []*ucp.Request
	refused := make(chan error, 1)
	go func() {
		for range 4 * n {
			r, err := enqueue()
			if err != nil {
				refused <- err
				return
			}
			reqs = append(reqs, r)
		}
		refused <- nil
	}()
	select {
	case err := <-refused:
		require.ErrorIs(t, err, condition.ErrStreamFull, what)
		require.ErrorIs(t, err, condition.ErrBusy, what)
		require.ErrorIs(t, err, ucp.ErrBusy, what)
	case <-time.After(time.Minute):
		require.FailNow(t, "an enqueue hung behind the closed gate", what)
	}
	require.Equal(t, n, len(reqs), what)
	return reqs
}

// waitEach waits for every request.
func waitEach(t *testing.T, ctx context.Context, reqs []*ucp.Request) {
	t.Helper()
	for i, r := range reqs {
		require.NoError(t, r.Wait(ctx), "operation %d", i)
	}
}

// TestStreamDepthUnderFakeDriver runs TestGPUStreamConditionDepth against the fake
// driver (a CPU emulation of libcuda), so CI checks the bound's logic.
func TestStreamDepthUnderFakeDriver(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a child process against the fake driver")
	}
	testenv.RunUnderFakeDriver(t, []string{"TestGPUStreamConditionDepth"})
}

package prepare_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/internal/testenv"
	"github.com/ucpx/ucpx/prepare"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// TestCUDAFakeDriver runs the CUDA graph tests of prepare against the CPU emulation of
// the driver (cgo/cuda/testdata/fakecuda) where there is no GPU.
func TestCUDAFakeDriver(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a child process against the fake driver")
	}
	testenv.RunUnderFakeDriver(t, []string{"TestCUDAPreadyNodeGatesWaitInTurn"})
}

// PreadyNode's gates (the memop waits for the receiver's ready flags) of one request in
// one CUDA graph wait one after another, and the user's dependencies go on the node
// after each gate: a graph of 8 partitions has one gate waiting at a time, before the
// receiver starts the iteration and after (the fake driver refuses to instantiate a
// graph where more memop waits than FAKECUDA_MAX_BLOCKED_WAITS would wait at once). Before,
// each partition's gate waited as soon as its dependencies were done, outside the chain
// that orders graph.CUDA's completion waits: a gate per partition (up to 1024) held a
// hardware work queue each until the receiver started, enough to leave the context's
// other work none. The launches still move every partition.
func TestCUDAPreadyNodeGatesWaitInTurn(t *testing.T) {
	testenv.RequireGPU(t)
	b, err := stream.Open(stream.CUDA)
	require.NoError(t, err)
	defer b.Close()
	cctx, _, ok := stream.CUDAContext(b)
	require.True(t, ok)

	// The sender's worker has a progress thread: nothing on the host calls it per launch.
	l := &link{}
	l.ctxS, err = ucp.NewContext(ucp.ContextParams{})
	require.NoError(t, err)
	defer l.ctxS.Close()
	l.ctxR, err = ucp.NewContext(ucp.ContextParams{})
	require.NoError(t, err)
	defer l.ctxR.Close()
	l.s, err = l.ctxS.NewWorker(ucp.WorkerParams{ProgressThread: true})
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

	const parts, size, launches = 8, 256, 3
	send, recv, sbuf, rbuf := pairWith(t, l, parts*size, parts, parts, 0x6a7e, func(p prepare.Params) prepare.Params {
		p.Backend = b
		return p
	})
	defer func() {
		require.NoError(t, send.Free())
		require.NoError(t, recv.Free())
	}()
	fill(sbuf, 7)

	cg, err := cctx.NewGraph()
	require.NoError(t, err)
	defer cg.Close()
	g := graph.CUDA{Graph: cg}
	for p := range parts {
		produce, err := cg.AddEmptyNode(nil) // stands for the kernel that fills p
		require.NoError(t, err)
		_, err = send.PreadyNode(g, []condition.Node{produce}, p)
		require.NoError(t, err)
	}
	t.Setenv("FAKECUDA_MAX_BLOCKED_WAITS", "1")
	x, err := cg.Instantiate(0)
	require.NoError(t, err, "more than one memop wait of the graph waits at once")
	defer x.Close()

	s, err := b.NewStream()
	require.NoError(t, err)
	defer s.Close()
	cs, ok := stream.CUDAStream(s)
	require.True(t, ok)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := 1; i <= launches; i++ {
		clear(rbuf)
		require.NoError(t, x.Launch(cs))
		require.NoError(t, recv.Start())
		require.NoError(t, recv.Wait(ctx), "launch %d", i)
		require.NoError(t, checkFilled(rbuf, 7), "launch %d", i)
	}
	done := make(chan error, 1)
	go func() { done <- s.Synchronize() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		require.FailNow(t, "the launches did not complete")
	}
	require.Equal(t, uint64(launches), recv.Stats().Iterations)
}

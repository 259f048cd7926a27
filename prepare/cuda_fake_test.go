package prepare_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/internal/testenv"
	"github.com/ucpx/ucpx/internal/testenv/streamenv"
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
	testenv.RunUnderFakeDriver(t, []string{"TestCUDAPreadyNodeGatesWaitInTurn", "TestCUDAPreadyNodeRefusedLeavesTheGraph"})
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
	const parts, size, launches = 8, 256, 3
	b, cctx, send, recv, sbuf, rbuf := cudaPair(t, parts, size)
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
	launchAndReceive(t, b, x, recv, rbuf, 7, launches)
}

// A PreadyNode that the driver refuses midway (here the condition's nodes: the fake
// driver refuses adds past FAKECUDA_GRAPH_NODES_MAX nodes) takes the nodes it added back
// out, so the graph is as it was and PreadyNode of the same partition can be retried.
// Before, the gate stayed: it took the partition's ready flag at every launch, and
// the retry's gate then waited for that flag for good (the launch hung).
func TestCUDAPreadyNodeRefusedLeavesTheGraph(t *testing.T) {
	testenv.RequireFakeDriver(t)
	const parts, size = 2, 256
	b, cctx, send, recv, sbuf, rbuf := cudaPair(t, parts, size)
	fill(sbuf, 3)
	cg, err := cctx.NewGraph()
	require.NoError(t, err)
	defer cg.Close()
	g := graph.CUDA{Graph: cg}
	count := func() int {
		t.Helper()
		nodes, err := cg.Nodes()
		require.NoError(t, err)
		return len(nodes)
	}
	_, err = send.PreadyNode(g, nil, 0)
	require.NoError(t, err)
	n := count()

	t.Setenv("FAKECUDA_GRAPH_NODES_MAX", strconv.Itoa(n+1)) // the gate fits, the condition's nodes do not
	_, err = send.PreadyNode(g, nil, 1)
	require.ErrorIs(t, err, cuda.ErrOutOfMemory)
	require.Equal(t, n, count(), "nodes after a refused PreadyNode")
	require.NoError(t, os.Unsetenv("FAKECUDA_GRAPH_NODES_MAX"))

	_, err = send.PreadyNode(g, nil, 1)
	require.NoError(t, err, "PreadyNode retried")
	require.Equal(t, 2*n, count())
	x, err := cg.Instantiate(0)
	require.NoError(t, err)
	defer x.Close()
	launchAndReceive(t, b, x, recv, rbuf, 3, 2)
}

// cudaPair makes a send and a receive request of parts partitions of size bytes on a
// CUDA backend (host buffers), prepared together; the sender's worker has a progress
// thread, as nothing on the host calls it per launch of a CUDA graph. The requests, the
// workers and the backend are freed once the test is done.
func cudaPair(t *testing.T, parts, size int) (b stream.Backend, cctx *cuda.Context, send, recv *prepare.Request, sbuf, rbuf []byte) {
	t.Helper()
	b = streamenv.CUDABackend(t)
	cctx, _, ok := stream.CUDAContext(b)
	require.True(t, ok)

	l := &link{}
	var err error
	l.ctxS, err = ucp.NewContext(ucp.ContextParams{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.ctxS.Close() })
	l.ctxR, err = ucp.NewContext(ucp.ContextParams{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.ctxR.Close() })
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

	send, recv, sbuf, rbuf = pairWith(t, l, parts*size, parts, parts, 0x6a7e, func(p prepare.Params) prepare.Params {
		p.Backend = b
		return p
	})
	return b, cctx, send, recv, sbuf, rbuf
}

// launchAndReceive launches x launches times, the receiver starting and waiting for
// each iteration and finding rbuf filled with seed, then waits for the launches.
func launchAndReceive(t *testing.T, b stream.Backend, x *cuda.GraphExec, recv *prepare.Request, rbuf []byte, seed, launches int) {
	t.Helper()
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
		require.NoError(t, checkFilled(rbuf, seed), "launch %d", i)
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

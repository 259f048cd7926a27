package graph_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/internal/testenv/streamenv"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// BenchmarkGraphVsStream: N 8-byte sends (and the N matching receives on the peer
// worker) per iteration, either as N communication nodes of one graph (a sender graph
// and a receiver graph, each launched once per iteration), as one communication node
// carrying the N operations in each graph ("graph-one-node"), or as 2N stream-condition
// enqueues per iteration with one stream-ordered wait per stream for the batch. On
// host streams the graphs are host graphs; on cuda (skipped without a GPU) they are
// CUDA graphs of batch-memop nodes. Reported:
//
//	enqueue-ns/op  CPU time of the calls that submit the iteration's work, per operation
//	ns/op-done     wall time per operation until both streams finished the iteration
func BenchmarkGraphVsStream(b *testing.B) {
	for _, kind := range []stream.Kind{stream.KindHost, stream.KindCUDA} {
		for _, n := range []int{1, 16, 256} {
			for _, path := range []string{"graph", "graph-one-node", "stream"} {
				b.Run(fmt.Sprintf("%s/%s/N=%d", kind, path, n), func(b *testing.B) { benchGraphVsStream(b, kind, path, n) })
			}
		}
	}
}

// benchBackend opens the backend of kind for the benchmark (closed at its end); CUDA
// skips or fails as testenv.RequireGPU does (UCPX_REQUIRE_GPU=1, the GPU bundle, makes
// its absence a failure).
func benchBackend(b *testing.B, kind stream.Kind) stream.Backend {
	b.Helper()
	if kind == stream.KindHost {
		return streamenv.HostBackend(b)
	}
	return streamenv.CUDABackend(b)
}

// Inside the timed sections an error is checked before require.NoError is called:
// require calls b.Helper on every call, whose cost would be measured with the work.

func benchGraphVsStream(b *testing.B, kind stream.Kind, path string, n int) {
	backend := benchBackend(b, kind)
	l := newLink(b) // its workers are closed when the benchmark run ends
	require.NoError(b, l.backend.Close())
	l.backend = backend
	out := make([][]byte, n)
	in := make([][]byte, n)
	for i := range out {
		out[i], in[i] = make([]byte, 8), make([]byte, 8)
	}
	ss, err := backend.NewStream()
	require.NoError(b, err)
	defer ss.Close()
	rs, err := backend.NewStream()
	require.NoError(b, err)
	defer rs.Close()
	// sync waits for both streams, failing instead of hanging past a generous bound.
	sync := func() {
		deadline := time.Now().Add(20 * time.Second)
		for _, s := range []stream.Stream{ss, rs} {
			for {
				done, err := s.Query()
				if err != nil {
					require.NoError(b, err)
				}
				if done {
					break
				}
				if time.Now().After(deadline) {
					require.FailNowf(b, "streams still busy", "%s/%s N=%d: streams still busy after 20 s", kind, path, n)
				}
			}
		}
	}
	var submit time.Duration
	b.ResetTimer()
	switch path {
	case "graph", "graph-one-node":
		b.StopTimer()
		sg, rg, launch, closeGraphs := benchGraphs(b, backend, ss, rs)
		var conds []*condition.Condition
		var sc, rc *condition.Condition
		for i := 0; i < n; i++ {
			if path == "graph" || i == 0 { // graph-one-node: one node carries all N
				var err error
				sc, err = condition.Create(condition.Param{Category: condition.Graph, Backend: backend, Graph: sg})
				require.NoError(b, err)
				rc, err = condition.Create(condition.Param{Category: condition.Graph, Backend: backend, Graph: rg})
				require.NoError(b, err)
				conds = append(conds, sc, rc)
			}
			_, err := l.ab.TagSendNbx(out[i], uint64(i), &ucp.RequestParam{Condition: sc})
			require.NoError(b, err)
			_, err = l.b.TagRecvNbx(in[i], uint64(i), ^uint64(0), &ucp.RequestParam{Condition: rc})
			require.NoError(b, err)
		}
		start := launch()
		b.StartTimer()
		for it := 0; it < b.N; it++ {
			t0 := time.Now()
			if err := start(); err != nil {
				require.NoError(b, err)
			}
			submit += time.Since(t0)
			sync()
		}
		b.StopTimer()
		closeGraphs()
		for _, c := range conds {
			require.NoError(b, c.Err())
			_ = c.Destroy()
		}
	case "stream":
		sc, _ := condition.Create(condition.Param{Category: condition.Stream, Backend: backend, Stream: ss})
		rc, _ := condition.Create(condition.Param{Category: condition.Stream, Backend: backend, Stream: rs})
		sp := &ucp.RequestParam{Condition: sc, Flags: ucp.NonBlockingEnqueue}
		rp := &ucp.RequestParam{Condition: rc, Flags: ucp.NonBlockingEnqueue}
		for it := 0; it < b.N; it++ {
			t0 := time.Now()
			var lastSend, lastRecv *ucp.Request
			for i := 0; i < n; i++ {
				r, err := l.b.TagRecvNbx(in[i], uint64(i), ^uint64(0), rp)
				if err != nil {
					require.NoError(b, err)
				}
				lastRecv = r
				if lastSend, err = l.ab.TagSendNbx(out[i], uint64(i), sp); err != nil {
					require.NoError(b, err)
				}
			}
			// One stream-ordered wait per stream for the whole batch, as each graph's
			// end is: the receiving stream finishes once every receive completed.
			if err := lastSend.WaitOnStream(ss); err != nil {
				require.NoError(b, err)
			}
			if err := lastRecv.WaitOnStream(rs); err != nil {
				require.NoError(b, err)
			}
			submit += time.Since(t0)
			sync()
		}
		b.StopTimer()
		require.NoError(b, sc.Err())
		require.NoError(b, rc.Err())
		_ = sc.Destroy()
		_ = rc.Destroy()
	}
	ops := float64(b.N * n)
	b.ReportMetric(float64(submit.Nanoseconds())/ops, "enqueue-ns/op")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/ops, "ns/op-done")
}

// benchGraphs makes the sender and receiver graphs of backend's kind; launch returns
// the function that launches both once (receiver first), after instantiating them.
func benchGraphs(b *testing.B, backend stream.Backend, ss, rs stream.Stream) (sg, rg condition.GraphBuilder, launch func() func() error, closeAll func()) {
	if backend.Kind() == stream.KindHost {
		hs, hr := graph.NewHost(), graph.NewHost()
		var sx, rx *graph.HostExec
		launch = func() func() error {
			var err error
			sx, err = hs.Instantiate()
			require.NoError(b, err)
			rx, err = hr.Instantiate()
			require.NoError(b, err)
			return func() error {
				if err := rx.Launch(rs); err != nil {
					return err
				}
				return sx.Launch(ss)
			}
		}
		closeAll = func() {
			_ = sx.Close()
			_ = rx.Close()
		}
		return hs, hr, launch, closeAll
	}
	ctx, _, _ := stream.CUDAContext(backend)
	cs, _ := stream.CUDAStream(ss)
	cr, _ := stream.CUDAStream(rs)
	gs, err := ctx.NewGraph()
	require.NoError(b, err)
	gr, err := ctx.NewGraph()
	require.NoError(b, err)
	var sx, rx *cuda.GraphExec
	launch = func() func() error {
		var err error
		sx, err = gs.Instantiate(0)
		require.NoError(b, err)
		rx, err = gr.Instantiate(0)
		require.NoError(b, err)
		// Sender first: CUDA may serialize independent graph branches of one context
		// onto one hardware queue, so a receive's blocked wait launched first could
		// sit ahead of the send triggers it waits for (see graph.CUDA).
		return func() error {
			if err := sx.Launch(cs); err != nil {
				return err
			}
			return rx.Launch(cr)
		}
	}
	closeAll = func() {
		_ = sx.Close()
		_ = rx.Close()
		_ = gs.Close()
		_ = gr.Close()
	}
	return graph.CUDA{Graph: gs}, graph.CUDA{Graph: gr}, launch, closeAll
}

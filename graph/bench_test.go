package graph_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/graph"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// BenchmarkGraphVsStream: N 8-byte sends (and the N matching receives on the peer
// worker) per iteration, either as N communication nodes of one host graph launched
// once per iteration, or as N stream-condition enqueues per iteration. Reported:
//
//	enqueue-ns/op  CPU time of the calls that submit the iteration's work, per operation
//	ns/op-done     wall time per operation until the iteration completed
func BenchmarkGraphVsStream(b *testing.B) {
	for _, n := range []int{1, 16, 256} {
		for _, path := range []string{"graph", "stream"} {
			b.Run(fmt.Sprintf("%s/N=%d", path, n), func(b *testing.B) { benchGraphVsStream(b, path, n) })
		}
	}
}

func benchGraphVsStream(b *testing.B, path string, n int) {
	t := &testing.T{}
	l := newLink(t)
	defer func() {
		for _, c := range l.contexts {
			_ = c.Close()
		}
		_ = l.backend.Close()
	}()
	out := make([][]byte, n)
	in := make([][]byte, n)
	for i := range out {
		out[i], in[i] = make([]byte, 8), make([]byte, 8)
	}
	ss, _ := l.backend.NewStream()
	rs, _ := l.backend.NewStream()
	defer ss.Close()
	defer rs.Close()
	var submit time.Duration
	b.ResetTimer()
	switch path {
	case "graph":
		b.StopTimer()
		sg, rg := graph.NewHost(), graph.NewHost()
		var conds []*condition.Condition
		for i := 0; i < n; i++ {
			sc, _ := condition.Create(condition.Param{Category: condition.Graph, Backend: l.backend, Graph: sg})
			rc, _ := condition.Create(condition.Param{Category: condition.Graph, Backend: l.backend, Graph: rg})
			if _, err := l.ab.TagSendNbx(out[i], uint64(i), &ucp.RequestParam{Condition: sc}); err != nil {
				b.Fatal(err)
			}
			if _, err := l.b.TagRecvNbx(in[i], uint64(i), ^uint64(0), &ucp.RequestParam{Condition: rc}); err != nil {
				b.Fatal(err)
			}
			conds = append(conds, sc, rc)
		}
		sx, _ := sg.Instantiate()
		rx, _ := rg.Instantiate()
		b.StartTimer()
		for it := 0; it < b.N; it++ {
			t0 := time.Now()
			_ = rx.Launch(rs)
			_ = sx.Launch(ss)
			submit += time.Since(t0)
			if err := ss.Synchronize(); err != nil {
				b.Fatal(err)
			}
			if err := rs.Synchronize(); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		_ = sx.Close()
		_ = rx.Close()
		for _, c := range conds {
			_ = c.Destroy()
		}
	case "stream":
		sc, _ := condition.Create(condition.Param{Category: condition.Stream, Backend: l.backend, Stream: ss})
		rc, _ := condition.Create(condition.Param{Category: condition.Stream, Backend: l.backend, Stream: rs})
		sp := &ucp.RequestParam{Condition: sc, Flags: ucp.NonBlockingEnqueue}
		rp := &ucp.RequestParam{Condition: rc, Flags: ucp.NonBlockingEnqueue}
		for it := 0; it < b.N; it++ {
			t0 := time.Now()
			var last *ucp.Request
			for i := 0; i < n; i++ {
				if _, err := l.b.TagRecvNbx(in[i], uint64(i), ^uint64(0), rp); err != nil {
					b.Fatal(err)
				}
				r, err := l.ab.TagSendNbx(out[i], uint64(i), sp)
				if err != nil {
					b.Fatal(err)
				}
				last = r
			}
			// One stream-ordered wait for the whole batch, as a graph's end is.
			if err := last.WaitOnStream(ss); err != nil {
				b.Fatal(err)
			}
			submit += time.Since(t0)
			if err := ss.Synchronize(); err != nil {
				b.Fatal(err)
			}
			if err := rs.Synchronize(); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		_ = sc.Destroy()
		_ = rc.Destroy()
	}
	ops := float64(b.N * n)
	b.ReportMetric(float64(submit.Nanoseconds())/ops, "enqueue-ns/op")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/ops, "ns/op-done")
	_ = stream.KindHost
}

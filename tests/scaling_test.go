package tests

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/bootstrap"
	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/stream"
	"github.com/ucpx/ucpx/ucp"
)

// TestScalingWorkers measures a job's wire-up with its ranks as workers of one
// process (one UCX context), at the sizes in UCPX_SCALING ("2,8,32,128,512"): the time
// for all ranks to join (rendezvous, address publication, barrier), resident memory
// per rank, and the time and memory of a ring (2 endpoints per rank) and of
// all-to-all (size-1 per rank, up to 64 ranks: 128 would need more than 20000 sockets in one process). A measurement for docs/scaling.md,
// not a check: it runs only when UCPX_SCALING is set.
func TestScalingWorkers(t *testing.T) {
	sizes := os.Getenv("UCPX_SCALING")
	if sizes == "" {
		t.Skip("a measurement for docs/scaling.md: UCPX_SCALING=2,8,32,128 go test -run TestScalingWorkers ./tests")
	}
	for _, s := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(s)
		require.NoError(t, err)
		scaleWorkers(t, n)
	}
}

func rssKB(t *testing.T) int64 {
	runtime.GC()
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

func scaleWorkers(t *testing.T, n int) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	uctx, err := ucp.NewContext(ucp.ContextParams{})
	require.NoError(t, err)
	defer uctx.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	rdv := ln.Addr().String()
	require.NoError(t, ln.Close())

	rss0 := rssKB(t)
	workers := make([]*ucp.Worker, n)
	for i := range workers {
		workers[i], err = uctx.NewWorker(ucp.WorkerParams{})
		require.NoError(t, err)
	}
	rssWorkers := rssKB(t)
	jobs := make([]*bootstrap.Job, n)
	errs := make([]error, n)
	start := time.Now()
	var wg sync.WaitGroup
	for r := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			jobs[r], errs[r] = bootstrap.New(ctx, bootstrap.Config{Rank: r, Size: n, Rendezvous: rdv}, &bootstrap.Options{Worker: workers[r]})
		}()
	}
	wg.Wait()
	join := time.Since(start)
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	rssJoined := rssKB(t)

	// exchange sends one word from every rank to each of peers(rank) and receives
	// one from each, over the job's lazy endpoints.
	exchange := func(peers func(r int) []int, tag uint64) time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		for r, j := range jobs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var reqs []*ucp.Request
				ps := peers(r)
				in := make([]byte, 8*len(ps))
				for i, p := range ps {
					rr, err := j.Worker().TagRecvNbx(in[8*i:8*i+8], tag|uint64(p)<<20|uint64(r), ^uint64(0), nil)
					require.NoError(t, err)
					ep, err := j.Endpoint(p)
					require.NoError(t, err)
					sr, err := ep.TagSendNbx(binary.LittleEndian.AppendUint64(nil, uint64(r)), tag|uint64(r)<<20|uint64(p), nil)
					require.NoError(t, err)
					reqs = append(reqs, rr, sr)
				}
				for _, q := range reqs {
					require.NoError(t, q.Wait(ctx))
				}
				for i, p := range ps {
					require.Equal(t, uint64(p), binary.LittleEndian.Uint64(in[8*i:]))
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	ring := exchange(func(r int) []int {
		if n == 1 {
			return nil
		}
		if n == 2 {
			return []int{1 - r}
		}
		return []int{(r + 1) % n, (r + n - 1) % n}
	}, 1<<62)
	rssRing := rssKB(t)
	line := fmt.Sprintf("workers=%d join_ms=%.1f worker_kb_per_rank=%d joined_kb_per_rank=%d ring_ms=%.1f ring_kb_per_rank=%d",
		n, float64(join.Microseconds())/1000, (rssWorkers-rss0)/int64(n), (rssJoined-rssWorkers)/int64(n),
		float64(ring.Microseconds())/1000, (rssRing-rssJoined)/int64(n))
	if n <= 64 {
		all := exchange(func(r int) []int {
			var ps []int
			for p := 0; p < n; p++ {
				if p != r {
					ps = append(ps, p)
				}
			}
			return ps
		}, 2<<61)
		rssAll := rssKB(t)
		line += fmt.Sprintf(" all_to_all_ms=%.1f all_to_all_kb_per_rank=%d", float64(all.Microseconds())/1000, (rssAll-rssRing)/int64(n))
	}
	t.Log(line)
	fmt.Println("scaling", line)
	var cw sync.WaitGroup
	for _, j := range jobs {
		cw.Add(1)
		go func() { defer cw.Done(); require.NoError(t, j.Close()) }()
	}
	cw.Wait()
	for _, w := range workers {
		require.NoError(t, w.Close())
	}
}

// TestScalingConditions measures what conditions with operations in flight cost: the
// round trip of a stream-triggered ping-pong on one condition while k other
// conditions of the same worker each hold a receive that never completes, either
// enqueued with NonBlockingEnqueue (only the engine, the proxy, holds them) or stream
// ordered (each condition's host stream also waits for its receive). Runs with
// UCPX_SCALING set (any value), like TestScalingWorkers.
func TestScalingConditions(t *testing.T) {
	if os.Getenv("UCPX_SCALING") == "" {
		t.Skip("a measurement for docs/scaling.md: UCPX_SCALING=1 go test -run TestScalingConditions ./tests")
	}
	uctx, err := ucp.NewContext(ucp.ContextParams{})
	require.NoError(t, err)
	defer uctx.Close()
	a, err := uctx.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	b, err := uctx.NewWorker(ucp.WorkerParams{})
	require.NoError(t, err)
	aAddr, _ := a.Address()
	bAddr, _ := b.Address()
	toB, err := a.ConnectAddress(bAddr, &ucp.EndpointParams{NoPeerErrorHandling: true})
	require.NoError(t, err)
	toA, err := b.ConnectAddress(aAddr, &ucp.EndpointParams{NoPeerErrorHandling: true})
	require.NoError(t, err)
	backend := stream.NewHostBackend()
	defer backend.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const iters = 500
	for _, run := range []struct {
		k       int
		ordered bool
	}{{0, false}, {16, false}, {256, false}, {1024, false}, {16, true}, {64, true}, {256, true}} {
		k := run.k
		flags := ucp.NonBlockingEnqueue
		if run.ordered {
			flags = 0
		}
		var idle []*condition.Condition
		var pending []*ucp.Request
		for i := 0; i < k; i++ {
			s, err := backend.NewStream()
			require.NoError(t, err)
			c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: backend, Stream: s})
			require.NoError(t, err)
			r, err := a.TagRecvNbx(make([]byte, 8), 1<<40|uint64(i), ^uint64(0), &ucp.RequestParam{Condition: c, Flags: flags})
			require.NoError(t, err)
			idle = append(idle, c)
			pending = append(pending, r)
		}
		s, err := backend.NewStream()
		require.NoError(t, err)
		c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: backend, Stream: s})
		require.NoError(t, err)
		// b echoes from the host.
		echoed := make(chan error, 1)
		go func() {
			in := make([]byte, 8)
			for i := 0; i < iters; i++ {
				r, err := b.TagRecvNbx(in, 1, ^uint64(0), nil)
				if err == nil {
					err = r.Wait(ctx)
				}
				if err == nil {
					var sr *ucp.Request
					if sr, err = toA.TagSendNbx(in, 2, nil); err == nil {
						err = sr.Wait(ctx)
					}
				}
				if err != nil {
					echoed <- err
					return
				}
			}
			echoed <- nil
		}()
		out, in := make([]byte, 8), make([]byte, 8)
		lat := make([]time.Duration, iters)
		for i := 0; i < iters; i++ {
			start := time.Now()
			require.NoError(t, c.BeginGroup())
			_, err := a.TagRecvNbx(in, 2, ^uint64(0), &ucp.RequestParam{Condition: c})
			require.NoError(t, err)
			_, err = toB.TagSendNbx(out, 1, &ucp.RequestParam{Condition: c})
			require.NoError(t, err)
			require.NoError(t, c.EndGroup())
			require.NoError(t, s.Synchronize())
			lat[i] = time.Since(start)
		}
		require.NoError(t, <-echoed)
		slices.Sort(lat)
		line := fmt.Sprintf("conditions_in_flight=%d stream_ordered=%v round_trip_p50_us=%.1f p90_us=%.1f", k, run.ordered,
			float64(lat[iters/2].Nanoseconds())/1000, float64(lat[iters*9/10].Nanoseconds())/1000)
		t.Log(line)
		fmt.Println("scaling", line)
		require.NoError(t, c.Destroy())
		require.NoError(t, s.Close())
		for _, r := range pending {
			r.Cancel()
		}
		for _, r := range pending {
			_ = r.Wait(ctx)
		}
		for _, c := range idle {
			_ = c.Destroy()
		}
	}
}

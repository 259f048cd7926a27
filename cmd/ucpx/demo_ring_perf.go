package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/ucpx/ucpx/bootstrap"
	"github.com/ucpx/ucpx/ucp"
)

// ringPerf is `ucpx demo-ring --perf tag_lat|tag_bw`: ucx_perftest's tag_lat and
// tag_bw between ranks 0 and 1 of a job formed through the bootstrap, so that the two
// can run on different hosts (bench/vs-ucx-perftest.sh's cross-namespace row). The
// estimators are ucx_perftest's: the typical latency is the median one-way time
// (half a round trip) of the last 2048 iterations; bandwidth is the sender's bytes
// over the time until the receiver acknowledged the last message, MB = 2^20 B, with
// window sends outstanding. Buffers are registered and their MemH passed (-z).
func ringPerf(ctx context.Context, job *bootstrap.Job, test string, size, iters, warmup, window int, stdout io.Writer) error {
	if job.Size != 2 {
		return fmt.Errorf("--perf runs between 2 ranks, this job has %d", job.Size)
	}
	peer := 1 - job.Rank
	ep, err := job.Endpoint(peer)
	if err != nil {
		return err
	}
	w := job.Worker()
	smem, err := w.Context().MemAlloc(size)
	if err != nil {
		return err
	}
	defer smem.Close()
	rmem, err := w.Context().MemAlloc(size)
	if err != nil {
		return err
	}
	defer rmem.Close()
	sp := &ucp.RequestParam{MemH: smem}
	rp := &ucp.RequestParam{MemH: rmem}
	const mask = ^uint64(0)
	// Both ranks' endpoints are wired up before anything is timed.
	if err := pingPong(ctx, w, ep, smem.Bytes()[:min(size, 8)], rmem.Bytes()[:min(size, 8)], nil, nil, job.Rank == 0); err != nil {
		return err
	}
	if err := job.Barrier(ctx); err != nil {
		return err
	}
	switch test {
	case "tag_lat":
		lat := make([]time.Duration, 0, iters)
		for i := 0; i < warmup+iters; i++ {
			start := time.Now()
			if err := pingPong(ctx, w, ep, smem.Bytes(), rmem.Bytes(), sp, rp, job.Rank == 0); err != nil {
				return fmt.Errorf("iteration %d: %w", i, err)
			}
			if i >= warmup {
				lat = append(lat, time.Since(start)/2)
			}
		}
		if job.Rank == 0 {
			last := lat[max(0, len(lat)-2048):]
			sort.Slice(last, func(i, j int) bool { return last[i] < last[j] })
			fmt.Fprintf(stdout, "perf tag_lat %d lat_last2048_us=%.3f\n", size, float64(last[len(last)/2].Nanoseconds())/1000)
		}
	case "tag_bw":
		run := func(n int) (time.Duration, error) {
			start := time.Now()
			var reqs []*ucp.Request
			ack := make([]byte, 8)
			if job.Rank == 0 {
				for i := 0; i < n; i++ {
					if len(reqs) == window {
						if err := reqs[0].Wait(ctx); err != nil {
							return 0, err
						}
						reqs = reqs[1:]
					}
					r, err := ep.TagSendNbx(smem.Bytes(), 1, sp)
					if err != nil {
						return 0, err
					}
					reqs = append(reqs, r)
				}
				for _, r := range reqs {
					if err := r.Wait(ctx); err != nil {
						return 0, err
					}
				}
				r, err := w.TagRecvNbx(ack, 2, mask, nil)
				if err == nil {
					err = r.Wait(ctx)
				}
				return time.Since(start), err
			}
			posted := 0
			for done := 0; done < n; done++ {
				for posted < n && posted-done < window {
					r, err := w.TagRecvNbx(rmem.Bytes(), 1, mask, rp)
					if err != nil {
						return 0, err
					}
					reqs = append(reqs, r)
					posted++
				}
				if err := reqs[0].Wait(ctx); err != nil {
					return 0, err
				}
				reqs = reqs[1:]
			}
			r, err := ep.TagSendNbx(ack, 2, nil)
			if err == nil {
				err = r.Wait(ctx)
			}
			return time.Since(start), err
		}
		if _, err := run(warmup); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
		took, err := run(iters)
		if err != nil {
			return err
		}
		if job.Rank == 0 {
			fmt.Fprintf(stdout, "perf tag_bw %d bandwidth_mbs=%.2f\n", size, float64(iters)*float64(size)/(1<<20)/took.Seconds())
		}
	default:
		return fmt.Errorf("--perf %q: want tag_lat or tag_bw", test)
	}
	return job.Barrier(ctx)
}

// pingPong is one round trip: rank 0 sends and waits for the echo, rank 1 echoes.
func pingPong(ctx context.Context, w *ucp.Worker, ep *ucp.Endpoint, out, in []byte, sp, rp *ucp.RequestParam, first bool) error {
	const mask = ^uint64(0)
	if first {
		rr, err := w.TagRecvNbx(in, 2, mask, rp)
		if err != nil {
			return err
		}
		sr, err := ep.TagSendNbx(out, 1, sp)
		if err != nil {
			return err
		}
		if err := sr.Wait(ctx); err != nil {
			return err
		}
		return rr.Wait(ctx)
	}
	rr, err := w.TagRecvNbx(in, 1, mask, rp)
	if err != nil {
		return err
	}
	if err := rr.Wait(ctx); err != nil {
		return err
	}
	sr, err := ep.TagSendNbx(out, 2, sp)
	if err != nil {
		return err
	}
	return sr.Wait(ctx)
}

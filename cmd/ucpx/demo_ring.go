package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ucpx/ucpx/bootstrap"
	"github.com/ucpx/ucpx/ucp"
)

const demoRingSynopsis = `[flags]

One rank of a ring allgather: run it under ucpx launch (ucpx launch -n 4 -- ucpx
demo-ring) or with UCPX_RANK, UCPX_SIZE and UCPX_RENDEZVOUS set on each host. Every
iteration each rank fills its block, the blocks travel N-1 steps around the ring
(tag send to the right, receive from the left) and every rank checks the CRC-32C
of all N blocks. Each rank opens one endpoint, to its right neighbour.`

// runDemoRing is `ucpx demo-ring`.
func runDemoRing(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("demo-ring", demoRingSynopsis, stderr)
	iters := fs.Int("iters", 100, "allgather iterations (with --perf: measured iterations), at most 10000000")
	block := fs.Int("bytes", 4096, "bytes each rank contributes per iteration (8..16 MiB)")
	timeout := fs.Duration("timeout", 60*time.Second, "bound on the whole run")
	perf := fs.String("perf", "", "instead of the ring, between 2 ranks: tag_lat or tag_bw of --bytes, --iters after --warmup (ucx_perftest's estimators; bench/vs-ucx-perftest.sh)")
	warmup := fs.Int("warmup", 100, "with --perf: warm-up iterations, at most 10000000")
	window := fs.Int("window", 32, "with --perf tag_bw: sends outstanding, 1 to 65536 (ucx_perftest's default)")
	measure := fs.Bool("measure", false, "also connect to every rank and print wire-up times and resident memory (docs/scaling.md)")
	if st, ok := parseFlags(fs, args); !ok {
		return st
	}
	if *iters < 1 || *iters > maxIters || *block < 8 || *block > 16<<20 || *warmup < 0 || *warmup > maxIters || *window < 1 || *window > maxWindow {
		fmt.Fprintf(stderr, "ucpx demo-ring: want --iters in [1, %d], --bytes in [8, 16 MiB], --warmup in [0, %d], --window in [1, %d]\n", maxIters, maxIters, maxWindow)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	rssStart := residentKB()
	start := time.Now()
	var opts *bootstrap.Options
	if *perf != "" {
		// As ucx_perftest's tag tests (and ucpx perf): the tag feature only, and
		// busy-polling, no parking on the event fd.
		opts = &bootstrap.Options{ContextParams: ucp.ContextParams{Features: ucp.FeatureTag},
			WorkerParams: ucp.WorkerParams{NoWakeup: true}}
	}
	job, err := bootstrap.FromEnv(ctx, opts)
	if err != nil {
		fmt.Fprintf(stderr, "ucpx demo-ring: %v\n", err)
		return 1
	}
	wireup := time.Since(start)
	if *perf != "" {
		if err := ringPerf(ctx, job, *perf, *block, *iters, *warmup, *window, stdout); err != nil {
			fmt.Fprintf(stderr, "ucpx demo-ring: rank %d: --perf %s: %v\n", job.Rank, *perf, err)
			_ = job.Close()
			return 1
		}
		if err := job.Close(); err != nil {
			fmt.Fprintf(stderr, "ucpx demo-ring: close: %v\n", err)
			return 1
		}
		return 0
	}
	if err := ringAllgather(ctx, job, *iters, *block, stdout); err != nil {
		fmt.Fprintf(stderr, "ucpx demo-ring: rank %d: %v (failed ranks: %v)\n", job.Rank, err, job.Failed())
		_ = job.Close()
		return 1
	}
	if *measure {
		if err := measureWireup(ctx, job, wireup, rssStart, stdout); err != nil {
			fmt.Fprintf(stderr, "ucpx demo-ring: rank %d: measure: %v\n", job.Rank, err)
			_ = job.Close()
			return 1
		}
	}
	if job.Rank == 0 {
		fmt.Fprintf(stdout, "ring of %d ranks: %d allgather iterations of %d B per rank, every checksum matched; job formed in %v\n",
			job.Size, *iters, *block, wireup.Round(time.Millisecond))
	}
	if err := job.Close(); err != nil {
		fmt.Fprintf(stderr, "ucpx demo-ring: close: %v\n", err)
		return 1
	}
	return 0
}

// ringFill writes the block rank contributes to iteration it.
func ringFill(b []byte, rank, it int) {
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], uint64(it)<<40|uint64(rank)<<24|uint64(i))
	}
}

func ringAllgather(ctx context.Context, job *bootstrap.Job, iters, block int, stdout io.Writer) error {
	n, r := job.Size, job.Rank
	right, err := job.Endpoint((r + 1) % n)
	if err != nil {
		return err
	}
	// Every rank agrees on the parameters through the store.
	if r == 0 {
		if err := job.Store().Set(ctx, "demo-ring/params", binary.LittleEndian.AppendUint64(nil, uint64(iters)<<32|uint64(block))); err != nil {
			return err
		}
	}
	p, err := job.Store().Wait(ctx, "demo-ring/params")
	if err != nil {
		return err
	}
	if len(p) != 8 {
		return fmt.Errorf("the store's demo-ring/params holds %d bytes, want 8", len(p))
	}
	if v := binary.LittleEndian.Uint64(p); int(v>>32) != iters || int(uint32(v)) != block {
		return fmt.Errorf("rank 0 runs %d iterations of %d B, this rank %d of %d B", v>>32, uint32(v), iters, block)
	}
	buf := make([]byte, n*block)
	want := make([]byte, n*block)
	w := job.Worker()
	table := crc32.MakeTable(crc32.Castagnoli)
	var last uint32
	for it := 0; it < iters; it++ {
		ringFill(buf[r*block:(r+1)*block], r, it)
		for step := 0; step < n-1; step++ {
			sb := (r - step + n) % n
			rb := (r - step - 1 + n) % n
			tag := uint64(it)<<20 | uint64(step)
			recv, err := w.TagRecvNbx(buf[rb*block:(rb+1)*block], tag, ^uint64(0), nil)
			if err != nil {
				return err
			}
			send, err := right.TagSendNbx(buf[sb*block:(sb+1)*block], tag, nil)
			if err != nil {
				return err
			}
			if err := send.Wait(ctx); err != nil {
				return fmt.Errorf("iteration %d step %d: send: %w", it, step, err)
			}
			if err := recv.Wait(ctx); err != nil {
				return fmt.Errorf("iteration %d step %d: receive: %w", it, step, err)
			}
		}
		for b := 0; b < n; b++ {
			ringFill(want[b*block:(b+1)*block], b, it)
		}
		got, exp := crc32.Checksum(buf, table), crc32.Checksum(want, table)
		if got != exp {
			return fmt.Errorf("iteration %d: checksum %08x, want %08x", it, got, exp)
		}
		last = got
	}
	if err := job.Barrier(ctx); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "rank %d of %d: %d iterations, last checksum %08x ok\n", r, n, iters, last)
	return nil
}

// measureWireup prints one line per rank: the time to join the job, the resident
// memory after joining (the ring's two endpoints are open by now) and after an
// endpoint to every other rank carried one message each way.
func measureWireup(ctx context.Context, job *bootstrap.Job, join time.Duration, rssStart int64, stdout io.Writer) error {
	rssRing := residentKB()
	addr, err := job.Worker().Address()
	if err != nil {
		return err
	}
	if err := job.Barrier(ctx); err != nil {
		return err
	}
	start := time.Now()
	w := job.Worker()
	const tag = 1 << 46
	var reqs []*ucp.Request
	in := make([]byte, 8*job.Size)
	for r := 0; r < job.Size; r++ {
		if r == job.Rank {
			continue
		}
		rr, err := w.TagRecvNbx(in[8*r:8*r+8], tag|uint64(r), ^uint64(0), nil)
		if err != nil {
			return err
		}
		ep, err := job.Endpoint(r)
		if err != nil {
			return err
		}
		sr, err := ep.TagSendNbx(binary.LittleEndian.AppendUint64(nil, uint64(job.Rank)), tag|uint64(job.Rank), nil)
		if err != nil {
			return err
		}
		reqs = append(reqs, rr, sr)
	}
	for _, r := range reqs {
		if err := r.Wait(ctx); err != nil {
			return err
		}
	}
	for r := 0; r < job.Size; r++ {
		if r != job.Rank && binary.LittleEndian.Uint64(in[8*r:]) != uint64(r) {
			return fmt.Errorf("all-to-all: rank %d's word is %d", r, binary.LittleEndian.Uint64(in[8*r:]))
		}
	}
	a2a := time.Since(start)
	rssAll := residentKB()
	if err := job.Barrier(ctx); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "measure rank=%d size=%d addr_bytes=%d join_ms=%.1f all_to_all_ms=%.1f rss_start_kb=%d rss_ring_kb=%d rss_all_to_all_kb=%d\n",
		job.Rank, job.Size, len(addr), float64(join.Microseconds())/1000, float64(a2a.Microseconds())/1000, rssStart, rssRing, rssAll)
	return nil
}

// residentKB is the process's resident set (VmRSS), 0 where /proc is missing.
func residentKB() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

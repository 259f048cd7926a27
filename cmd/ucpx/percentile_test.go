package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Percentiles are nearest-rank, as `ucpx trace summarize` takes them: of one-way
// times 1..100 µs, p50 is 50, p90 90, p99 99 and max 100 (index n*q/100 gave 51, 91
// and 100, the maximum).
func TestFillLatencyNearestRank(t *testing.T) {
	rtts := func(n int) []time.Duration { // round trips 2n µs: one-way 1..n µs
		var d []time.Duration
		for i := n; i >= 1; i-- { // unsorted: fillLatency sorts
			d = append(d, time.Duration(2*i)*time.Microsecond)
		}
		return d
	}
	for _, tc := range []struct {
		n                  int
		p50, p90, p99, max float64
		typical            float64
	}{
		{100, 50, 90, 99, 100, 51},
		{10, 5, 9, 10, 10, 6},
		{1, 1, 1, 1, 1, 1},
		{2, 1, 2, 2, 2, 2},
		{1000, 500, 900, 990, 1000, 501},
	} {
		res := perfResult{Size: 8}
		d := rtts(tc.n)
		var total time.Duration
		for _, x := range d {
			total += x
		}
		fillLatency(&res, d, total)
		assert.InDelta(t, tc.p50, res.LatP50Us, 1e-9, "n=%d p50", tc.n)
		assert.InDelta(t, tc.p90, res.LatP90Us, 1e-9, "n=%d p90", tc.n)
		assert.InDelta(t, tc.p99, res.LatP99Us, 1e-9, "n=%d p99", tc.n)
		assert.InDelta(t, tc.max, res.LatMaxUs, 1e-9, "n=%d max", tc.n)
		assert.InDelta(t, tc.typical, res.LatTypicalUs, 1e-9, "n=%d typical: ucx_perftest's median, element n/2", tc.n)
		assert.InDelta(t, 1, res.LatMinUs, 1e-9, "n=%d min", tc.n)
	}
	st, out, _ := run(t, "help", "perf")
	require.Zero(t, st)
	assert.Contains(t, out, "nearest-rank", "the help says how percentiles are taken")
}

package main

import (
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The progress line of a size whose iterations are slow counts them as they complete:
// it said "0 of N iterations (0%)" until 64 were done, for a size of 1 GiB through the
// whole run.
func TestProgressCountsSlowIterations(t *testing.T) {
	after, tick := progressAfter, progressTick
	progressAfter, progressTick = time.Millisecond, 2*time.Millisecond
	defer func() { progressAfter, progressTick = after, tick }()
	st, _, errs := run(t, "perf", "--tests", "tag_lat", "--sizes", "16m", "--iters", "30", "--warmup", "0", "--timeout", "60s")
	require.Zero(t, st, "stderr:\n%s", errs)
	lines := regexp.MustCompile(`ucpx perf: tag_lat 16M: (\d+) of 30 iterations`).FindAllStringSubmatch(errs, -1)
	require.NotEmpty(t, lines, "no progress line:\n%s", errs)
	most := 0
	for _, l := range lines {
		n, _ := strconv.Atoi(l[1])
		most = max(most, n)
	}
	assert.Greater(t, most, 1, "the progress line never counted a completed iteration:\n%s", errs)
}

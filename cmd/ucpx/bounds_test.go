package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// Counts whose memory would not fit (every round trip is kept; a request per
// outstanding operation) are usage errors, before anything runs: never a makeslice
// panic or a process the kernel kills for memory.
func TestPerfCountBounds(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"perf", "--tests", "tag_lat", "--sizes", "8", "--iters", "4611686018427387904", "--warmup", "0"}, "--iters 4611686018427387904: want 0 (automatic) to 10000000"},
		{[]string{"perf", "--tests", "tag_lat", "--sizes", "8", "--iters", "10000001", "--warmup", "0"}, "--iters 10000001"},
		{[]string{"perf", "--tests", "tag_lat", "--sizes", "8", "--iters", "10", "--warmup", "9223372036854775807"}, "--warmup 9223372036854775807: want -1 (automatic) to 10000000"},
		{[]string{"perf", "--tests", "tag_bw", "--sizes", "8", "--iters", "10", "--warmup", "0", "--window", "1000000000"}, "--window 1000000000: want 1 to 65536"},
		{[]string{"demo-ring", "--perf", "tag_lat", "--iters", "4611686018427387904", "--warmup", "0"}, "--iters in [1, 10000000]"},
		{[]string{"demo-ring", "--perf", "tag_lat", "--iters", "10", "--warmup", "4611686018427387904"}, "--warmup in [0, 10000000]"},
		{[]string{"demo-ring", "--perf", "tag_bw", "--iters", "10", "--window", "1000000000"}, "--window in [1, 65536]"},
	} {
		r := runBounded(t, 30*time.Second, nil, tc.args...)
		if !assert.Empty(t, r.killed, "%v", tc.args) {
			continue
		}
		assert.Equal(t, 2, r.status, "%v: stderr:\n%.1000s", tc.args, r.err)
		assert.True(t, strings.Contains(r.err, tc.want), "%v: want %q in stderr:\n%.1000s", tc.args, tc.want, r.err)
		assert.False(t, strings.Contains(r.err, "panic"), "%v: stderr:\n%.1000s", tc.args, r.err)
	}
}

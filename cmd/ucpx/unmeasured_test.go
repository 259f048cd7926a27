package main

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A latency a row did not measure is null in JSON and empty in CSV, as the table's
// "-": the stream modes and the bandwidth tests filled lat_min_us, lat_last2048_us
// and lat_typical_us with the mean.
func TestUnmeasuredLatencyIsNull(t *testing.T) {
	stream := perfResult{Test: testTagLat, Mode: modeStream, Size: 8, Iters: 100}
	fillMean(&stream, 2*time.Millisecond)
	bw := perfResult{Test: testTagBw, Size: 4096, Iters: 100}
	fillBandwidth(&bw, time.Millisecond)
	plain := perfResult{Test: testTagLat, Mode: modePlain, Size: 8}
	fillLatency(&plain, []time.Duration{2 * time.Microsecond, 4 * time.Microsecond}, 6*time.Microsecond)
	unmeasured := []string{"lat_typical_us", "lat_last2048_us", "lat_p50_us", "lat_p90_us", "lat_p99_us", "lat_max_us", "lat_min_us"}
	for _, r := range []perfResult{stream, bw, plain} {
		b, err := json.Marshal(r)
		require.NoError(t, err)
		var m map[string]any
		require.NoError(t, json.Unmarshal(b, &m))
		assert.Positive(t, m["lat_avg_us"], "%s", b)
		for _, k := range unmeasured {
			v, ok := m[k]
			assert.True(t, ok, "%s missing in %s", k, b)
			if r.Test == testTagLat && !r.MeanOnly {
				assert.Positive(t, v, "%s of a plain ping-pong: %s", k, b)
			} else {
				assert.Nil(t, v, "%s not measured: %s", k, b)
			}
		}
		var back perfResult
		require.NoError(t, json.Unmarshal(b, &back), "a report reads back (--reference, --from)")
		assert.Equal(t, r.LatAvgUs, back.LatAvgUs)
	}

	var out bytes.Buffer
	c := &csvSink{w: &out}
	c.begin(nil)
	c.row(nil, stream)
	c.row(nil, bw)
	c.row(nil, plain)
	recs, err := csv.NewReader(&out).ReadAll()
	require.NoError(t, err)
	col := map[string]int{}
	for i, h := range recs[0] {
		col[h] = i
	}
	for i, rec := range recs[1:] {
		assert.NotEmpty(t, rec[col["lat_avg_us"]])
		for _, k := range unmeasured {
			if k == "lat_typical_us" {
				continue // not a CSV column
			}
			if i == 2 {
				assert.NotEmpty(t, rec[col[k]], "%s of a plain ping-pong", k)
			} else {
				assert.Empty(t, rec[col[k]], "%s of row %v", k, rec)
			}
		}
	}
}

package ucp

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/condition"
	"github.com/ucpx/ucpx/internal/runahead"
	"github.com/ucpx/ucpx/trace"
)

// A conditioned exchange traced: the JSON is valid Chrome trace event JSON (a
// traceEvents array whose events carry name, ph, ts, pid, tid), every operation has
// its four phases on its condition's track, and per operation enqueue <= trigger seen
// <= issue <= completion seen <= store.
func TestTraceOfConditionedExchange(t *testing.T) {
	p := newShmPair(t)
	b := hostBackend(t)
	s, c := streamCondition(t, b)
	rec := trace.NewRecorder()
	require.NoError(t, p.a.Trace(rec))
	stop := background(p.b)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const rounds = 20
	for i := range rounds {
		r, err := p.b.TagRecvNbx(make([]byte, 64), uint64(i), ^uint64(0), nil)
		require.NoError(t, err)
		sr, err := p.epA.TagSendNbx(make([]byte, 64), uint64(i), &RequestParam{Condition: c})
		require.NoError(t, err)
		require.NoError(t, sr.Wait(ctx))
		require.NoError(t, r.Wait(ctx))
	}
	require.NoError(t, s.Synchronize())
	require.NoError(t, p.a.Trace(nil))
	require.Len(t, rec.Ops(), rounds)

	var buf bytes.Buffer
	require.NoError(t, rec.WriteJSON(&buf))
	var doc struct {
		TraceEvents []map[string]any `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(buf.Bytes(), &doc))
	require.NotEmpty(t, doc.TraceEvents)
	type phases map[string][2]float64 // name -> ts, ts+dur
	ops := map[float64]phases{}       // by seq
	named := false
	for _, ev := range doc.TraceEvents {
		for _, k := range []string{"name", "ph", "pid", "tid"} {
			require.Contains(t, ev, k, "event %v", ev)
		}
		if ev["ph"] == "M" {
			named = named || ev["name"] == "thread_name"
			continue
		}
		require.Contains(t, ev, "ts")
		require.Equal(t, "X", ev["ph"])
		args := ev["args"].(map[string]any)
		require.Equal(t, "tag_send_nbx", args["op"])
		require.Equal(t, float64(64), args["bytes"])
		require.Equal(t, "as is", args["protocol"])
		seq := args["seq"].(float64)
		if ops[seq] == nil {
			ops[seq] = phases{}
		}
		ts, dur := ev["ts"].(float64), 0.0
		if d, ok := ev["dur"].(float64); ok {
			dur = d
		}
		ops[seq][ev["name"].(string)] = [2]float64{ts, ts + dur}
	}
	require.True(t, named, "the condition's track is named")
	require.Len(t, ops, rounds)
	for seq, ph := range ops {
		order := []string{trace.PhaseWaitTrigger, trace.PhaseIssue, trace.PhaseInFlight, trace.PhaseStore}
		for i, name := range order {
			span, ok := ph[name]
			require.True(t, ok, "operation %v has no %q span", seq, name)
			require.LessOrEqual(t, span[0], span[1], "operation %v %s", seq, name)
			if i > 0 {
				// enqueue <= trigger <= issue <= complete <= store: each phase starts
				// where the previous one ended.
				require.InDelta(t, ph[order[i-1]][1], span[0], 0.002, "operation %v: %s follows %s", seq, name, order[i-1])
			}
		}
	}
	// Timelines themselves, in nanoseconds.
	for _, op := range rec.Ops() {
		require.True(t, op.Enqueue <= op.Trigger && op.Trigger <= op.Issue && op.Issue <= op.Done && op.Done <= op.Store, "%+v", op)
		require.False(t, op.Failed)
	}
}

// benchTrace, when set, is attached to the workers of the host-stream benchmarks.
var benchTrace *trace.Recorder

// BenchmarkTraceOverhead is the stream mode's 8 B ping-pong with tracing off and on,
// in one run: compare the two half-rt-ns figures (benchstat, or by eye).
func BenchmarkTraceOverhead(b *testing.B) {
	b.Run("off", func(b *testing.B) { benchMode(b, "stream", 8) })
	b.Run("on", func(b *testing.B) {
		benchTrace = trace.NewRecorder()
		defer func() { benchTrace = nil }()
		b.ReportAllocs()
		benchMode(b, "stream", 8)
	})
}

// BenchmarkTraceOverheadInterleaved is the same 8 B stream-mode ping-pong with tracing
// switched off and on between blocks of traceBlock iterations of one run, so that load
// from elsewhere on the machine falls on both alike. Each block ends with the stream
// synchronized; half-rt-ns are the medians over the blocks of each kind, on/off their
// ratio (the overhead target: at most 1.02).
func BenchmarkTraceOverheadInterleaved(b *testing.B) {
	const traceBlock, size = 128, 8
	p, backend, s := benchSetup(b)
	ctx := context.Background()
	blocks := max(2, (b.N+traceBlock-1)/traceBlock)
	n := blocks * traceBlock
	echoDone := make(chan error, 1)
	go func() { echoDone <- echo(ctx, p, n, size) }()
	c, err := condition.Create(condition.Param{Category: condition.Stream, Backend: backend, Stream: s})
	require.NoError(b, err)
	ahead := runahead.New(runahead.StreamWindow)
	prm := &RequestParam{Condition: c}
	sprm := &RequestParam{Condition: c, Callback: func(*Request) { ahead.Done() }}
	out, in := make([]byte, size), make([]byte, size)
	rec := trace.NewRecorder()
	var times [2][]time.Duration // off, on
	b.ResetTimer()
	for k := range blocks {
		on := k % 2
		if on == 1 {
			require.NoError(b, p.a.Trace(rec))
		} else {
			require.NoError(b, p.a.Trace(nil))
		}
		start := time.Now()
		for i := k * traceBlock; i < (k+1)*traceBlock; i++ {
			require.NoError(b, ahead.Ahead(ctx, i, n))
			enqueueGroup(b, p, c, out, in, 2, sprm, prm)
		}
		require.NoError(b, s.Synchronize())
		times[on] = append(times[on], time.Since(start))
	}
	b.StopTimer()
	require.NoError(b, p.a.Trace(nil))
	require.NoError(b, c.Err())
	require.NoError(b, <-echoDone)
	require.NoError(b, c.Destroy())
	// Two operations (send, receive) per iteration of every traced block.
	require.Len(b, rec.Ops(), 2*traceBlock*len(times[1]))
	median := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2]) / traceBlock / 2
	}
	off, onNs := median(times[0]), median(times[1])
	b.ReportMetric(off, "off-half-rt-ns")
	b.ReportMetric(onNs, "on-half-rt-ns")
	b.ReportMetric(onNs/off, "on/off")
}

package trace

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/errs"
	"github.com/ucpx/ucpx/internal/testenv"
)

// UCPX_TRACE names the file the process's recorder writes when flushed.
func TestFromEnvWritesTheNamedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.json")
	t.Setenv(EnvFile, path)
	r := FromEnv()
	require.NotNil(t, r)
	require.Same(t, r, FromEnv())
	r.Name(7, "condition 7 (stream)")
	r.Record(Op{Track: 7, What: "put_nbx", Seq: 1, Bytes: 8, Plan: "as is", Enqueue: 1000, Trigger: 2000, Issue: 2500, Done: 4000, Store: 4100})
	r.Mark(7, "ring")
	require.NoError(t, r.Flush())
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var f File
	require.NoError(t, json.Unmarshal(b, &f))
	require.Len(t, f.TraceEvents, 1+4+1) // the name, four phases, the ring
	require.Equal(t, "thread_name", f.TraceEvents[0].Name)
	spans := f.TraceEvents[1:5]
	want := []struct {
		name    string
		ts, dur float64
	}{{PhaseWaitTrigger, 1, 1}, {PhaseIssue, 2, 0.5}, {PhaseInFlight, 2.5, 1.5}, {PhaseStore, 4, 0.1}}
	for i, w := range want {
		require.Equal(t, w.name, spans[i].Name)
		require.InDelta(t, w.ts, spans[i].Ts, 1e-9)
		require.InDelta(t, w.dur, spans[i].Dur, 1e-9)
		require.Equal(t, uint64(7), spans[i].Tid)
	}
	require.Equal(t, "i", f.TraceEvents[5].Ph)
	// A recorder not made by FromEnv has no file: Flush does nothing.
	require.NoError(t, NewRecorder().Flush())
	var nilRec *Recorder
	require.NoError(t, nilRec.Flush())
}

func TestSummarize(t *testing.T) {
	r := NewRecorder()
	for i := range 100 {
		base := int64(i) * 10000
		r.Record(Op{Track: 1, What: "tag_send_nbx", Seq: uint64(i + 1), Enqueue: base, Trigger: base + 1000, Issue: base + 1500, Done: base + 1500 + int64(i)*100, Store: base + 1500 + int64(i)*100 + 50})
	}
	f := File{TraceEvents: r.Events()}
	s := Summarize(f)
	require.Equal(t, 100, s.Ops)
	require.Len(t, s.Phases, 4)
	inFlight := s.Phases[2]
	require.Equal(t, PhaseInFlight, inFlight.Phase)
	require.InDelta(t, 4.9, inFlight.P50, 1e-9) // nearest rank: the 50th of 0, 0.1, ..., 9.9 µs
	require.InDelta(t, 9.8, inFlight.P99, 1e-9) // the 99th
	require.InDelta(t, 9.9, inFlight.Max, 1e-9)
	require.InDelta(t, 1.0, s.Phases[0].P99, 1e-9)
	require.Contains(t, s.String(), "in flight")
}

// Percentiles are nearest-rank: of two values p50 is the first; a zero Recorder
// records and names without a panic; a nil reader is refused; names past the
// interning limit are labelled as such, not as another operation.
func TestSummaryEdges(t *testing.T) {
	r := NewRecorder()
	r.Record(Op{Track: 1, What: "a", Seq: 1, Enqueue: 10, Trigger: 20, Issue: 30, Done: 1030, Store: 1040})
	r.Record(Op{Track: 1, What: "a", Seq: 2, Enqueue: 10, Trigger: 20, Issue: 30, Done: 2030, Store: 2040})
	s := Summarize(File{TraceEvents: r.Events()})
	i := slices.IndexFunc(s.Phases, func(p PhaseStats) bool { return p.Phase == PhaseInFlight })
	require.GreaterOrEqual(t, i, 0)
	require.InDelta(t, 1.0, s.Phases[i].P50, 1e-9)
	require.InDelta(t, 2.0, s.Phases[i].P99, 1e-9)

	var zero Recorder
	zero.Name(1, "track")
	zero.Record(Op{Track: 1, What: "x", Seq: 1})
	require.Len(t, zero.Ops(), 1)

	_, err := ReadFile(nil)
	require.ErrorIs(t, err, errs.InvalidParam)

	many := NewRecorder()
	for i := range 1<<16 + 10 {
		many.Record(Op{Track: 1, What: fmt.Sprint("op", i), Seq: uint64(i + 1)})
	}
	ops := many.Ops()
	require.Equal(t, "op0", ops[0].What)
	require.Equal(t, overflowName, ops[len(ops)-1].What)
}

// BenchmarkOpTimeline is what tracing adds to one conditioned operation when on, as
// the engine does it: the timeline (one allocation), five clock reads (enqueue,
// trigger, issue, completion, store) and the Record. Off, the engine only loads a nil
// pointer per operation and per round.
func BenchmarkOpTimeline(b *testing.B) {
	b.Run("off", func(b *testing.B) {
		var p atomic.Pointer[Recorder]
		b.ReportAllocs()
		n := 0
		for range b.N {
			if tr := p.Load(); tr != nil {
				n++
			}
		}
		require.Zero(b, n)
	})
	b.Run("on", func(b *testing.B) {
		r := NewRecorder()
		b.ReportAllocs()
		for i := range b.N {
			op := &Op{Track: 1, What: "tag_send_nbx", Seq: uint64(i), Bytes: 8, Plan: "as is", Enqueue: r.Now()}
			op.Trigger = r.Now()
			op.Issue = r.Now()
			op.Done = r.Now()
			op.Store = r.Now()
			r.Record(*op)
		}
		b.StopTimer()
		require.Len(b, r.Ops(), b.N)
	})
}

// Device stamps go on the device track of their condition, harvested before the events
// are made: read as wall-clock time while that puts every release after its store, else
// shifted so the quickest release meets its store.
func TestDeviceSpansAlignWithTheHostClock(t *testing.T) {
	for _, tc := range []struct {
		name      string
		latency   int64 // device release - host store, as the device's clock says
		wantClock string
		wantSees  float64 // µs, the store-to-device span of seq 1
	}{
		{"wall clock", 3000, ClockWall, 3},
		{"behind the host", -50000, ClockAligned, 0},
		{"far ahead", int64(5 * time.Second), ClockAligned, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRecorder()
			r.Name(7, "condition 7 (stream)")
			wall := r.start.UnixNano()
			for seq := uint64(1); seq <= 2; seq++ {
				store := int64(seq) * 100_000
				r.Record(Op{Track: 7, What: "tag_recv_nbx", Seq: seq, Enqueue: store - 4000, Trigger: store - 3000, Issue: store - 2000, Done: store - 1000, Store: store})
				extra := int64(seq-1) * 2000 // seq 2's release comes 2 µs later than seq 1's
				released := uint64(wall + store + tc.latency + extra)
				harvested := false
				remove := r.AddHarvester(func() {
					if !harvested {
						harvested = true
						r.AddDeviceSpan(7, seq, released-10_000, released)
					}
				})
				defer remove()
			}
			var waits, sees []Event
			clock := ""
			for _, ev := range r.Events() {
				switch {
				case ev.Ph == "M" && ev.Tid == 7+DeviceTrack:
					clock = ev.Args["name"].(string)
				case ev.Name == PhaseDeviceWait:
					require.Equal(t, uint64(7+DeviceTrack), ev.Tid)
					waits = append(waits, ev)
				case ev.Name == PhaseDeviceSees:
					sees = append(sees, ev)
				}
			}
			require.Len(t, waits, 2)
			require.Len(t, sees, 2)
			require.Contains(t, clock, tc.wantClock)
			require.Contains(t, clock, "condition 7 (stream)")
			for _, w := range waits {
				require.InDelta(t, 10.0, w.Dur, 1e-9)
			}
			bySeq := map[uint64]float64{}
			for _, s := range sees {
				bySeq[s.Args["seq"].(uint64)] = s.Dur
			}
			require.InDelta(t, tc.wantSees, bySeq[1], 1e-9)
			require.InDelta(t, tc.wantSees+2, bySeq[2], 1e-9, "durations on the device track are the device's")
		})
	}
}

// A nil Recorder is tracing off: every method is a no-op and the trace it writes is
// empty but valid.
func TestNilRecorderIsOff(t *testing.T) {
	var r *Recorder
	r.Name(1, "x")
	r.Record(Op{Track: 1, Seq: 1, What: "tag_send_nbx"})
	r.Mark(1, "ring")
	r.AddDeviceSpan(1, 1, 2, 3)
	r.AddHarvester(func() { t.Error("a nil recorder ran a harvester") })()
	require.Zero(t, r.Now())
	require.Nil(t, r.Ops())
	require.Nil(t, r.Events())
	require.NoError(t, r.Flush())
	path := filepath.Join(t.TempDir(), "nil.json")
	require.NoError(t, r.WriteFile(path))
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	var f File
	require.NoError(t, json.Unmarshal(data, &f))
	require.Empty(t, f.TraceEvents)
}

// A live recorder and a nil one answer zero arguments and extreme integers (tracks,
// sequence numbers, stamps) without panicking: a nil writer is an error, a nil
// harvester is ignored.
func TestRecorderTakesBadArguments(t *testing.T) {
	r := NewRecorder()
	testenv.ZeroArgs(t, map[string]bool{"WriteFile": true, "Flush": true}, r)
	testenv.ExtremeArgs(t, map[string]bool{"WriteFile": true, "Flush": true}, r)
	testenv.NilMethods(t, (*Recorder)(nil))
	require.ErrorIs(t, r.WriteJSON(nil), errs.InvalidParam)
	var b strings.Builder
	require.NoError(t, r.WriteJSON(&b), "the recorder still works after the sweep")
	f, err := ReadFile(strings.NewReader(b.String()))
	require.NoError(t, err)
	require.NotNil(t, f.TraceEvents)
}

package trace

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"

	"github.com/ucpx/ucpx/internal/errs"
)

// PhaseStats are the percentiles of one phase's durations, in microseconds.
type PhaseStats struct {
	Phase                   string
	Count                   int
	P50, P90, P99, Max, Sum float64
}

// Summary answers "where did the time go": per phase (trigger wait, issue, in flight,
// store, and where the device stamped its polls, the device's wait and the time from
// the store until the device saw it) the distribution of durations over every
// operation of a trace.
type Summary struct {
	Ops    int
	Phases []PhaseStats
}

// ReadFile parses Chrome trace JSON as WriteJSON writes it.
func ReadFile(r io.Reader) (File, error) {
	var f File
	if r == nil {
		return f, fmt.Errorf("trace: nil reader: %w", errs.InvalidParam)
	}
	if err := json.NewDecoder(r).Decode(&f); err != nil {
		return f, fmt.Errorf("trace: %w", err)
	}
	return f, nil
}

// Summarize computes the per-phase percentiles of f's operation spans.
func Summarize(f File) Summary {
	durs := map[string][]float64{}
	ops := map[[2]uint64]bool{}
	for _, ev := range f.TraceEvents {
		if ev.Ph != "X" {
			continue
		}
		durs[ev.Name] = append(durs[ev.Name], ev.Dur)
		if ev.Cat == "device" {
			continue // the device's view of an operation counted on its own track
		}
		switch seq := ev.Args["seq"].(type) {
		case float64: // read from JSON
			ops[[2]uint64{ev.Tid, uint64(seq)}] = true
		case uint64: // from Events
			ops[[2]uint64{ev.Tid, seq}] = true
		}
	}
	s := Summary{Ops: len(ops)}
	for _, name := range []string{PhaseWaitTrigger, PhaseIssue, PhaseInFlight, PhaseStore, PhaseDeviceWait, PhaseDeviceSees} {
		d := durs[name]
		if len(d) == 0 {
			continue
		}
		sort.Float64s(d)
		// Nearest rank: the smallest value with at least a fraction q of them at or
		// below it (p50 of 1..100 is 50, p99 is 99).
		at := func(q float64) float64 { return d[max(0, int(math.Ceil(q*float64(len(d))))-1)] }
		st := PhaseStats{Phase: name, Count: len(d), P50: at(0.50), P90: at(0.90), P99: at(0.99), Max: d[len(d)-1]}
		for _, x := range d {
			st.Sum += x
		}
		s.Phases = append(s.Phases, st)
	}
	return s
}

// String is the summary as a table.
func (s Summary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d operations; durations in µs\n", s.Ops)
	fmt.Fprintf(&b, "%-14s %8s %10s %10s %10s %10s %12s\n", "phase", "count", "p50", "p90", "p99", "max", "total")
	for _, p := range s.Phases {
		fmt.Fprintf(&b, "%-14s %8d %10.3f %10.3f %10.3f %10.3f %12.1f\n", p.Phase, p.Count, p.P50, p.P90, p.P99, p.Max, p.Sum)
	}
	return b.String()
}

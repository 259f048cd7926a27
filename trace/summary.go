package trace

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
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
	var a summer
	for _, ev := range f.TraceEvents {
		if ev.Ph != "X" {
			continue
		}
		seq, ok := uint64(0), false
		switch v := ev.Args["seq"].(type) {
		case float64: // read from JSON
			seq, ok = uint64(v), true
		case uint64: // from Events
			seq, ok = v, true
		}
		a.add(ev.Name, ev.Cat, ev.Dur, ev.Tid, seq, ok)
	}
	return a.summary()
}

// ReadSummary is Summarize of the trace JSON r holds, read an event at a time: it
// keeps a duration per span and a key per operation, not the events (a trace file of
// a long run is large; ReadFile holds it all, with a map per event).
func ReadSummary(r io.Reader) (Summary, error) {
	if r == nil {
		return Summary{}, fmt.Errorf("trace: nil reader: %w", errs.InvalidParam)
	}
	var a summer
	dec := json.NewDecoder(bufio.NewReaderSize(r, 64<<10))
	err := eachEvent(dec, func(ev *spanEvent) error {
		if ev.Ph != "X" {
			return nil
		}
		seq, err := ev.Args.Seq.Int64()
		a.add(ev.Name, ev.Cat, ev.Dur, ev.Tid, uint64(seq), err == nil)
		return nil
	})
	if err != nil {
		return Summary{}, fmt.Errorf("trace: %w", err)
	}
	return a.summary(), nil
}

// spanEvent is what ReadSummary reads of an event.
type spanEvent struct {
	Name string  `json:"name"`
	Cat  string  `json:"cat"`
	Ph   string  `json:"ph"`
	Dur  float64 `json:"dur"`
	Tid  uint64  `json:"tid"`
	Args struct {
		Seq json.Number `json:"seq"`
	} `json:"args"`
}

// eachEvent decodes the events of a {"traceEvents": [...]} document one at a time.
func eachEvent(dec *json.Decoder, f func(*spanEvent) error) error {
	if err := expectDelim(dec, '{'); err != nil {
		return err
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return err
		}
		if key, _ := t.(string); key != "traceEvents" {
			var skip json.RawMessage // another member: displayTimeUnit, metadata
			if err := dec.Decode(&skip); err != nil {
				return err
			}
			continue
		}
		if err := expectDelim(dec, '['); err != nil {
			return fmt.Errorf("traceEvents: %w", err)
		}
		for i := 0; dec.More(); i++ {
			var ev spanEvent
			if err := dec.Decode(&ev); err != nil {
				return fmt.Errorf("event %d: %w", i, err)
			}
			if err := f(&ev); err != nil {
				return fmt.Errorf("event %d: %w", i, err)
			}
		}
		if err := expectDelim(dec, ']'); err != nil {
			return err
		}
	}
	return expectDelim(dec, '}')
}

func expectDelim(dec *json.Decoder, want json.Delim) error {
	t, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := t.(json.Delim); !ok || d != want {
		return fmt.Errorf("want %q, found %v", want, t)
	}
	return nil
}

// summer accumulates spans into a Summary.
type summer struct {
	durs map[string][]float64
	ops  map[[2]uint64]struct{}
}

// add counts one span; seq is its operation's sequence number where hasSeq.
func (a *summer) add(name, cat string, dur float64, tid, seq uint64, hasSeq bool) {
	if !slices.Contains(summaryPhases, name) {
		return
	}
	if a.durs == nil {
		a.durs, a.ops = map[string][]float64{}, map[[2]uint64]struct{}{}
	}
	a.durs[name] = append(a.durs[name], dur)
	if cat == "device" || !hasSeq {
		return // the device's view of an operation counted on its own track
	}
	a.ops[[2]uint64{tid, seq}] = struct{}{}
}

// summaryPhases are the phases a Summary reports, in its order.
var summaryPhases = []string{PhaseWaitTrigger, PhaseIssue, PhaseInFlight, PhaseStore, PhaseDeviceWait, PhaseDeviceSees}

func (a *summer) summary() Summary {
	s := Summary{Ops: len(a.ops)}
	for _, name := range summaryPhases {
		d := a.durs[name]
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

package trace

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
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

// ReadFile parses Chrome trace JSON as WriteJSON writes it. It refuses a document
// with anything but white space after it, and a span of an operation's phase with a
// negative duration or without a sequence number that is a non-negative integer.
func ReadFile(r io.Reader) (File, error) {
	var f File
	if r == nil {
		return f, fmt.Errorf("trace: nil reader: %w", errs.InvalidParam)
	}
	dec := json.NewDecoder(r)
	if err := dec.Decode(&f); err != nil {
		return f, fmt.Errorf("trace: %w", err)
	}
	if err := atEOF(dec); err != nil {
		return f, fmt.Errorf("trace: %w", err)
	}
	for i, ev := range f.TraceEvents {
		if !isOpSpan(ev.Ph, ev.Name) {
			continue
		}
		if ev.Dur < 0 {
			return f, fmt.Errorf("trace: event %d (%s): negative dur %v", i, ev.Name, ev.Dur)
		}
		v, ok := ev.Args["seq"].(float64) // 2^64-1 reads as 2^64
		if !ok || v < 0 || v != math.Trunc(v) || v > 1<<64 {
			return f, fmt.Errorf("trace: event %d (%s): args.seq %v is not a non-negative integer", i, ev.Name, ev.Args["seq"])
		}
	}
	return f, nil
}

// atEOF: nothing but white space follows the document dec read.
func atEOF(dec *json.Decoder) error {
	if t, err := dec.Token(); err != io.EOF {
		if err != nil {
			return fmt.Errorf("after the trace: %w", err)
		}
		return fmt.Errorf("after the trace: unexpected %v", t)
	}
	return nil
}

// Summarize computes the per-phase percentiles of f's operation spans. An operation
// is a (pid, tid, seq): a trace merged from several processes counts each process's
// operations.
func Summarize(f File) Summary {
	var a summer
	for _, ev := range f.TraceEvents {
		if !isOpSpan(ev.Ph, ev.Name) {
			continue
		}
		seq, ok := uint64(0), false
		switch v := ev.Args["seq"].(type) {
		case float64: // read from JSON
			seq, ok = uint64(v), true
		case uint64: // from Events
			seq, ok = v, true
		}
		a.add(ev.Name, ev.Cat, ev.Dur, int64(ev.Pid), ev.Tid, seq, ok)
	}
	return a.summary()
}

// ReadSummary is Summarize of the trace JSON r holds, read an event at a time: it
// keeps a duration per span and a key per operation, not the events (a trace file of
// a long run is large; ReadFile holds it all, with a map per event). It refuses what
// ReadFile refuses, and a pid that is not an integer.
func ReadSummary(r io.Reader) (Summary, error) {
	if r == nil {
		return Summary{}, fmt.Errorf("trace: nil reader: %w", errs.InvalidParam)
	}
	var a summer
	dec := json.NewDecoder(bufio.NewReaderSize(r, 64<<10))
	err := eachEvent(dec, func(ev *spanEvent) error {
		if !isOpSpan(ev.Ph, ev.Name) {
			return nil // metadata, marks, spans of other tools
		}
		if ev.Dur < 0 {
			return fmt.Errorf("%s: negative dur %v", ev.Name, ev.Dur)
		}
		seq, err := strconv.ParseUint(string(ev.Args.Seq), 10, 64)
		if err != nil {
			return fmt.Errorf("%s: args.seq %s is not a non-negative integer", ev.Name, orNone(ev.Args.Seq))
		}
		var pid int64
		if ev.Pid != nil {
			if pid, err = strconv.ParseInt(string(ev.Pid), 10, 64); err != nil {
				return fmt.Errorf("%s: pid %s is not an integer", ev.Name, ev.Pid)
			}
		}
		a.add(ev.Name, ev.Cat, ev.Dur, pid, ev.Tid, seq, true)
		return nil
	})
	if err == nil {
		err = atEOF(dec)
	}
	if err != nil {
		return Summary{}, fmt.Errorf("trace: %w", err)
	}
	return a.summary(), nil
}

// spanEvent is what ReadSummary reads of an event.
type spanEvent struct {
	Name string          `json:"name"`
	Cat  string          `json:"cat"`
	Ph   string          `json:"ph"`
	Dur  float64         `json:"dur"`
	Pid  json.RawMessage `json:"pid"`
	Tid  uint64          `json:"tid"`
	Args struct {
		Seq json.RawMessage `json:"seq"`
	} `json:"args"`
}

// orNone is a raw JSON value for a message: "none" when it is missing.
func orNone(v json.RawMessage) string {
	if v == nil {
		return "(none)"
	}
	return string(v)
}

// eachEvent decodes the events of a {"traceEvents": [...]} document one at a time.
func eachEvent(dec *json.Decoder, f func(*spanEvent) error) error {
	err := decodeEvents(dec, f)
	if errors.Is(err, io.EOF) { // within the document: it was cut short
		return fmt.Errorf("the JSON document ends early (%w)", io.ErrUnexpectedEOF)
	}
	return err
}

func decodeEvents(dec *json.Decoder, f func(*spanEvent) error) error {
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
	ops  map[opKey]struct{}
}

// opKey names an operation: its process, its condition's track, its sequence number.
type opKey struct {
	pid      int64
	tid, seq uint64
}

// add counts one span of an operation's phase (isOpSpan); seq is its operation's
// sequence number where hasSeq.
func (a *summer) add(name, cat string, dur float64, pid int64, tid, seq uint64, hasSeq bool) {
	if a.durs == nil {
		a.durs, a.ops = map[string][]float64{}, map[opKey]struct{}{}
	}
	a.durs[name] = append(a.durs[name], dur)
	if cat == "device" || !hasSeq {
		return // the device's view of an operation counted on its own track
	}
	a.ops[opKey{pid, tid, seq}] = struct{}{}
}

// summaryPhases are the phases a Summary reports, in its order.
var summaryPhases = []string{PhaseWaitTrigger, PhaseIssue, PhaseInFlight, PhaseStore, PhaseDeviceWait, PhaseDeviceSees}

// isOpSpan: an event is a span of an operation's phase, what a Summary counts (and
// ReadFile and ReadSummary check), not metadata, a mark or another tool's span.
func isOpSpan(ph, name string) bool { return ph == "X" && slices.Contains(summaryPhases, name) }

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

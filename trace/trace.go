package trace

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// EnvFile names the file UCPX_TRACE asks every worker of the process to trace into;
// "{pid}" in it stands for the process id.
const EnvFile = "UCPX_TRACE"

// Op is one operation's timeline, in nanoseconds since the Recorder started.
type Op struct {
	Track   uint64 // the condition's track
	What    string // "tag_send_nbx", ...
	Seq     uint64
	Bytes   int
	Plan    string // "as is", "staged", "parts"
	Enqueue int64
	Trigger int64 // the engine saw the trigger reach the operation
	Issue   int64 // the transport call returned
	Done    int64 // the engine saw the transport's completion
	Store   int64 // the completion word was stored
	Failed  bool
}

// Recorder collects timelines. Safe for concurrent use.
type Recorder struct {
	path  string // FromEnv's file, written by Flush
	start time.Time
	mu    sync.Mutex
	// Timelines are kept in fixed chunks of pointer-free records (the op and protocol
	// names interned): recording one never copies those before it, and the garbage
	// collector never scans them.
	chunks [][]record
	words  []string          // interned names, by index
	word   map[string]uint16 // index of each name
	marks  []mark
	names  map[uint64]string
}

// record is an Op without pointers.
type record struct {
	track, seq                            uint64
	bytes                                 int
	what, plan                            uint16
	failed                                bool
	enqueue, trigger, issue, done, stored int64
}

// chunkOps is how many records a chunk holds (about 72 KiB).
const chunkOps = 1024

// intern returns name's index; r.mu held.
func (r *Recorder) intern(name string) uint16 {
	i, ok := r.word[name]
	if !ok && len(r.words) < 1<<16 {
		i = uint16(len(r.words))
		r.words = append(r.words, name)
		r.word[name] = i
	}
	return i
}

func (r *Recorder) op(rec *record) Op {
	return Op{Track: rec.track, What: r.words[rec.what], Seq: rec.seq, Bytes: rec.bytes, Plan: r.words[rec.plan],
		Enqueue: rec.enqueue, Trigger: rec.trigger, Issue: rec.issue, Done: rec.done, Store: rec.stored, Failed: rec.failed}
}

// each calls f with every timeline recorded; r.mu held.
func (r *Recorder) each(f func(Op)) {
	for _, c := range r.chunks {
		for i := range c {
			f(r.op(&c[i]))
		}
	}
}

type mark struct {
	track uint64
	name  string
	at    int64
}

// NewRecorder starts a recorder; times are taken from now on.
func NewRecorder() *Recorder {
	return &Recorder{start: time.Now(), names: map[uint64]string{}, word: map[string]uint16{}}
}

var env struct {
	mu   sync.Mutex
	read bool
	r    *Recorder
}

// FromEnv is the process's recorder when UCPX_TRACE names a file (or UseFile was
// called), nil otherwise. Every worker's engine started afterwards records into it;
// Flush writes the file.
func FromEnv() *Recorder {
	env.mu.Lock()
	defer env.mu.Unlock()
	if !env.read {
		env.read = true
		if path := os.Getenv(EnvFile); path != "" {
			env.r = NewRecorder()
			env.r.path = expandPID(path)
		}
	}
	return env.r
}

// UseFile does what UCPX_TRACE=path does, from now on: engines started afterwards
// record into a new recorder that writes path (the commands' --trace flags). An empty
// path stops it.
func UseFile(path string) *Recorder {
	env.mu.Lock()
	defer env.mu.Unlock()
	env.read = true
	env.r = nil
	if path != "" {
		env.r = NewRecorder()
		env.r.path = expandPID(path)
	}
	return env.r
}

// expandPID replaces "{pid}" in path with the process id, so that processes sharing
// the environment (a command and the peer it starts) write files of their own.
func expandPID(path string) string {
	return strings.ReplaceAll(path, "{pid}", strconv.Itoa(os.Getpid()))
}

// Flush writes everything recorded so far to the file of a FromEnv recorder (the
// engines call it when they close); for other recorders it does nothing.
func (r *Recorder) Flush() error {
	if r == nil || r.path == "" {
		return nil
	}
	return r.WriteFile(r.path)
}

// Now is the time since the recorder started, in nanoseconds (monotonic).
func (r *Recorder) Now() int64 { return int64(time.Since(r.start)) }

// Name names a track ("condition 3 (stream)").
func (r *Recorder) Name(track uint64, name string) {
	r.mu.Lock()
	if _, ok := r.names[track]; !ok {
		r.names[track] = name
	}
	r.mu.Unlock()
}

// Record adds one operation's timeline.
func (r *Recorder) Record(op Op) {
	r.mu.Lock()
	rec := record{track: op.Track, seq: op.Seq, bytes: op.Bytes, what: r.intern(op.What), plan: r.intern(op.Plan), failed: op.Failed,
		enqueue: op.Enqueue, trigger: op.Trigger, issue: op.Issue, done: op.Done, stored: op.Store}
	if n := len(r.chunks); n == 0 || len(r.chunks[n-1]) == chunkOps {
		r.chunks = append(r.chunks, make([]record, 0, chunkOps))
	}
	last := &r.chunks[len(r.chunks)-1]
	*last = append(*last, rec)
	r.mu.Unlock()
}

// Mark adds an instant event (a doorbell ring) on a track.
func (r *Recorder) Mark(track uint64, name string) {
	at := r.Now()
	r.mu.Lock()
	r.marks = append(r.marks, mark{track, name, at})
	r.mu.Unlock()
}

// Ops returns a copy of the timelines recorded so far.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ops []Op
	r.each(func(op Op) { ops = append(ops, op) })
	return ops
}

// Event is one Chrome trace event.
type Event struct {
	Name  string         `json:"name"`
	Cat   string         `json:"cat,omitempty"`
	Ph    string         `json:"ph"`
	Ts    float64        `json:"ts"`            // microseconds
	Dur   float64        `json:"dur,omitempty"` // microseconds, ph "X"
	Pid   int            `json:"pid"`
	Tid   uint64         `json:"tid"`
	Scope string         `json:"s,omitempty"`
	Args  map[string]any `json:"args,omitempty"`
}

// File is the JSON document: {"traceEvents": [...]}.
type File struct {
	TraceEvents     []Event `json:"traceEvents"`
	DisplayTimeUnit string  `json:"displayTimeUnit"`
}

// Phases of an operation's timeline, the span names in the trace.
const (
	PhaseWaitTrigger = "wait trigger" // enqueue -> trigger seen
	PhaseIssue       = "issue"        // trigger seen -> transport call returned
	PhaseInFlight    = "in flight"    // issued -> completion seen
	PhaseStore       = "store"        // completion seen -> completion word stored
)

// Events converts what was recorded into trace events.
func (r *Recorder) Events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid := os.Getpid()
	us := func(ns int64) float64 { return float64(ns) / 1e3 }
	var ev []Event
	tracks := make([]uint64, 0, len(r.names))
	for t := range r.names {
		tracks = append(tracks, t)
	}
	sort.Slice(tracks, func(i, j int) bool { return tracks[i] < tracks[j] })
	for _, t := range tracks {
		ev = append(ev, Event{Name: "thread_name", Ph: "M", Pid: pid, Tid: t, Args: map[string]any{"name": r.names[t]}})
	}
	r.each(func(op Op) {
		args := map[string]any{"op": op.What, "seq": op.Seq, "bytes": op.Bytes, "protocol": op.Plan}
		if op.Failed {
			args["failed"] = true
		}
		span := func(name string, from, to int64) {
			if from == 0 && name != PhaseWaitTrigger {
				return
			}
			ev = append(ev, Event{Name: name, Cat: op.What, Ph: "X", Ts: us(from), Dur: us(max(to-from, 0)), Pid: pid, Tid: op.Track, Args: args})
		}
		span(PhaseWaitTrigger, op.Enqueue, op.Trigger)
		span(PhaseIssue, op.Trigger, op.Issue)
		span(PhaseInFlight, op.Issue, op.Done)
		span(PhaseStore, op.Done, op.Store)
	})
	for _, m := range r.marks {
		ev = append(ev, Event{Name: m.name, Ph: "i", Scope: "t", Ts: us(m.at), Pid: pid, Tid: m.track})
	}
	return ev
}

// WriteJSON writes the trace as Chrome trace event JSON.
func (r *Recorder) WriteJSON(w io.Writer) error {
	f := File{TraceEvents: r.Events(), DisplayTimeUnit: "ns"}
	if f.TraceEvents == nil {
		f.TraceEvents = []Event{}
	}
	enc := json.NewEncoder(w)
	if err := enc.Encode(f); err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	return nil
}

// WriteFile writes the trace to path (replacing it).
func (r *Recorder) WriteFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	if err := r.WriteJSON(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

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

	"github.com/ucpx/ucpx/internal/errs"
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

// Recorder collects timelines. Safe for concurrent use. A nil Recorder is tracing
// off (what FromEnv returns without UCPX_TRACE): it records nothing and writes an
// empty trace.
type Recorder struct {
	path    string // FromEnv's file, written by Flush
	flushMu sync.Mutex
	start   time.Time
	mu      sync.Mutex
	// Timelines are kept in fixed chunks of pointer-free records (the op and protocol
	// names interned): recording one never copies those before it, and the garbage
	// collector never scans them.
	chunks [][]record
	words  []string          // interned names, by index
	word   map[string]uint16 // index of each name
	marks  []mark
	names  map[uint64]string
	// Device stamps (AddDeviceSpan), in the device's clock, and the functions that
	// collect them before the recorder writes (AddHarvester).
	device     []deviceSpan
	harvesters map[int]func()
	nextHarv   int
}

// deviceSpan is one completion poll as the device stamped it (%globaltimer, ns).
type deviceSpan struct {
	track, seq, arrived, released uint64
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

// intern returns name's index; r.mu held. Past 1<<16-1 distinct names the rest share
// the last index, named overflowName, rather than take another's name.
func (r *Recorder) intern(name string) uint16 {
	if r.word == nil { // a zero Recorder
		r.word = map[string]uint16{}
	}
	i, ok := r.word[name]
	switch {
	case ok:
	case len(r.words) < 1<<16-1:
		i = uint16(len(r.words))
		r.words = append(r.words, name)
		r.word[name] = i
	default:
		if len(r.words) == 1<<16-1 {
			r.words = append(r.words, overflowName)
		}
		i = 1<<16 - 1
	}
	return i
}

// overflowName names the operations of a recorder that saw too many distinct names.
const overflowName = "(other: more than 65535 names)"

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
	// Engines closing at once flush one file: one writer at a time, or their writes
	// interleave in it.
	r.flushMu.Lock()
	defer r.flushMu.Unlock()
	return r.WriteFile(r.path)
}

// Now is the time since the recorder started, in nanoseconds (monotonic).
func (r *Recorder) Now() int64 {
	if r == nil {
		return 0
	}
	return int64(time.Since(r.start))
}

// Name names a track ("condition 3 (stream)").
func (r *Recorder) Name(track uint64, name string) {
	if r == nil {
		return
	}
	r.mu.Lock()
	if r.names == nil { // a zero Recorder
		r.names = map[uint64]string{}
	}
	if _, ok := r.names[track]; !ok {
		r.names[track] = name
	}
	r.mu.Unlock()
}

// Record adds one operation's timeline.
func (r *Recorder) Record(op Op) {
	if r == nil {
		return
	}
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

// AddDeviceSpan adds the device's own view of operation seq of track: its clock
// (%globaltimer, nanoseconds) when the stream reached the completion poll and when the
// poll saw the completion. It goes on the track's device track, aligned with the host
// clock when written (see Events).
func (r *Recorder) AddDeviceSpan(track, seq, arrived, released uint64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.device = append(r.device, deviceSpan{track, seq, arrived, released})
	r.mu.Unlock()
}

// AddHarvester registers f, which the recorder calls (without its lock) before it
// converts what it holds into events: the owners of device stamps hand over those the
// device wrote meanwhile. remove unregisters it.
func (r *Recorder) AddHarvester(f func()) (remove func()) {
	if r == nil || f == nil {
		return func() {}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.harvesters == nil {
		r.harvesters = map[int]func(){}
	}
	id := r.nextHarv
	r.nextHarv++
	r.harvesters[id] = f
	return func() {
		r.mu.Lock()
		delete(r.harvesters, id)
		r.mu.Unlock()
	}
}

// harvest runs the harvesters.
func (r *Recorder) harvest() {
	r.mu.Lock()
	fs := make([]func(), 0, len(r.harvesters))
	for _, f := range r.harvesters {
		fs = append(fs, f)
	}
	r.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

// DeviceTrack is added to a condition's track to name its device track.
const DeviceTrack = 1 << 40

// Mark adds an instant event (a doorbell ring) on a track.
func (r *Recorder) Mark(track uint64, name string) {
	if r == nil {
		return
	}
	at := r.Now()
	r.mu.Lock()
	r.marks = append(r.marks, mark{track, name, at})
	r.mu.Unlock()
}

// Ops returns a copy of the timelines recorded so far.
func (r *Recorder) Ops() []Op {
	if r == nil {
		return nil
	}
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
	// On a condition's device track (stamped completion polls):
	PhaseDeviceWait = "device wait"     // the stream reached the poll -> the poll saw completion
	PhaseDeviceSees = "store to device" // completion word stored -> the device's poll saw it
)

// Device clocks: how a device track's stamps were put on the host's time line.
const (
	// ClockWall: %globaltimer read as wall-clock nanoseconds (the driver keeps it so on
	// Linux), which put every release after its store.
	ClockWall = "globaltimer as wall clock"
	// ClockAligned: shifted so that the quickest release coincides with its store
	// (reading it as wall clock put a release before its store, or far after).
	ClockAligned = "aligned to the quickest release"
)

// deviceOffset returns what to subtract from a device stamp to get the recorder's
// nanoseconds, and which of the two clocks that is. ops are the host's timelines by
// (track, seq); r.mu held.
func (r *Recorder) deviceOffset(ops map[[2]uint64]Op) (int64, string) {
	wall := r.start.UnixNano()
	minLat, found := int64(0), false
	for _, d := range r.device {
		op, ok := ops[[2]uint64{d.track, d.seq}]
		if !ok {
			continue
		}
		lat := int64(d.released) - wall - op.Store
		if !found || lat < minLat {
			minLat, found = lat, true
		}
	}
	// A release sees a store after a PCIe read at least; a millisecond later for the
	// quickest one means the clocks disagree.
	if !found || (minLat >= 0 && minLat < int64(time.Millisecond)) {
		return wall, ClockWall
	}
	return wall + minLat, ClockAligned
}

// Events converts what was recorded into trace events.
func (r *Recorder) Events() []Event {
	if r == nil {
		return nil
	}
	r.harvest()
	r.mu.Lock()
	defer r.mu.Unlock()
	pid := os.Getpid()
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
	if len(r.device) > 0 {
		ev = append(ev, r.deviceEventsLocked(pid)...)
	}
	return ev
}

// us converts the recorder's nanoseconds into the trace's microseconds.
func us(ns int64) float64 { return float64(ns) / 1e3 }

// deviceEventsLocked puts the device stamps on each condition's device track; r.mu held.
func (r *Recorder) deviceEventsLocked(pid int) []Event {
	ops := map[[2]uint64]Op{} // the host's timelines, by track and sequence number
	r.each(func(op Op) { ops[[2]uint64{op.Track, op.Seq}] = op })
	offset, clock := r.deviceOffset(ops)
	if clock == ClockAligned {
		// How far the device's clock is from the wall clock (the quickest release's
		// latency included): the reader can see how far off "as wall clock" was.
		clock = fmt.Sprintf("%s (globaltimer - wall clock = %.1f µs)", clock, float64(offset-r.start.UnixNano())/1e3)
	}
	var ev []Event
	named := map[uint64]bool{}
	for _, d := range r.device {
		tid := d.track + DeviceTrack
		if !named[tid] {
			named[tid] = true
			name := fmt.Sprintf("condition %d (device, %s)", d.track, clock)
			if n, ok := r.names[d.track]; ok {
				name = fmt.Sprintf("%s: device, %s", n, clock)
			}
			ev = append(ev, Event{Name: "thread_name", Ph: "M", Pid: pid, Tid: tid, Args: map[string]any{"name": name}})
		}
		args := map[string]any{"seq": d.seq, "clock": clock}
		op, ok := ops[[2]uint64{d.track, d.seq}]
		if ok {
			args["op"] = op.What
		}
		arrived, released := int64(d.arrived)-offset, int64(d.released)-offset
		ev = append(ev, Event{Name: PhaseDeviceWait, Cat: "device", Ph: "X", Ts: us(arrived), Dur: us(max(released-arrived, 0)), Pid: pid, Tid: tid, Args: args})
		if ok && op.Store != 0 {
			ev = append(ev, Event{Name: PhaseDeviceSees, Cat: "device", Ph: "X", Ts: us(op.Store), Dur: us(max(released-op.Store, 0)), Pid: pid, Tid: tid, Args: args})
		}
	}
	return ev
}

// WriteJSON writes the trace as Chrome trace event JSON.
func (r *Recorder) WriteJSON(w io.Writer) error {
	if w == nil {
		return fmt.Errorf("trace: nil writer: %w", errs.InvalidParam)
	}
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

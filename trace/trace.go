package trace

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
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
	path     string // FromEnv's file, written by Flush
	flushMu  sync.Mutex
	flushed  bool   // Flush wrote the file (under flushMu)
	reported bool   // Flush reported a failure (under flushMu)
	wrote    uint64 // gen when it did
	start    time.Time
	mu       sync.Mutex
	gen      uint64 // counts what was recorded, named or marked (under mu)
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
			env.r.path = ExpandPID(path)
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
		env.r.path = ExpandPID(path)
	}
	return env.r
}

// Use makes r the process's recorder from now on, as UseFile does, but with no file:
// the engines' Flush writes nothing, and the caller writes r once, when it is done
// (WriteFile), and sees the error. A nil r stops tracing.
func Use(r *Recorder) {
	env.mu.Lock()
	defer env.mu.Unlock()
	env.read = true
	env.r = r
}

// ExpandPID replaces "{pid}" in path with the process id, so that processes sharing
// the environment (a command and the peer it starts) write files of their own. FromEnv
// and UseFile expand their paths with it; a caller writing a Use recorder's file
// (WriteFile) expands its own path the same way.
func ExpandPID(path string) string {
	return strings.ReplaceAll(path, "{pid}", strconv.Itoa(os.Getpid()))
}

// Flush writes everything recorded so far to the file of a FromEnv recorder (the
// engines call it when they close), unless nothing was recorded since it last wrote
// it; for other recorders it does nothing.
func (r *Recorder) Flush() error {
	if r == nil || r.path == "" {
		return nil
	}
	// Engines closing at once flush one file: one writer at a time, or their writes
	// interleave in it.
	r.flushMu.Lock()
	defer r.flushMu.Unlock()
	snap := r.snapshot()
	if r.flushed && snap.gen == r.wrote {
		return nil
	}
	if err := writeFile(r.path, snap); err != nil {
		// The engines that flush have no one to tell: say it once, on stderr.
		if !r.reported {
			r.reported = true
			fmt.Fprintf(flushErrors, "%v (%s=%s: the trace is not written; later failures are not reported)\n", err, EnvFile, r.path)
		}
		return err
	}
	r.flushed, r.wrote = true, snap.gen
	return nil
}

// flushErrors is where Flush reports its first failure.
var flushErrors io.Writer = os.Stderr

// Path is the file Flush writes: UCPX_TRACE's (its "{pid}" replaced) or UseFile's;
// empty for other recorders.
func (r *Recorder) Path() string {
	if r == nil {
		return ""
	}
	return r.path
}

// Len is the number of timelines recorded so far.
func (r *Recorder) Len() int {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.chunks {
		n += len(c)
	}
	return n
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
		r.gen++
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
	r.gen++
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
	r.gen++
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
	r.gen++
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

// snapshot is what a Recorder held at one moment: its slices are append-only (a chunk
// is filled in place up to its fixed capacity, never moved), so their headers taken
// under r.mu stay valid, and readable without the lock, while the engine records on.
type snapshot struct {
	start  time.Time
	chunks [][]record
	words  []string
	names  map[uint64]string
	marks  []mark
	device []deviceSpan
	gen    uint64 // the recorder's gen
}

// snapshot runs the harvesters, then takes what the recorder holds; nil for a nil r.
func (r *Recorder) snapshot() *snapshot {
	if r == nil {
		return nil
	}
	r.harvest()
	r.mu.Lock()
	defer r.mu.Unlock()
	s := snapshot{start: r.start, chunks: slices.Clone(r.chunks), words: r.words, marks: r.marks, device: r.device,
		names: make(map[uint64]string, len(r.names)), gen: r.gen}
	for t, n := range r.names {
		s.names[t] = n
	}
	return &s
}

// rawEvent is one trace event before it is written: Events makes it an Event,
// WriteJSON encodes it directly, without a map of arguments.
type rawEvent struct {
	name, cat, ph, scope string
	ts, dur              float64
	tid                  uint64
	args                 int // argsNone, argsName, argsOp, argsDevice
	argName              string
	op                   *record // argsOp; argsDevice: the host's timeline, if any
	seq                  uint64  // argsDevice
	clock                string  // argsDevice
}

const (
	argsNone   = iota
	argsName   // {"name": argName}
	argsOp     // {"bytes", "failed", "op", "protocol", "seq"} of op
	argsDevice // {"clock", "op", "seq"}
)

// deviceOffset returns what to subtract from a device stamp to get the recorder's
// nanoseconds, and which of the two clocks that is. ops are the host's timelines by
// (track, seq).
func (s *snapshot) deviceOffset(ops map[[2]uint64]*record) (int64, string) {
	wall := s.start.UnixNano()
	minLat, found := int64(0), false
	for _, d := range s.device {
		op := ops[[2]uint64{d.track, d.seq}]
		if op == nil {
			continue
		}
		lat := int64(d.released) - wall - op.stored
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

// walk hands each event of s to emit, in the trace's order: track names, the
// operations' spans, the marks, the device tracks. ev is reused between calls.
func (s *snapshot) walk(emit func(ev *rawEvent)) {
	var ev rawEvent
	tracks := make([]uint64, 0, len(s.names))
	for t := range s.names {
		tracks = append(tracks, t)
	}
	slices.Sort(tracks)
	for _, t := range tracks {
		ev = rawEvent{name: "thread_name", ph: "M", tid: t, args: argsName, argName: s.names[t]}
		emit(&ev)
	}
	for _, c := range s.chunks {
		for i := range c {
			op := &c[i]
			span := func(name string, from, to int64) {
				if from == 0 && name != PhaseWaitTrigger {
					return
				}
				ev = rawEvent{name: name, cat: s.words[op.what], ph: "X", ts: us(from), dur: us(max(to-from, 0)), tid: op.track, args: argsOp, op: op}
				emit(&ev)
			}
			span(PhaseWaitTrigger, op.enqueue, op.trigger)
			span(PhaseIssue, op.trigger, op.issue)
			span(PhaseInFlight, op.issue, op.done)
			span(PhaseStore, op.done, op.stored)
		}
	}
	for _, m := range s.marks {
		ev = rawEvent{name: m.name, ph: "i", scope: "t", ts: us(m.at), tid: m.track}
		emit(&ev)
	}
	if len(s.device) == 0 {
		return
	}
	// The host's timelines of the stamped operations only, by track and sequence
	// number (the last one where a pair repeats).
	ops := make(map[[2]uint64]*record, len(s.device))
	for _, d := range s.device {
		ops[[2]uint64{d.track, d.seq}] = nil
	}
	for _, c := range s.chunks {
		for i := range c {
			k := [2]uint64{c[i].track, c[i].seq}
			if _, ok := ops[k]; ok {
				ops[k] = &c[i]
			}
		}
	}
	offset, clock := s.deviceOffset(ops)
	if clock == ClockAligned {
		// How far the device's clock is from the wall clock (the quickest release's
		// latency included): the reader can see how far off "as wall clock" was.
		clock = fmt.Sprintf("%s (globaltimer - wall clock = %.1f µs)", clock, float64(offset-s.start.UnixNano())/1e3)
	}
	named := map[uint64]bool{}
	for _, d := range s.device {
		tid := d.track + DeviceTrack
		if !named[tid] {
			named[tid] = true
			name := fmt.Sprintf("condition %d (device, %s)", d.track, clock)
			if n, ok := s.names[d.track]; ok {
				name = fmt.Sprintf("%s: device, %s", n, clock)
			}
			ev = rawEvent{name: "thread_name", ph: "M", tid: tid, args: argsName, argName: name}
			emit(&ev)
		}
		op := ops[[2]uint64{d.track, d.seq}]
		arrived, released := int64(d.arrived)-offset, int64(d.released)-offset
		ev = rawEvent{name: PhaseDeviceWait, cat: "device", ph: "X", ts: us(arrived), dur: us(max(released-arrived, 0)), tid: tid,
			args: argsDevice, op: op, seq: d.seq, clock: clock}
		emit(&ev)
		if op != nil && op.stored != 0 {
			ev = rawEvent{name: PhaseDeviceSees, cat: "device", ph: "X", ts: us(op.stored), dur: us(max(released-op.stored, 0)), tid: tid,
				args: argsDevice, op: op, seq: d.seq, clock: clock}
			emit(&ev)
		}
	}
}

// Events converts what was recorded into trace events. Each event carries a map of
// its arguments: for a large trace, WriteJSON writes the same events without them.
func (r *Recorder) Events() []Event {
	if r == nil {
		return nil
	}
	s := r.snapshot()
	pid := os.Getpid()
	var out []Event
	var opArgs map[string]any // shared by the spans of one operation, as before
	var argsOf *record
	s.walk(func(ev *rawEvent) {
		e := Event{Name: ev.name, Cat: ev.cat, Ph: ev.ph, Ts: ev.ts, Dur: ev.dur, Pid: pid, Tid: ev.tid, Scope: ev.scope}
		switch ev.args {
		case argsName:
			e.Args = map[string]any{"name": ev.argName}
		case argsOp:
			if argsOf != ev.op {
				argsOf = ev.op
				opArgs = map[string]any{"op": s.words[ev.op.what], "seq": ev.op.seq, "bytes": ev.op.bytes, "protocol": s.words[ev.op.plan]}
				if ev.op.failed {
					opArgs["failed"] = true
				}
			}
			e.Args = opArgs
		case argsDevice:
			e.Args = map[string]any{"seq": ev.seq, "clock": ev.clock}
			if ev.op != nil {
				e.Args["op"] = s.words[ev.op.what]
			}
		}
		out = append(out, e)
	})
	return out
}

// us converts the recorder's nanoseconds into the trace's microseconds.
func us(ns int64) float64 { return float64(ns) / 1e3 }

// WriteJSON writes the trace as Chrome trace event JSON, an event at a time: what it
// needs beyond what the recorder holds does not grow with the trace.
func (r *Recorder) WriteJSON(w io.Writer) error {
	if w == nil {
		return fmt.Errorf("trace: nil writer: %w", errs.InvalidParam)
	}
	return writeJSON(w, r.snapshot())
}

// writeJSON writes s (nil: an empty trace) as WriteJSON does.
func writeJSON(w io.Writer, s *snapshot) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	bw.WriteString(`{"traceEvents":[`)
	if s != nil {
		enc := eventEncoder{pid: strconv.Itoa(os.Getpid()), strs: map[string][]byte{}}
		first := true
		s.walk(func(ev *rawEvent) {
			if !first {
				bw.WriteByte(',')
			}
			first = false
			enc.buf = enc.event(enc.buf[:0], s, ev)
			bw.Write(enc.buf)
		})
	}
	bw.WriteString("],\"displayTimeUnit\":\"ns\"}\n")
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	return nil
}

// eventEncoder appends events as encoding/json would write an Event, with the strings
// (operation and protocol names, track names: few distinct ones) quoted once.
type eventEncoder struct {
	pid  string
	strs map[string][]byte
	buf  []byte
}

func (e *eventEncoder) str(b []byte, s string) []byte {
	q, ok := e.strs[s]
	if !ok {
		q, _ = json.Marshal(s) // a string always marshals
		if len(e.strs) < 1<<16 {
			e.strs[s] = q
		}
	}
	return append(b, q...)
}

func (e *eventEncoder) event(b []byte, s *snapshot, ev *rawEvent) []byte {
	b = append(b, `{"name":`...)
	b = e.str(b, ev.name)
	if ev.cat != "" {
		b = append(b, `,"cat":`...)
		b = e.str(b, ev.cat)
	}
	b = append(b, `,"ph":`...)
	b = e.str(b, ev.ph)
	b = append(b, `,"ts":`...)
	b = appendFloat(b, ev.ts)
	if ev.dur != 0 {
		b = append(b, `,"dur":`...)
		b = appendFloat(b, ev.dur)
	}
	b = append(b, `,"pid":`...)
	b = append(b, e.pid...)
	b = append(b, `,"tid":`...)
	b = strconv.AppendUint(b, ev.tid, 10)
	if ev.scope != "" {
		b = append(b, `,"s":`...)
		b = e.str(b, ev.scope)
	}
	switch ev.args {
	case argsName:
		b = append(b, `,"args":{"name":`...)
		b = e.str(b, ev.argName)
		b = append(b, '}')
	case argsOp: // keys in encoding/json's order for a map: sorted
		b = append(b, `,"args":{"bytes":`...)
		b = strconv.AppendInt(b, int64(ev.op.bytes), 10)
		if ev.op.failed {
			b = append(b, `,"failed":true`...)
		}
		b = append(b, `,"op":`...)
		b = e.str(b, s.words[ev.op.what])
		b = append(b, `,"protocol":`...)
		b = e.str(b, s.words[ev.op.plan])
		b = append(b, `,"seq":`...)
		b = strconv.AppendUint(b, ev.op.seq, 10)
		b = append(b, '}')
	case argsDevice:
		b = append(b, `,"args":{"clock":`...)
		b = e.str(b, ev.clock)
		if ev.op != nil {
			b = append(b, `,"op":`...)
			b = e.str(b, s.words[ev.op.what])
		}
		b = append(b, `,"seq":`...)
		b = strconv.AppendUint(b, ev.seq, 10)
		b = append(b, '}')
	}
	return append(b, '}')
}

// appendFloat appends f as encoding/json writes a float64 (f is finite: times made
// from int64 nanoseconds).
func appendFloat(b []byte, f float64) []byte {
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' { // e-09 as e-9
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

// WriteFile writes the trace to path (replacing it).
func (r *Recorder) WriteFile(path string) error {
	return writeFile(path, r.snapshot())
}

// writeFile writes s (nil: an empty trace) to path as WriteFile does.
func writeFile(path string, s *snapshot) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	if err := writeJSON(f, s); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

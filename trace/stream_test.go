package trace

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// forgetEnv makes the process's recorder unread again when t ends, as at start.
func forgetEnv(t *testing.T) {
	t.Cleanup(func() {
		env.mu.Lock()
		env.read, env.r = false, nil
		env.mu.Unlock()
	})
}

// tracedRecorder holds every kind of event: named tracks (one name needing escapes),
// operations (one failed, one never triggered), marks and device stamps.
func tracedRecorder(n int) *Recorder {
	r := NewRecorder()
	r.Name(1, "condition 1 (stream)")
	r.Name(2, "odd <name> & \"quotes\"\n")
	for i := range n {
		base := int64(i) * 1000
		r.Record(Op{Track: uint64(1 + i%2), What: "tag_send_nbx", Seq: uint64(i + 1), Bytes: 8 << (i % 4), Plan: "as is",
			Enqueue: base + 1, Trigger: base + 100, Issue: base + 150, Done: base + 400, Store: base + 410, Failed: i%7 == 3})
	}
	r.Record(Op{Track: 1, What: "put_nbx", Seq: uint64(n + 1), Plan: "staged", Enqueue: 5}) // never triggered
	r.Mark(1, "ring")
	wall := uint64(r.start.UnixNano())
	r.AddDeviceSpan(1, 1, wall+50, wall+420)
	r.AddDeviceSpan(2, 2, wall+1050, wall+1500)
	r.AddDeviceSpan(9, 99, wall+1, wall+2) // no host timeline
	return r
}

// WriteJSON writes, an event at a time, exactly what encoding/json makes of Events.
func TestWriteJSONIsEventsEncoded(t *testing.T) {
	r := tracedRecorder(50)
	var got bytes.Buffer
	require.NoError(t, r.WriteJSON(&got))
	want, err := json.Marshal(File{TraceEvents: r.Events(), DisplayTimeUnit: "ns"})
	require.NoError(t, err)
	require.Equal(t, string(want)+"\n", got.String())

	var empty bytes.Buffer
	require.NoError(t, NewRecorder().WriteJSON(&empty))
	require.Equal(t, `{"traceEvents":[],"displayTimeUnit":"ns"}`+"\n", empty.String())
}

// Writing a trace takes memory that does not grow with it: no event list, no map per
// event (a 300k-iteration traced run took 2.7 GB that way).
func TestWriteJSONMemoryIsBounded(t *testing.T) {
	const n = 20000
	r := tracedRecorder(n)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	require.NoError(t, r.WriteJSON(io.Discard))
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	require.Less(t, alloc, uint64(1<<20), "writing %d operations allocated %d bytes", n, alloc)
}

// A FromEnv recorder's file is written when something new was recorded: the engines
// each flush it when they close, and a second flush of the same content writes nothing.
func TestFlushWritesOnlyWhatIsNew(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.json")
	forgetEnv(t)
	r := UseFile(path)
	r.Record(Op{Track: 1, What: "put_nbx", Seq: 1, Enqueue: 1, Trigger: 2, Issue: 3, Done: 4, Store: 5})
	require.NoError(t, r.Flush())
	require.FileExists(t, path)
	require.NoError(t, os.Remove(path))
	require.NoError(t, r.Flush())
	require.NoFileExists(t, path, "nothing new: not written again")
	r.Mark(1, "ring")
	require.NoError(t, r.Flush())
	require.FileExists(t, path)
	require.Equal(t, 1, r.Len())
}

// Use installs a recorder without a file: the engines' flushes write nothing, the
// caller writes it once.
func TestUseHasNoFile(t *testing.T) {
	forgetEnv(t)
	r := NewRecorder()
	Use(r)
	require.Same(t, r, FromEnv())
	r.Record(Op{Track: 1, What: "x", Seq: 1})
	require.NoError(t, FromEnv().Flush())
	Use(nil)
	require.Nil(t, FromEnv())
}

// ReadSummary reads a trace an event at a time and sums it up as Summarize does.
func TestReadSummaryMatchesSummarize(t *testing.T) {
	r := tracedRecorder(300)
	var b bytes.Buffer
	require.NoError(t, r.WriteJSON(&b))
	f, err := ReadFile(bytes.NewReader(b.Bytes()))
	require.NoError(t, err)
	want := Summarize(f)
	got, err := ReadSummary(bytes.NewReader(b.Bytes()))
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.Equal(t, 301, got.Ops)
	// Members other than traceEvents, before or after it, are skipped.
	got, err = ReadSummary(strings.NewReader(`{"displayTimeUnit":"ns","otherData":{"x":[1,2]},"traceEvents":[{"name":"issue","ph":"X","dur":2,"tid":1,"args":{"seq":1}}],"z":null}`))
	require.NoError(t, err)
	require.Equal(t, 1, got.Ops)
	for _, bad := range []string{``, `[]`, `{"traceEvents":{}}`, `{"traceEvents":[{]}`, `{"traceEvents":[]`} {
		_, err := ReadSummary(strings.NewReader(bad))
		require.Error(t, err, "%q", bad)
	}
}

// heapPeak is a reader that samples the live heap every MiB it hands out.
type heapPeak struct {
	r         io.Reader
	n, next   int
	base, max uint64
}

func (h *heapPeak) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	h.n += n
	if h.n >= h.next {
		h.next += 1 << 20
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		h.max = max(h.max, ms.HeapAlloc-min(ms.HeapAlloc, h.base))
	}
	return n, err
}

// ReadSummary holds a fraction of the trace it reads (a duration per span, a key per
// operation), not the trace: summarizing a long run's file took six times its size.
func TestReadSummaryMemoryIsAFractionOfTheFile(t *testing.T) {
	var b bytes.Buffer
	require.NoError(t, tracedRecorder(20000).WriteJSON(&b))
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	h := &heapPeak{r: bytes.NewReader(b.Bytes()), base: ms.HeapAlloc}
	s, err := ReadSummary(h)
	require.NoError(t, err)
	require.Equal(t, 20001, s.Ops)
	t.Logf("held %d of %d", h.max, b.Len())
	require.Less(t, h.max, uint64(b.Len()/4), "reading a %d-byte trace held %d bytes", b.Len(), h.max)
}

// A FromEnv recorder whose file cannot be written says so on stderr, once: the
// engines that flush it discard the error.
func TestFlushReportsAFailureOnce(t *testing.T) {
	forgetEnv(t)
	var out bytes.Buffer
	flushErrors = &out
	defer func() { flushErrors = os.Stderr }()
	dir := t.TempDir()
	r := UseFile(dir) // a directory: os.Create fails
	require.Equal(t, dir, r.Path())
	r.Record(Op{Track: 1, What: "x", Seq: 1})
	require.Error(t, r.Flush())
	r.Record(Op{Track: 1, What: "x", Seq: 2})
	require.Error(t, r.Flush())
	require.Equal(t, 1, strings.Count(out.String(), "\n"), "%q", out.String())
	require.Contains(t, out.String(), EnvFile+"="+dir)
	require.Empty(t, NewRecorder().Path())
}

package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/trace"
)

// `ucpx demo --trace` writes a trace of its conditioned steps, and `ucpx trace
// summarize` reads it back into per-phase percentiles.
func TestDemoTraceAndSummarize(t *testing.T) {
	path := filepath.Join(t.TempDir(), "demo.json")
	var out, errb bytes.Buffer
	require.Equal(t, 0, dispatch([]string{"demo", "--trace", path}, &out, &errb), "stderr:\n%s", errb.String())
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	doc, err := trace.ReadFile(f)
	require.NoError(t, err)
	s := trace.Summarize(doc)
	require.Positive(t, s.Ops, "the demo's conditioned steps are in the trace")
	// The four host phases, then on a GPU the device track's two (the demo's polled
	// steps on CUDA streams).
	var phases []string
	for _, p := range s.Phases {
		phases = append(phases, p.Phase)
		require.Positive(t, p.Count, p.Phase)
	}
	host := []string{trace.PhaseWaitTrigger, trace.PhaseIssue, trace.PhaseInFlight, trace.PhaseStore}
	require.GreaterOrEqual(t, len(phases), len(host))
	require.Equal(t, host, phases[:len(host)])
	if len(phases) > len(host) {
		require.Equal(t, []string{trace.PhaseDeviceWait, trace.PhaseDeviceSees}, phases[len(host):])
	}

	out.Reset()
	require.Equal(t, 0, dispatch([]string{"trace", "summarize", path}, &out, &errb), "stderr:\n%s", errb.String())
	require.Contains(t, out.String(), trace.PhaseInFlight)
	require.Contains(t, out.String(), "operations")

	require.Equal(t, 2, dispatch([]string{"trace"}, &out, &errb))
	empty := filepath.Join(t.TempDir(), "empty.json")
	require.NoError(t, os.WriteFile(empty, []byte(`{"traceEvents":[]}`), 0o644))
	require.Equal(t, 1, dispatch([]string{"trace", "summarize", empty}, &out, &errb))
	require.Equal(t, 1, dispatch([]string{"trace", "summarize", filepath.Join(t.TempDir(), "missing.json")}, &out, &errb))
}

// `ucpx trace summarize` refuses a malformed trace with the reason and status 1 (data
// after the JSON, a negative dur, a sequence number that is no integer were
// summarized with status 0), and counts a merged two-process trace's operations per
// process.
func TestTraceSummarizeRefusesMalformed(t *testing.T) {
	dir := t.TempDir()
	write := func(name, doc string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(doc), 0o644))
		return p
	}
	for name, tc := range map[string]struct{ doc, want string }{
		"trail.json": {`{"traceEvents":[{"name":"issue","ph":"X","dur":5,"tid":1,"args":{"seq":1}}]} GARBAGE{{{`, "after the trace"},
		"neg.json":   {`{"traceEvents":[{"name":"issue","ph":"X","dur":-5,"tid":1,"args":{"seq":1}}]}`, "negative dur -5"},
		"seq.json":   {`{"traceEvents":[{"name":"issue","ph":"X","dur":5,"tid":1,"args":{"seq":1.5}},{"name":"issue","ph":"X","dur":5,"tid":1,"args":{"seq":1}}]}`, "args.seq 1.5"},
		"noseq.json": {`{"traceEvents":[{"name":"issue","ph":"X","dur":5,"tid":1}]}`, "args.seq (none)"},
	} {
		var out, errb bytes.Buffer
		st := dispatch([]string{"trace", "summarize", write(name, tc.doc)}, &out, &errb)
		require.Equal(t, 1, st, "%s: stdout:\n%s", name, out.String())
		require.Contains(t, errb.String(), tc.want, name)
		require.Empty(t, out.String(), name)
	}
	var b strings.Builder
	b.WriteString(`{"traceEvents":[`)
	for i := range 8 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"issue","ph":"X","dur":1,"pid":%d,"tid":1,"args":{"seq":%d}}`, 1+i%2, i/2)
	}
	b.WriteString(`]}`)
	var out, errb bytes.Buffer
	require.Equal(t, 0, dispatch([]string{"trace", "summarize", write("twopid.json", b.String())}, &out, &errb), errb.String())
	require.True(t, strings.HasPrefix(out.String(), "8 operations;"), "%s", out.String())
}

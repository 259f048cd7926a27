package main

import (
	"bytes"
	"os"
	"path/filepath"
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

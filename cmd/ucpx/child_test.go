package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A child's output is prefixed line by line, also when its lines come in pieces; a
// line with no newline in sight is written in pieces of maxPrefixedLine, so the
// launcher's memory stays bounded.
func TestPrefixWriter(t *testing.T) {
	var out bytes.Buffer
	pw := &prefixWriter{w: &out, prefix: "[1] "}
	for _, piece := range []string{"he", "llo\nwor", "ld\n\n", "tail"} {
		n, err := pw.Write([]byte(piece))
		require.NoError(t, err)
		require.Equal(t, len(piece), n)
	}
	pw.flush()
	require.Equal(t, "[1] hello\n[1] world\n[1] \n[1] tail\n", out.String())

	out.Reset()
	long := strings.Repeat("x", 3*maxPrefixedLine+10)
	for i := 0; i < len(long); i += 1000 {
		_, _ = pw.Write([]byte(long[i:min(i+1000, len(long))]))
		require.LessOrEqual(t, len(pw.buf), maxPrefixedLine)
	}
	pw.flush()
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	require.Len(t, lines, 4)
	for _, l := range lines {
		require.True(t, strings.HasPrefix(l, "[1] x"))
	}
	require.Equal(t, len(long), len(strings.ReplaceAll(strings.ReplaceAll(out.String(), "[1] ", ""), "\n", "")))
}

// `ucpx help trace` and `ucpx trace -h` show the usage and succeed, as for every other
// command; a bad use of trace is a usage error.
func TestTraceHelp(t *testing.T) {
	for _, args := range [][]string{{"help", "trace"}, {"trace", "-h"}} {
		st, out, _ := run(t, args...)
		require.Zero(t, st, "%v", args)
		require.Contains(t, out, "ucpx trace summarize", "%v", args)
	}
	st, _, errs := run(t, "trace", "frobnicate")
	require.Equal(t, 2, st)
	require.Contains(t, errs, "usage")
}

// `ucpx perf --json` writes nothing but the report on the process's stdout, UCX's own
// logging included (a context without active messages made UCX log an error there),
// so the file feeds `--from` and `--reference` as is.
func TestPerfJSONStdoutIsJSON(t *testing.T) {
	cmd := exec.Command(os.Args[0], "perf", "--tests", "tag_lat", "--sizes", "8", "--iters", "500", "--json")
	cmd.Env = append(os.Environ(), reexecEnv+"=1")
	out, err := cmd.Output()
	require.NoError(t, err)
	var rep map[string]any
	require.NoError(t, json.Unmarshal(out, &rep), "stdout is not the JSON report:\n%.300s", out)
}

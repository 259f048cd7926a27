package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An unknown --backend is a usage error (status 2) like every other bad flag value,
// found before any peer starts; it failed with status 1 once the backend was opened.
func TestPerfUnknownBackendIsUsageError(t *testing.T) {
	st, out, errs := run(t, "perf", "--backend", "foo", "--modes", "stream", "--timeout", "5s")
	assert.Equal(t, 2, st, "stdout:\n%s", out)
	assert.Contains(t, errs, `--backend "foo": want auto, host or cuda`)
	assert.NotContains(t, errs, "[perf-peer]")
}

// `ucpx trace summarize -h` shows the usage and succeeds (it tried to open a file
// named -h).
func TestTraceSummarizeHelp(t *testing.T) {
	for _, h := range []string{"-h", "-help", "--help"} {
		st, out, errs := run(t, "trace", "summarize", h)
		assert.Zero(t, st, "stderr:\n%s", errs)
		assert.Contains(t, out, "usage: ucpx trace summarize FILE")
	}
}

// `ucpx help` aligns every summary (demo-ring pushed its own out of line), `ucpx help
// help` describes help instead of calling it an unknown command, and keygen's usage
// reads like every other command's.
func TestHelpOutput(t *testing.T) {
	st, out, _ := run(t, "help")
	require.Zero(t, st)
	col := -1
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, "  ") {
			continue
		}
		name := strings.Fields(l)[0]
		at := strings.Index(l[2+len(name):], strings.Fields(l[2+len(name):])[0]) + 2 + len(name)
		if col < 0 {
			col = at
		}
		assert.Equal(t, col, at, "summary of %s starts at column %d, not %d:\n%s", name, at, col, out)
	}
	assert.Positive(t, col)

	st, out, errs := run(t, "help", "help")
	assert.Zero(t, st, "stderr:\n%s", errs)
	assert.Contains(t, out, "usage: ucpx help [command]")

	st, out, _ = run(t, "help", "keygen")
	assert.Zero(t, st)
	assert.Contains(t, out, "usage: ucpx keygen [-o FILE]")
	st, _, errs = run(t, "keygen", "-x")
	assert.Equal(t, 2, st)
	assert.Contains(t, errs, "usage: ucpx keygen [-o FILE]")
}

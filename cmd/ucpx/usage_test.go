package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
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

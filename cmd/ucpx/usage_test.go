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

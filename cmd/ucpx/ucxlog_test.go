package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// --json output stays JSON when UCX logs: UCX writes its WARN and ERROR lines to the C
// stdout stream, where they came before the report (`ucpx demo --tls bogus --json`,
// `UCX_TLS=bogus ucpx info --json`); now they go to stderr, unless the user set
// UCX_LOG_FILE.
func TestUCXLogStaysOffStdout(t *testing.T) {
	for _, tc := range []struct {
		env    []string
		args   []string
		status int
	}{
		{nil, []string{"demo", "--tls", "bogus", "--json", "--timeout", "30s"}, 1},
		{[]string{"UCX_TLS=bogus"}, []string{"info", "--json"}, 1}, // the report lists the error
	} {
		r := runBounded(t, 60*time.Second, tc.env, tc.args...)
		require.Empty(t, r.killed)
		assert.Equal(t, tc.status, r.status, "%v: stderr:\n%s", tc.args, r.err)
		var v map[string]any
		assert.NoError(t, json.Unmarshal([]byte(r.out), &v), "%v: stdout is not JSON:\n%s", tc.args, r.out)
		assert.Contains(t, r.err, "'bogus' is not available", "%v: UCX's warning on stderr", tc.args)
	}
	r := runBounded(t, 60*time.Second, []string{"UCX_TLS=bogus", ucxLogFileEnv + "=stdout"}, "info", "--json")
	require.Empty(t, r.killed)
	assert.Contains(t, r.out, "'bogus' is not available", "UCX_LOG_FILE=stdout, the user's choice, is kept")
}

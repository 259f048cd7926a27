package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// A trace or figure that cannot be written is an error before the run, with the path
// and a non-zero status: it was lost without a word (`ucpx demo --trace
// /nonexistent/dir/t.json`, UCPX_TRACE naming a directory or a missing folder exited
// 0 with no file and no message).
func TestUnwritableOutputsAreRefused(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "no", "such", "dir", "t.json")
	quick := []string{"--tests", "tag_lat", "--sizes", "8", "--iters", "10", "--warmup", "0", "--timeout", "30s"}
	for _, tc := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"demo", "--trace", missing}, "ucpx demo: --trace: open " + missing},
		{[]string{"UCPX_TRACE=" + missing}, []string{"demo"}, "ucpx demo: UCPX_TRACE: open " + missing},
		{[]string{"UCPX_TRACE=" + dir}, []string{"demo"}, dir + " is a directory"},
		{[]string{"UCPX_TRACE=" + dir}, append([]string{"perf", "--modes", "stream", "--backend", "host", "--csv"}, quick...), "ucpx perf: UCPX_TRACE: " + dir + " is a directory"},
		{nil, append([]string{"perf", "--trace", dir}, quick...), "ucpx perf: --trace: " + dir + " is a directory"},
		{nil, append([]string{"perf", "--trace", missing}, quick...), "ucpx perf: --trace: open " + missing},
		{nil, append([]string{"perf", "--plot", strings.TrimSuffix(missing, ".json") + ".svg"}, quick...), "ucpx perf: --plot: open "},
	} {
		r := runBounded(t, 60*time.Second, tc.env, tc.args...)
		if !assert.Empty(t, r.killed, "%v", tc.args) {
			continue
		}
		assert.Equal(t, 1, r.status, "%v %v: stdout:\n%s\nstderr:\n%s", tc.env, tc.args, r.out, r.err)
		assert.Contains(t, r.err, tc.want, "%v %v", tc.env, tc.args)
		assert.NotContains(t, r.out, "tag_lat", "%v %v: nothing ran", tc.env, tc.args)
	}
	entries, err := os.ReadDir(dir)
	assert.NoError(t, err)
	assert.Empty(t, entries, "the checks leave nothing behind")

	// A writable path is left as it was until the end of the run.
	path := filepath.Join(dir, "t.json")
	assert.NoError(t, checkWritable(path))
	_, err = os.Stat(path)
	assert.True(t, os.IsNotExist(err), "the check removed the file it made")
	assert.NoError(t, os.WriteFile(path, []byte("keep"), 0o644))
	assert.NoError(t, checkWritable(path))
	b, _ := os.ReadFile(path)
	assert.Equal(t, "keep", string(b))
}

// UCPX_TRACE without "{pid}" names one file for every process: a perf or demo peer
// inherited it and wrote over the parent's trace, and launch's ranks over each other's.
// Peers now run without it, and launch refuses it for more than one rank.
func TestTraceEnvIsNotShared(t *testing.T) {
	t.Setenv("UCPX_TRACE", "/tmp/t.json")
	for _, kv := range peerEnviron() {
		assert.False(t, strings.HasPrefix(kv, "UCPX_TRACE="), "a peer inherits %s", kv)
	}
	t.Setenv("UCPX_TRACE", "/tmp/t-{pid}.json")
	assert.Contains(t, peerEnviron(), "UCPX_TRACE=/tmp/t-{pid}.json", "with {pid}, each process writes its own file")

	dir := t.TempDir()
	one := filepath.Join(dir, "t.json")
	r := runBounded(t, 60*time.Second, []string{"UCPX_TRACE=" + one}, "launch", "-n", "2", "--", "true")
	assert.Equal(t, 2, r.status, "stderr:\n%s", r.err)
	assert.Contains(t, r.err, "put {pid} in it")
	for _, tc := range []struct {
		path string
		n    string
	}{{filepath.Join(dir, "t-{pid}.json"), "2"}, {one, "1"}} {
		r := runBounded(t, 60*time.Second, []string{"UCPX_TRACE=" + tc.path}, "launch", "-n", tc.n, "--", "true")
		assert.Equal(t, 0, r.status, "%s -n %s: stderr:\n%s", tc.path, tc.n, r.err)
	}
}

package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A report a log scale cannot show whole is drawn as far as it can be: a panel of a
// single point (size 1 made the size ticks loop forever, a latency under 1 µs made
// gonum panic) gets a range around it, a row whose size or value is not above zero is
// left out with a note, and a report with nothing to draw is refused; never a panic,
// a hang or memory without bound.
func TestPerfPlotDegenerateReports(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, report string
		status       int
		labels       []string // texts the figure must hold
		note         string   // on stderr
	}{
		{"size 1", `{"transport":"shm","results":[{"test":"tag_lat","size":1,"iters":1,"lat_p50_us":5,"bandwidth_mbs":5}]}`, 0, []string{"1", plotLatTitle}, ""},
		{"one point under 1 us", `{"transport":"shm","results":[{"test":"tag_lat","size":8,"iters":1,"lat_p50_us":0.3,"bandwidth_mbs":25}]}`, 0, []string{"8", "0.1", "1"}, ""},
		{"one bandwidth point", `{"transport":"shm","results":[{"test":"tag_bw","size":4096,"iters":1,"bandwidth_mbs":2000}]}`, 0, []string{"4K", plotBwTitle}, ""},
		{"size 0 beside a good row", `{"transport":"shm","results":[{"test":"tag_lat","size":0,"iters":1,"lat_p50_us":1,"bandwidth_mbs":1},{"test":"tag_lat","size":64,"iters":1,"lat_p50_us":2,"bandwidth_mbs":30}]}`, 0, []string{"64"}, "1 point(s) left out"},
		{"zero latency beside a good row", `{"transport":"shm","results":[{"test":"tag_lat","size":8,"iters":1,"lat_p50_us":0,"bandwidth_mbs":1},{"test":"tag_lat","size":64,"iters":1,"lat_p50_us":2,"bandwidth_mbs":30}]}`, 0, []string{"64"}, "tag_lat size 8: latency 0"},
		{"extreme values", `{"transport":"shm","results":[{"test":"tag_lat","size":8,"iters":1,"lat_p50_us":1e308,"bandwidth_mbs":1e308},{"test":"tag_lat","size":16,"iters":1,"lat_p50_us":1e-308,"bandwidth_mbs":1e-308}]}`, 0, []string{"8", "16"}, ""},
		{"size 0 only", `{"transport":"shm","results":[{"test":"tag_lat","size":0,"iters":1,"lat_p50_us":1,"bandwidth_mbs":1}]}`, 1, nil, "nothing to draw"},
		{"negative size", `{"transport":"shm","results":[{"test":"tag_lat","size":-8,"iters":1,"lat_p50_us":1,"bandwidth_mbs":1}]}`, 1, nil, "nothing to draw"},
		{"zero bandwidth", `{"transport":"shm","results":[{"test":"tag_bw","size":8,"iters":1,"bandwidth_mbs":0}]}`, 1, nil, "nothing to draw"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".json")
			svg := strings.TrimSuffix(rep, ".json") + ".svg"
			require.NoError(t, os.WriteFile(rep, []byte(tc.report), 0o644))
			r := runBounded(t, 30*time.Second, nil, "perf", "--from", rep, "--plot", svg)
			require.Empty(t, r.killed, "stderr:\n%.2000s", r.err)
			require.NotContains(t, r.err, "panic")
			require.Equal(t, tc.status, r.status, "stderr:\n%s", r.err)
			if tc.note != "" {
				assert.Contains(t, r.err, tc.note)
			}
			if tc.status != 0 {
				_, err := os.Stat(svg)
				assert.True(t, os.IsNotExist(err), "no figure for a refused report")
				return
			}
			f, err := os.Open(svg)
			require.NoError(t, err)
			defer f.Close()
			texts, _ := svgTexts(t, f)
			for _, l := range tc.labels {
				assert.Contains(t, texts, l, "figure texts %q", texts)
			}
		})
	}
}

// The size and value tickers stay bounded over the widest ranges a report can hold,
// and give nothing for a range a log scale cannot have (writePlot never asks for one).
func TestPlotTicksBounded(t *testing.T) {
	for _, r := range [][2]float64{{0.5, 2}, {1, 1}, {1e-308, 1e308}, {5e-324, 1}} {
		assert.LessOrEqual(t, len(sizeTicks([]int{1, 8})(r[0], r[1])), maxSizeTicks+2, "size ticks of %v", r)
		assert.LessOrEqual(t, len(valueTicks(r[0], r[1])), 12*9+2, "value ticks of %v", r)
	}
	assert.Empty(t, sizeTicks(nil)(0, 8))
	assert.Empty(t, valueTicks(0, 8))
}

// Once the run is over, SIGTERM ends `ucpx perf` again while it writes its outputs
// (drawing a figure can take a while): the handler that turned it into "stop the run"
// is gone.
func TestPerfSIGTERMAfterRun(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "perf.svg")
	cmd := exec.Command(os.Args[0], "perf", "--tests", "tag_lat", "--sizes", "8", "--iters", "20", "--warmup", "2", "--timeout", "60s", "--plot", svg)
	cmd.Env = append(os.Environ(), reexecEnv+"=1", holdOutputsEnv+"=1")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill() }()
	held := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if sc.Text() == holdOutputsLine {
				close(held)
			}
		}
	}()
	select {
	case <-held:
	case <-time.After(45 * time.Second):
		t.Fatalf("the run did not end within 45 s")
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee)
		ws := ee.Sys().(syscall.WaitStatus)
		require.True(t, ws.Signaled(), "exit: %v", err)
		require.Equal(t, syscall.SIGTERM, ws.Signal())
	case <-time.After(10 * time.Second):
		t.Fatalf("SIGTERM was ignored while the outputs were written")
	}
}

// holdOutputsEnv makes a re-executed test binary stop for a minute once its perf run is
// over, before it writes its outputs, after saying holdOutputsLine on stderr.
const (
	holdOutputsEnv  = "UCPX_TEST_HOLD_OUTPUTS"
	holdOutputsLine = "ucpx test: the run is over, holding the outputs"
)

func holdOutputs() {
	fmt.Fprintln(os.Stderr, holdOutputsLine)
	time.Sleep(time.Minute)
}

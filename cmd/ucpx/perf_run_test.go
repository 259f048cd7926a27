package main

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/cgo/cuda"
	"github.com/ucpx/ucpx/trace"
)

// A row is printed as its size completes: read from a running `ucpx perf` whose peer
// never gets ready for the last size, the first rows arrive while the process still
// runs; Ctrl-C then stops it, and the completed rows stay, with the reason.
func TestPerfRowsStreamAndInterrupt(t *testing.T) {
	cmd := exec.Command(os.Args[0], "perf", "--tests", "tag_lat", "--sizes", "8,64,4k", "--iters", "50", "--warmup", "5", "--check", "--timeout", "60s")
	cmd.Env = append(os.Environ(), reexecEnv+"=1", perfPeerStallEnv+"=tag_lat/4096")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	defer func() { _ = cmd.Process.Kill() }()

	rowRe := regexp.MustCompile(`^tag_lat\s+(8|64|4K)\s+50\s`)
	var out []string
	rows := 0
	deadline := time.After(45 * time.Second)
	for rows < 2 {
		select {
		case l, ok := <-lines:
			if !ok {
				<-exited // errb is written until the process ends
				t.Fatalf("output ended before two rows:\n%s\nstderr:\n%s", strings.Join(out, "\n"), errb.String())
			}
			out = append(out, l)
			if rowRe.MatchString(l) {
				rows++
			}
		case <-deadline:
			t.Fatalf("no two rows within 45 s:\n%s", strings.Join(out, "\n"))
		}
	}
	select {
	case err := <-exited:
		t.Fatalf("perf exited (%v) before it was interrupted: the rows were not streamed", err)
	default:
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	for l := range lines {
		out = append(out, l)
	}
	err = <-exited
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "stderr:\n%s", errb.String())
	assert.Equal(t, 1, ee.ExitCode())
	text := strings.Join(out, "\n")
	assert.Regexp(t, `(?m)^tag_lat\s+8\s+50\s.*\s0$`, text, "the 8-byte row, no wrong byte")
	assert.Regexp(t, `(?m)^tag_lat\s+64\s+50\s.*\s0$`, text, "the 64-byte row")
	assert.NotRegexp(t, `(?m)^tag_lat\s+4K\s`, text, "the stalled size has no row")
	assert.Contains(t, text, "STOPPED after 2 rows: tag_lat 4K warm-up: interrupted")
	assert.Contains(t, errb.String(), "interrupted")
}

// --timeout keeps the completed rows, in the table, in JSON and in CSV, with the
// reason; a size still running after progressAfter gets a progress line.
func TestPerfTimeoutKeepsRows(t *testing.T) {
	t.Setenv(perfPeerStallEnv, "tag_lat/4096")
	after, tick := progressAfter, progressTick
	progressAfter, progressTick = time.Second, time.Second
	defer func() { progressAfter, progressTick = after, tick }()
	args := []string{"perf", "--tests", "tag_lat", "--sizes", "8,64,4k", "--iters", "50", "--warmup", "5", "--check", "--timeout", "6s"}
	const reason = "tag_lat 4K warm-up: --timeout 6s reached"
	// The three formats at once: each waits out its timeout.
	type result struct {
		st       int
		out, err string
	}
	var text, js, cs result
	var wg sync.WaitGroup
	for _, c := range []struct {
		res  *result
		args []string
	}{{&text, args}, {&js, append(slices.Clone(args), "--json")}, {&cs, append(slices.Clone(args), "--csv")}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out, errb bytes.Buffer
			c.res.st = dispatch(c.args, &out, &errb)
			c.res.out, c.res.err = out.String(), errb.String()
		}()
	}
	wg.Wait()

	st, out, errs := text.st, text.out, text.err
	require.Equal(t, 1, st, "status\nstdout:\n%s\nstderr:\n%s", out, errs)
	assert.Regexp(t, `(?m)^tag_lat\s+8\s+50\s`, out)
	assert.Regexp(t, `(?m)^tag_lat\s+64\s+50\s`, out)
	assert.Contains(t, out, "STOPPED after 2 rows: "+reason)
	assert.Contains(t, errs, reason)
	assert.Contains(t, errs, "ucpx perf: tag_lat 4K warm-up: 0 of 5 iterations", "progress line")

	st, out, errs = js.st, js.out, js.err
	require.Equal(t, 1, st, "status\nstderr:\n%s", errs)
	var rep perfReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), "--json output on timeout does not parse:\n%s", out)
	assert.Contains(t, rep.Stopped, reason)
	require.Len(t, rep.Results, 2)
	for i, size := range []int{8, 64} {
		r := rep.Results[i]
		assert.Equal(t, size, r.Size)
		assert.Equal(t, 50, r.Iters)
		assert.Positive(t, r.LatP50Us)
		assert.LessOrEqual(t, r.LatP50Us, r.LatP90Us)
		assert.LessOrEqual(t, r.LatP90Us, r.LatP99Us)
		assert.LessOrEqual(t, r.LatP99Us, r.LatMaxUs)
		if assert.NotNil(t, r.Wrong) {
			assert.Zero(t, *r.Wrong)
		}
	}

	st, out, errs = cs.st, cs.out, cs.err
	require.Equal(t, 1, st, "status\nstderr:\n%s", errs)
	_, stop, ok := strings.Cut(out, "# stopped after 2 rows: ")
	require.True(t, ok, "CSV output:\n%s", out)
	assert.Contains(t, stop, reason)
	cr := csv.NewReader(strings.NewReader(out))
	cr.Comment = '#' // the stop line is a comment to CSV readers that know them
	recs, err := cr.ReadAll()
	require.NoError(t, err)
	require.Len(t, recs, 3, "header and two rows")
	assert.Equal(t, csvHeader, recs[0])
	assert.Equal(t, []string{"tag_lat", "plain", "8"}, recs[1][:3])
	assert.Equal(t, "0", recs[2][len(csvHeader)-1], "wrong")
}

// --check counts a byte the peer corrupted (through the test hook) in one answer of
// each phase; the run reports it and fails.
func TestPerfCheckCatchesCorruptByte(t *testing.T) {
	t.Setenv(perfPeerCorruptEnv, testTagLat)
	st, out, errs := run(t, "perf", "--json", "--check", "--tests", "tag_lat", "--sizes", "64,4k", "--iters", "20", "--warmup", "4", "--timeout", "60s")
	require.Equal(t, 1, st, "status\nstderr:\n%s", errs)
	var rep perfReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), "output:\n%s", out)
	assert.True(t, rep.Check)
	assert.Empty(t, rep.Stopped)
	require.Len(t, rep.Results, 2)
	for _, r := range rep.Results {
		require.NotNil(t, r.Wrong, "%+v", r)
		assert.Equal(t, int64(2), *r.Wrong, "one byte in the warm-up's answers and one in the measured ones: %+v", r)
	}
	assert.Contains(t, errs, "--check: 4 received bytes differed")

	// Without --check nothing is counted (and nothing is said).
	st, out, errs = run(t, "perf", "--json", "--tests", "tag_lat", "--sizes", "64", "--iters", "20", "--warmup", "4", "--timeout", "60s")
	require.Zero(t, st, "status\nstderr:\n%s", errs)
	rep = perfReport{}
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Len(t, rep.Results, 1)
	assert.Nil(t, rep.Results[0].Wrong)
}

// --wait spin drives tag_lat through the nbx calls and Request.Test instead of the
// fused calls: the rows come out the same, and --check still counts the byte the peer
// corrupted; tag_bw's window beside it receives every byte intact.
func TestPerfWaitSpin(t *testing.T) {
	t.Setenv(perfPeerCorruptEnv, testTagLat)
	st, out, errs := run(t, "perf", "--json", "--check", "--wait", "spin", "--tests", "tag_lat,tag_bw", "--sizes", "64,64k", "--iters", "20", "--warmup", "4", "--timeout", "60s")
	require.Equal(t, 1, st, "status (the corrupted bytes fail the run)\nstderr:\n%s", errs)
	var rep perfReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), "output:\n%s", out)
	assert.Equal(t, "spin", rep.Wait)
	assert.Empty(t, rep.Stopped)
	require.Len(t, rep.Results, 4)
	for _, r := range rep.Results {
		assert.Equal(t, 20, r.Iters, "%+v", r)
		require.NotNil(t, r.Wrong, "%+v", r)
		want := int64(0)
		if r.Test == testTagLat {
			want = 2 // one byte in the warm-up's answers, one in the measured ones
			assert.Positive(t, r.LatMinUs, "%+v", r)
		}
		assert.Equal(t, want, *r.Wrong, "%+v", r)
	}
}

func TestCountWrong(t *testing.T) {
	assert.Zero(t, countWrong([]byte("abcd"), []byte("abcd")))
	assert.Equal(t, int64(2), countWrong([]byte("abcd"), []byte("xbcy")))
	assert.Equal(t, int64(1), countWrong([]byte("abc"), []byte("ab")))
}

// svgTexts returns the text of every <text> element of an SVG document, and the style
// of every path.
func svgTexts(t *testing.T, r io.Reader) (texts, pathStyles []string) {
	t.Helper()
	dec := xml.NewDecoder(r)
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return texts, pathStyles
		}
		require.NoError(t, err, "the SVG does not parse as XML")
		if se, ok := tok.(xml.StartElement); ok {
			switch se.Name.Local {
			case "text":
				var s string
				require.NoError(t, dec.DecodeElement(&s, &se))
				texts = append(texts, s)
			case "path":
				for _, a := range se.Attr {
					if a.Name.Local == "style" {
						pathStyles = append(pathStyles, a.Value)
					}
				}
			}
		}
	}
}

// --plot writes an SVG with a latency and a bandwidth panel against size: their axes,
// a legend entry per test (tag_bw has no latency line), and the --reference run's
// lines, dashed, in the colour of the line they are the reference of.
func TestPerfPlot(t *testing.T) {
	dir := t.TempDir()
	ref := perfReport{Label: "ucx_perftest", Transport: "shm", Results: []perfResult{
		{Test: testTagLat, Size: 8, LatP50Us: 0.4, BandwidthMBs: 19},
		{Test: testTagLat, Size: 4096, LatP50Us: 1.1, BandwidthMBs: 3500},
	}}
	b, err := json.Marshal(ref)
	require.NoError(t, err)
	refPath, svgPath := filepath.Join(dir, "ref.json"), filepath.Join(dir, "perf.svg")
	require.NoError(t, os.WriteFile(refPath, b, 0o644))
	st, _, errs := run(t, "perf", "--tests", "tag_lat,tag_bw", "--sizes", "8,4k", "--iters", "30", "--warmup", "3", "--timeout", "60s",
		"--plot", svgPath, "--reference", refPath)
	require.Zero(t, st, "status\nstderr:\n%s", errs)
	f, err := os.Open(svgPath)
	require.NoError(t, err)
	defer f.Close()
	texts, styles := svgTexts(t, f)
	count := func(s string) int {
		n := 0
		for _, x := range texts {
			if x == s {
				n++
			}
		}
		return n
	}
	assert.Equal(t, 2, count(plotSizeAxis), "x axis of both panels: %q", texts)
	assert.Equal(t, 1, count(plotLatAxis), "latency axis")
	assert.Equal(t, 1, count(plotBwAxis), "bandwidth axis")
	assert.Equal(t, 1, count(plotLatTitle), "latency panel")
	assert.Equal(t, 1, count(plotBwTitle), "bandwidth panel")
	assert.Equal(t, 2, count("tag_lat"), "tag_lat in both legends")
	assert.Equal(t, 1, count("tag_bw"), "tag_bw in the bandwidth legend only")
	assert.Equal(t, 2, count("tag_lat [ucx_perftest]"), "the reference in both legends")
	assert.Equal(t, 2, count("8"), "size ticks")
	assert.Equal(t, 2, count("4K"), "size ticks")
	tagLatColor := "stroke:#1F77B4"
	dashed, solid := 0, 0
	for _, s := range styles {
		if strings.Contains(s, tagLatColor) {
			if strings.Contains(s, "stroke-dasharray") {
				dashed++
			} else {
				solid++
			}
		}
	}
	assert.Positive(t, solid, "tag_lat's line in %s", tagLatColor)
	assert.Positive(t, dashed, "the reference's dashed line in tag_lat's colour")

	// --from draws an earlier report without running; PNG by the extension.
	pngPath := filepath.Join(dir, "ref.png")
	st, _, errs = run(t, "perf", "--from", refPath, "--plot", pngPath)
	require.Zero(t, st, "--from: stderr:\n%s", errs)
	png, err := os.ReadFile(pngPath)
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(png, []byte("\x89PNG")), "--plot %s is no PNG", pngPath)

	// Bad uses are refused before anything runs.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--reference", refPath}, "give --plot too"},
		{[]string{"--plot", svgPath, "--reference", filepath.Join(dir, "missing.json")}, "--reference"},
		{[]string{"--json", "--csv"}, "choose one output format"},
		{[]string{"--plot", filepath.Join(dir, "x.pdf")}, "want a .svg or .png file"},
		{[]string{"--from", refPath}, "give --plot"},
	} {
		st, _, errs := run(t, append([]string{"perf", "--timeout", "5s"}, tc.args...)...)
		assert.Equal(t, 2, st, "perf %v: status", tc.args)
		assert.Contains(t, errs, tc.want, "perf %v", tc.args)
	}
}

// --modes is applied where it fits (tag_lat) or refused; a stream backend that cannot
// open is reported before any peer starts, so no peer output precedes the error.
func TestPerfModesFitAndBackendFirst(t *testing.T) {
	st, _, errs := run(t, "perf", "--modes", "stream", "--tests", "tag_lat,tag_bw", "--timeout", "5s")
	assert.Equal(t, 2, st)
	assert.Contains(t, errs, "the stream modes drive tag_lat only, not tag_bw")
	st, _, errs = run(t, "perf", "--backend", "host", "--timeout", "5s")
	assert.Equal(t, 2, st)
	assert.Contains(t, errs, "only the stream modes use a stream backend")

	o := perfOptions{tests: []string{testTagLat, testTagBw}, modes: []string{modePlain, modeStream}}
	require.NoError(t, o.fitModes(false, false))
	assert.Equal(t, []string{testTagLat}, o.tests, "no --tests: the tests the modes fit")

	if cuda.Load() == nil {
		t.Skip("a CUDA driver is present: --backend cuda would open")
	}
	st, out, errs := run(t, "perf", "--modes", "stream", "--backend", "cuda", "--sizes", "8", "--iters", "10", "--timeout", "30s")
	assert.Equal(t, 1, st, "stdout:\n%s", out)
	assert.Contains(t, errs, "stream backend cuda")
	assert.NotContains(t, errs, "[perf-peer]", "the peer started")
	assert.NotContains(t, errs, "UCX  ERROR")
	assert.Empty(t, out)
}

// `ucpx perf --trace` writes the stream mode's conditioned operations as trace JSON
// that `ucpx trace summarize` reads: a send and a receive per iteration, warm-up
// included, each with its four phases in order.
func TestPerfTrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "perf.json")
	st, _, errs := run(t, "perf", "--tests", "tag_lat", "--modes", "stream", "--backend", "host", "--sizes", "8", "--iters", "40", "--warmup", "10",
		"--timeout", "60s", "--trace", path)
	require.Zero(t, st, "stderr:\n%s", errs)
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	doc, err := trace.ReadFile(f)
	require.NoError(t, err)
	s := trace.Summarize(doc)
	assert.Equal(t, 2*(40+10), s.Ops, "a send and a receive per iteration")
	require.Len(t, s.Phases, 4)
	type span struct{ from, to float64 }
	ops := map[[2]float64]map[string]span{}
	for _, ev := range doc.TraceEvents {
		if ev.Ph != "X" {
			continue
		}
		k := [2]float64{float64(ev.Tid), ev.Args["seq"].(float64)}
		if ops[k] == nil {
			ops[k] = map[string]span{}
		}
		ops[k][ev.Name] = span{ev.Ts, ev.Ts + ev.Dur}
	}
	order := []string{trace.PhaseWaitTrigger, trace.PhaseIssue, trace.PhaseInFlight, trace.PhaseStore}
	for k, ph := range ops {
		for i := 1; i < len(order); i++ {
			assert.LessOrEqual(t, ph[order[i-1]].to, ph[order[i]].from+0.002, "operation %v: %s before %s", k, order[i-1], order[i])
		}
	}
	// Without a conditioned operation the trace is empty, and perf says so.
	st, _, errs = run(t, "perf", "--tests", "tag_lat", "--sizes", "8", "--iters", "20", "--warmup", "2", "--timeout", "60s", "--trace", path)
	require.Zero(t, st, "stderr:\n%s", errs)
	assert.Contains(t, errs, "no conditioned operation ran")
}

package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/runahead"
)

// TestMain routes a re-executed test binary (the perf and demo peers) to dispatch,
// the way the real binary's main does.
func TestMain(m *testing.M) {
	if os.Getenv(reexecEnv) != "" {
		if os.Getenv(holdOutputsEnv) != "" {
			afterPerfRun = holdOutputs
		}
		os.Exit(dispatch(os.Args[1:], ucxLogToStderr(), os.Stderr))
	}
	os.Exit(m.Run())
}

func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	st := dispatch(args, &out, &errb)
	return st, out.String(), errb.String()
}

func TestInfoJSON(t *testing.T) {
	st, out, errs := run(t, "info", "--json")
	require.Zero(t, st, "info --json: status\n%s", errs)
	var rep infoReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), "info --json output does not parse:\n%s", out)
	assert.Truef(t, strings.HasPrefix(rep.UCXVersion, "1."), "ucx_version %q", rep.UCXVersion)
	if assert.NotEmpty(t, rep.MemoryTypes, "memory_types") {
		assert.Equal(t, "host", rep.MemoryTypes[0], "memory_types %v, want host first", rep.MemoryTypes)
	}
	if !rep.CUDA.Driver {
		assert.NotEmpty(t, rep.CUDA.Reason, "CUDA without driver must say why: %+v", rep.CUDA)
	}
	if len(rep.Transports) > 0 {
		for _, tr := range rep.Transports {
			assert.NotEmpty(t, tr.Transport, "incomplete transport entry %+v", tr)
			assert.NotEmpty(t, tr.Device, "incomplete transport entry %+v", tr)
		}
	} else {
		assert.Truef(t, strings.HasPrefix(rep.TransportsSource, "unknown"), "no transports but source %q", rep.TransportsSource)
	}
}

func TestParseUCXInfo(t *testing.T) {
	out := []byte(`#
# Memory domain: tcp
#     Component: tcp
#      Transport: tcp
#         Device: lo
#           Type: network
#       error handling: peer failure, ep_check, keepalive
#
# Connection manager: tcp
#      max_conn_priv: 2064 bytes
# Memory domain: sysv
#      Transport: sysv
#         Device: memory
#           Type: intra-node
`)
	got := parseUCXInfo(out)
	want := []transportInfo{
		{Transport: "tcp", Device: "lo", Type: "network", ErrorHandling: "peer failure, ep_check, keepalive"},
		{Transport: "sysv", Device: "memory", Type: "intra-node"},
	}
	require.Equal(t, want, got)
}

func TestUsage(t *testing.T) {
	st, _, _ := run(t)
	assert.Equal(t, 2, st, "no command: status")
	st, _, errs := run(t, "frobnicate")
	assert.Equal(t, 2, st, "unknown command: status")
	assert.Contains(t, errs, "unknown command")
	st, out, _ := run(t, "help")
	assert.Zero(t, st, "help: status")
	assert.Contains(t, out, "perf", "help")
	assert.NotContains(t, out, "perf-peer", "help")
	st, _, errs = run(t, "perf", "--sizes", "0")
	assert.Equal(t, 2, st, "perf --sizes 0: status")
	assert.Contains(t, errs, "bad size", "perf --sizes 0")
	st, _, errs = run(t, "perf", "--transport", "ib")
	assert.Equal(t, 2, st, "perf --transport ib: status")
	assert.Contains(t, errs, "want shm or tcp", "perf --transport ib")
}

// keygen writes where -o says, refuses to overwrite, and refuses a stray argument (a
// path given without -o) instead of writing ucpx.key in the working directory.
func TestKeygen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "job.key")
	st, out, errs := run(t, "keygen", "-o", path)
	require.Zero(t, st, "keygen: %s", errs)
	assert.Contains(t, out, path)
	info, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "the key file is the owner's only")
	st, _, _ = run(t, "keygen", "-o", path)
	assert.Equal(t, 1, st, "an existing key file is not overwritten")
	t.Chdir(dir) // restored when the test ends
	st, _, errs = run(t, "keygen", filepath.Join(dir, "other.key"))
	assert.Equal(t, 2, st, "keygen PATH: status")
	assert.Contains(t, errs, "unexpected argument")
	_, err = os.Stat(filepath.Join(dir, "ucpx.key"))
	assert.True(t, os.IsNotExist(err), "nothing written for a refused call")
}

func TestParseSizes(t *testing.T) {
	got, err := parseSizes("8, 4k,64KiB,4m,1MB")
	require.NoError(t, err)
	require.Equal(t, []int{8, 4096, 64 << 10, 4 << 20, 1 << 20}, got)
	for _, bad := range []string{"", "x", "-1", "2g", "1.5k"} {
		_, err := parseSizes(bad)
		assert.Error(t, err, "parseSizes(%q) accepted", bad)
	}
}

func TestDemo(t *testing.T) {
	start := time.Now()
	st, out, errs := run(t, "demo", "--json", "--timeout", "60s")
	require.Zero(t, st, "demo: status\nstdout:\n%s\nstderr:\n%s", out, errs)
	var rep demoReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), "demo --json output does not parse:\n%s", out)
	require.True(t, rep.OK, "demo report not OK: %+v", rep)
	require.Len(t, rep.Steps, len(demoSteps()), "demo report: %+v", rep)
	for _, s := range rep.Steps {
		assert.True(t, s.Verified, "step %+v", s)
		assert.Positive(t, s.Bytes, "step %+v", s)
	}
	t.Logf("demo: %d steps in %v", len(rep.Steps), time.Since(start))
}

// A peer that dies in the middle must make the demo fail quickly and say why.
func TestDemoPeerCrash(t *testing.T) {
	t.Setenv(demoPeerCrashEnv, "verify")
	start := time.Now()
	st, out, errs := run(t, "demo", "--timeout", "60s", "--step-timeout", "20s")
	require.Equal(t, 1, st, "demo with crashing peer: status\nstdout:\n%s\nstderr:\n%s", out, errs)
	assert.Contains(t, errs, "FAILED", "error does not name the failed step")
	assert.Contains(t, errs, "RMA put", "error does not name the failed step")
	assert.LessOrEqual(t, time.Since(start), 15*time.Second, "time the failure took to be reported")
	t.Logf("reported in %v: %s", time.Since(start), strings.TrimSpace(errs))
}

func TestPerf(t *testing.T) {
	for _, tr := range []string{"shm", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			st, out, errs := run(t, "perf", "--json", "--check", "--transport", tr, "--sizes", "8,64k", "--iters", "200", "--warmup", "20", "--timeout", "60s")
			require.Zero(t, st, "perf: status\nstderr:\n%s", errs)
			var rep perfReport
			require.NoError(t, json.Unmarshal([]byte(out), &rep), "perf --json output does not parse:\n%s", out)
			assert.Equal(t, tr, rep.TLS, "tls")
			assert.Equal(t, tr, rep.PeerTLS, "peer tls")
			assert.Equal(t, tr == "tcp", rep.PeerErrorHandling, "peer_error_handling for %s", tr)
			require.Len(t, rep.Results, len(allTests)*2, "results")
			for _, r := range rep.Results {
				assert.Equal(t, 200, r.Iters, "implausible result %+v", r)
				assert.Equal(t, 20, r.Warmup, "implausible result %+v", r)
				assert.Positive(t, r.ElapsedS, "implausible result %+v", r)
				assert.Positive(t, r.BandwidthMBs, "implausible result %+v", r)
				assert.Positive(t, r.MsgRate, "implausible result %+v", r)
				if isPartTest(r.Test) {
					assert.Equal(t, defaultPartitions, r.Partitions, "partitions of %+v", r)
				} else {
					assert.Zero(t, r.Partitions, "partitions of %+v", r)
				}
				if assert.NotNil(t, r.Wrong, "--check: wrong of %+v", r) {
					assert.Zero(t, *r.Wrong, "wrong bytes in %+v", r)
				}
				if r.Test == testTagLat || r.Test == testPartLat {
					assert.Positive(t, r.LatMinUs, "implausible latency %+v", r)
					assert.LessOrEqual(t, r.LatMinUs, r.LatTypicalUs, "implausible latency %+v", r)
					assert.Positive(t, r.LatTypicalUs, "implausible latency %+v", r)
					assert.Positive(t, r.LatAvgUs, "implausible latency %+v", r)
					assert.LessOrEqual(t, r.LatP50Us, r.LatTypicalUs, "p50 (nearest rank) is at most the upper median %+v", r)
					assert.LessOrEqual(t, r.LatP50Us, r.LatP90Us, "percentiles %+v", r)
					assert.LessOrEqual(t, r.LatP90Us, r.LatP99Us, "percentiles %+v", r)
					assert.LessOrEqual(t, r.LatP99Us, r.LatMaxUs, "percentiles %+v", r)
				}
			}
		})
	}
}

// part_lat and part_bw run prepared partitioned iterations between the two processes
// (each receiver checks the bytes it got) and report plausible rows.
func TestPerfPartitioned(t *testing.T) {
	for _, tr := range []string{"shm", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			st, out, errs := run(t, "perf", "--json", "--check", "--tests", "part_lat,part_bw", "--transport", tr,
				"--sizes", "64,4k,64k", "--partitions", "16", "--iters", "300", "--warmup", "30", "--timeout", "60s")
			require.Zero(t, st, "perf: status\nstderr:\n%s", errs)
			var rep perfReport
			require.NoError(t, json.Unmarshal([]byte(out), &rep), "perf --json output does not parse:\n%s", out)
			require.Len(t, rep.Results, 2*3, "results")
			seen := map[string]int{}
			for _, r := range rep.Results {
				seen[r.Test]++
				assert.Equal(t, 16, r.Partitions, "partitions of %+v", r)
				assert.Equal(t, 300, r.Iters, "implausible result %+v", r)
				assert.Equal(t, 30, r.Warmup, "implausible result %+v", r)
				assert.Positive(t, r.ElapsedS, "implausible result %+v", r)
				assert.Positive(t, r.BandwidthMBs, "implausible result %+v", r)
				assert.Positive(t, r.MsgRate, "implausible result %+v", r)
				assert.Positive(t, r.LatAvgUs, "implausible result %+v", r)
				if assert.NotNil(t, r.Wrong, "--check: wrong of %+v", r) {
					assert.Zero(t, *r.Wrong, "wrong bytes in %+v", r)
				}
				if r.Test == testPartLat {
					assert.Positive(t, r.LatMinUs, "implausible latency %+v", r)
					assert.LessOrEqual(t, r.LatMinUs, r.LatTypicalUs, "implausible latency %+v", r)
					// The mean comes from the total time: two one-way trips per iteration.
					assert.InEpsilon(t, r.ElapsedS, r.LatAvgUs*2*float64(r.Iters)/1e6, 0.01, "implausible latency %+v", r)
				} else {
					// Bytes per second: the whole buffer once per iteration.
					assert.InEpsilon(t, float64(r.Size)*float64(r.Iters)/r.ElapsedS/mb, r.BandwidthMBs, 0.01, "implausible bandwidth %+v", r)
				}
			}
			assert.Equal(t, map[string]int{testPartLat: 3, testPartBw: 3}, seen, "rows per test")
		})
	}
	st, out, _ := run(t, "perf", "--tests", "part_lat", "--sizes", "4k", "--partitions", "4", "--iters", "50", "--warmup", "5", "--timeout", "60s")
	require.Zero(t, st, "perf table: status")
	assert.Contains(t, out, "part_lat x4", "table")
	assert.Contains(t, out, "xN: size is the whole buffer", "table footer")
}

// Bad --partitions fail before anything starts, saying why.
func TestPerfPartitionsFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tests", "part_lat", "--sizes", "8,100", "--partitions", "3"}, "--partitions 3 does not divide --sizes 8"},
		{[]string{"--tests", "tag_lat,part_bw", "--sizes", "4k,6", "--partitions", "4"}, "--partitions 4 does not divide --sizes 6"},
		{[]string{"--tests", "part_bw", "--sizes", "8", "--partitions", "16"}, "--partitions 16 does not divide --sizes 8"},
		{[]string{"--tests", "part_lat", "--partitions", "0"}, "--partitions 0: want 1 to"},
		{[]string{"--tests", "part_lat", "--partitions", "-2"}, "--partitions -2: want 1 to"},
		{[]string{"--tests", "part_lat", "--partitions", "x"}, "invalid value"},
	} {
		st, _, errs := run(t, append([]string{"perf", "--timeout", "5s"}, tc.args...)...)
		assert.Equal(t, 2, st, "perf %v: status", tc.args)
		assert.Contains(t, errs, tc.want, "perf %v", tc.args)
	}
	// Only the partitioned tests split their sizes: the others take any.
	o := perfOptions{tests: []string{testTagLat}, sizes: []int{7}, partitions: 8}
	assert.NoError(t, o.checkPartitions())
	o.tests = append(o.tests, testPartBw)
	assert.ErrorContains(t, o.checkPartitions(), "split into 8 equal partitions")
}

// Every stream mode of tag_lat runs on host streams between two processes, without
// and with a producer on the stream (--work kernel: a host function there). Each mode
// checks its own outcome (every operation succeeded, every pong had the right length,
// the last producer's data is in the send buffer) and fails the run otherwise.
func TestPerfModes(t *testing.T) {
	for _, work := range []string{"none", "kernel"} {
		t.Run("work="+work, func(t *testing.T) {
			// More iterations than runahead.KernelWindow: kernel mode arms ahead in several bursts.
			iters := 2*runahead.KernelWindow + 100
			st, out, errs := run(t, "perf", "--json", "--check", "--tests", "tag_lat", "--modes", strings.Join(allModes, ","), "--work", work,
				"--backend", "host", "--sizes", "8,4k", "--iters", strconv.Itoa(iters), "--warmup", "20", "--timeout", "60s")
			require.Zero(t, st, "perf --modes: status\nstderr:\n%s", errs)
			var rep perfReport
			require.NoError(t, json.Unmarshal([]byte(out), &rep), "output does not parse:\n%s", out)
			assert.Equal(t, "host", rep.Backend, "backend")
			want := map[string]int{}
			for _, m := range allModes {
				want[m] = 2
				if work == "kernel" && takesWork(m) {
					want[m+workSuffix] = 2
				}
			}
			seen := map[string]int{}
			for _, r := range rep.Results {
				seen[r.Mode]++
				assert.Equal(t, testTagLat, r.Test, "implausible result %+v", r)
				assert.Equal(t, iters, r.Iters, "implausible result %+v", r)
				assert.Equal(t, 20, r.Warmup, "implausible result %+v", r)
				assert.Positive(t, r.LatAvgUs, "implausible result %+v", r)
				assert.Positive(t, r.ElapsedS, "implausible result %+v", r)
				assert.Equal(t, r.Mode != modePlain, r.MeanOnly, "only the mean is known of the stream modes: %+v", r)
				if assert.NotNil(t, r.Wrong, "--check: wrong of %+v", r) {
					assert.Zero(t, *r.Wrong, "wrong bytes in %s/%d", r.Mode, r.Size)
				}
				// The total time is what the mean latency comes from: two one-way trips per iteration.
				assert.InEpsilonf(t, r.ElapsedS, r.LatAvgUs*2*float64(r.Iters)/1e6, 0.01,
					"%s/%d: mean latency %.3f us does not match %d iterations in %.6f s", r.Mode, r.Size, r.LatAvgUs, r.Iters, r.ElapsedS)
			}
			assert.Equal(t, want, seen, "results per mode")
			// (c) against (a) and (b) at both sizes, and with work against their +work.
			wantCells := 2 * 2
			if work == "kernel" {
				wantCells *= 2
			}
			assert.Len(t, rep.Comparisons, wantCells, "comparisons")
			for _, c := range rep.Comparisons {
				assert.Positive(t, c.Ratio, "comparison %+v", c)
			}
		})
	}
	for _, bad := range [][]string{{"--modes", "warp"}, {"--work", "gpu"}, {"--modes", "plain,kernel", "--work", "kernel"}} {
		st, _, errs := run(t, append([]string{"perf", "--tests", "tag_lat", "--timeout", "5s"}, bad...)...)
		assert.Equal(t, 2, st, "perf %v: status", bad)
		assert.Contains(t, errs, "--", "perf %v", bad)
	}
}

// compareModes pairs (c) with (a) and (b) of the same size and work, and nothing else.
func TestCompareModes(t *testing.T) {
	res := func(mode string, size int, lat float64) perfResult {
		return perfResult{Test: testTagLat, Mode: mode, Size: size, LatAvgUs: lat}
	}
	got := compareModes([]perfResult{
		res(modePlain, 8, 0.5),
		res(modeSync, 8, 2), res(modeHostFunc, 8, 4), res(modeStream, 8, 3),
		res(modeSync+workSuffix, 8, 6), res(modeStream+workSuffix, 8, 4.5),
		res(modeSync, 4096, 5), // no (c) at 4 KiB: no cell
		{Test: testTagBw, Size: 8, LatAvgUs: 1},
	})
	want := []modeComparison{
		{Size: 8, Mode: modeStream, Against: modeSync, Ratio: 1.5},
		{Size: 8, Mode: modeStream, Against: modeHostFunc, Ratio: 0.75},
		{Size: 8, Mode: modeStream + workSuffix, Against: modeSync + workSuffix, Ratio: 0.75},
	}
	require.Equal(t, want, got)

	var out strings.Builder
	printComparisons(&out, got)
	require.Contains(t, out.String(), "stream+work/sync+work")
	require.Regexp(t, `(?m)^\s+8\s+1\.500\s+0\.750\s+0\.750\s*$`, out.String())
	out.Reset()
	printComparisons(&out, nil)
	require.Empty(t, out.String(), "no cells, no table")
}

func TestParseModes(t *testing.T) {
	got, err := parseModes("plain,sync,kernel,stream", "kernel")
	require.NoError(t, err)
	assert.Equal(t, "plain,sync,sync+work,kernel,stream,stream+work", strings.Join(got, ","))
	got, err = parseModes("stream", "none")
	if assert.NoError(t, err, "--work none") {
		assert.Equal(t, "stream", strings.Join(got, ","), "--work none")
	}
	for _, bad := range [][2]string{{"stream+work", "none"}, {"kernel", "kernel"}, {"sync", "host"}, {"", "none"}} {
		_, err := parseModes(bad[0], bad[1])
		assert.Error(t, err, "parseModes(%q, %q) accepted", bad[0], bad[1])
	}
}

// A peer that dies in the middle of a phase must not leave perf waiting: over shm
// UCX cannot tell, so the parent notices the process exit.
func TestPerfPeerCrash(t *testing.T) {
	for _, test := range allTests {
		t.Run(test, func(t *testing.T) {
			t.Setenv(perfPeerCrashEnv, test)
			start := time.Now()
			st, _, errs := run(t, "perf", "--tests", test, "--sizes", "64k", "--iters", "100000", "--warmup", "0", "--timeout", "60s")
			require.Equal(t, 1, st, "status, stderr:\n%s", errs)
			require.Contains(t, errs, "peer")
			assert.LessOrEqual(t, time.Since(start), 15*time.Second, "time the failure took to be reported")
			t.Logf("reported in %v: %s", time.Since(start), strings.TrimSpace(errs))
		})
	}
}

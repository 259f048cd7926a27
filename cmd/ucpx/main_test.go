package main

import (
	"bytes"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ucpx/ucpx/internal/runahead"
)

// TestMain routes a re-executed test binary (the perf and demo peers) to dispatch,
// the way the real binary's main does.
func TestMain(m *testing.M) {
	if os.Getenv(reexecEnv) != "" {
		os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
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
	if st != 0 {
		t.Fatalf("info --json: status %d\n%s", st, errs)
	}
	var rep infoReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("info --json output does not parse: %v\n%s", err, out)
	}
	if !strings.HasPrefix(rep.UCXVersion, "1.") {
		t.Errorf("ucx_version %q", rep.UCXVersion)
	}
	if len(rep.MemoryTypes) == 0 || rep.MemoryTypes[0] != "host" {
		t.Errorf("memory_types %v, want host first", rep.MemoryTypes)
	}
	if !rep.CUDA.Driver && rep.CUDA.Reason == "" {
		t.Errorf("CUDA without driver must say why: %+v", rep.CUDA)
	}
	if len(rep.Transports) > 0 {
		for _, tr := range rep.Transports {
			if tr.Transport == "" || tr.Device == "" {
				t.Errorf("incomplete transport entry %+v", tr)
			}
		}
	} else if !strings.HasPrefix(rep.TransportsSource, "unknown") {
		t.Errorf("no transports but source %q", rep.TransportsSource)
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
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestUsage(t *testing.T) {
	if st, _, _ := run(t); st != 2 {
		t.Errorf("no command: status %d, want 2", st)
	}
	if st, _, errs := run(t, "frobnicate"); st != 2 || !strings.Contains(errs, "unknown command") {
		t.Errorf("unknown command: status %d, stderr %q", st, errs)
	}
	st, out, _ := run(t, "help")
	if st != 0 || !strings.Contains(out, "perf") || strings.Contains(out, "perf-peer") {
		t.Errorf("help: status %d, output %q", st, out)
	}
	if st, _, errs := run(t, "perf", "--sizes", "0"); st != 2 || !strings.Contains(errs, "bad size") {
		t.Errorf("perf --sizes 0: status %d, stderr %q", st, errs)
	}
	if st, _, errs := run(t, "perf", "--transport", "ib"); st != 2 || !strings.Contains(errs, "want shm or tcp") {
		t.Errorf("perf --transport ib: status %d, stderr %q", st, errs)
	}
}

func TestParseSizes(t *testing.T) {
	got, err := parseSizes("8, 4k,64KiB,4m,1MB")
	if err != nil {
		t.Fatal(err)
	}
	want := []int{8, 4096, 64 << 10, 4 << 20, 1 << 20}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	for _, bad := range []string{"", "x", "-1", "2g", "1.5k"} {
		if _, err := parseSizes(bad); err == nil {
			t.Errorf("parseSizes(%q) accepted", bad)
		}
	}
}

func TestDemo(t *testing.T) {
	start := time.Now()
	st, out, errs := run(t, "demo", "--json", "--timeout", "60s")
	if st != 0 {
		t.Fatalf("demo: status %d\nstdout:\n%s\nstderr:\n%s", st, out, errs)
	}
	var rep demoReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("demo --json output does not parse: %v\n%s", err, out)
	}
	if !rep.OK || len(rep.Steps) != len(demoSteps()) {
		t.Fatalf("demo report not OK: %+v", rep)
	}
	for _, s := range rep.Steps {
		if !s.Verified || s.Bytes <= 0 {
			t.Errorf("step %+v", s)
		}
	}
	t.Logf("demo: %d steps in %v", len(rep.Steps), time.Since(start))
}

// A peer that dies in the middle must make the demo fail quickly and say why.
func TestDemoPeerCrash(t *testing.T) {
	t.Setenv(demoPeerCrashEnv, "verify")
	start := time.Now()
	st, out, errs := run(t, "demo", "--timeout", "60s", "--step-timeout", "20s")
	if st != 1 {
		t.Fatalf("demo with crashing peer: status %d, want 1\nstdout:\n%s\nstderr:\n%s", st, out, errs)
	}
	if !strings.Contains(errs, "FAILED") || !strings.Contains(errs, "RMA put") {
		t.Errorf("error does not name the failed step:\n%s", errs)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("failure took %v to be reported", d)
	}
	t.Logf("reported in %v: %s", time.Since(start), strings.TrimSpace(errs))
}

func TestPerf(t *testing.T) {
	for _, tr := range []string{"shm", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			st, out, errs := run(t, "perf", "--json", "--transport", tr, "--sizes", "8,64k", "--iters", "200", "--warmup", "20", "--timeout", "60s")
			if st != 0 {
				t.Fatalf("perf: status %d\nstderr:\n%s", st, errs)
			}
			var rep perfReport
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("perf --json output does not parse: %v\n%s", err, out)
			}
			if rep.TLS != tr || rep.PeerTLS != tr {
				t.Errorf("tls %q, peer tls %q, want %q", rep.TLS, rep.PeerTLS, tr)
			}
			if rep.PeerErrorHandling != (tr == "tcp") {
				t.Errorf("peer_error_handling %v for %s", rep.PeerErrorHandling, tr)
			}
			if len(rep.Results) != len(allTests)*2 {
				t.Fatalf("%d results, want %d: %+v", len(rep.Results), len(allTests)*2, rep.Results)
			}
			for _, r := range rep.Results {
				if r.Iters != 200 || r.Warmup != 20 || r.ElapsedS <= 0 || r.BandwidthMBs <= 0 || r.MsgRate <= 0 {
					t.Errorf("implausible result %+v", r)
				}
				if r.Test == testTagLat && !(r.LatMinUs > 0 && r.LatMinUs <= r.LatTypicalUs && r.LatTypicalUs > 0 && r.LatAvgUs > 0) {
					t.Errorf("implausible latency %+v", r)
				}
			}
		})
	}
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
			st, out, errs := run(t, "perf", "--json", "--tests", "tag_lat", "--modes", strings.Join(allModes, ","), "--work", work,
				"--backend", "host", "--sizes", "8,4k", "--iters", strconv.Itoa(iters), "--warmup", "20", "--timeout", "60s")
			if st != 0 {
				t.Fatalf("perf --modes: status %d\nstderr:\n%s", st, errs)
			}
			var rep perfReport
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("output does not parse: %v\n%s", err, out)
			}
			if rep.Backend != "host" {
				t.Errorf("backend %q, want host", rep.Backend)
			}
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
				if r.Test != testTagLat || r.Iters != iters || r.Warmup != 20 || !(r.LatAvgUs > 0) || !(r.ElapsedS > 0) {
					t.Errorf("implausible result %+v", r)
				}
				// The total time is what the mean latency comes from: two one-way trips per iteration.
				if got := r.LatAvgUs * 2 * float64(r.Iters) / 1e6; got < r.ElapsedS*0.99 || got > r.ElapsedS*1.01 {
					t.Errorf("%s/%d: mean latency %.3f us does not match %d iterations in %.6f s", r.Mode, r.Size, r.LatAvgUs, r.Iters, r.ElapsedS)
				}
			}
			for m, n := range want {
				if seen[m] != n {
					t.Errorf("mode %s: %d results, want %d", m, seen[m], n)
				}
			}
			if len(seen) != len(want) {
				t.Errorf("modes %v, want %v", seen, want)
			}
			// (c) against (a) and (b) at both sizes, and with work against their +work.
			wantCells := 2 * 2
			if work == "kernel" {
				wantCells *= 2
			}
			if len(rep.Comparisons) != wantCells {
				t.Errorf("%d comparisons, want %d: %+v", len(rep.Comparisons), wantCells, rep.Comparisons)
			}
			for _, c := range rep.Comparisons {
				if !(c.Ratio > 0) {
					t.Errorf("comparison %+v: ratio not positive", c)
				}
			}
		})
	}
	for _, bad := range [][]string{{"--modes", "warp"}, {"--work", "gpu"}, {"--modes", "plain,kernel", "--work", "kernel"}} {
		st, _, errs := run(t, append([]string{"perf", "--tests", "tag_lat", "--timeout", "5s"}, bad...)...)
		if st != 2 || !strings.Contains(errs, "--") {
			t.Errorf("perf %v: status %d, stderr %s", bad, st, errs)
		}
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
	if err != nil {
		t.Fatal(err)
	}
	if want := "plain,sync,sync+work,kernel,stream,stream+work"; strings.Join(got, ",") != want {
		t.Errorf("got %v, want %s", got, want)
	}
	if got, err := parseModes("stream", "none"); err != nil || strings.Join(got, ",") != "stream" {
		t.Errorf("--work none: %v, %v", got, err)
	}
	for _, bad := range [][2]string{{"stream+work", "none"}, {"kernel", "kernel"}, {"sync", "host"}, {"", "none"}} {
		if _, err := parseModes(bad[0], bad[1]); err == nil {
			t.Errorf("parseModes(%q, %q) accepted", bad[0], bad[1])
		}
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
			if st != 1 || !strings.Contains(errs, "peer") {
				t.Fatalf("status %d, stderr:\n%s", st, errs)
			}
			if d := time.Since(start); d > 15*time.Second {
				t.Errorf("failure took %v to be reported", d)
			}
			t.Logf("reported in %v: %s", time.Since(start), strings.TrimSpace(errs))
		})
	}
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ucpx/ucpx/cgo/ucx"
	"github.com/ucpx/ucpx/trace"
)

// The perf tests, named like ucx_perftest's (-t tag_lat, -t tag_bw, -t ucp_put_bw).
const (
	testTagLat = "tag_lat"
	testTagBw  = "tag_bw"
	testPutBw  = "put_bw"
)

var allTests = []string{testTagLat, testTagBw, testPutBw, testPartLat, testPartBw}

// defaultSizes: 8 B to 4 MiB, powers of 8 plus 1 MiB and 4 MiB.
var defaultSizes = []int{8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20}

// mb is ucx_perftest's "MB": 2^20 bytes.
const mb = 1 << 20

type perfOptions struct {
	tests      []string
	sizes      []int
	iters      int // 0: automatic per size
	warmup     int // -1: automatic
	transport  string
	tls        string
	peerErr    bool
	window     int
	spin       bool
	timeout    time.Duration
	asJSON     bool
	asCSV      bool
	modes      []string // tag_lat only: plain and the stream modes
	backend    string   // stream backend of the stream modes: auto, host, cuda
	partitions int      // part_lat, part_bw: partitions of each message
	check      bool     // validate every received byte, count the wrong ones
	tracePath  string   // --trace: Chrome trace JSON of the conditioned operations
	plotPath   string   // --plot: SVG of latency and bandwidth against size
	refPath    string   // --reference: an earlier --json report drawn beside this run
	label      string   // --label: names this run (perfReport.Label)
}

// perfReport is the output of `ucpx perf --json`.
type perfReport struct {
	Date              string `json:"date"`
	UCXVersion        string `json:"ucx_version"`
	Transport         string `json:"transport"` // of the set used: tcp, shm, or the UCX_TLS of another set
	TLS               string `json:"tls"`       // UCX_TLS this process used
	PeerTLS           string `json:"peer_tls"`  // UCX_TLS the peer process used
	PeerErrorHandling bool   `json:"peer_error_handling"`
	Window            int    `json:"window"`
	Wait              string `json:"wait"` // wait or spin
	CPUs              int    `json:"cpus"`
	Backend           string `json:"backend,omitempty"` // stream backend of the stream modes
	Check             bool   `json:"check,omitempty"`   // --check: rows carry wrong byte counts
	// Label names the run where it is drawn as another run's reference (--reference);
	// empty: the transport and date.
	Label   string       `json:"label,omitempty"`
	Results []perfResult `json:"results"`
	// Comparisons: stream against sync and hostfunc at each size, from Results (tag_lat
	// with --modes including stream and sync or hostfunc).
	Comparisons []modeComparison `json:"comparisons,omitempty"`
	// Stopped says why the run ended before its last row (--timeout, Ctrl-C, a
	// failure); Results holds the rows completed until then.
	Stopped string `json:"stopped,omitempty"`
}

// perfResult follows ucx_perftest's columns: latency typical (median), average and
// minimum one-way latency (half a round trip for ping-pong tests) in microseconds;
// bandwidth in MB/s with MB = 2^20 bytes; message rate in messages per second.
// LatTypicalUs is the median of all iterations; LatLast2048Us is ucx_perftest's own
// "typical", the median of the last 2048 iterations (its timing queue), the one to
// compare with it; both take ucx_perftest's median, the element at n/2 of the sorted
// times (of an even count the upper middle one). p50, p90, p99 and max are over all
// iterations, p50..p99 by the nearest-rank method (`ucpx trace summarize`'s): the
// smallest time with at least that share of the iterations at or below it. The stream modes
// know only their total time (the stream runs ahead of the host): MeanOnly, with the
// mean in lat_avg_us only. Where a latency field was not measured (the stream modes,
// the bandwidth tests, whose lat_avg_us is the time per message) it is null in JSON
// and empty in CSV, as the table shows "-".
type perfResult struct {
	Test          string  `json:"test"`
	Mode          string  `json:"mode,omitempty"` // tag_lat: how a stream drives it (plain: no stream)
	Size          int     `json:"size"`
	Partitions    int     `json:"partitions,omitempty"` // part_lat, part_bw: Size is split into this many`
	Iters         int     `json:"iters"`
	Warmup        int     `json:"warmup"`
	LatTypicalUs  float64 `json:"lat_typical_us"`
	LatLast2048Us float64 `json:"lat_last2048_us"`
	LatP50Us      float64 `json:"lat_p50_us"`
	LatP90Us      float64 `json:"lat_p90_us"`
	LatP99Us      float64 `json:"lat_p99_us"`
	LatMaxUs      float64 `json:"lat_max_us"`
	LatAvgUs      float64 `json:"lat_avg_us"`
	LatMinUs      float64 `json:"lat_min_us"`
	MeanOnly      bool    `json:"mean_only,omitempty"`
	BandwidthMBs  float64 `json:"bandwidth_mbs"`
	MsgRate       float64 `json:"msg_rate"`
	ElapsedS      float64 `json:"elapsed_s"`
	// Wrong counts the received bytes, warm-up included, that differ from what was
	// sent (--check; nil without it), as nccl-tests' #wrong.
	Wrong *int64 `json:"wrong,omitempty"`
}

const perfSynopsis = `[flags]

Runs each test at each size between this process and a peer process it starts, a row
as each size completes. Latency is one way (half a round trip); p50, p90 and p99 are
over all iterations by the nearest-rank method (the smallest time with at least that
share of the iterations at or below it, as ucpx trace summarize takes them), max is the
largest, last2048 is ucx_perftest's typical (the median of the last 2048 iterations).`

// afterPerfRun, when set (by tests), runs once a perf run is over, before its outputs
// are written.
var afterPerfRun func()

func runPerf(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("perf", perfSynopsis, stderr)
	tests := fs.String("tests", strings.Join(allTests, ","), "tests to run: "+strings.Join(allTests, ",")+" (with stream --modes: tag_lat)")
	sizes := fs.String("sizes", joinSizes(defaultSizes), "message sizes in bytes (suffixes k, m: 4k = 4096)")
	iters := fs.Int("iters", 0, "measured iterations per size, at most 10000000 (0: automatic, fewer for large sizes)")
	warmup := fs.Int("warmup", -1, "warm-up iterations per size, at most 10000000 (-1: automatic, iters/10 but at least 10)")
	transport := fs.String("transport", "shm", "transport set: shm (UCX_TLS=shm) or tcp (UCX_TLS=tcp)")
	tls := fs.String("tls", "", "UCX_TLS for both processes, overriding --transport's set")
	peerErr := fs.String("peer-err", "auto", "peer error handling on endpoints: on, off, auto (on where the transports used, --transport's or --tls's, are tcp only; UCX 1.13 uses only tcp when on)")
	window := fs.Int("window", 32, "outstanding operations in the bandwidth tests, 1 to 65536 (ucx_perftest's default for tag_bw and ucp_put_bw)")
	waitMode := fs.String("wait", "wait", "how both processes wait for operations: wait (Request.Wait: spin, then park on the worker) or spin (busy-poll with Request.Test)")
	timeout := fs.Duration("timeout", 10*time.Minute, "bound on the whole run; the rows completed by then are printed")
	asJSON := fs.Bool("json", false, "print machine-readable JSON instead of a table (at the end, or when stopped)")
	asCSV := fs.Bool("csv", false, "print CSV instead of a table, a row as each size completes")
	check := fs.Bool("check", false, "validate every received byte and count the wrong ones (a wrong column; slower: off for speed runs)")
	modes := fs.String("modes", modePlain, "tag_lat only, how it is driven: "+strings.Join(allModes, ",")+" (stream modes: see docs/performance.md)")
	backend := fs.String("backend", "auto", "stream backend of the stream modes: auto (CUDA where there is a GPU), host, cuda")
	work := fs.String("work", "none", "tag_lat stream modes: none, or kernel to also run sync, hostfunc and stream as mode+work, with a producer kernel writing the send buffer on the stream before each iteration (a host function on host streams)")
	partitions := fs.Int("partitions", defaultPartitions, "part_lat, part_bw: partitions of each message (each size is the whole buffer, split into this many equal partitions; it must divide every size)")
	tracePath := fs.String("trace", "", "write a trace of this process's conditioned operations (the stream modes) to `file` (Chrome trace JSON; ucpx trace summarize reads it)")
	plotPath := fs.String("plot", "", "draw latency and bandwidth against size, a line per test and mode, into `file` (.svg, or .png)")
	refPath := fs.String("reference", "", "with --plot: the `report` of an earlier ucpx perf --json run (another transport, another machine) drawn dashed on the same axes")
	from := fs.String("from", "", "with --plot: draw the `report` of an earlier ucpx perf --json run instead of running (figures of a run made elsewhere)")
	label := fs.String("label", "", "name of this run in its JSON report, where --reference draws it (default: transport and date)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of this process (not the peer's) to `file`")
	if st, ok := parseFlags(fs, args); !ok {
		return st
	}
	if *from != "" {
		return replot(*from, *plotPath, *refPath, stderr)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	o := perfOptions{iters: *iters, warmup: *warmup, transport: *transport, window: *window, timeout: *timeout,
		asJSON: *asJSON, asCSV: *asCSV, partitions: *partitions, check: *check,
		tracePath: *tracePath, plotPath: *plotPath, refPath: *refPath, label: *label}
	var err error
	switch *waitMode {
	case "wait":
	case "spin":
		o.spin = true
	default:
		err = fmt.Errorf("--wait %q: want wait or spin", *waitMode)
	}
	if err == nil {
		o.tests, err = parseTests(*tests)
	}
	if err == nil {
		o.modes, err = parseModes(*modes, *work)
		o.backend = *backend
	}
	if err == nil {
		err = o.fitModes(set["tests"], set["backend"])
	}
	if err == nil {
		o.sizes, err = parseSizes(*sizes)
	}
	if err == nil {
		o.tls, o.transport, o.peerErr, err = resolveTransport(*transport, *tls, *peerErr)
	}
	if err == nil {
		err = o.checkPartitions()
	}
	var ref *perfReport
	switch {
	case err != nil:
	case o.iters < 0 || o.iters > maxIters:
		err = fmt.Errorf("--iters %d: want 0 (automatic) to %d (every round trip is kept for exact percentiles)", o.iters, maxIters)
	case o.warmup < -1 || o.warmup > maxIters:
		err = fmt.Errorf("--warmup %d: want -1 (automatic) to %d", o.warmup, maxIters)
	case o.window < 1 || o.window > maxWindow:
		err = fmt.Errorf("--window %d: want 1 to %d", o.window, maxWindow)
	case o.timeout <= 0:
		err = fmt.Errorf("--timeout %v: must be positive", o.timeout)
	case o.asJSON && o.asCSV:
		err = errors.New("--json and --csv: choose one output format")
	case o.plotPath != "" && !plotFormat(o.plotPath):
		err = fmt.Errorf("--plot %s: want a .svg or .png file", o.plotPath)
	case o.refPath != "" && o.plotPath == "":
		err = errors.New("--reference is drawn by --plot: give --plot too")
	case o.refPath != "":
		if ref, err = readPerfReport(o.refPath); err != nil {
			err = fmt.Errorf("--reference: %w", err)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "ucpx perf: %v\n", err)
		return 2
	}
	// The outputs written at the end are checked before anything runs, as
	// --cpuprofile is opened: a run must not end with its trace or figure lost.
	err = checkTraceOutput(o.tracePath)
	if err == nil && o.plotPath != "" {
		if err = checkWritable(o.plotPath); err != nil {
			err = fmt.Errorf("--plot: %w", err)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "ucpx perf: %v\n", err)
		return 1
	}
	if *cpuProfile != "" {
		stop, err := startCPUProfile(*cpuProfile)
		if err != nil {
			fmt.Fprintf(stderr, "ucpx perf: %v\n", err)
			return 1
		}
		defer stop()
	}
	// The engines this run starts record into rec (as UCPX_TRACE would); it is written
	// once, when the run is over.
	rec, stopTrace := startTrace(o.tracePath)
	defer stopTrace()

	// Ctrl-C and SIGTERM stop the run like --timeout: the rows completed so far are printed.
	ctx, stop := context.WithCancelCause(context.Background())
	defer stop(nil)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		select {
		case sig := <-sigs:
			stop(fmt.Errorf("interrupted (%v)", sig))
		case <-ctx.Done():
		}
	}()

	var sink perfSink = &textSink{w: stdout}
	switch {
	case o.asJSON:
		sink = &jsonSink{w: stdout}
	case o.asCSV:
		sink = &csvSink{w: stdout}
	}
	rep, err := perfMain(ctx, o, sink, stderr)
	// The run is over: Ctrl-C and SIGTERM end the process again, as they do for any
	// command, while the trace and the figure are written (drawing can take a while).
	signal.Stop(sigs)
	if afterPerfRun != nil {
		afterPerfRun()
	}
	status := 0
	if err != nil {
		fmt.Fprintf(stderr, "ucpx perf: %v\n", err)
		status = 1
	}
	if rep == nil {
		return status
	}
	if err != nil {
		rep.Stopped = err.Error()
	}
	rep.Comparisons = compareModes(rep.Results)
	sink.end(rep)
	if rec != nil {
		if ferr := rec.WriteFile(trace.ExpandPID(o.tracePath)); ferr != nil {
			fmt.Fprintf(stderr, "ucpx perf: --trace: %v\n", ferr)
			status = 1
		} else if rec.Len() == 0 {
			fmt.Fprintf(stderr, "ucpx perf: --trace %s: no conditioned operation ran (only the stream modes of --modes make them)\n", o.tracePath)
		}
	}
	if o.plotPath != "" && len(rep.Results) > 0 {
		if perr := writePlot(o.plotPath, rep, ref, stderr); perr != nil {
			fmt.Fprintf(stderr, "ucpx perf: --plot: %v\n", perr)
			status = 1
		}
	}
	if n := rep.wrong(); n > 0 {
		fmt.Fprintf(stderr, "ucpx perf: --check: %d received bytes differed from what was sent\n", n)
		status = 1
	}
	return status
}

// replot is `ucpx perf --from REPORT --plot FILE [--reference REF]`: a figure of a
// run made earlier, elsewhere (a GPU machine), without running.
func replot(from, plotPath, refPath string, stderr io.Writer) int {
	fail := func(st int, err error) int {
		fmt.Fprintf(stderr, "ucpx perf: %v\n", err)
		return st
	}
	if plotPath == "" || !plotFormat(plotPath) {
		return fail(2, fmt.Errorf("--from %s: give --plot FILE.svg (or .png) to draw it", from))
	}
	rep, err := readPerfReport(from)
	if err != nil {
		return fail(2, err)
	}
	var ref *perfReport
	if refPath != "" {
		if ref, err = readPerfReport(refPath); err != nil {
			return fail(2, err)
		}
	}
	if err := writePlot(plotPath, rep, ref, stderr); err != nil {
		return fail(1, fmt.Errorf("--plot: %w", err))
	}
	return 0
}

// resolveTransport returns the UCX_TLS both processes use, the transport it is
// (what the report says: tcp, shm, or the UCX_TLS itself for another set) and whether
// the endpoints use peer error handling. --tls overrides --transport's set, and then
// the transport and --peer-err auto follow the set used, not --transport: auto is on
// where the set is tcp only (UCX 1.13 with peer error handling selects only tcp, so on
// would change a shared-memory set).
func resolveTransport(transport, tls, peerErr string) (string, string, bool, error) {
	switch transport {
	case "shm", "tcp":
	default:
		return "", "", false, fmt.Errorf("--transport %q: want shm or tcp", transport)
	}
	if tls = strings.TrimSpace(tls); tls == "" {
		tls = transport
	}
	used := transportOf(tls)
	pe := used == "tcp"
	switch peerErr {
	case "auto":
	case "on", "true", "1":
		pe = true
	case "off", "false", "0":
		pe = false
	default:
		return "", "", false, fmt.Errorf("--peer-err %q: want on, off or auto", peerErr)
	}
	return tls, used, pe, nil
}

// transportOf names a UCX_TLS set: tcp where it holds tcp only, shm where it holds
// shared-memory transports only (with self, loopback within a process), else the set
// itself.
func transportOf(tls string) string {
	shm := map[string]bool{"shm": true, "sm": true, "posix": true, "sysv": true, "cma": true, "knem": true, "xpmem": true, "self": true}
	tcp, mem, other := false, false, false
	for _, t := range strings.Split(tls, ",") {
		switch t = strings.TrimSpace(t); {
		case t == "tcp":
			tcp = true
		case shm[t]:
			mem = true
		case t != "":
			other = true
		}
	}
	switch {
	case tcp && !mem && !other:
		return "tcp"
	case mem && !tcp && !other:
		return "shm"
	}
	return tls
}

func parseTests(s string) ([]string, error) {
	var out []string
	for _, t := range strings.Split(s, ",") {
		t = strings.TrimSpace(t)
		if t == "ucp_put_bw" {
			t = testPutBw
		}
		switch t {
		case "":
			continue
		case testTagLat, testTagBw, testPutBw, testPartLat, testPartBw:
			out = append(out, t)
		default:
			return nil, fmt.Errorf("--tests: unknown test %q (want %s)", t, strings.Join(allTests, ", "))
		}
	}
	if len(out) == 0 {
		return nil, errors.New("--tests: no test given")
	}
	return out, nil
}

// maxSize bounds message sizes: both processes allocate two buffers of the largest.
const maxSize = 1 << 30

// maxIters bounds --iters and --warmup: the ping-pong tests keep every round trip
// (16 bytes an iteration: its start time and its duration) for exact percentiles, so
// a phase holds at most 160 MB of samples. maxWindow bounds --window: each side keeps
// a request per outstanding operation.
const (
	maxIters  = 10_000_000
	maxWindow = 1 << 16
)

func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.ToLower(strings.TrimSpace(f))
		if f == "" {
			continue
		}
		mult := 1
		num := strings.TrimSuffix(strings.TrimSuffix(f, "ib"), "b")
		switch {
		case strings.HasSuffix(num, "k"):
			mult, num = 1<<10, strings.TrimSuffix(num, "k")
		case strings.HasSuffix(num, "m"):
			mult, num = 1<<20, strings.TrimSuffix(num, "m")
		case strings.HasSuffix(num, "g"):
			mult, num = 1<<30, strings.TrimSuffix(num, "g")
		}
		n, err := strconv.Atoi(num)
		if err != nil || n <= 0 || n > maxSize/mult {
			return nil, fmt.Errorf("--sizes: bad size %q (want 1 byte to 1 GiB, e.g. 8,4k,4m)", f)
		}
		out = append(out, n*mult)
	}
	if len(out) == 0 {
		return nil, errors.New("--sizes: no size given")
	}
	return out, nil
}

func joinSizes(sizes []int) string {
	parts := make([]string, len(sizes))
	for i, s := range sizes {
		parts[i] = strconv.Itoa(s)
	}
	return strings.Join(parts, ",")
}

func fmtSize(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dM", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dK", n>>10)
	}
	return strconv.Itoa(n)
}

// autoIters picks the iteration count for a size: many for small messages, enough
// bytes for a stable bandwidth for large ones.
func autoIters(test string, size int) int {
	budget := 512 << 20 // bytes moved per size
	if test == testTagLat || test == testPartLat {
		budget = 256 << 20
	}
	return min(100000, max(100, budget/size))
}

// needsRMA: like ucx_perftest, request only the features the selected tests use
// (UCX picks its lanes from them).
func (o *perfOptions) needsRMA() bool {
	for _, t := range o.tests {
		if t == testPutBw {
			return true
		}
	}
	return false
}

func (o *perfOptions) itersFor(test string, size int) (iters, warmup int) {
	iters = o.iters
	if iters == 0 {
		iters = autoIters(test, size)
	}
	warmup = o.warmup
	if warmup < 0 {
		warmup = max(10, iters/10)
	}
	return iters, warmup
}

func largest(sizes []int) int {
	m := 0
	for _, s := range sizes {
		m = max(m, s)
	}
	return m
}

// perfMsg is a control message between `ucpx perf` and its peer.
type perfMsg struct {
	Op    string `json:"op"` // hello, phase, ready, done, bye, error
	Addr  []byte `json:"addr,omitempty"`
	Rkey  []byte `json:"rkey,omitempty"`
	TLS   string `json:"tls,omitempty"`
	Test  string `json:"test,omitempty"`
	Size  int    `json:"size,omitempty"`
	Count int    `json:"count,omitempty"`
	Parts int    `json:"parts,omitempty"` // part_lat, part_bw: partitions
	Mode  string `json:"mode,omitempty"`  // tag_lat: how the initiator drives it (what its pings hold)
	Wrong int64  `json:"wrong,omitempty"` // done: wrong bytes the peer received (--check)
	Err   string `json:"err,omitempty"`
}

const ctlTimeout = 30 * time.Second

// perfMain runs the tests with a peer process, handing each row to sink as its size
// completes. On a failure, --timeout or ctx's end it returns the report of the rows
// completed so far with the error; the report is nil only when nothing could start.
func perfMain(ctx context.Context, o perfOptions, sink perfSink, logw io.Writer) (*perfReport, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, o.timeout, fmt.Errorf("--timeout %v reached", o.timeout))
	defer cancel()
	logw = &syncWriter{w: logw} // the peer's output and the progress line share it
	maj, mnr, rel := ucx.Version()
	rep := &perfReport{
		Date:              time.Now().UTC().Format(time.RFC3339),
		UCXVersion:        fmt.Sprintf("%d.%d.%d", maj, mnr, rel),
		Transport:         o.transport,
		TLS:               o.tls,
		PeerErrorHandling: o.peerErr,
		Window:            o.window,
		Wait:              map[bool]string{false: "wait", true: "spin"}[o.spin],
		CPUs:              runtime.NumCPU(),
		Check:             o.check,
		Label:             o.label,
		Results:           []perfResult{},
	}
	if o.transport == "shm" && o.peerErr {
		fmt.Fprintln(logw, "ucpx perf: warning: with peer error handling UCX 1.13 selects only tcp, not shared memory")
	}
	// The stream backend first: a missing GPU is reported before any peer starts.
	var rig *modeRig
	for _, m := range o.modes {
		if m != modePlain && rig == nil {
			var err error
			if rig, err = openModeRig(o.backend); err != nil {
				return nil, fmt.Errorf("--modes %s: stream backend %s: %w", m, o.backend, err)
			}
			rep.Backend = rig.backend.Kind().String()
		}
	}
	closeRig := func() {
		if rig != nil {
			rig.close()
		}
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		closeRig()
		return nil, fmt.Errorf("control listener: %w", err)
	}
	defer ln.Close()
	size := largest(o.sizes)
	peer, err := startPeer([]string{"perf-peer",
		"--ctl", ln.Addr().String(), "--tls", o.tls,
		"--peer-err=" + strconv.FormatBool(o.peerErr),
		"--max-size", strconv.Itoa(size),
		"--window", strconv.Itoa(o.window),
		"--rma=" + strconv.FormatBool(o.needsRMA()),
		"--part=" + strconv.FormatBool(o.needsPart()),
		"--spin=" + strconv.FormatBool(o.spin),
		"--check=" + strconv.FormatBool(o.check),
		"--timeout", o.timeout.String(),
	}, logw, "[perf-peer] ")
	if err != nil {
		closeRig()
		return nil, err
	}
	defer peer.kill() // no-op after a successful wait
	// A dead peer cannot be detected by UCX without peer error handling (shm): stop
	// every wait as soon as the process exits.
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	go func() {
		select {
		case <-peer.done:
			fail(fmt.Errorf("peer process exited (%s)", orErr(peer.err, "")))
		case <-ctx.Done():
		}
	}()

	conn, err := acceptCtl(ln, peer, ctlTimeout)
	if err != nil {
		closeRig()
		return rep, err
	}
	ctl := newCtlConn(conn)
	defer ctl.close()
	// A control read waits on its socket, not on ctx: once ctx ends (Ctrl-C), keep
	// its deadline in the past so that every read returns, and the run with it.
	ran := make(chan struct{})
	defer close(ran)
	go func() {
		select {
		case <-ctx.Done():
		case <-ran:
			return
		}
		for {
			_ = conn.SetReadDeadline(time.Unix(1, 0))
			select {
			case <-ran:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()

	s, err := newPerfSide(o.tls, o.peerErr, o.needsRMA(), o.needsPart(), o.spin, size, o.window)
	if err != nil {
		closeRig()
		return rep, err
	}
	s.rig, s.check = rig, o.check
	defer s.close() // closes the rig before UCX

	var hello perfMsg
	if err := ctl.recv(ctx, &hello, ctlTimeout); err != nil {
		return rep, peerFailure(peer, stopCause(ctx, err))
	}
	if hello.Op != "hello" {
		return rep, fmt.Errorf("peer: %s", orMsg(hello.Err, "unexpected "+hello.Op))
	}
	rep.PeerTLS = hello.TLS
	addr, err := s.w.Address()
	if err != nil {
		return rep, err
	}
	if err := ctl.send(perfMsg{Op: "hello", Addr: addr, TLS: o.tls}, ctlTimeout); err != nil {
		return rep, err
	}
	if err := s.connect(hello.Addr, hello.Rkey); err != nil {
		return rep, err
	}

	sink.begin(rep)
	prog := newProgress(logw)
	for _, test := range o.tests {
		modes := []string{modePlain}
		if test == testTagLat {
			modes = o.modes
		}
		for _, mode := range modes {
			for _, sz := range o.sizes {
				iters, warmup := o.itersFor(test, sz)
				label := test
				if mode != modePlain {
					label += "/" + mode
				}
				label += " " + fmtSize(sz)
				var warmWrong int64
				if warmup > 0 {
					done := prog.start(label+" warm-up", warmup, &s.progress)
					w, err := s.phase(ctx, ctl, test, mode, sz, warmup, o.partitions)
					done()
					if err != nil {
						return rep, peerFailure(peer, fmt.Errorf("%s warm-up: %w", label, stopCause(ctx, err)))
					}
					if w.Wrong != nil {
						warmWrong = *w.Wrong
					}
				}
				done := prog.start(label, iters, &s.progress)
				res, err := s.phase(ctx, ctl, test, mode, sz, iters, o.partitions)
				done()
				if err != nil {
					return rep, peerFailure(peer, fmt.Errorf("%s: %w", label, stopCause(ctx, err)))
				}
				res.Warmup = warmup
				if res.Wrong != nil {
					*res.Wrong += warmWrong
				}
				rep.Results = append(rep.Results, res)
				sink.row(rep, res)
			}
		}
	}
	if err := s.freePart(ctx); err != nil {
		return rep, peerFailure(peer, stopCause(ctx, err))
	}
	if err := ctl.send(perfMsg{Op: "bye"}, ctlTimeout); err != nil {
		return rep, err
	}
	var bye perfMsg
	if err := s.ctlRecv(ctx, ctl, &bye, ctlTimeout); err != nil || bye.Op != "bye" {
		return rep, peerFailure(peer, fmt.Errorf("peer did not confirm the end: %v", orErr(stopCause(ctx, err), bye.Err)))
	}
	if err := peer.wait(10 * time.Second); err != nil {
		return rep, fmt.Errorf("peer exit: %w", err)
	}
	return rep, nil
}

// stopCause is why ctx ended (--timeout, Ctrl-C, the peer's exit) when it has, else
// err. A wait bounded by ctx's deadline (a control-channel read) can return just
// before ctx's own timer fires: past the deadline, it waits for that.
func stopCause(ctx context.Context, err error) error {
	if d, ok := ctx.Deadline(); ok && ctx.Err() == nil && !time.Now().Before(d) {
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	return orCause(ctx, err)
}

// acceptCtl accepts the peer's control connection, giving up if the peer exits first.
func acceptCtl(ln net.Listener, peer *peerProc, timeout time.Duration) (net.Conn, error) {
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(timeout))
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, peerFailure(peer, fmt.Errorf("peer did not connect to the control channel: %w", r.err))
		}
		return r.c, nil
	case <-peer.done:
		_ = ln.Close()
		return nil, fmt.Errorf("peer exited before connecting: %v", peer.err)
	}
}

// peerFailure adds the peer's exit status to err when the peer has died.
func peerFailure(peer *peerProc, err error) error {
	select {
	case <-peer.done:
	case <-time.After(200 * time.Millisecond):
	}
	if exited, perr := peer.exited(); exited && !strings.Contains(err.Error(), "peer process exited") {
		return fmt.Errorf("%w (peer exited: %v)", err, orErr(perr, ""))
	}
	return err
}

func orMsg(s, def string) string {
	if s != "" {
		return s
	}
	return def
}

func orErr(err error, msg string) string {
	if err != nil {
		return err.Error()
	}
	if msg != "" {
		return msg
	}
	return "status 0"
}

// phase runs count iterations of test at size with the peer and measures them; parts
// is the partition count of the partitioned tests.
func (s *perfSide) phase(ctx context.Context, ctl *ctlConn, test, mode string, size, count, parts int) (perfResult, error) {
	res := perfResult{Test: test, Size: size, Iters: count}
	if test == testTagLat {
		res.Mode = mode
	}
	msg := perfMsg{Op: "phase", Test: test, Size: size, Count: count, Mode: res.Mode}
	s.progress.Store(0)
	s.progressMask = progressMaskFor(size)
	s.wrong.Store(0)
	if isPartTest(test) {
		res.Partitions, msg.Parts = parts, parts
	}
	if err := ctl.send(msg, ctlTimeout); err != nil {
		return res, err
	}
	var ps *partSet
	if isPartTest(test) {
		// The peer prepares its requests before it says ready: prepare ours meanwhile.
		var err error
		if ps, err = s.partPhaseSetup(ctx, test, size, parts); err != nil {
			return res, err
		}
	}
	var m perfMsg
	if err := s.ctlRecv(ctx, ctl, &m, ctlTimeout); err != nil {
		return res, err
	}
	if m.Op != "ready" {
		return res, fmt.Errorf("peer: %s", orMsg(m.Err, "unexpected "+m.Op))
	}
	var err error
	switch test {
	case testTagLat:
		var rtts []time.Duration
		var total time.Duration
		if mode == modePlain {
			rtts, total, err = s.tagLatInitiator(ctx, size, count)
			if err == nil {
				fillLatency(&res, rtts, total)
			}
		} else if total, err = s.tagLatMode(ctx, s.rig, mode, size, count); err == nil {
			// The stream runs ahead of the host: only the mean round trip is known.
			fillMean(&res, total)
		}
	case testTagBw:
		var total time.Duration
		total, err = s.tagBwSender(ctx, size, count)
		fillBandwidth(&res, total)
	case testPutBw:
		var total time.Duration
		total, err = s.putBwSender(ctx, size, count)
		fillBandwidth(&res, total)
	case testPartLat:
		var rtts []time.Duration
		var total time.Duration
		if rtts, total, err = s.partLatInitiator(ctx, ps, count); err == nil {
			fillLatency(&res, rtts, total)
		}
	case testPartBw:
		var total time.Duration
		total, err = s.partBwSender(ctx, ps, count)
		fillBandwidth(&res, total)
	}
	if err != nil {
		return res, err
	}
	if err := s.ctlRecv(ctx, ctl, &m, ctlTimeout); err != nil {
		return res, err
	}
	if m.Op != "done" {
		return res, fmt.Errorf("peer: %s", orMsg(m.Err, "unexpected "+m.Op))
	}
	if s.check {
		wrong := s.wrong.Load() + m.Wrong
		res.Wrong = &wrong
	}
	return res, nil
}

// timingQueue is the number of last iterations whose median ucx_perftest reports as
// its typical latency (TIMING_QUEUE_SIZE in libperf).
const timingQueue = 2048

// fillLatency: one-way latency is half the round trip, as ucx_perftest reports for
// ping-pong tests; typical is the median, of all iterations and of the last 2048.
func fillLatency(res *perfResult, rtts []time.Duration, total time.Duration) {
	half := func(d time.Duration) float64 { return float64(d) / 2 / float64(time.Microsecond) }
	last := append([]time.Duration(nil), rtts[max(0, len(rtts)-timingQueue):]...)
	slices.Sort(last)
	res.LatLast2048Us = half(last[len(last)/2])
	slices.Sort(rtts)
	res.LatTypicalUs = half(rtts[len(rtts)/2])
	res.LatP50Us = half(nearestRank(rtts, 50))
	res.LatP90Us = half(nearestRank(rtts, 90))
	res.LatP99Us = half(nearestRank(rtts, 99))
	res.LatMaxUs = half(rtts[len(rtts)-1])
	res.LatMinUs = half(rtts[0])
	res.LatAvgUs = half(total) / float64(len(rtts))
	res.ElapsedS = total.Seconds()
	oneWay := total.Seconds() / 2 / float64(len(rtts))
	res.BandwidthMBs = float64(res.Size) / oneWay / mb
	res.MsgRate = 1 / oneWay
}

// nearestRank is the p-th percentile of sorted (not empty) by the nearest-rank
// method, as `ucpx trace summarize` computes it: the smallest value with at least p%
// of them at or below it (of 1..100: p50 is 50, p90 is 90, p99 is 99).
func nearestRank(sorted []time.Duration, p int) time.Duration {
	n := len(sorted)
	return sorted[max(0, (n*p+99)/100-1)]
}

// fillMean: a ping-pong of which only the total time is known (the stream modes).
func fillMean(res *perfResult, total time.Duration) {
	res.MeanOnly = true
	res.ElapsedS = total.Seconds()
	oneWay := total.Seconds() / 2 / float64(res.Iters)
	res.LatAvgUs = oneWay * 1e6
	res.BandwidthMBs = float64(res.Size) / oneWay / mb
	res.MsgRate = 1 / oneWay
}

func fillBandwidth(res *perfResult, total time.Duration) {
	if total <= 0 {
		return
	}
	sec := total.Seconds()
	res.ElapsedS = sec
	res.BandwidthMBs = float64(res.Size) * float64(res.Iters) / sec / mb
	res.MsgRate = float64(res.Iters) / sec
	res.LatAvgUs = sec / float64(res.Iters) * 1e6 // ucx_perftest's "overhead" column
}

// runPerfPeer is the hidden `ucpx perf-peer`: the responder of every test.
func runPerfPeer(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("perf-peer", "--ctl host:port [flags]", stderr)
	ctlAddr := fs.String("ctl", "", "control channel address of `ucpx perf`")
	tls := fs.String("tls", "shm", "UCX_TLS")
	peerErr := fs.Bool("peer-err", false, "peer error handling on endpoints")
	size := fs.Int("max-size", 4<<20, "largest message size")
	window := fs.Int("window", 32, "outstanding receives in tag_bw")
	rma := fs.Bool("rma", true, "create the context with the RMA feature (put_bw)")
	part := fs.Bool("part", false, "create the context with what prepared requests use (part_lat, part_bw)")
	spin := fs.Bool("spin", false, "busy-poll instead of Request.Wait")
	check := fs.Bool("check", false, "count the received bytes that differ from what was sent")
	timeout := fs.Duration("timeout", 10*time.Minute, "bound on the whole run")
	if st, ok := parseFlags(fs, args); !ok {
		return st
	}
	if os.Getenv(reexecEnv) != "" {
		watchParent("ucpx perf-peer")
		// Ctrl-C reaches the whole process group: the parent ends this peer once it
		// has printed its rows, and a peer dying first would hide the reason.
		signal.Ignore(os.Interrupt)
	}
	if err := perfPeerMain(*ctlAddr, *tls, *peerErr, *rma, *part, *spin, *check, *size, *window, *timeout); err != nil {
		fmt.Fprintf(stderr, "ucpx perf-peer: %v\n", err)
		return 1
	}
	return 0
}

func perfPeerMain(ctlAddr, tls string, peerErr, rma, part, spin, check bool, size, window int, timeout time.Duration) error {
	if ctlAddr == "" {
		return errors.New("--ctl is required")
	}
	if size <= 0 || size > maxSize {
		return fmt.Errorf("--max-size %d out of range", size)
	}
	if window < 1 || window > maxWindow {
		return fmt.Errorf("--window %d out of range", window)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := net.DialTimeout("tcp", ctlAddr, ctlTimeout)
	if err != nil {
		return fmt.Errorf("connect control channel: %w", err)
	}
	ctl := newCtlConn(conn)
	defer ctl.close()

	s, err := newPerfSide(tls, peerErr, rma, part, spin, size, window)
	if err != nil {
		_ = ctl.send(perfMsg{Op: "error", Err: err.Error()}, ctlTimeout)
		return err
	}
	defer s.close()
	s.check = check
	addr, err := s.w.Address()
	if err != nil {
		return err
	}
	var rkey []byte
	if rma {
		if rkey, err = s.rmem.PackRkey(); err != nil {
			return err
		}
	}
	if err := ctl.send(perfMsg{Op: "hello", Addr: addr, Rkey: rkey, TLS: tls}, ctlTimeout); err != nil {
		return err
	}
	var m perfMsg
	if err := ctl.recv(ctx, &m, ctlTimeout); err != nil {
		return err
	}
	if m.Op != "hello" {
		return fmt.Errorf("expected hello, got %q", m.Op)
	}
	if err := s.connect(m.Addr, nil); err != nil {
		return err
	}
	for {
		// The parent may think for a while between phases (sorting samples, printing).
		if err := s.ctlRecv(ctx, ctl, &m, timeout); err != nil {
			return err
		}
		switch m.Op {
		case "bye":
			if err := s.freePart(ctx); err != nil {
				_ = ctl.send(perfMsg{Op: "error", Err: err.Error()}, ctlTimeout)
				return err
			}
			return ctl.send(perfMsg{Op: "bye"}, ctlTimeout)
		case "phase":
			if err := s.respond(ctx, ctl, m); err != nil {
				_ = ctl.send(perfMsg{Op: "error", Err: err.Error()}, ctlTimeout)
				return fmt.Errorf("%s %s: %w", m.Test, fmtSize(m.Size), err)
			}
		default:
			return fmt.Errorf("unexpected control message %q", m.Op)
		}
	}
}

// startCPUProfile profiles this process into path until the returned function runs.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ucpx/ucpx/cgo/ucx"
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
	modes      []string // tag_lat only: plain and the stream modes
	backend    string   // stream backend of the stream modes: auto, host, cuda
	partitions int      // part_lat, part_bw: partitions of each message
}

// perfReport is the output of `ucpx perf --json`.
type perfReport struct {
	Date              string       `json:"date"`
	UCXVersion        string       `json:"ucx_version"`
	Transport         string       `json:"transport"`
	TLS               string       `json:"tls"`      // UCX_TLS this process used
	PeerTLS           string       `json:"peer_tls"` // UCX_TLS the peer process used
	PeerErrorHandling bool         `json:"peer_error_handling"`
	Window            int          `json:"window"`
	Wait              string       `json:"wait"` // wait or spin
	CPUs              int          `json:"cpus"`
	Backend           string       `json:"backend,omitempty"` // stream backend of the stream modes
	Results           []perfResult `json:"results"`
	// Comparisons: (c) against (a) and (b) at each size, from Results (tag_lat with
	// --modes including stream and sync or hostfunc).
	Comparisons []modeComparison `json:"comparisons,omitempty"`
}

// perfResult follows ucx_perftest's columns: latency typical (median), average and
// minimum one-way latency (half a round trip for ping-pong tests) in microseconds;
// bandwidth in MB/s with MB = 2^20 bytes; message rate in messages per second.
// LatTypicalUs is the median of all iterations; LatLast2048Us is ucx_perftest's own
// "typical", the median of the last 2048 iterations (its timing queue), the one to
// compare with it; p50 and p99 are over all iterations.
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
	LatP99Us      float64 `json:"lat_p99_us"`
	LatAvgUs      float64 `json:"lat_avg_us"`
	LatMinUs      float64 `json:"lat_min_us"`
	BandwidthMBs  float64 `json:"bandwidth_mbs"`
	MsgRate       float64 `json:"msg_rate"`
	ElapsedS      float64 `json:"elapsed_s"`
}

func runPerf(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("perf", "[flags]", stderr)
	tests := fs.String("tests", strings.Join(allTests, ","), "tests to run: "+strings.Join(allTests, ","))
	sizes := fs.String("sizes", joinSizes(defaultSizes), "message sizes in bytes (suffixes k, m: 4k = 4096)")
	iters := fs.Int("iters", 0, "measured iterations per size (0: automatic, fewer for large sizes)")
	warmup := fs.Int("warmup", -1, "warm-up iterations per size (-1: automatic, iters/10 but at least 10)")
	transport := fs.String("transport", "shm", "transport set: shm (UCX_TLS=shm) or tcp (UCX_TLS=tcp)")
	tls := fs.String("tls", "", "UCX_TLS for both processes, overriding --transport's set")
	peerErr := fs.String("peer-err", "auto", "peer error handling on endpoints: on, off, auto (off for shm, on for tcp; UCX 1.13 uses only tcp when on)")
	window := fs.Int("window", 32, "outstanding operations in the bandwidth tests (ucx_perftest's default for tag_bw and ucp_put_bw)")
	waitMode := fs.String("wait", "wait", "how both processes wait for operations: wait (Request.Wait: spin, then park on the worker) or spin (busy-poll with Request.Test)")
	timeout := fs.Duration("timeout", 10*time.Minute, "bound on the whole run")
	asJSON := fs.Bool("json", false, "print machine-readable JSON instead of a table")
	modes := fs.String("modes", modePlain, "tag_lat only, how it is driven: "+strings.Join(allModes, ",")+" (stream modes: see docs/performance.md)")
	backend := fs.String("backend", "auto", "stream backend of the stream modes: auto (CUDA where there is a GPU), host, cuda")
	work := fs.String("work", "none", "tag_lat stream modes: none, or kernel to also run sync, hostfunc and stream as mode+work, with a producer kernel writing the send buffer on the stream before each iteration (a host function on host streams)")
	partitions := fs.Int("partitions", defaultPartitions, "part_lat, part_bw: partitions of each message (each size is the whole buffer, split into this many equal partitions; it must divide every size)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of this process (not the peer's) to `file`")
	if st, ok := parseFlags(fs, args); !ok {
		return st
	}
	o := perfOptions{iters: *iters, warmup: *warmup, transport: *transport, window: *window, timeout: *timeout, asJSON: *asJSON, partitions: *partitions}
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
		o.sizes, err = parseSizes(*sizes)
	}
	if err == nil {
		o.tls, o.peerErr, err = resolveTransport(*transport, *tls, *peerErr)
	}
	if err == nil {
		err = o.checkPartitions()
	}
	switch {
	case err != nil:
	case o.iters < 0:
		err = fmt.Errorf("--iters %d: must be >= 0", o.iters)
	case o.warmup < -1:
		err = fmt.Errorf("--warmup %d: must be >= -1", o.warmup)
	case o.window < 1:
		err = fmt.Errorf("--window %d: must be >= 1", o.window)
	case o.timeout <= 0:
		err = fmt.Errorf("--timeout %v: must be positive", o.timeout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "ucpx perf: %v\n", err)
		return 2
	}
	if *cpuProfile != "" {
		stop, err := startCPUProfile(*cpuProfile)
		if err != nil {
			fmt.Fprintf(stderr, "ucpx perf: %v\n", err)
			return 1
		}
		defer stop()
	}
	rep, err := perfMain(o, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "ucpx perf: %v\n", err)
		return 1
	}
	if o.asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	} else {
		printPerf(stdout, rep)
	}
	return 0
}

func resolveTransport(transport, tls, peerErr string) (string, bool, error) {
	var defTLS string
	var defPeerErr bool
	switch transport {
	case "shm":
		defTLS = "shm"
	case "tcp":
		defTLS, defPeerErr = "tcp", true
	default:
		return "", false, fmt.Errorf("--transport %q: want shm or tcp", transport)
	}
	if tls == "" {
		tls = defTLS
	}
	switch peerErr {
	case "auto":
	case "on", "true", "1":
		defPeerErr = true
	case "off", "false", "0":
		defPeerErr = false
	default:
		return "", false, fmt.Errorf("--peer-err %q: want on, off or auto", peerErr)
	}
	return tls, defPeerErr, nil
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
	Err   string `json:"err,omitempty"`
}

const ctlTimeout = 30 * time.Second

func perfMain(o perfOptions, logw io.Writer) (*perfReport, error) {
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	defer cancel()
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
		Results:           []perfResult{},
	}
	if o.transport == "shm" && o.peerErr {
		fmt.Fprintln(logw, "ucpx perf: warning: with peer error handling UCX 1.13 selects only tcp, not shared memory")
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
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
		"--timeout", o.timeout.String(),
	}, logw, "[perf-peer] ")
	if err != nil {
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
		return nil, err
	}
	ctl := newCtlConn(conn)
	defer ctl.close()

	s, err := newPerfSide(o.tls, o.peerErr, o.needsRMA(), o.needsPart(), o.spin, size, o.window)
	if err != nil {
		return nil, err
	}
	defer s.close()

	var hello perfMsg
	if err := ctl.recv(ctx, &hello, ctlTimeout); err != nil {
		return nil, peerFailure(peer, err)
	}
	if hello.Op != "hello" {
		return nil, fmt.Errorf("peer: %s", orMsg(hello.Err, "unexpected "+hello.Op))
	}
	rep.PeerTLS = hello.TLS
	addr, err := s.w.Address()
	if err != nil {
		return nil, err
	}
	if err := ctl.send(perfMsg{Op: "hello", Addr: addr, TLS: o.tls}, ctlTimeout); err != nil {
		return nil, err
	}
	if err := s.connect(hello.Addr, hello.Rkey); err != nil {
		return nil, err
	}

	for _, m := range o.modes {
		if m != modePlain && s.rig == nil {
			if s.rig, err = openModeRig(o.backend); err != nil {
				return nil, fmt.Errorf("--modes %s: stream backend %s: %w", m, o.backend, err)
			}
			defer s.rig.close()
			rep.Backend = s.rig.backend.Kind().String()
		}
	}
	for _, test := range o.tests {
		modes := []string{modePlain}
		if test == testTagLat {
			modes = o.modes
		}
		for _, mode := range modes {
			for _, sz := range o.sizes {
				iters, warmup := o.itersFor(test, sz)
				if warmup > 0 {
					if _, err := s.phase(ctx, ctl, test, mode, sz, warmup, o.partitions); err != nil {
						return nil, peerFailure(peer, fmt.Errorf("%s %s %s warm-up: %w", test, mode, fmtSize(sz), orCause(ctx, err)))
					}
				}
				res, err := s.phase(ctx, ctl, test, mode, sz, iters, o.partitions)
				if err != nil {
					return nil, peerFailure(peer, fmt.Errorf("%s %s %s: %w", test, mode, fmtSize(sz), orCause(ctx, err)))
				}
				res.Warmup = warmup
				rep.Results = append(rep.Results, res)
			}
		}
	}
	rep.Comparisons = compareModes(rep.Results)
	if err := s.freePart(ctx); err != nil {
		return nil, peerFailure(peer, err)
	}
	if err := ctl.send(perfMsg{Op: "bye"}, ctlTimeout); err != nil {
		return nil, err
	}
	var bye perfMsg
	if err := s.ctlRecv(ctx, ctl, &bye, ctlTimeout); err != nil || bye.Op != "bye" {
		return nil, peerFailure(peer, fmt.Errorf("peer did not confirm the end: %v", orErr(err, bye.Err)))
	}
	if err := peer.wait(10 * time.Second); err != nil {
		return nil, fmt.Errorf("peer exit: %w", err)
	}
	return rep, nil
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
	msg := perfMsg{Op: "phase", Test: test, Size: size, Count: count}
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
		} else if total, err = s.tagLatMode(ctx, s.rig, mode, size, count); err == nil {
			// The stream runs ahead of the host: only the mean round trip is known.
			rtts = make([]time.Duration, count)
			for i := range rtts {
				rtts[i] = total / time.Duration(count)
			}
		}
		if err == nil {
			fillLatency(&res, rtts, total)
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
	res.LatP50Us = res.LatTypicalUs
	res.LatP99Us = half(rtts[min(len(rtts)-1, len(rtts)*99/100)])
	res.LatMinUs = half(rtts[0])
	res.LatAvgUs = half(total) / float64(len(rtts))
	res.ElapsedS = total.Seconds()
	oneWay := total.Seconds() / 2 / float64(len(rtts))
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
	res.LatTypicalUs = res.LatAvgUs
	res.LatMinUs = res.LatAvgUs
}

func printPerf(w io.Writer, rep *perfReport) {
	fmt.Fprintf(w, "ucpx perf  %s  UCX %s  transport %s  UCX_TLS=%s (peer: %s)  peer error handling %v  window %d  wait %s  cpus %d\n",
		rep.Date, rep.UCXVersion, rep.Transport, rep.TLS, rep.PeerTLS, rep.PeerErrorHandling, rep.Window, rep.Wait, rep.CPUs)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "test\tsize\titers\tlat typical us\tlast-2048 us\tp99 us\tlat avg us\tlat min us\tMB/s\tmsg/s\t")
	parts := false
	for _, r := range rep.Results {
		pingPong := r.Test == testTagLat || r.Test == testPartLat
		if r.Mode != "" && r.Mode != modePlain {
			r.Test += "/" + r.Mode
		}
		if r.Partitions > 0 {
			r.Test += fmt.Sprintf(" x%d", r.Partitions)
			parts = true
		}
		lat := fmt.Sprintf("%.3f\t%.3f\t%.3f\t%.3f\t%.3f", r.LatTypicalUs, r.LatLast2048Us, r.LatP99Us, r.LatAvgUs, r.LatMinUs)
		if !pingPong {
			lat = fmt.Sprintf("-\t-\t-\t%.3f\t-", r.LatAvgUs)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%.2f\t%.0f\t\n", r.Test, fmtSize(r.Size), r.Iters, lat, r.BandwidthMBs, r.MsgRate)
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "latency: one way (half a round trip), typical = median of all iterations, last-2048 = median of the last 2048 (ucx_perftest's typical), p99 of all; MB = 2^20 bytes (as ucx_perftest); bw tests: lat avg = time per message")
	if parts {
		fmt.Fprintln(w, "part_lat, part_bw xN: size is the whole buffer of an iteration, in N partitions (prepared once; each iteration Start, N Pready, Wait)")
	}
	printComparisons(w, rep.Comparisons)
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
	timeout := fs.Duration("timeout", 10*time.Minute, "bound on the whole run")
	if st, ok := parseFlags(fs, args); !ok {
		return st
	}
	if os.Getenv(reexecEnv) != "" {
		watchParent("ucpx perf-peer")
	}
	if err := perfPeerMain(*ctlAddr, *tls, *peerErr, *rma, *part, *spin, *size, *window, *timeout); err != nil {
		fmt.Fprintf(stderr, "ucpx perf-peer: %v\n", err)
		return 1
	}
	return 0
}

func perfPeerMain(ctlAddr, tls string, peerErr, rma, part, spin bool, size, window int, timeout time.Duration) error {
	if ctlAddr == "" {
		return errors.New("--ctl is required")
	}
	if size <= 0 || size > maxSize {
		return fmt.Errorf("--max-size %d out of range", size)
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
			if err := s.respond(ctx, ctl, m.Test, m.Size, m.Count, m.Parts); err != nil {
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

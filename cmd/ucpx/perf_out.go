package main

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// perfSink prints a run as it goes: begin once the peer answered, row as each size
// completes, end when the run is over or stopped (rep.Stopped says why; the rows
// completed until then are in rep.Results).
type perfSink interface {
	begin(rep *perfReport)
	row(rep *perfReport, r perfResult)
	end(rep *perfReport)
}

// textSink is the table: a row per size as it completes, fixed-width columns (a
// tabwriter would hold every row back until the end).
type textSink struct {
	w     io.Writer
	begun bool
	parts bool
}

const textRow = "%-22s %6s %8s %9s %9s %9s %10s %9s %9s %9s %10s %10s"

func (t *textSink) begin(rep *perfReport) {
	t.begun = true
	fmt.Fprintf(t.w, "ucpx perf  %s  UCX %s  transport %s  UCX_TLS=%s (peer: %s)  peer error handling %v  window %d  wait %s  cpus %d",
		rep.Date, rep.UCXVersion, rep.Transport, rep.TLS, rep.PeerTLS, rep.PeerErrorHandling, rep.Window, rep.Wait, rep.CPUs)
	if rep.Backend != "" {
		fmt.Fprintf(t.w, "  stream backend %s", rep.Backend)
	}
	fmt.Fprintln(t.w)
	head := fmt.Sprintf(textRow, "test", "size", "iters", "p50 us", "p90 us", "p99 us", "max us", "avg us", "min us", "last2048", "MB/s", "msg/s")
	if rep.Check {
		head += fmt.Sprintf(" %7s", "wrong")
	}
	fmt.Fprintln(t.w, head)
}

func (t *textSink) row(rep *perfReport, r perfResult) {
	name := rowName(r)
	t.parts = t.parts || r.Partitions > 0
	us := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	p50, p90, p99, mx, avg, mn, last := us(r.LatP50Us), us(r.LatP90Us), us(r.LatP99Us), us(r.LatMaxUs), us(r.LatAvgUs), us(r.LatMinUs), us(r.LatLast2048Us)
	if !r.latMeasured() {
		p50, p90, p99, mx, mn, last = "-", "-", "-", "-", "-", "-"
	}
	line := fmt.Sprintf(textRow, name, fmtSize(r.Size), strconv.Itoa(r.Iters), p50, p90, p99, mx, avg, mn, last,
		strconv.FormatFloat(r.BandwidthMBs, 'f', 2, 64), strconv.FormatFloat(r.MsgRate, 'f', 0, 64))
	if rep.Check {
		w := "-"
		if r.Wrong != nil {
			w = strconv.FormatInt(*r.Wrong, 10)
		}
		line += fmt.Sprintf(" %7s", w)
	}
	fmt.Fprintln(t.w, line)
}

func (t *textSink) end(rep *perfReport) {
	if !t.begun {
		return
	}
	fmt.Fprintln(t.w, "latency: one way (half a round trip); p50..max over all iterations (percentiles by nearest rank), last2048 = median of the last 2048 (ucx_perftest's typical); stream modes: mean only (the stream runs ahead of the host); bw tests: avg = time per message; MB = 2^20 bytes (as ucx_perftest)")
	if rep.Check {
		fmt.Fprintln(t.w, "wrong: received bytes, warm-up included, that differ from what was sent (--check)")
	}
	if t.parts {
		fmt.Fprintln(t.w, "part_lat, part_bw xN: size is the whole buffer of an iteration, in N partitions (prepared once; each iteration Start, N Pready, Wait)")
	}
	printComparisons(t.w, rep.Comparisons)
	if rep.Stopped != "" {
		fmt.Fprintf(t.w, "STOPPED after %d rows: %s\n", len(rep.Results), rep.Stopped)
	}
}

// latMeasured: the row's latency distribution (typical, last2048, percentiles, min,
// max) was measured: a ping-pong timed per iteration. The stream modes know only their
// mean, the bandwidth tests their time per message (lat_avg_us).
func (r perfResult) latMeasured() bool {
	return !r.MeanOnly && (r.Test == testTagLat || r.Test == testPartLat)
}

// perfResultJSON is perfResult as JSON, its unmeasured latency fields null; its fields
// follow perfResult's, in the same order (keep them in step).
type perfResultJSON struct {
	Test          string   `json:"test"`
	Mode          string   `json:"mode,omitempty"`
	Size          int      `json:"size"`
	Partitions    int      `json:"partitions,omitempty"`
	Iters         int      `json:"iters"`
	Warmup        int      `json:"warmup"`
	LatTypicalUs  *float64 `json:"lat_typical_us"`
	LatLast2048Us *float64 `json:"lat_last2048_us"`
	LatP50Us      *float64 `json:"lat_p50_us"`
	LatP90Us      *float64 `json:"lat_p90_us"`
	LatP99Us      *float64 `json:"lat_p99_us"`
	LatMaxUs      *float64 `json:"lat_max_us"`
	LatAvgUs      float64  `json:"lat_avg_us"`
	LatMinUs      *float64 `json:"lat_min_us"`
	MeanOnly      bool     `json:"mean_only,omitempty"`
	BandwidthMBs  float64  `json:"bandwidth_mbs"`
	MsgRate       float64  `json:"msg_rate"`
	ElapsedS      float64  `json:"elapsed_s"`
	Wrong         *int64   `json:"wrong,omitempty"`
}

// MarshalJSON writes null for the latency fields a row did not measure (reading it
// back, a null leaves the field zero).
func (r perfResult) MarshalJSON() ([]byte, error) {
	j := perfResultJSON{Test: r.Test, Mode: r.Mode, Size: r.Size, Partitions: r.Partitions, Iters: r.Iters, Warmup: r.Warmup,
		LatAvgUs: r.LatAvgUs, MeanOnly: r.MeanOnly, BandwidthMBs: r.BandwidthMBs, MsgRate: r.MsgRate, ElapsedS: r.ElapsedS, Wrong: r.Wrong}
	if r.latMeasured() {
		j.LatTypicalUs, j.LatLast2048Us, j.LatP50Us, j.LatP90Us = &r.LatTypicalUs, &r.LatLast2048Us, &r.LatP50Us, &r.LatP90Us
		j.LatP99Us, j.LatMaxUs, j.LatMinUs = &r.LatP99Us, &r.LatMaxUs, &r.LatMinUs
	}
	return json.Marshal(j)
}

// rowName is a row's test with its mode and partitions: tag_lat/stream, part_lat x8.
func rowName(r perfResult) string {
	name := r.Test
	if r.Mode != "" && r.Mode != modePlain {
		name += "/" + r.Mode
	}
	if r.Partitions > 0 {
		name += fmt.Sprintf(" x%d", r.Partitions)
	}
	return name
}

// csvSink writes a header and then a record per size as it completes; a stopped run
// ends with a "# stopped: ..." line.
type csvSink struct {
	w  io.Writer
	cw *csv.Writer
}

var csvHeader = []string{"test", "mode", "size", "partitions", "iters", "warmup",
	"lat_p50_us", "lat_p90_us", "lat_p99_us", "lat_max_us", "lat_avg_us", "lat_min_us", "lat_last2048_us", "mean_only",
	"bandwidth_mbs", "msg_rate", "elapsed_s", "wrong"}

func (c *csvSink) begin(*perfReport) {
	c.cw = csv.NewWriter(c.w)
	_ = c.cw.Write(csvHeader)
	c.cw.Flush()
}

func (c *csvSink) row(_ *perfReport, r perfResult) {
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	measured := r.latMeasured()
	lat := func(v float64) string { // empty where not measured, as the table's "-"
		if !measured {
			return ""
		}
		return f(v)
	}
	wrong := ""
	if r.Wrong != nil {
		wrong = strconv.FormatInt(*r.Wrong, 10)
	}
	_ = c.cw.Write([]string{r.Test, r.Mode, strconv.Itoa(r.Size), strconv.Itoa(r.Partitions), strconv.Itoa(r.Iters), strconv.Itoa(r.Warmup),
		lat(r.LatP50Us), lat(r.LatP90Us), lat(r.LatP99Us), lat(r.LatMaxUs), f(r.LatAvgUs), lat(r.LatMinUs), lat(r.LatLast2048Us), strconv.FormatBool(r.MeanOnly),
		f(r.BandwidthMBs), f(r.MsgRate), f(r.ElapsedS), wrong})
	c.cw.Flush()
}

func (c *csvSink) end(rep *perfReport) {
	if rep.Stopped != "" {
		fmt.Fprintf(c.w, "# stopped after %d rows: %s\n", len(rep.Results), strings.ReplaceAll(rep.Stopped, "\n", " "))
	}
}

// jsonSink writes the whole report at the end: a JSON document cannot be printed a
// row at a time (--csv can).
type jsonSink struct{ w io.Writer }

func (*jsonSink) begin(*perfReport)           {}
func (*jsonSink) row(*perfReport, perfResult) {}
func (j *jsonSink) end(rep *perfReport) {
	enc := json.NewEncoder(j.w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(rep)
}

// readPerfReport reads a `ucpx perf --json` report (--reference, --from).
func readPerfReport(path string) (*perfReport, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rep perfReport
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("%s: not a ucpx perf --json report: %w", path, err)
	}
	if len(rep.Results) == 0 {
		return nil, fmt.Errorf("%s: no results", path)
	}
	return &rep, nil
}

// syncWriter serializes writes from the peer's output copier and the progress line.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

// progressAfter: a size still running after this long gets a progress line, renewed
// every progressTick (tests shorten both).
var (
	progressAfter = 3 * time.Second
	progressTick  = 2 * time.Second
)

// progress is the one-line indication of a long size: on a terminal one line,
// rewritten in place and erased when the size completes; elsewhere a line per tick.
type progress struct {
	w    io.Writer
	term bool
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if sw, ok := w.(*syncWriter); ok {
		w = sw.w
	}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.term = true
		}
	}
	return p
}

// start shows label's progress (done of iters iterations) until the returned
// function is called.
func (p *progress) start(label string, iters int, done *atomic.Int64) func() {
	stop := make(chan struct{})
	finished := make(chan struct{})
	begin := time.Now()
	go func() {
		defer close(finished)
		shown := false
		t := time.NewTimer(progressAfter)
		defer t.Stop()
		for {
			select {
			case <-stop:
				if shown && p.term {
					fmt.Fprint(p.w, "\r\033[K")
				}
				return
			case <-t.C:
			}
			n := done.Load()
			line := fmt.Sprintf("ucpx perf: %s: %d of %d iterations (%d%%), %.0f s", label, n, iters, n*100/int64(max(iters, 1)), time.Since(begin).Seconds())
			if p.term {
				fmt.Fprintf(p.w, "\r%s\033[K", line)
			} else {
				fmt.Fprintln(p.w, line)
			}
			shown = true
			t.Reset(progressTick)
		}
	}()
	return func() {
		close(stop)
		<-finished
	}
}

package main

import (
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Axis labels and titles of --plot (tests read them back from the SVG).
const (
	plotSizeAxis = "message size (bytes)"
	plotLatAxis  = "one-way latency (µs)"
	plotBwAxis   = "bandwidth (MB/s, MB = 2^20 B)"
	plotLatTitle = "latency: p50 of ping-pong tests (stream modes: mean)"
	plotBwTitle  = "bandwidth"
)

// plotSeries is one line: a test (with its mode and partitions) of one run.
type plotSeries struct {
	name   string
	ref    bool // from --reference: dashed
	work   bool // a mode+work: dotted, in its mode's colour
	color  int  // shared by a series, its +work twin and its reference
	lat    plotter.XYs
	bw     plotter.XYs
	pinged bool // a ping-pong test: it has a latency line
}

// seriesOf groups rep's rows into lines, in the order they first appear; colors
// assigns each name a color index shared across runs. A log scale shows only values
// above zero: a row whose size or value is not (a hand-made or damaged report) is left
// out of that line, and counted in skipped.
func seriesOf(rep *perfReport, ref bool, suffix string, colors map[string]int, skipped *[]string) []*plotSeries {
	var out []*plotSeries
	skip := func(r perfResult, what string, v float64) {
		s := fmt.Sprintf("%s%s size %d", rowName(r), suffix, r.Size)
		if what != "" {
			s += fmt.Sprintf(": %s %g", what, v)
		}
		*skipped = append(*skipped, s)
	}
	byName := map[string]*plotSeries{}
	for _, r := range rep.Results {
		name := rowName(r)
		s := byName[name]
		if s == nil {
			key := strings.TrimSuffix(name, workSuffix)
			if _, ok := colors[key]; !ok {
				colors[key] = len(colors)
			}
			s = &plotSeries{name: name + suffix, ref: ref, work: key != name, color: colors[key]}
			byName[name] = s
			out = append(out, s)
		}
		x := float64(r.Size)
		if r.Size <= 0 {
			skip(r, "", 0)
			continue
		}
		if positive(r.BandwidthMBs) {
			s.bw = append(s.bw, plotter.XY{X: x, Y: r.BandwidthMBs})
		} else {
			skip(r, "bandwidth", r.BandwidthMBs)
		}
		if r.Test == testTagLat || r.Test == testPartLat {
			s.pinged = true
			lat := r.LatP50Us
			if r.MeanOnly {
				lat = r.LatAvgUs
			}
			if positive(lat) {
				s.lat = append(s.lat, plotter.XY{X: x, Y: lat})
			} else {
				skip(r, "latency", lat)
			}
		}
	}
	return out
}

// positive: v can be drawn on a log scale.
func positive(v float64) bool { return v > 0 && !math.IsInf(v, 1) }

// refName labels a reference run's lines.
func refName(ref *perfReport) string {
	if ref.Label != "" {
		return ref.Label
	}
	return fmt.Sprintf("%s %s", ref.Transport, ref.Date)
}

// plotFormat: --plot writes SVG or PNG, by the file's extension.
func plotFormat(path string) bool {
	ext := strings.ToLower(filepath.Ext(path))
	return ext == ".svg" || ext == ".png"
}

// writePlot draws rep (and ref, dashed, on the same axes) as an SVG of two panels:
// latency against size above, bandwidth against size below, log-log, a line per test
// and mode. Rows a log scale cannot show (a size or value not above zero) are left out,
// with a note on warn; a panel left with no point is not drawn.
func writePlot(path string, rep, ref *perfReport, warn io.Writer) error {
	colors := map[string]int{}
	var skipped []string
	series := seriesOf(rep, false, "", colors, &skipped)
	if ref != nil {
		series = append(series, seriesOf(ref, true, " ["+refName(ref)+"]", colors, &skipped)...)
	}
	if len(skipped) > 0 {
		fmt.Fprintf(warn, "ucpx perf: --plot: %d point(s) left out, a log scale shows only values above zero: %s\n",
			len(skipped), strings.Join(skipped[:min(len(skipped), 5)], ", ")+map[bool]string{true: ", ...", false: ""}[len(skipped) > 5])
	}
	title := "ucpx perf"
	for _, f := range [][2]string{{"", rep.Label}, {"", rep.Transport}, {"UCX_TLS=", rep.TLS}, {"UCX ", rep.UCXVersion}, {"", rep.Date}, {"stream backend ", rep.Backend}} {
		if f[1] != "" {
			title += "  " + f[0] + f[1]
		}
	}
	var sizes []int
	for _, r := range rep.Results {
		if r.Size > 0 && !slices.Contains(sizes, r.Size) {
			sizes = append(sizes, r.Size)
		}
	}
	lat := newLogPlot(plotLatTitle, plotLatAxis, sizes)
	bw := newLogPlot(plotBwTitle, plotBwAxis, sizes)
	var latPts, bwPts plotter.XYs
	for _, s := range series {
		if s.pinged {
			latPts = append(latPts, s.lat...)
			if err := addLine(lat, s, s.lat); err != nil {
				return err
			}
		}
		bwPts = append(bwPts, s.bw...)
		if err := addLine(bw, s, s.bw); err != nil {
			return err
		}
	}
	var plots [][]*plot.Plot
	if len(latPts) > 0 {
		plots = append(plots, []*plot.Plot{lat})
	}
	if len(bwPts) > 0 {
		plots = append(plots, []*plot.Plot{bw})
	}
	if len(plots) == 0 {
		return errors.New("nothing to draw: no row has a size and a latency or bandwidth above zero")
	}
	setLogRange(&lat.X, &lat.Y, latPts)
	setLogRange(&bw.X, &bw.Y, bwPts)
	plots[0][0].Title.Text = title + "\n" + plots[0][0].Title.Text
	const w, h = 22 * vg.Centimeter, 15 * vg.Centimeter
	var c interface {
		vg.CanvasSizer
		io.WriterTo
	}
	switch strings.ToLower(filepath.Ext(path)) {
	case ".svg":
		c = vgsvg.New(w, h*vg.Length(len(plots)))
	case ".png":
		c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(w, h*vg.Length(len(plots))), vgimg.UseDPI(110))}
	default:
		return fmt.Errorf("%s: want a .svg or .png file", path)
	}
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadX: vg.Millimeter * 2, PadY: vg.Millimeter * 4}
	canvases := plot.Align(plots, tiles, draw.New(c))
	for i, row := range plots {
		row[0].Draw(canvases[i][0])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// setLogRange sets a panel's axes to cover pts (every coordinate above zero), widened
// where all points share a value: gonum widens an empty range by one on each side,
// which on a log scale reaches zero or below (a single point of size 1, a latency
// under 1 µs) and panics. A size is widened to the powers of two around it, a value to
// a decade on each side, so each axis keeps a labelled tick.
func setLogRange(x, y *plot.Axis, pts plotter.XYs) {
	if len(pts) == 0 {
		return
	}
	x.Min, x.Max = math.Inf(1), math.Inf(-1)
	y.Min, y.Max = math.Inf(1), math.Inf(-1)
	for _, p := range pts {
		x.Min, x.Max = math.Min(x.Min, p.X), math.Max(x.Max, p.X)
		y.Min, y.Max = math.Min(y.Min, p.Y), math.Max(y.Max, p.Y)
	}
	widen := func(a *plot.Axis, f float64) {
		if a.Min < a.Max {
			return
		}
		if lo := a.Min / f; lo > 0 {
			a.Min = lo
		}
		if hi := a.Max * f; !math.IsInf(hi, 1) {
			a.Max = hi
		}
	}
	widen(x, 2)
	widen(y, 10)
}

func newLogPlot(title, yLabel string, sizes []int) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = plotSizeAxis
	p.Y.Label.Text = yLabel
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = sizeTicks(sizes)
	p.Y.Tick.Marker = plot.TickerFunc(valueTicks)
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.ThumbnailWidth = vg.Centimeter
	p.Add(plotter.NewGrid())
	return p
}

func addLine(p *plot.Plot, s *plotSeries, xys plotter.XYs) error {
	if len(xys) == 0 {
		return nil
	}
	line, points, err := plotter.NewLinePoints(xys)
	if err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	line.Color = plotColors[s.color%len(plotColors)]
	line.Width = vg.Points(1.5)
	points.Color = line.Color
	points.Shape = plotutil.Shape(s.color)
	switch {
	case s.ref && s.work:
		line.Dashes = []vg.Length{vg.Points(6), vg.Points(2), vg.Points(1.5), vg.Points(2)}
	case s.ref:
		line.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
	case s.work:
		line.Dashes = []vg.Length{vg.Points(1.5), vg.Points(2)}
	}
	if s.ref {
		line.Width = vg.Points(1)
	}
	p.Add(line, points)
	p.Legend.Add(s.name, line, points)
	return nil
}

// plotColors: Tableau's ten, distinct where plotutil's seven would repeat.
var plotColors = []color.Color{
	color.RGBA{0x1f, 0x77, 0xb4, 0xff}, color.RGBA{0xff, 0x7f, 0x0e, 0xff}, color.RGBA{0x2c, 0xa0, 0x2c, 0xff},
	color.RGBA{0xd6, 0x27, 0x28, 0xff}, color.RGBA{0x94, 0x67, 0xbd, 0xff}, color.RGBA{0x8c, 0x56, 0x4b, 0xff},
	color.RGBA{0xe3, 0x77, 0xc2, 0xff}, color.RGBA{0x7f, 0x7f, 0x7f, 0xff}, color.RGBA{0xbc, 0xbd, 0x22, 0xff},
	color.RGBA{0x17, 0xbe, 0xcf, 0xff},
}

// valueTicks is gonum's LogTicks (a labelled tick per power of ten, minor ticks
// between) for up to maxDecades decades; over a wider range (a damaged report) it
// labels every few powers of ten and leaves the minor ticks out, so the number of
// ticks stays bounded and their labels readable.
func valueTicks(lo, hi float64) []plot.Tick {
	const maxDecades = 12
	from, to := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if math.IsInf(from, 0) || math.IsNaN(from) || math.IsInf(to, 0) || math.IsNaN(to) {
		return nil
	}
	step := math.Max(1, math.Ceil((to-from)/maxDecades))
	var ticks []plot.Tick
	for e := from; e <= to; e += step {
		v := math.Pow10(int(e))
		label := strconv.FormatFloat(v, 'g', -1, 64)
		if math.Abs(e) > 15 { // a product of two table entries: not the shortest decimal
			label = fmt.Sprintf("1e%+03d", int(e))
		}
		ticks = append(ticks, plot.Tick{Value: v, Label: label})
		for i := 2; step == 1 && e < to && i < 10; i++ {
			ticks = append(ticks, plot.Tick{Value: v * float64(i)})
		}
	}
	return ticks
}

// maxSizeTicks bounds the powers of two sizeTicks marks.
const maxSizeTicks = 64

// sizeTicks marks powers of two between lo and hi, labelling the measured sizes in
// ucpx's notation (8, 4K, 1M), or about ten powers where more sizes were measured.
func sizeTicks(sizes []int) plot.TickerFunc {
	return func(lo, hi float64) []plot.Tick {
		label := map[float64]bool{}
		if len(sizes) <= 12 {
			for _, s := range sizes {
				label[float64(s)] = true
			}
		}
		var ticks []plot.Tick
		// Powers of two from lo to hi, at most maxSizeTicks of them (every few where
		// the range is wider); none for a range a log scale cannot have.
		from, to := math.Floor(math.Log2(lo)), math.Ceil(math.Log2(hi))
		if math.IsInf(from, 0) || math.IsNaN(from) || math.IsInf(to, 0) || math.IsNaN(to) {
			return nil
		}
		step := math.Max(1, math.Ceil((to-from+1)/maxSizeTicks))
		for e := from; e <= to; e += step {
			ticks = append(ticks, plot.Tick{Value: math.Exp2(e)})
		}
		if len(label) == 0 {
			step := max(1, (len(ticks)+9)/10)
			for i := range ticks {
				label[ticks[i].Value] = (len(ticks)-1-i)%step == 0
			}
		}
		for v := range label { // measured sizes between powers of two get a tick too
			if label[v] && !slices.ContainsFunc(ticks, func(t plot.Tick) bool { return t.Value == v }) {
				ticks = append(ticks, plot.Tick{Value: v})
			}
		}
		for i := range ticks {
			if label[ticks[i].Value] {
				ticks[i].Label = fmtSize(int(ticks[i].Value))
			}
		}
		return ticks
	}
}

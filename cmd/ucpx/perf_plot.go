package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
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
	color  int  // shared by a series and its reference
	lat    plotter.XYs
	bw     plotter.XYs
	pinged bool // a ping-pong test: it has a latency line
}

// seriesOf groups rep's rows into lines, in the order they first appear; colors
// assigns each name a color index shared across runs.
func seriesOf(rep *perfReport, ref bool, suffix string, colors map[string]int) []*plotSeries {
	var out []*plotSeries
	byName := map[string]*plotSeries{}
	for _, r := range rep.Results {
		name := rowName(r)
		s := byName[name]
		if s == nil {
			if _, ok := colors[name]; !ok {
				colors[name] = len(colors)
			}
			s = &plotSeries{name: name + suffix, ref: ref, color: colors[name]}
			byName[name] = s
			out = append(out, s)
		}
		if r.BandwidthMBs > 0 {
			s.bw = append(s.bw, plotter.XY{X: float64(r.Size), Y: r.BandwidthMBs})
		}
		lat := r.LatP50Us
		if r.MeanOnly {
			lat = r.LatAvgUs
		}
		if (r.Test == testTagLat || r.Test == testPartLat) && lat > 0 {
			s.pinged = true
			s.lat = append(s.lat, plotter.XY{X: float64(r.Size), Y: lat})
		}
	}
	return out
}

// refName labels a reference run's lines.
func refName(ref *perfReport) string {
	if ref.Label != "" {
		return ref.Label
	}
	return fmt.Sprintf("%s %s", ref.Transport, ref.Date)
}

// writePlot draws rep (and ref, dashed, on the same axes) as an SVG of two panels:
// latency against size above, bandwidth against size below, log-log, a line per test
// and mode.
func writePlot(path string, rep, ref *perfReport) error {
	colors := map[string]int{}
	series := seriesOf(rep, false, "", colors)
	if ref != nil {
		series = append(series, seriesOf(ref, true, " ["+refName(ref)+"]", colors)...)
	}
	title := fmt.Sprintf("ucpx perf  %s (UCX_TLS=%s)  UCX %s  %s", rep.Transport, rep.TLS, rep.UCXVersion, rep.Date)
	if rep.Backend != "" {
		title += "  stream backend " + rep.Backend
	}
	lat := newLogPlot(plotLatTitle, plotLatAxis)
	lat.Title.Text = title + "\n" + plotLatTitle
	bw := newLogPlot(plotBwTitle, plotBwAxis)
	pinged := false
	for _, s := range series {
		if s.pinged {
			pinged = true
			if err := addLine(lat, s, s.lat); err != nil {
				return err
			}
		}
		if err := addLine(bw, s, s.bw); err != nil {
			return err
		}
	}
	const w, h = 22 * vg.Centimeter, 15 * vg.Centimeter
	c := vgsvg.New(w, 2*h)
	plots := [][]*plot.Plot{{lat}, {bw}}
	if !pinged { // bandwidth tests only
		plots = plots[1:]
		bw.Title.Text = title + "\n" + plotBwTitle
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

func newLogPlot(title, yLabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = plotSizeAxis
	p.Y.Label.Text = yLabel
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = plot.TickerFunc(sizeTicks)
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
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
	if s.ref {
		line.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
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

// sizeTicks marks powers of two between lo and hi, labelling a few of them in
// ucpx's size notation (8, 4K, 1M).
func sizeTicks(lo, hi float64) []plot.Tick {
	var pows []float64
	for e := math.Floor(math.Log2(lo)); e <= math.Ceil(math.Log2(hi)); e++ {
		pows = append(pows, math.Exp2(e))
	}
	step := max(1, (len(pows)+9)/10) // at most about ten labels
	var ticks []plot.Tick
	for i, v := range pows {
		t := plot.Tick{Value: v}
		if (len(pows)-1-i)%step == 0 {
			t.Label = fmtSize(int(v))
		}
		ticks = append(ticks, t)
	}
	if !slices.ContainsFunc(ticks, func(t plot.Tick) bool { return t.Label != "" }) && len(ticks) > 0 {
		ticks[0].Label = fmtSize(int(ticks[0].Value))
	}
	return ticks
}

package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// WritePlots draws, for each load shape in the report, latency (p50 solid,
// p99 dashed) vs load and throughput vs load with every target on one chart,
// and saves each as PNG and SVG in dir: closed_latency.png, closed_throughput.svg,
// open_latency.png, … It returns the files written. Labels are ASCII because
// the fonts gonum/plot embeds have no Han glyphs.
func (r *Report) WritePlots(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var files []string
	for _, shape := range []string{"closed", "open"} {
		xlabel := "concurrent users (closed loop)"
		if shape == "open" {
			xlabel = "offered load, req/s (open loop, Poisson)"
		}
		lat, thr, found, err := r.shapePlots(shape, xlabel)
		if err != nil {
			return files, err
		}
		if !found {
			continue
		}
		for name, p := range map[string]*plot.Plot{"latency": lat, "throughput": thr} {
			for _, ext := range []string{"png", "svg"} {
				f := filepath.Join(dir, fmt.Sprintf("%s_%s.%s", shape, name, ext))
				if err := p.Save(7*vg.Inch, 4.2*vg.Inch, f); err != nil {
					return files, fmt.Errorf("save %s: %w", f, err)
				}
				files = append(files, f)
			}
		}
	}
	return files, nil
}

// shapePlots builds the two charts for one shape; found=false when no target
// has a completed level of that shape.
func (r *Report) shapePlots(shape, xlabel string) (lat, thr *plot.Plot, found bool, err error) {
	lat, thr = plot.New(), plot.New()
	lat.Title.Text = "Latency vs load (p50 solid, p99 dashed)"
	lat.X.Label.Text, lat.Y.Label.Text = xlabel, "latency (ms)"
	thr.Title.Text = "Throughput vs load"
	thr.X.Label.Text, thr.Y.Label.Text = xlabel, "couplets/s"
	for _, p := range []*plot.Plot{lat, thr} {
		p.Legend.Top, p.Legend.Left = true, true
		p.Legend.XOffs, p.Legend.YOffs = vg.Points(8), -vg.Points(4)
		p.Add(plotter.NewGrid())
	}
	xmin, xmax := 0.0, 0.0
	var xs []float64
	for ti, tr := range r.Targets {
		var p50, p99, qps plotter.XYs // one point per completed level, in run order
		for _, l := range tr.Levels {
			if l.Shape != shape || l.Completed == 0 {
				continue
			}
			x := float64(l.Concurrency)
			if shape == "open" {
				x = l.Rate
			}
			p50 = append(p50, plotter.XY{X: x, Y: l.Latency.P50})
			p99 = append(p99, plotter.XY{X: x, Y: l.Latency.P99})
			qps = append(qps, plotter.XY{X: x, Y: l.CoupletsPerSec})
			if !found || x < xmin {
				xmin = x
			}
			if !found || x > xmax {
				xmax = x
			}
			xs = append(xs, x)
			found = true
		}
		if len(p50) == 0 {
			continue
		}
		color := plotutil.Color(ti)
		add := func(p *plot.Plot, pts plotter.XYs, label string, dashed bool) error {
			line, points, err := plotter.NewLinePoints(pts)
			if err != nil {
				return err
			}
			line.Color, points.Color = color, color
			line.Width = vg.Points(1.5)
			points.Shape = plotutil.Shape(ti)
			if dashed {
				line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
			}
			p.Add(line, points)
			p.Legend.Add(label, line, points)
			return nil
		}
		if err := add(lat, p50, tr.Name+" p50", false); err != nil {
			return nil, nil, false, err
		}
		if err := add(lat, p99, tr.Name+" p99", true); err != nil {
			return nil, nil, false, err
		}
		if err := add(thr, qps, tr.Name, false); err != nil {
			return nil, nil, false, err
		}
	}
	if !found {
		return lat, thr, false, nil
	}
	// Ticks at the measured levels; a log axis when they span a decade or
	// more (1, 10, 20, 50, 100 users would crowd a linear axis at the left).
	ticks := plot.ConstantTicks(levelTicks(xs))
	for _, p := range []*plot.Plot{lat, thr} {
		p.X.Tick.Marker = ticks
		// Start at zero and leave headroom so the legend (top left) does
		// not sit on the data.
		p.Y.Min = 0
		p.Y.Max *= 1.35
		if xmin > 0 && xmax/xmin >= 10 {
			p.X.Scale = plot.LogScale{}
			p.X.Min, p.X.Max = xmin/1.2, xmax*1.2
		}
	}
	return lat, thr, true, nil
}

// levelTicks returns one labelled tick per distinct level value.
func levelTicks(xs []float64) []plot.Tick {
	seen := map[float64]bool{}
	var ts []plot.Tick
	for _, x := range xs {
		if seen[x] {
			continue
		}
		seen[x] = true
		ts = append(ts, plot.Tick{Value: x, Label: strconv.FormatFloat(x, 'g', 4, 64)})
	}
	return ts
}

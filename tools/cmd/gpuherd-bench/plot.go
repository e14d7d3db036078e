package main

import (
	"fmt"
	"image/color"
	"path/filepath"
	"slices"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

type series struct {
	label string
	lat   durations
}

// plotLatencyCDF draws the cumulative distribution of claim latencies (log x).
func plotLatencyCDF(path, title string, ss []series, floor time.Duration) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "claim latency (ms, log scale)"
	p.Y.Label.Text = "share of claims at or below"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = false
	p.Legend.Left = false
	p.Y.Min, p.Y.Max = 0, 1
	for i, s := range ss {
		if len(s.lat) == 0 {
			continue
		}
		v := slices.Clone(s.lat)
		slices.Sort(v)
		pts := make(plotter.XYs, len(v))
		for j, d := range v {
			pts[j].X = max(float64(d)/1e6, 0.01)
			pts[j].Y = float64(j+1) / float64(len(v))
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = plotutil.Color(i)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(s.label, l)
	}
	if floor > 0 {
		fl, _ := plotter.NewLine(plotter.XYs{{X: float64(floor) / 1e6, Y: 0}, {X: float64(floor) / 1e6, Y: 1}})
		fl.Color = color.Gray{Y: 100}
		fl.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(fl)
		p.Legend.Add("floor: 2 RTT + 1 fsync", fl)
	}
	return p.Save(8*vg.Inch, 5*vg.Inch, path)
}

type curve struct {
	label string
	x, y  []float64
}

// plotCurves draws y against x for several curves, with points.
func plotCurves(path, title, xl, yl string, cs []curve, logY bool) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xl
	p.Y.Label.Text = yl
	if logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	p.Legend.Top = false
	p.Legend.Left = true
	for i, c := range cs {
		pts := make(plotter.XYs, 0, len(c.x))
		for j := range c.x {
			if logY && c.y[j] <= 0 {
				continue
			}
			pts = append(pts, plotter.XY{X: c.x[j], Y: c.y[j]})
		}
		if len(pts) == 0 {
			continue
		}
		l, sc, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		l.Color = plotutil.Color(i)
		sc.Color = plotutil.Color(i)
		sc.Shape = plotutil.Shape(i)
		p.Add(l, sc)
		p.Legend.Add(c.label, l, sc)
	}
	return p.Save(8*vg.Inch, 5*vg.Inch, path)
}

func pngPath(dir, name string) string { return filepath.Join(dir, name) }

// plots writes docs/bench/*.png.
func plots(o options, fl floorResult, rs []*sizeResult, mocks []mockResult) error {
	var focus *sizeResult
	for _, r := range rs {
		if r.n == o.focus {
			focus = r
		}
	}
	if focus != nil {
		ss := []series{
			{"gpuherd Agent.Claim (unloaded)", focus.seqAgent},
			{"without the ID lookup (bench coordinator)", focus.seqView},
			{"etcd central allocator (unloaded)", focus.etcdSeq},
		}
		for _, x := range focus.replays {
			if x.load == 0.9 && x.alloc == (agentAlloc{}).name() {
				ss = append(ss, series{"gpuherd under the trace, 90% load", x.latency})
			}
		}
		if focus.etcdReplay != nil {
			ss = append(ss, series{"etcd under the trace, 90% load", focus.etcdReplay.latency})
		}
		if err := plotLatencyCDF(pngPath(o.out, "latency.png"), fmt.Sprintf("Claim latency, %d agents", focus.n), ss, fl.floor()); err != nil {
			return err
		}
		var cs []curve
		names := []string{"oracle: omniscient best fit", "omniscient first fit", "omniscient random"}
		for k, nm := range names {
			c := curve{label: nm}
			for _, load := range o.loads {
				if or, ok := focus.oracle[load]; ok && focus.oracleOffer[load] > 0 {
					c.x = append(c.x, load*100)
					c.y = append(c.y, 100*float64(or[k])/float64(focus.oracleOffer[load]))
				}
			}
			cs = append(cs, c)
		}
		byAlloc := map[string]*curve{}
		var order []string
		for _, x := range focus.replays {
			c := byAlloc[x.alloc]
			if c == nil {
				c = &curve{label: x.alloc}
				byAlloc[x.alloc] = c
				order = append(order, x.alloc)
			}
			if x.offered > 0 {
				c.x = append(c.x, x.load*100)
				c.y = append(c.y, 100*float64(x.accepted)/float64(x.offered))
			}
		}
		for _, a := range order {
			cs = append(cs, *byAlloc[a])
		}
		if err := plotCurves(pngPath(o.out, "acceptance.png"), fmt.Sprintf("Claims accepted against load, %d agents", focus.n), "target load (% of all GPUs held)", "claims accepted (%)", cs, false); err != nil {
			return err
		}
	}
	var c50, c99, c100 curve
	c50.label, c99.label, c100.label = "50% of members", "99%", "100%"
	var m50, m99, m100 curve
	m50.label, m99.label, m100.label = "50% (in-memory transport)", "99% (in-memory)", "100% (in-memory)"
	add := func(c *curve, n int, d time.Duration) {
		if d >= 0 {
			c.x = append(c.x, float64(n))
			c.y = append(c.y, float64(d)/1e6)
		}
	}
	for _, r := range rs {
		s := mergeSpreads(r.spreads)
		add(&c50, r.n, s.p50)
		add(&c99, r.n, s.p99)
		add(&c100, r.n, s.all)
	}
	for _, m := range mocks {
		s := mergeSpreads(m.changes)
		add(&m50, m.n, s.p50)
		add(&m99, m.n, s.p99)
		add(&m100, m.n, s.all)
	}
	return plotCurves(pngPath(o.out, "convergence.png"), "Capacity change seen by the other members (memberlist LAN timings)", "members", "time (ms)", []curve{c50, c99, c100, m50, m99, m100}, false)
}

// Command benchplot draws the plots of `make bench` (out/bench/*.png) from
// the JSON lines it writes (and the GPU runs' sweeps): time against block
// count, one line per mode, on log-log axes.
//
//	go -C tools build -o "$PWD/bin/benchplot" ./benchplot
//	bin/benchplot -title "this machine" -o out/bench/solve-host.png out/bench/solve.jsonl
//
// It is a module of its own (tools/go.mod), so that the library's go.mod
// needs only what the library uses.
//
// Input lines are either ranktest -json summaries (mode, blocks,
// median_solve_us) or distbench result lines (mode, n, median_us; -bench
// keeps those of one benchmark). With -timeline the inputs are ranktest
// -timeline files, drawn one under the other: device memory in use, the
// pool's reservation and the live buffers, and GPU utilization, against
// time (the design note's picture of a growing run, one per policy).
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"os"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

type point struct {
	mode   string
	blocks float64
	us     float64
}

// line is the subset of both JSON shapes benchplot reads.
type line struct {
	Mode          string  `json:"mode"`
	Blocks        int     `json:"blocks"`
	MedianSolveUS float64 `json:"median_solve_us"`
	N             int     `json:"n"`
	MedianUS      float64 `json:"median_us"`
	Bench         string  `json:"bench"`
}

func read(paths []string, bench string) ([]point, error) {
	var pts []point
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for ln := 1; sc.Scan(); ln++ {
			var l line
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				continue // tables and progress lines around the JSON
			}
			switch {
			case l.MedianSolveUS > 0 && l.Blocks > 0:
				pts = append(pts, point{l.Mode, float64(l.Blocks), l.MedianSolveUS})
			case l.MedianUS > 0 && l.N > 0 && (bench == "" || l.Bench == bench):
				pts = append(pts, point{l.Mode, float64(l.N), l.MedianUS})
			}
		}
		err = errors.Join(sc.Err(), f.Close())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
	}
	if len(pts) == 0 {
		return nil, errors.New("no result lines with a mode, a block count and a median time")
	}
	return pts, nil
}

func drawPlot(pts []point, title, out string) error {
	byMode := map[string]plotter.XYs{}
	for _, p := range pts {
		byMode[p.mode] = append(byMode[p.mode], plotter.XY{X: p.blocks, Y: p.us / 1e3})
	}
	modes := make([]string, 0, len(byMode))
	for m := range byMode {
		modes = append(modes, m)
	}
	sort.Strings(modes)
	pl := plot.New()
	pl.Title.Text = title
	pl.X.Label.Text = "blocks per rank"
	pl.Y.Label.Text = "median time (ms)"
	pl.X.Scale, pl.Y.Scale = plot.LogScale{}, plot.LogScale{}
	pl.X.Tick.Marker, pl.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
	pl.Legend.Top = true
	pl.Legend.Left = true
	palette := []color.Color{
		color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
		color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
		color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}, color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff},
		color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
	}
	for i, m := range modes {
		xy := byMode[m]
		sort.Slice(xy, func(a, b int) bool { return xy[a].X < xy[b].X })
		l, s, err := plotter.NewLinePoints(xy)
		if err != nil {
			return err
		}
		c := palette[i%len(palette)]
		l.Color, s.Color = c, c
		s.Shape = draw.CircleGlyph{}
		pl.Add(l, s)
		pl.Legend.Add(m, l, s)
	}
	return pl.Save(6*vg.Inch, 4*vg.Inch, out)
}

func main() {
	title := flag.String("title", "", "plot title")
	out := flag.String("o", "", "output PNG file")
	bench := flag.String("bench", "", "only -bench result lines of this benchmark")
	timeline := flag.Bool("timeline", false, "the inputs are ranktest -timeline files: draw each as memory and GPU utilization against time")
	flag.Parse()
	if *out == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: benchplot -o out.png [-title T] [-bench NAME] results.jsonl...\n       benchplot -timeline -o out.png [-title T] run.timeline...")
		os.Exit(2)
	}
	var err error
	if *timeline {
		err = drawTimelines(flag.Args(), *title, *out)
	} else {
		var pts []point
		if pts, err = read(flag.Args(), *bench); err == nil {
			err = drawPlot(pts, *title, *out)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchplot:", err)
		os.Exit(1)
	}
}

package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// timelineLine is a line of a ranktest -timeline file: its header (policy,
// workload) or a sample.
type timelineLine struct {
	Policy       string   `json:"policy"`
	Workload     string   `json:"workload"`
	Device       string   `json:"device"`
	BallastBytes int64    `json:"ballast_bytes"`
	T            *float64 `json:"t"`
	M            int64    `json:"m"`
	DeviceUsed   *int64   `json:"device_used"`
	PoolReserved *int64   `json:"pool_reserved"`
	PoolLive     *int64   `json:"pool_live"`
	GPUUtil      *int64   `json:"gpu_util"`
}

// timelineRun is one -timeline file's series.
type timelineRun struct {
	label                string
	used, reserved, live plotter.XYs
	util                 plotter.XYs
}

func readTimeline(path string) (*timelineRun, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := &timelineRun{label: strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	const gib = 1 << 30
	var ballast int64
	for sc.Scan() {
		var l timelineLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if l.T == nil {
			if l.Policy != "" {
				r.label = fmt.Sprintf("policy %s: %s, %s", l.Policy, l.Workload, l.Device)
				ballast = l.BallastBytes
			}
			continue
		}
		t := *l.T
		switch {
		case l.GPUUtil != nil:
			r.util = append(r.util, plotter.XY{X: t, Y: float64(*l.GPUUtil)})
		default:
			if l.DeviceUsed != nil {
				r.used = append(r.used, plotter.XY{X: t, Y: float64(*l.DeviceUsed-ballast) / gib})
			}
			if l.PoolReserved != nil {
				r.reserved = append(r.reserved, plotter.XY{X: t, Y: float64(*l.PoolReserved) / gib})
			}
			if l.PoolLive != nil {
				r.live = append(r.live, plotter.XY{X: t, Y: float64(*l.PoolLive) / gib})
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(r.live) == 0 {
		return nil, fmt.Errorf("%s: no samples", path)
	}
	return r, nil
}

// drawTimelines draws each run as two panels, one above the other: memory
// (device in use less the run's ballast, the pool's reservation, live
// buffers) and GPU utilization, against time.
func drawTimelines(paths []string, title, out string) error {
	var runs []*timelineRun
	for _, p := range paths {
		r, err := readTimeline(p)
		if err != nil {
			return err
		}
		runs = append(runs, r)
	}
	if len(runs) == 0 {
		return errors.New("no timeline files")
	}
	blue, red, green, grey := color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
		color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, color.RGBA{R: 0x55, G: 0x55, B: 0x55, A: 0xff}
	plots := make([][]*plot.Plot, 2*len(runs))
	for i, r := range runs {
		mem := plot.New()
		mem.Title.Text = r.label
		if i == 0 && title != "" {
			mem.Title.Text = title + "\n" + r.label
		}
		mem.Y.Label.Text = "GiB"
		mem.Legend.Top, mem.Legend.Left = true, true
		for _, s := range []struct {
			name string
			xy   plotter.XYs
			c    color.Color
		}{{"device in use (less the ballast)", r.used, grey}, {"pool reserved", r.reserved, red}, {"live buffers", r.live, blue}} {
			if len(s.xy) == 0 {
				continue
			}
			l, err := plotter.NewLine(s.xy)
			if err != nil {
				return err
			}
			l.Color = s.c
			mem.Add(l)
			mem.Legend.Add(s.name, l)
		}
		util := plot.New()
		util.X.Label.Text = "time (s)"
		util.Y.Label.Text = "GPU busy (%)"
		util.Y.Min, util.Y.Max = 0, 100
		if len(r.util) > 0 {
			l, err := plotter.NewLine(r.util)
			if err != nil {
				return err
			}
			l.Color = green
			util.Add(l)
		}
		util.X.Min, util.X.Max = mem.X.Min, mem.X.Max
		plots[2*i] = []*plot.Plot{mem}
		plots[2*i+1] = []*plot.Plot{util}
	}
	w, h := 8*vg.Inch, vg.Length(len(runs))*4*vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadY: vg.Millimeter * 2, PadX: vg.Millimeter * 2, PadTop: vg.Millimeter, PadBottom: vg.Millimeter}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	_, err = vgimg.PngCanvas{Canvas: img}.WriteTo(f)
	return errors.Join(err, f.Close())
}

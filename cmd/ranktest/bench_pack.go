package main

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/distbuf/distbuf/packing"
)

func init() { benches["pack"] = benchPack }

// benchPack measures packing:
//
//	plan    plan plus one view per block for 1e5 mixed blocks, in ns/block
//	        (goal 15), on any backend
//	gather  20000 scattered blocks of 4 KiB into one coalesced buffer: the
//	        mover (gather kernel on CUDA, parallel goroutines on the host)
//	        against one copy per block, measured in the same run; on CUDA
//	        also the bandwidth (goal 1.5 TB/s). packing's BenchmarkGather
//	        compares the mover's copy methods one by one.
func benchPack(c *benchContext) error {
	modes := []string{"plan", "gather"}
	if c.cfg.mode != "" {
		if !contains(modes, c.cfg.mode) {
			return fmt.Errorf("-mode %q: pack has modes %v", c.cfg.mode, modes)
		}
		modes = []string{c.cfg.mode}
	}
	g, err := newGemmBench(c) // the stream and the timer
	if err != nil {
		return err
	}
	defer g.close()
	for _, m := range modes {
		var err error
		if m == "plan" {
			err = benchPlan(c)
		} else {
			err = benchGather(g)
		}
		if err != nil {
			return fmt.Errorf("mode %s: %w", m, err)
		}
	}
	return nil
}

func benchPlan(c *benchContext) error {
	const n = 100000
	rng := rand.New(rand.NewPCG(c.cfg.seed, 1))
	dims := []int{1, 2, 3, 4, 6, 8, 12, 16}
	descs := make([]packing.Desc, n)
	for i := range descs {
		descs[i] = packing.Desc{ID: uint64(i), DType: packing.Float64, Rows: dims[rng.IntN(len(dims))], Cols: dims[rng.IntN(len(dims))]}
	}
	a := c.alloc
	p0, err := packing.NewPlan(descs, packing.Options{})
	if err != nil {
		return err
	}
	buf, err := a.Alloc(p0.Groups()[0].Bytes, a.DefaultStream())
	if err != nil {
		return err
	}
	defer func() { _ = buf.Free() }()
	var samples []float64
	var sink int64
	iters := max(c.cfg.iters, 20)
	for it := range iters + 1 {
		start := time.Now()
		p, err := packing.NewPlan(descs, packing.Options{})
		if err != nil {
			return err
		}
		co, err := packing.Wrap(buf, 0, p, 0, nil)
		if err != nil {
			return err
		}
		for _, v := range co.All() {
			d := v.Desc()
			sink += v.Offset() + int64(d.Rows*d.Cols)
		}
		if it > 0 { // the first run warms the heap up
			samples = append(samples, float64(time.Since(start).Nanoseconds())/1e3)
		}
	}
	us := median(samples)
	_ = sink
	return c.emit(benchResult{Bench: "pack", Mode: "plan", N: n, MedianUS: us, Extra: map[string]any{
		"ns_per_block": us * 1e3 / n, "goal_ns_per_block": 15, "classes": len(p0.Classes()),
	}})
}

func benchGather(g *gemmBench) error {
	const n, size = 20000, 4096
	descs := make([]packing.Desc, n)
	for i := range descs {
		descs[i] = packing.Desc{ID: uint64(i), DType: packing.Float64, Rows: 16, Cols: size / 8 / 16}
	}
	p, err := packing.NewPlan(descs, packing.Options{})
	if err != nil {
		return err
	}
	dst, err := packing.Alloc(g.a, p, g.s)
	if err != nil {
		return err
	}
	defer func() { _ = dst.Free() }()
	// The blocks sit in every other 4 KiB slot of one source buffer, shuffled.
	src, err := g.a.Alloc(2*n*size, g.s)
	if err != nil {
		return err
	}
	defer func() { _ = src.Free() }()
	if err := g.s.Memset(src, 0, src.Size(), 1); err != nil {
		return err
	}
	refs := make([]packing.Ref, n)
	for i, j := range rand.New(rand.NewPCG(g.c.cfg.seed, 2)).Perm(n) {
		refs[i] = packing.Ref{Buf: src, Off: int64(2*j) * size}
	}
	m, err := packing.NewMover(g.s, dst, refs)
	if err != nil {
		return err
	}
	defer func() { _ = m.Close() }()
	us, err := g.timeUS(g.iters, func() error { return m.Pack(g.s) })
	if err != nil {
		return err
	}
	bytes := int64(n * size)
	extra := map[string]any{"method": m.Method(), "block_bytes": size, "timer": g.timer(),
		"gb_per_s": float64(bytes) / us / 1e3}
	if g.device {
		extra["tb_per_s"] = float64(bytes) / us / 1e6
		extra["tb_per_s_read_plus_write"] = 2 * float64(bytes) / us / 1e6
		extra["goal_tb_per_s"] = 1.5
	}
	// The per-block baseline: one devalloc Copy per block on the stream, in
	// the same run.
	perUS, err := g.timeUS(min(g.iters, 5), func() error {
		for k, r := range refs {
			v, err := dst.View(k)
			if err != nil {
				return err
			}
			if err := g.s.Copy(dst.Buffer(), v.Offset(), r.Buf, r.Off, size); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	extra["per_block_us"] = perUS
	extra["ratio_vs_per_block"] = perUS / us
	return g.c.emit(benchResult{Bench: "pack", Mode: "gather", N: n, Bytes: bytes, MedianUS: us, Extra: extra})
}

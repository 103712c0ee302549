package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
)

// summary is the -json line, printed last by rank 0. Counts are totals over
// every rank and solve; times are medians over solves of the slowest rank.
type summary struct {
	OK                    bool    `json:"ok"`
	Ranks                 int     `json:"ranks"`
	Backend               string  `json:"backend"`
	Policy                string  `json:"policy"`
	Mode                  string  `json:"mode"`
	Iters                 int     `json:"iters"`
	Blocks                int     `json:"blocks"`
	AllocCalls            int64   `json:"alloc_calls"`
	GemmLaunches          int64   `json:"gemm_launches"`
	Messages              int64   `json:"messages"`
	BytesMoved            int64   `json:"bytes_moved"`
	VerifyFailures        int64   `json:"verify_failures"`
	MedianSolveUS         float64 `json:"median_solve_us"`
	PoolReservedPeakBytes int64   `json:"pool_reserved_peak_bytes"`
	// Reserved memory after the warm-up solves and at the end, summed over
	// ranks: equal when the pool does not grow in steady state.
	PoolReservedAfterWarmupBytes int64 `json:"pool_reserved_after_warmup_bytes"`
	PoolReservedFinalBytes       int64 `json:"pool_reserved_final_bytes"`
	// Devices is the CUDA device of each rank, -1 on the host backend.
	Devices []int64 `json:"devices"`
}

// warmupIters is how many solves warm the pool up before its size is
// expected to stay constant.
func warmupIters(iters int) int { return min(max(iters/10, 1), 10) }

// run is the main job: cfg.iters synthetic solves on every rank, a
// cluster-wide table on rank 0, and a non-zero exit on any failed block.
func run(cfg config, world *cluster.Comm, out, errOut io.Writer) (err error) {
	if cfg.iters <= 0 {
		return fmt.Errorf("-iters must be positive, got %d", cfg.iters)
	}
	if cfg.mode == "" {
		cfg.mode = "packed"
	}
	if cfg.mode != "packed" && cfg.mode != "perblock" {
		return fmt.Errorf("-mode %q: the solve runs packed or perblock", cfg.mode)
	}
	a, err := openAllocator(cfg)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, a.Close()) }()
	sv, err := newSolver(cfg, world, a)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, sv.close()) }()
	root := world.Rank() == 0
	if root {
		fmt.Fprintf(out, "ranktest: %d rank(s), backend %s (%s), policy %s, mode %s, %d blocks per rank, %d solves\n",
			world.Size(), a.Kind(), a.Describe(), a.Policy(), cfg.mode, sv.shape.blocks, cfg.iters)
		if r := a.FallbackReason(); r != "" {
			fmt.Fprintf(out, "ranktest: %s\n", r)
		}
	}

	per := make([]iterStats, 0, cfg.iters)
	var reservedWarm int64
	start := time.Now()
	lastReport := start
	for iter := range cfg.iters {
		st, err := sv.iterate(iter)
		if err != nil {
			return fmt.Errorf("rank %d, solve %d: %w", world.Rank(), iter, err)
		}
		per = append(per, st)
		if st.verifyFailures > 0 {
			fmt.Fprintf(errOut, "ranktest: solve %d: %s (%d block(s) wrong on this rank)\n", iter, st.firstFailure, st.verifyFailures)
		}
		if iter+1 == warmupIters(cfg.iters) {
			reservedWarm = a.Stats().ReservedCurrent
		}
		if root && time.Since(lastReport) > 5*time.Second {
			lastReport = time.Now()
			fmt.Fprintf(errOut, "ranktest: %d/%d solves, %.0f s\n", iter+1, cfg.iters, time.Since(start).Seconds())
		}
	}
	return report(cfg, world, a, sv, per, reservedWarm, out)
}

// metric is one row of the table: a per-rank value reduced over ranks.
type metric struct {
	name  string
	unit  string
	value float64
}

func report(cfg config, world *cluster.Comm, a *devalloc.Allocator, sv *solver, per []iterStats, reservedWarm int64, out io.Writer) error {
	st := a.Stats()
	n := float64(len(per))
	var total iterStats
	solve := make([]float64, len(per))
	for i, p := range per {
		total.allocCalls += p.allocCalls
		total.gemmLaunches += p.gemmLaunches
		total.messages += p.messages
		total.bytesMoved += p.bytesMoved
		total.verifyFailures += p.verifyFailures
		total.verifyUS += p.verifyUS
		solve[i] = p.solveUS
	}
	// The solve time of the cluster is the slowest rank's, solve by solve.
	if err := world.AllreduceFloat64(solve, solve, cluster.Max); err != nil {
		return err
	}
	medSolve := median(slices.Clone(solve))
	rows := []metric{
		{"time per solve", "us", mean(per, func(p iterStats) float64 { return p.solveUS })},
		{"verify per solve", "us", total.verifyUS / n},
		{"allocator calls per solve", "", float64(total.allocCalls) / n},
		{"GEMM launches per solve", "", float64(total.gemmLaunches) / n},
		{"messages per solve", "", float64(total.messages) / n},
		{"bytes moved per solve", "B", float64(total.bytesMoved) / n},
		{"pool reserved", "B", float64(st.ReservedCurrent)},
		{"pool reserved peak", "B", float64(st.ReservedPeak)},
	}
	vals := make([]float64, len(rows))
	for i, r := range rows {
		vals[i] = r.value
	}
	lo, hi, sum := slices.Clone(vals), slices.Clone(vals), slices.Clone(vals)
	counts := []int64{total.allocCalls, total.gemmLaunches, total.messages, total.bytesMoved, total.verifyFailures,
		st.ReservedPeak, reservedWarm, st.ReservedCurrent}
	maxPeak := []int64{st.ReservedPeak}
	err := errors.Join(world.AllreduceFloat64(lo, lo, cluster.Min), world.AllreduceFloat64(hi, hi, cluster.Max),
		world.AllreduceFloat64(sum, sum, cluster.Sum), world.AllreduceInt64(counts, counts, cluster.Sum),
		world.AllreduceInt64(maxPeak, maxPeak, cluster.Max))
	if err != nil {
		return err
	}
	failures := counts[4]
	// Placement: the device of every rank, and whether ranks of one node
	// share one although the node has enough.
	devices := make([]int64, world.Size())
	if err := world.AllgatherInt64([]int64{placementOf(a)}, devices); err != nil {
		return err
	}
	// Ranks may land on different backends (a node without a GPU, say).
	lo64, hi64 := []int64{int64(a.Kind())}, []int64{int64(a.Kind())}
	if err := errors.Join(world.AllreduceInt64(lo64, lo64, cluster.Min), world.AllreduceInt64(hi64, hi64, cluster.Max)); err != nil {
		return err
	}
	if world.Rank() == 0 {
		if a.Kind().IsDevice() {
			fmt.Fprintf(out, "placement (device of each rank): %v\n", devices)
		}
		if lo64[0] != hi64[0] {
			fmt.Fprintf(out, "ranktest: the ranks do not all run on the same backend (%s to %s): see each rank's devalloc.FallbackReason\n",
				devalloc.Kind(lo64[0]), devalloc.Kind(hi64[0]))
		}
		ranks := float64(world.Size())
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "per rank\tmin\tmean\tmax\t")
		for i, r := range rows {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", r.name, human(lo[i], r.unit), human(sum[i]/ranks, r.unit), human(hi[i], r.unit))
		}
		_ = tw.Flush()
		fmt.Fprintf(out, "median solve (slowest rank) %s; verification: %d block(s) wrong\n", human(medSolve, "us"), failures)
		if cfg.json {
			line, _ := json.Marshal(summary{
				OK: failures == 0, Ranks: world.Size(), Backend: a.Kind().String(), Policy: a.Policy().String(), Mode: cfg.mode,
				Iters: cfg.iters, Blocks: sv.shape.blocks, AllocCalls: counts[0], GemmLaunches: counts[1], Messages: counts[2],
				BytesMoved: counts[3], VerifyFailures: failures, MedianSolveUS: round3(medSolve), PoolReservedPeakBytes: maxPeak[0],
				PoolReservedAfterWarmupBytes: counts[6], PoolReservedFinalBytes: counts[7], Devices: devices,
			})
			fmt.Fprintln(out, string(line))
		}
	}
	if failures > 0 {
		return fmt.Errorf("verification failed: %d block(s) wrong across the cluster (each rank names its first above)", failures)
	}
	return nil
}

func mean(per []iterStats, f func(iterStats) float64) float64 {
	var s float64
	for _, p := range per {
		s += f(p)
	}
	return s / float64(len(per))
}

// human formats v in its unit for the table.
func human(v float64, unit string) string {
	switch unit {
	case "us":
		if v >= 1e6 {
			return fmt.Sprintf("%.2f s", v/1e6)
		}
		if v >= 1e3 {
			return fmt.Sprintf("%.2f ms", v/1e3)
		}
		return fmt.Sprintf("%.1f us", v)
	case "B":
		return devalloc.FormatBytes(int64(v))
	}
	if v == float64(int64(v)) {
		return fmt.Sprintf("%d", int64(v))
	}
	return fmt.Sprintf("%.1f", v)
}

// placementOf is the CUDA ordinal the allocator runs on, -1 on the host.
func placementOf(a *devalloc.Allocator) int64 {
	if !a.Kind().IsDevice() {
		return -1
	}
	return int64(a.Device())
}

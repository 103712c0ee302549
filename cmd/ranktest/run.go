package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/allockind"
	"github.com/distbuf/distbuf/internal/bytesize"
	"github.com/distbuf/distbuf/internal/cudart"
)

// summary is the -json line, printed last by rank 0. Every field is one of
// three kinds, and says which in its name or comment:
//   - counts (alloc_calls, gemm_launches, messages, bytes_moved,
//     verify_failures, gemm_plans_built, runtime_calls) are totals over
//     every rank and solve;
//   - memory (pool_reserved_*_bytes, working_set_bytes) is the sum over
//     ranks of each rank's figure, a cluster total (the peak is the sum of
//     the ranks' peaks);
//   - runtime_calls_by_entry (with -calls) is per solve and rank: each
//     entry point's calls and microseconds, the mean over ranks;
//   - times (*_us) are medians over solves of the slowest rank's time in
//     that solve, to half a percent (solveStats' histograms). The ranks
//     start each solve together, at a barrier after the last solve's
//     verification, so a solve's time is the solver's alone.
//
// A solve is fresh when its bond's layout was made for it (a bond's first
// solve, or every solve with -fresh) and repeated otherwise; median_solve_us,
// phase_us and device_us cover every solve, and "repeated" and "fresh" each
// kind alone (null when the run had none).
type summary struct {
	OK             bool   `json:"ok"`
	Ranks          int    `json:"ranks"`
	Backend        string `json:"backend"`
	Policy         string `json:"policy"`
	Mode           string `json:"mode"`
	Iters          int    `json:"iters"`
	Blocks         int    `json:"blocks"` // synthetic: blocks per rank; 0 for sectors
	Bonds          int    `json:"bonds"`
	Fresh          bool   `json:"fresh"`
	AllocCalls     int64  `json:"alloc_calls"`
	GemmLaunches   int64  `json:"gemm_launches"`
	GemmPlansBuilt int64  `json:"gemm_plans_built"`
	// RuntimeCalls counts the CUDA runtime and driver calls of the solves
	// (the loader's counters, every entry point): the harness's device
	// timer included (six a solve), its staging of a new layout's operands
	// and its verification left out. Absent on the host backend.
	RuntimeCalls *int64 `json:"runtime_calls,omitempty"`
	// RuntimeCallsByEntry is, with -calls, each entry point's calls and
	// microseconds spent inside it per solve, the mean over ranks, over
	// the same calls as RuntimeCalls. Absent without -calls.
	RuntimeCallsByEntry map[string]entryCalls `json:"runtime_calls_by_entry,omitempty"`
	Messages            int64                 `json:"messages"`
	BytesMoved          int64                 `json:"bytes_moved"`
	VerifyFailures      int64                 `json:"verify_failures"`
	MedianSolveUS       float64               `json:"median_solve_us"`
	// PhaseUS splits the solve (see cmd/ranktest's packed): alloc, upload,
	// gemm_plan, gemm, exchange, free.
	PhaseUS phaseTimes `json:"phase_us"`
	// DeviceUS is the device time of the solve's stream from the upload to
	// the end of the GEMMs (CUDA events); absent on the host backend. The
	// sectors workload's last GEMMs follow the exchange, which these times
	// then include.
	DeviceUS     *float64       `json:"device_us,omitempty"`
	DeviceGemmUS *float64       `json:"device_gemm_us,omitempty"`
	Repeated     *layoutSummary `json:"repeated"`
	FreshSolves  *layoutSummary `json:"fresh_solves"`
	// Memory, summed over ranks: the peak, after the warm-up (the first
	// sweep over the bonds, or the first tenth of the run) and at the end,
	// equal to the one after the warm-up when the pool does not grow.
	PoolReservedPeakBytes        int64 `json:"pool_reserved_peak_bytes"`
	PoolReservedAfterWarmupBytes int64 `json:"pool_reserved_after_warmup_bytes"`
	PoolReservedFinalBytes       int64 `json:"pool_reserved_final_bytes"`
	// Devices is the CUDA device of each rank, -1 on the host backend.
	Devices []int64 `json:"devices"`
	// Workload is synthetic or sectors; M the sectors workload's bond
	// dimension (absent for synthetic).
	Workload string `json:"workload"`
	M        int    `json:"m,omitempty"`
	// WorkingSetBytes is memory, summed over ranks: each rank's largest
	// working set, the most bytes a solve held at once in buffers outside
	// pinned memory (the synthetic solve holds all of them to its end).
	WorkingSetBytes int64 `json:"working_set_bytes"`
	// Structure describes the sectors workload's latest fresh block
	// structure; absent for synthetic.
	Structure *structureSummary `json:"structure,omitempty"`
}

// structureSummary is one block structure of the sectors workload, whole
// (every rank's blocks).
type structureSummary struct {
	Bond         int     `json:"bond"`
	LeftSectors  []int   `json:"left_sectors"`  // dimensions, in charge order
	RightSectors []int   `json:"right_sectors"` // dimensions, in charge order
	PsiBlocks    int     `json:"psi_blocks"`
	T1Blocks     int     `json:"t1_blocks"`
	T2Blocks     int     `json:"t2_blocks"`
	Products     int     `json:"gemm_products"` // of the three steps, step 3 counted by slab
	GFlop        float64 `json:"gflop"`         // of one solve
}

func summarize(st *sectorStructure) *structureSummary {
	if st == nil {
		return nil
	}
	products := len(st.t1) + len(st.step2)
	for _, t := range st.t2 {
		products += dw(t.kw2)
	}
	return &structureSummary{Bond: st.bond, LeftSectors: st.left.dim, RightSectors: st.right.dim, PsiBlocks: len(st.psi),
		T1Blocks: len(st.t1), T2Blocks: len(st.t2), Products: products, GFlop: round3(st.flops / 1e9)}
}

// layoutSummary is the medians over the solves of one kind of layout.
type layoutSummary struct {
	Solves        int64      `json:"solves"`
	MedianSolveUS float64    `json:"median_solve_us"`
	PhaseUS       phaseTimes `json:"phase_us"`
	DeviceUS      *float64   `json:"device_us,omitempty"`
	DeviceGemmUS  *float64   `json:"device_gemm_us,omitempty"`
}

// phaseTimes is the phase_us object, in the order of the solve.
type phaseTimes struct {
	Alloc    float64 `json:"alloc"`
	Upload   float64 `json:"upload"`
	GemmPlan float64 `json:"gemm_plan"`
	Gemm     float64 `json:"gemm"`
	Exchange float64 `json:"exchange"`
	Free     float64 `json:"free"`
}

// warmupIters is how many solves warm the pool up before its size is
// expected to stay constant: the first sweep over the bonds (every bond's
// sizes seen once), and at least a tenth of the run up to 10 solves.
func warmupIters(iters, bonds int) int { return min(iters, max(min(max(iters/10, 1), 10), bonds)) }

// run is the main job: cfg.iters synthetic solves on every rank, a
// cluster-wide table on rank 0, and a non-zero exit on any failed block.
func run(cfg config, world *cluster.Comm, out, errOut io.Writer) (err error) {
	if cfg.iters <= 0 || cfg.iters > maxIters {
		return fmt.Errorf("-iters must be in [1, %d], got %d", maxIters, cfg.iters)
	}
	if cfg.bonds == 0 {
		cfg.bonds = defaultBonds
	}
	if cfg.bonds < 0 || cfg.bonds > maxBonds {
		return fmt.Errorf("-bonds must be in [1, %d], got %d", maxBonds, cfg.bonds)
	}
	if cfg.mode == "" {
		cfg.mode = "packed"
	}
	if cfg.mode != "packed" && cfg.mode != "perblock" {
		return fmt.Errorf("-mode %q: the solve runs packed or perblock", cfg.mode)
	}
	if cfg.workload == "" {
		cfg.workload = "synthetic"
	}
	switch {
	case cfg.workload != "synthetic" && cfg.workload != "sectors" && cfg.workload != "maxm":
		return fmt.Errorf("-workload %q: want synthetic, sectors or maxm", cfg.workload)
	case cfg.workload != "synthetic" && cfg.mode != "packed":
		return fmt.Errorf("-mode %s: the %s workload runs packed only", cfg.mode, cfg.workload)
	case cfg.workload != "synthetic" && (cfg.m < 1 || cfg.m > maxM):
		return fmt.Errorf("-m must be in [1, %d], got %d", maxM, cfg.m)
	}
	release, ballast, err := placeBallast(world, cfg)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, release()) }()
	a, err := openAllocator(cfg)
	if err != nil {
		return err
	}
	// After a failure the job ends (main aborts it): what the allocator
	// still holds then is not a leak worth reporting beside the error.
	defer func() {
		if err == nil {
			err = a.Close()
		}
	}()
	if cfg.workload == "maxm" {
		return runWorkloadSteps(cfg, world, a, newAnchorWorkload(a), ballast, out, errOut)
	}
	sv, err := newSolver(cfg, world, a)
	if err != nil {
		return err
	}
	if cfg.calls {
		// After the setup: its calls (the kernels' compilation, the IPC
		// windows) are not the solve's.
		sv.calls = &callTimes{}
		cudart.SetTiming(true)
		defer cudart.SetTiming(false)
	}
	// Closing the exchanger is collective: after a failure, which ends the
	// job (main aborts it), this rank must not wait in it for ranks that
	// may be waiting for it elsewhere.
	defer func() {
		if err == nil {
			err = sv.close()
		}
	}()
	cfg = sv.cfg
	if cfg.workload == "sectors" && cfg.grow > 0 {
		return runWorkloadSteps(cfg, world, a, &sectorsWorkload{sv: sv}, ballast, out, errOut)
	}
	root := world.Rank() == 0
	if root {
		layouts := fmt.Sprintf("%d bond(s), each planned once", cfg.bonds)
		if cfg.fresh {
			layouts = fmt.Sprintf("%d bond(s), every solve planned afresh", cfg.bonds)
		} else if cfg.bonds > maxCachedLayouts {
			layouts = fmt.Sprintf("%d bond(s), more than the %d layouts kept: every solve planned afresh", cfg.bonds, maxCachedLayouts)
		}
		work := fmt.Sprintf("%d blocks per rank", sv.shape.blocks)
		if cfg.workload == "sectors" {
			work = fmt.Sprintf("workload sectors (a U(1) spin-1/2 chain's two-site H·psi) at m %d", cfg.m)
		}
		fmt.Fprintf(out, "ranktest: %d rank(s), backend %s (%s), policy %s, mode %s, %s, %d solves over %s\n",
			world.Size(), allockind.Name(a), a.Info().Description, a.Info().Config.Policy, cfg.mode, work, cfg.iters, layouts)
		if r := a.Info().FallbackReason; r != "" {
			fmt.Fprintf(out, "ranktest: %s\n", r)
		}
	}
	if err := warnSharedGPU(world, a, cfg.timeout, out); err != nil {
		return err
	}

	stats := solveStats{world: world, timeout: cfg.timeout}
	var reservedWarm int64
	start := time.Now()
	lastReport := start
	for iter := range cfg.iters {
		st, err := sv.iterate(iter)
		if err != nil {
			return fmt.Errorf("solve %d: %w", iter, err)
		}
		if err := stats.add(st); err != nil {
			return err
		}
		if st.verifyFailures > 0 {
			fmt.Fprintf(errOut, "ranktest: solve %d: %s (%d block(s) wrong on this rank)\n", iter, st.firstFailure, st.verifyFailures)
		}
		if iter+1 == warmupIters(cfg.iters, cfg.bonds) {
			reservedWarm = a.Stats().ReservedCurrent
		}
		if root && time.Since(lastReport) > 5*time.Second {
			lastReport = time.Now()
			fmt.Fprintf(errOut, "ranktest: %d/%d solves, %.0f s\n", iter+1, cfg.iters, time.Since(start).Seconds())
		}
	}
	if err := stats.flush(); err != nil {
		return err
	}
	return report(cfg, world, a, sv, &stats, reservedWarm, out)
}

// metric is one row of the table: a per-rank value reduced over ranks.
type metric struct {
	name  string
	unit  string
	value float64
}

func report(cfg config, world *cluster.Comm, a *devalloc.Allocator, sv *solver, stats *solveStats, reservedWarm int64, out io.Writer) error {
	st := a.Stats()
	n := float64(stats.solves)
	total := stats.total
	rows := []metric{
		{"time per solve", "us", total.solveUS / n},
		{"verify per solve", "us", total.verifyUS / n},
		{"allocator calls per solve", "", float64(total.allocCalls) / n},
		{"GEMM launches per solve", "", float64(total.gemmLaunches) / n},
		{"runtime calls per solve", "", float64(total.runtimeCalls) / n},
		{"messages per solve", "", float64(total.messages) / n},
		{"bytes moved per solve", "B", float64(total.bytesMoved) / n},
		{"working set", "B", float64(total.workingSet)},
		{"pool reserved", "B", float64(st.ReservedCurrent)},
		{"pool reserved peak", "B", float64(st.ReservedPeak)},
	}
	vals := make([]float64, len(rows))
	for i, r := range rows {
		vals[i] = r.value
	}
	lo, hi, sum := slices.Clone(vals), slices.Clone(vals), slices.Clone(vals)
	counts := []int64{total.allocCalls, total.gemmLaunches, total.messages, total.bytesMoved, total.verifyFailures,
		st.ReservedPeak, reservedWarm, st.ReservedCurrent, sv.plansBuilt, total.runtimeCalls, total.workingSet}
	t := cfg.timeout
	err := errors.Join(cluster.AllreduceWithin(world, lo, lo, cluster.Min, t), cluster.AllreduceWithin(world, hi, hi, cluster.Max, t),
		cluster.AllreduceWithin(world, sum, sum, cluster.Sum, t), cluster.AllreduceWithin(world, counts, counts, cluster.Sum, t))
	if err != nil {
		return err
	}
	failures := counts[4]
	// Placement: the device of every rank, and whether ranks of one node
	// share one although the node has enough.
	devices := make([]int64, world.Size())
	if err := cluster.AllgatherWithin(world, []int64{placementOf(a)}, devices, t); err != nil {
		return err
	}
	// Ranks may land on different backends (a node without a GPU, say).
	lo64, hi64 := []int64{int64(allockind.Index(a))}, []int64{int64(allockind.Index(a))}
	if err := errors.Join(cluster.AllreduceWithin(world, lo64, lo64, cluster.Min, t), cluster.AllreduceWithin(world, hi64, hi64, cluster.Max, t)); err != nil {
		return err
	}
	var byEntry map[string]entryCalls
	if sv.calls != nil {
		if byEntry, err = sv.calls.collect(world, t); err != nil {
			return err
		}
	}
	if world.Rank() == 0 {
		if a.Info().Backend == devalloc.BackendCUDA {
			fmt.Fprintf(out, "placement (device of each rank): %v\n", devices)
			if err := sv.eng.KernelStatus(); err != nil {
				fmt.Fprintf(out, "ranktest: %v\n", err)
			}
		}
		if lo64[0] != hi64[0] {
			fmt.Fprintf(out, "ranktest: the ranks do not all run on the same backend (%s to %s): see each rank's devalloc Info.FallbackReason\n",
				allockind.Names[lo64[0]], allockind.Names[hi64[0]])
		}
		ranks := float64(world.Size())
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "per rank\tmin\tmean\tmax\t")
		for i, r := range rows {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", r.name, human(lo[i], r.unit), human(sum[i]/ranks, r.unit), human(hi[i], r.unit))
		}
		_ = tw.Flush()
		printPhases(out, stats)
		if sv.calls != nil {
			if len(byEntry) > 0 {
				printCalls(out, byEntry)
			} else {
				fmt.Fprintln(out, "ranktest: -calls: the solves made no CUDA runtime call")
			}
		}
		if ss := sv.lastStructure; ss != nil {
			fmt.Fprintf(out, "structure of bond %d: %d left and %d right sectors (largest %d, smallest %d), %d psi blocks, %d T1 and %d T2 blocks, %.3g GFlop a solve\n",
				ss.bond, len(ss.left.q), len(ss.right.q), max(slices.Max(ss.left.dim), slices.Max(ss.right.dim)), min(slices.Min(ss.left.dim), slices.Min(ss.right.dim)),
				len(ss.psi), len(ss.t1), len(ss.t2), ss.flops/1e9)
		}
		fmt.Fprintf(out, "median solve (slowest rank) %s; verification: %d block(s) wrong\n", human(stats.median(2, tSolve), "us"), failures)
		if cfg.json {
			var runtimeCalls *int64
			if a.Info().Backend == devalloc.BackendCUDA {
				runtimeCalls = &counts[9]
			}
			sum := summary{
				OK: failures == 0, Ranks: world.Size(), Backend: allockind.Name(a), Policy: a.Info().Config.Policy.String(), Mode: cfg.mode,
				Iters: cfg.iters, Blocks: sv.shape.blocks, Bonds: cfg.bonds, Fresh: cfg.fresh,
				AllocCalls: counts[0], GemmLaunches: counts[1], Messages: counts[2], BytesMoved: counts[3], VerifyFailures: failures,
				GemmPlansBuilt: counts[8], RuntimeCalls: runtimeCalls, MedianSolveUS: round3(stats.median(2, tSolve)), PhaseUS: phasesOf(stats, 2),
				DeviceUS: optional(stats.median(2, tDevice)), DeviceGemmUS: optional(stats.median(2, tDeviceGemm)),
				Repeated: layoutOf(stats, 0), FreshSolves: layoutOf(stats, 1),
				PoolReservedPeakBytes: counts[5], PoolReservedAfterWarmupBytes: counts[6], PoolReservedFinalBytes: counts[7], Devices: devices,
				RuntimeCallsByEntry: byEntry, Workload: cfg.workload, WorkingSetBytes: counts[10], Structure: summarize(sv.lastStructure),
			}
			if cfg.workload == "sectors" {
				sum.M, sum.Blocks = cfg.m, 0
			}
			line, _ := json.Marshal(sum)
			fmt.Fprintln(out, string(line))
		}
	}
	if failures > 0 {
		return fmt.Errorf("verification failed: %d block(s) wrong across the cluster (each rank names its first above)", failures)
	}
	return nil
}

// printPhases is the table of the solve's phases: medians of the slowest
// rank, by layout.
func printPhases(out io.Writer, stats *solveStats) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "solve phases (median, slowest rank)\trepeated layout (%d)\tfresh layout (%d)\t\n", stats.count[0], stats.count[1])
	row := func(name string, j int) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t\n", name, humanOrNone(stats.median(0, j)), humanOrNone(stats.median(1, j)))
	}
	for j, name := range phaseNames {
		row(name, j)
	}
	row("solve", tSolve)
	if !math.IsNaN(stats.median(2, tDevice)) {
		row("device: upload to GEMM end", tDevice)
		row("device: GEMM", tDeviceGemm)
	}
	_ = tw.Flush()
}

func humanOrNone(us float64) string {
	if math.IsNaN(us) {
		return "-"
	}
	return human(us, "us")
}

func optional(us float64) *float64 {
	if math.IsNaN(us) {
		return nil
	}
	v := round3(us)
	return &v
}

func phasesOf(stats *solveStats, k int) phaseTimes {
	m := func(j int) float64 { return round3(stats.median(k, j)) }
	return phaseTimes{Alloc: m(phAlloc), Upload: m(phUpload), GemmPlan: m(phPlan), Gemm: m(phGemm), Exchange: m(phExchange), Free: m(phFree)}
}

func layoutOf(stats *solveStats, k int) *layoutSummary {
	if stats.count[k] == 0 {
		return nil
	}
	return &layoutSummary{Solves: stats.count[k], MedianSolveUS: round3(stats.median(k, tSolve)), PhaseUS: phasesOf(stats, k),
		DeviceUS: optional(stats.median(k, tDevice)), DeviceGemmUS: optional(stats.median(k, tDeviceGemm))}
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
		return bytesize.Format(int64(v))
	}
	if v == float64(int64(v)) {
		return fmt.Sprintf("%d", int64(v))
	}
	return fmt.Sprintf("%.1f", v)
}

// placementOf is the CUDA ordinal the allocator runs on, -1 on the host.
func placementOf(a *devalloc.Allocator) int64 {
	if a.Info().Backend != devalloc.BackendCUDA {
		return -1
	}
	return int64(a.Info().Device)
}

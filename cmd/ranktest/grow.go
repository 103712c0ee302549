package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/allockind"
	"github.com/distbuf/distbuf/internal/bytesize"
)

// growable is a workload that a run of steps drives, one bond dimension m
// a step: the design note's question is what happens as m grows until the
// device is full.
type growable interface {
	// solveAt runs solve iter at bond dimension m, laying out a fresh block
	// structure when m is new, and ends the phase (devalloc EndPhase, in
	// the solve's time), with the bytes of memory the solve held at its
	// peak in the result's workingSet. An allocation that fails returns an
	// error matching distbuf.ErrOutOfMemory with everything the solve
	// allocated freed, and no rank is left waiting for this one.
	solveAt(m, iter int) (iterStats, error)
	// dropStructures forgets the structures laid out so far.
	dropStructures() error
}

// sectorsWorkload is the sectors solve (sectorsolve.go) as a growable
// workload: one structure at each m.
type sectorsWorkload struct {
	sv *solver
	m  int // the structure laid out last
}

func (w *sectorsWorkload) solveAt(m, iter int) (iterStats, error) {
	w.m = m
	return w.sv.solveSectors(iter, m, 0)
}

func (w *sectorsWorkload) dropStructures() error { return w.sv.dropSectors(w.m, 0) }

// stepRecord is one step of the run, every memory figure summed over ranks
// (each rank's own peak, so the sum is the cluster's at its worst), except
// where it says otherwise.
type stepRecord struct {
	M               int   `json:"m"`
	WorkingSetBytes int64 `json:"working_set_bytes"`
	// ReservedPeakBytes is the pools' reservation at their peak in the
	// step, LivePeakBytes the bytes of live buffers at theirs: the
	// difference is what the pool held beyond what the step used.
	ReservedPeakBytes int64 `json:"reserved_peak_bytes"`
	LivePeakBytes     int64 `json:"live_peak_bytes"`
	// ReservedEndBytes is what the pools kept after the step's last phase
	// ended: the retained memory.
	ReservedEndBytes int64 `json:"reserved_end_bytes"`
	// LargestAllocBytes is, after the step, the largest allocation that
	// still succeeded (devalloc LargestAlloc), the smallest over ranks; -1
	// without -probe.
	LargestAllocBytes int64 `json:"largest_alloc_bytes"`
	// DeviceFreeBytes is the device's free memory after the step, the
	// smallest any rank saw.
	DeviceFreeBytes int64 `json:"device_free_bytes"`
	// SolveUS is each solve's time, the slowest rank's, the phase's end
	// (devalloc EndPhase) included.
	SolveUS []float64 `json:"solve_us"`
}

// growSummary is the -json line of a run of steps.
type growSummary struct {
	OK       bool    `json:"ok"`
	Ranks    int     `json:"ranks"`
	Backend  string  `json:"backend"`
	Policy   string  `json:"policy"`
	Workload string  `json:"workload"`
	Grow     float64 `json:"grow"` // the factor per step; 1 for a run at a fixed m
	StartM   int     `json:"start_m"`
	// MaxM is the largest m whose step every rank completed, 0 if none.
	MaxM int `json:"max_m"`
	// EndedBy says why the run stopped: "out of memory" (the device was
	// full, the normal end of a growing run), "-grow-until" or "-iters".
	EndedBy string `json:"ended_by"`
	// EndedDetail is the out-of-memory report of the lowest rank that met it.
	EndedDetail      string       `json:"ended_detail,omitempty"`
	DeviceTotalBytes int64        `json:"device_total_bytes"` // of rank 0's device
	BallastBytes     int64        `json:"ballast_bytes"`      // summed over the ballasts
	VerifyFailures   int64        `json:"verify_failures"`
	Steps            []stepRecord `json:"steps"`
}

// runWorkloadSteps runs w step by step (runSteps) with the timeline the
// flags ask for around it; ballast is this rank's (placeBallast).
func runWorkloadSteps(cfg config, world *cluster.Comm, a *devalloc.Allocator, w growable, ballast int64, out, errOut io.Writer) (err error) {
	var tl *timeline
	if cfg.timeline != "" && world.Rank() == 0 {
		header := timelineHeader{Policy: a.Info().Config.Policy.String(), Workload: cfg.workload, Device: a.Info().Description, Ranks: world.Size(), BallastBytes: ballast}
		if tl, err = startTimeline(cfg.timeline, a, header, func(note string) { fmt.Fprintln(errOut, "ranktest:", note) }); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, tl.close()) }()
	}
	total := []int64{ballast}
	if err := cluster.AllreduceWithin(world, total, total, cluster.Sum, cfg.timeout); err != nil {
		return err
	}
	return runSteps(cfg, world, a, w, total[0], tl, out, errOut)
}

// runSteps drives w step by step: at m = cfg.m, then m times cfg.grow at
// each step (two solves a step, cfg.stepSolves) until an allocation fails on
// some rank, which ends the run at that step on every rank, or m passes
// cfg.growUntil. Without -grow it is one step of cfg.iters solves at m.
func runSteps(cfg config, world *cluster.Comm, a *devalloc.Allocator, w growable, ballast int64, tl *timeline, out, errOut io.Writer) error {
	root := world.Rank() == 0
	sum := growSummary{Ranks: world.Size(), Backend: allockind.Name(a), Policy: a.Info().Config.Policy.String(), Workload: cfg.workload,
		Grow: max(cfg.grow, 1), StartM: cfg.m, EndedBy: "-iters", BallastBytes: ballast}
	_, sum.DeviceTotalBytes = a.MemInfo()
	if root {
		what := fmt.Sprintf("%d solves at m = %d", cfg.iters, cfg.m)
		if cfg.grow > 0 {
			what = fmt.Sprintf("m from %d, times %g a step, %d solves a step, until the device is full", cfg.m, cfg.grow, cfg.stepSolves)
			if cfg.growUntil > 0 {
				what += fmt.Sprintf(" or m passes %d", cfg.growUntil)
			}
		}
		fmt.Fprintf(out, "ranktest: %d rank(s), backend %s (%s), policy %s, workload %s: %s\n",
			world.Size(), allockind.Name(a), a.Info().Description, sum.Policy, cfg.workload, what)
		if r := a.Info().FallbackReason; r != "" {
			fmt.Fprintf(out, "ranktest: %s\n", r)
		}
	}
	progress := root && isTerminal(errOut)
	start := time.Now()
	iter := 0
	// m grows as maxm.cu's does: a real number, truncated at each step.
	mf := float64(cfg.m)
	for m, step := cfg.m, 0; ; step++ {
		if cfg.grow > 0 && cfg.growUntil > 0 && m > cfg.growUntil {
			sum.EndedBy = "-grow-until"
			break
		}
		solves := cfg.stepSolves
		if cfg.grow == 0 {
			solves = cfg.iters
		}
		rec, oom, err := runStep(world, a, w, m, solves, &iter, cfg, &sum.VerifyFailures, tl)
		if err != nil {
			return fmt.Errorf("step %d (m = %d): %w", step, m, err)
		}
		if oom != nil {
			sum.EndedBy, sum.EndedDetail = "out of memory", oom.Error()
			break
		}
		sum.Steps = append(sum.Steps, rec)
		sum.MaxM = m
		if progress {
			fmt.Fprintf(errOut, "\rranktest: step %d, m = %d: working set %s, solve %s, %.0f s   ",
				step, m, bytesize.Format(rec.WorkingSetBytes), human(rec.SolveUS[len(rec.SolveUS)-1], "us"), time.Since(start).Seconds())
		}
		if cfg.grow == 0 {
			break
		}
		if mf *= cfg.grow; int(mf) <= m {
			mf = float64(m + 1)
		}
		m = int(mf)
		if err := w.dropStructures(); err != nil {
			return err
		}
	}
	if progress {
		fmt.Fprintln(errOut)
	}
	if cfg.grow > 0 && sum.MaxM == 0 {
		return fmt.Errorf("-m %d: the first step did not fit: %s", cfg.m, sum.EndedDetail)
	}
	sum.OK = sum.VerifyFailures == 0
	if root {
		printSteps(out, &sum)
		if cfg.json {
			line, _ := json.Marshal(sum)
			fmt.Fprintln(out, string(line))
		}
	}
	if sum.VerifyFailures > 0 {
		return fmt.Errorf("verification failed: %d block(s) wrong across the cluster (each rank names its first above)", sum.VerifyFailures)
	}
	return nil
}

// runStep runs the solves of one step at m on every rank. When an
// allocation fails on some rank, every rank stops after the same solve and
// oom is the lowest such rank's report; any other error is returned as is
// (the caller ends the job).
func runStep(world *cluster.Comm, a *devalloc.Allocator, w growable, m, solves int, iter *int, cfg config, failures *int64, tl *timeline) (rec stepRecord, oom error, err error) {
	timeout := cfg.timeout
	a.ResetPeak()
	rec.M = m
	var workingSet int64
	for range solves {
		tl.at(m, *iter)
		st, serr := w.solveAt(m, *iter)
		*iter++
		workingSet = max(workingSet, st.workingSet)
		if serr != nil && !errors.Is(serr, distbuf.ErrOutOfMemory) {
			return rec, nil, serr
		}
		// Every rank learns whether any ran out, and its own solve's time
		// is reduced to the slowest's.
		me := int64(math.MaxInt64)
		if serr != nil {
			me = int64(world.Rank())
		}
		flags := []int64{me, st.verifyFailures}
		if err := errors.Join(cluster.AllreduceWithin(world, flags[:1], flags[:1], cluster.Min, timeout), cluster.AllreduceWithin(world, flags[1:], flags[1:], cluster.Sum, timeout)); err != nil {
			return rec, nil, err
		}
		if st.verifyFailures > 0 {
			fmt.Fprintf(os.Stderr, "ranktest: m = %d: %s (%d block(s) wrong on this rank)\n", m, st.firstFailure, st.verifyFailures)
		}
		*failures += flags[1]
		if flags[0] != math.MaxInt64 {
			return rec, outOfMemoryOf(world, int(flags[0]), serr, timeout), nil
		}
		us := []float64{st.solveUS}
		if err := cluster.AllreduceWithin(world, us, us, cluster.Max, timeout); err != nil {
			return rec, nil, err
		}
		rec.SolveUS = append(rec.SolveUS, round3(us[0]))
	}
	st := a.Stats()
	free, _ := a.MemInfo()
	largest := int64(-1)
	if cfg.probe {
		if largest, err = a.LargestAlloc(a.DefaultStream()); err != nil {
			return rec, nil, err
		}
	}
	sums := []int64{workingSet, st.ReservedPeak, st.RequestedPeak, st.ReservedCurrent}
	mins := []int64{largest, free}
	if err := errors.Join(cluster.AllreduceWithin(world, sums, sums, cluster.Sum, timeout), cluster.AllreduceWithin(world, mins, mins, cluster.Min, timeout)); err != nil {
		return rec, nil, err
	}
	rec.WorkingSetBytes, rec.ReservedPeakBytes, rec.LivePeakBytes, rec.ReservedEndBytes = sums[0], sums[1], sums[2], sums[3]
	rec.LargestAllocBytes, rec.DeviceFreeBytes = mins[0], mins[1]
	return rec, nil, nil
}

// oomMessageBytes bounds the out-of-memory report passed to every rank.
const oomMessageBytes = 1024

// outOfMemoryOf is rank r's out-of-memory report, on every rank (err is
// this rank's, nil where it had none).
func outOfMemoryOf(world *cluster.Comm, r int, err error, timeout time.Duration) error {
	buf := make([]byte, oomMessageBytes)
	if world.Rank() == r {
		copy(buf, fmt.Sprintf("rank %d: %v", r, err))
	}
	if berr := cluster.BcastWithin(world, buf, r, timeout); berr != nil {
		return berr
	}
	msg, _, _ := strings.Cut(string(buf), "\x00")
	return errors.New(msg)
}

// printSteps is the table of the steps and the run's end.
func printSteps(out io.Writer, sum *growSummary) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "m\tworking set\treserved peak\tlive peak\treserved after\tlargest alloc\tdevice free\tsolve (median)\t")
	for _, r := range sum.Steps {
		largest := "-"
		if r.LargestAllocBytes >= 0 {
			largest = bytesize.Format(r.LargestAllocBytes)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.M, bytesize.Format(r.WorkingSetBytes), bytesize.Format(r.ReservedPeakBytes),
			bytesize.Format(r.LivePeakBytes), bytesize.Format(r.ReservedEndBytes), largest, bytesize.Format(r.DeviceFreeBytes), human(medianOf(r.SolveUS), "us"))
	}
	_ = tw.Flush()
	switch {
	case len(sum.Steps) == 0:
	case sum.EndedBy == "out of memory":
		last := sum.Steps[len(sum.Steps)-1]
		fmt.Fprintf(out, "largest m %d (working set %s); the next step ran out of memory: %s\n", sum.MaxM, bytesize.Format(last.WorkingSetBytes), sum.EndedDetail)
	default:
		fmt.Fprintf(out, "largest m %d; ended by %s\n", sum.MaxM, sum.EndedBy)
	}
	fmt.Fprintf(out, "verification: %d block(s) wrong\n", sum.VerifyFailures)
}

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// isTerminal reports whether w is a character device (a terminal), where a
// progress line that rewrites itself belongs.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// growConfig is the configuration of a run of steps.
type growConfig struct {
	grow        float64 // m's factor a step; 0: one step of -iters solves
	growUntil   int     // stop once m passes it; 0: at out of memory only
	stepSolves  int     // solves a step of a growing run
	probe       bool    // measure the largest allocation after each step
	ballastFree int64   // CUDA: leave only this much of each device free; 0: none
	timeline    string  // sample memory and utilization into this file
}

// maxStepSolves bounds -step-solves.
const maxStepSolves = 1000

func registerGrowFlags(fs *flag.FlagSet, g *growConfig) {
	fs.Float64Var(&g.grow, "grow", 0, "grow m by this factor a step (e.g. 1.12), -step-solves solves a step, until the device is full; 0: -iters solves at -m")
	fs.IntVar(&g.growUntil, "grow-until", 0, "end a growing run once m passes this (0: when the device is full)")
	fs.IntVar(&g.stepSolves, "step-solves", 2, fmt.Sprintf("solves a step of a growing run (at most %d)", maxStepSolves))
	fs.BoolVar(&g.probe, "probe", true, "after each step, find the largest allocation that still succeeds (devalloc LargestAlloc)")
	fs.Func("ballast-free", "CUDA: before the run, a cudaMalloc ballast leaves only this much of each device free (e.g. 24GiB), as maxm.cu's does; one rank per device holds it", func(v string) error {
		n, err := bytesize.Parse(v)
		if err == nil && n <= 0 {
			err = fmt.Errorf("want a positive size")
		}
		g.ballastFree = n
		return err
	})
	fs.StringVar(&g.timeline, "timeline", "", "rank 0 samples its device's memory and utilization (NVML) and its pool every 2 ms into FILE, one JSON object a line")
}

// checkGrowFlags validates the step flags, for a run of workload.
func checkGrowFlags(g growConfig, workload string) error {
	switch {
	case math.IsNaN(g.grow) || g.grow < 0 || g.grow > 0 && g.grow <= 1 || g.grow > 16:
		return fmt.Errorf("-grow %v: want a factor in (1, 16], or 0 for no growth", g.grow)
	case g.grow > 0 && workload != "sectors" && workload != "maxm":
		return fmt.Errorf("-grow needs a workload with a bond dimension: -workload sectors or maxm")
	case g.growUntil < 0:
		return fmt.Errorf("-grow-until %d: must not be negative", g.growUntil)
	case g.stepSolves < 1 || g.stepSolves > maxStepSolves:
		return fmt.Errorf("-step-solves %d: want 1 to %d", g.stepSolves, maxStepSolves)
	}
	return nil
}

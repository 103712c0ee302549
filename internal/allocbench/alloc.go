package allocbench

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/allockind"
	"github.com/distbuf/distbuf/internal/benchtimer"
	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/packing"
)

// The alloc benchmark compares allocator configurations on one device:
//
//   - cudamalloc: no pool, no cache: cudaMalloc for every allocation and
//     cudaFree (which waits for the device) for every free, called directly
//     as naive code does (CUDA only);
//   - threshold0: the pool under AggressiveFree with release threshold 0: the
//     driver returns freed memory at every synchronisation, and EndPhase trims;
//   - trim-phase: the pool retained (threshold UINT64_MAX) and trimmed to 0 at
//     each phase boundary only: the other way to give memory back;
//   - retained: the pool retained, never trimmed, as devalloc opens it: a
//     block freed on a stream is kept for the next allocation of its size
//     there (Stats.ReuseHits);
//   - retained-noreuse: the same with that reuse off (cache:off): every
//     Alloc and Free calls the pool, the per-call path itself;
//   - large-only: the solve cycle with only its large buffers, for retained,
//     threshold0 and cudamalloc;
//   - retained-packed: the retained pool, with the tiny blocks packed into
//     one coalesced buffer: one allocation, one memset and one free for all
//     of them, instead of 2000 of each. Each bond's packing.Plan is built
//     at its first solve and reused while its tiny blocks keep their sizes
//     (checked every cycle), as a solver plans each block structure once.
//     retained-packed-replan is the same with the plan built every cycle, as
//     when every solve brings a new structure. Both run in turns with their
//     large-only baseline (retained), each on a pool of its own, ten cycles
//     at a time, so that all medians see the same machine: its speed moves
//     by half over seconds. A second large-only run takes its turns too;
//     its ratio to the first (twin_vs_large_only) is the method's error;
//   - raw-pool: the cycle on a cudaMemPool called directly (no devalloc),
//     retained and at threshold 0 (CUDA only): what the platform itself
//     allows, the bound of any allocator built on the pool;
//   - c-pool: the cycle and the pair written in C on a retained private
//     pool (baseline.go), the bar for devalloc's overhead. On
//     the CUDA backend every devalloc measurement runs in turns with the C
//     one of its shape and reports vs_c (devalloc over C), the C median,
//     the C cycle's phases as devalloc's are timed (c_alloc_median_us,
//     c_touch_median_us, c_sync_median_us beside alloc_median_us,
//     touch_median_us, sync_median_us) and the C driver calls; the mode
//     alone measures C by itself;
//   - fallback: devalloc's cudaMalloc fallback (pool:off) with a cache that
//     holds a whole cycle (CUDA only), against the same C baseline.
//
// Every devalloc line on CUDA also reports the driver calls it made, by
// entry point, as the loader counted them (cudaSetDevice and
// cuCtxGetCurrent included): per cycle, and per Alloc and per Free for the
// pairs; the C lines report theirs beside them.
//
// Each configuration gets its own Allocator, opened on the backend of the
// session (Open). Two measurements per configuration:
//
//   - pair: Alloc, Free and Stream.Synchronize of one buffer, per size; the
//     synchronisation is where a low threshold releases memory. Extra has the
//     same pair without the synchronisation (nosync_median_us), in batches.
//   - cycle: a DMRG two-site solve's allocation pattern: 20 large buffers
//     (16 to 64 MiB) and 2000 tiny ones (64 B to 16 KiB, log-uniform), all
//     allocated, each touched by a memset, all freed, then one stream
//     synchronisation. Cycle i is the solve at bond i mod allocParams.bonds
//     of a converged sweep at fixed bond dimension, the run the retained
//     policy is for: a bond's solve has the same sizes every sweep. A phase
//     is allocPhaseCycles cycles; EndPhase (and for trim-phase, Trim(0)) runs
//     at its end, inside the timed cycle.
//     Two touches, each its own line: case "cycle" fills every buffer
//     (840 MB of memsets per cycle, the same in every mode), case
//     "cycle-touch" sets the first touchBytes of each buffer
//     (all of a tiny one), so the cycle times allocation rather than memset
//     bandwidth. A coalesced buffer is always filled: every block in it is
//     touched.
//
// Results are medians. The retained lines carry the ratios against
// threshold0 and cudamalloc measured in the same run (vs_threshold0,
// vs_cudamalloc: how many times faster retained is), and the goals.

// allocBenchParams sizes the benchmark; tests shrink it.
type allocBenchParams struct {
	pairs, pairWarmup int
	pairSizes         []int64
	nosyncBatch       int
	minCycles, warmup int
	// pairedCycles is the least number of cycles, on a device, of the
	// packed measurements and of their large-only baseline, which take
	// turns: their cycles are cheap there, a ratio of two medians of the
	// host's noisiest steps needs the samples, and the first sweep, which
	// builds every bond's plan, must stay a small part of them.
	pairedCycles int
	// deviceCycles is the least number of cycles, on a device, of the
	// cycles of every buffer allocated alone (milliseconds each there),
	// compared with C's in turns: twenty gave ratios from 1.0 to 1.6 in
	// one session for the same build.
	deviceCycles       int
	bonds              int // bonds of a sweep: cycles i and i+bonds have the same sizes
	large, tiny        int
	largeMin, largeMax int64
	tinyMin, tinyMax   int64
	phaseCycles        int
	touchBytes         int64
	goalVsThreshold0   float64
	goalVsCudaMalloc   float64
	goalVsC            float64 // retained, large-only and retained-packed cycles over C in turns, at most
	goalPairVsC        float64 // an Alloc+Free pair without synchronisation over C's, at most
	fallbackCache      int64   // the fallback mode's cache: a whole cycle
	// exactCycles: every cycle measurement makes minCycles cycles, on any
	// backend (a benchmark's b.N), instead of the least counts above.
	exactCycles bool
}

var allocParams = allocBenchParams{
	pairs: 1000, pairWarmup: 20, pairSizes: []int64{256, 64 << 10, 16 << 20}, nosyncBatch: 100,
	minCycles: 20, warmup: 2, pairedCycles: 500, deviceCycles: 100, bonds: 50,
	large: 20, tiny: 2000, largeMin: 16 << 20, largeMax: 64 << 20, tinyMin: 64, tinyMax: 16 << 10,
	phaseCycles: 5, touchBytes: 4096, goalVsThreshold0: 10, goalVsCudaMalloc: 5,
	goalVsC: 1.25, goalPairVsC: 1.3, fallbackCache: 4 << 30,
}

type allocVariant struct {
	mode      string
	cfg       devalloc.Config
	trimPhase bool
	raw       bool   // cudaMalloc/cudaFree called directly, no allocator
	packed    bool   // tiny blocks from one coalesced buffer
	replan    bool   // packed, with the plan built every cycle
	cudaOnly  string // why the mode is skipped off the CUDA backend; empty: it runs anywhere
	goals     bool   // the line carries the goals against C
}

var allocVariants = []allocVariant{
	{mode: "cudamalloc", raw: true},
	{mode: "threshold0", cfg: devalloc.Config{Policy: devalloc.AggressiveFree, FreeThreshold: 0}},
	{mode: "trim-phase", cfg: devalloc.Config{Policy: devalloc.Retain}, trimPhase: true},
	{mode: "retained", cfg: devalloc.Config{Policy: devalloc.Retain}, goals: true},
	{mode: "retained-noreuse", cfg: devalloc.Config{Policy: devalloc.Retain, Cache: -1},
		cudaOnly: "needs the CUDA backend (the reuse it turns off is the CUDA pool's)"},
	{mode: "fallback", cfg: devalloc.Config{NoPool: true, Cache: allocParams.fallbackCache},
		cudaOnly: "needs the CUDA backend (the cudaMalloc fallback)"},
	{mode: "retained-packed", cfg: devalloc.Config{Policy: devalloc.Retain}, packed: true, goals: true},
}

var allocModes = []string{"c-pool", "cudamalloc", "threshold0", "trim-phase", "retained", "retained-noreuse", "fallback", "large-only", "retained-packed", "raw-pool"}

// cycleTouch is one way of touching the buffers of a cycle.
type cycleTouch struct {
	kase  string // the "case" of the result line
	bytes int64  // bytes set at the start of each buffer; 0: all of it
}

func cycleTouches() []cycleTouch {
	return []cycleTouch{{"cycle", 0}, {"cycle-touch", allocParams.touchBytes}}
}

// key names a cycle median in allocRun.cycle.
func (t cycleTouch) key(mode string) string {
	if t.bytes == 0 {
		return mode
	}
	return mode + "#touch"
}

func variantByMode(mode string) (allocVariant, error) {
	for _, v := range allocVariants {
		if v.mode == mode {
			return v, nil
		}
	}
	return allocVariant{}, fmt.Errorf("no allocator configuration %q", mode)
}

// allocRun remembers medians of the run for the ratios.
type allocRun struct {
	pair  map[string]map[int64]float64 // mode -> size -> median us
	cycle map[string]float64           // mode or "large-only/"+mode -> median us
	base  *cBaseline
}

// runModes runs each mode in turn, on the run's C baseline.
func runModes(c *benchContext, modes []string) (err error) {
	for _, m := range modes {
		if !slices.Contains(allocModes, m) {
			return fmt.Errorf("mode %q: %w: unknown mode of alloc (have %v)", m, distbuf.ErrInvalid, allocModes)
		}
	}
	base, err := openCBaseline(c)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, base.close()) }()
	run := c.run
	run.base = base
	for _, mode := range modes {
		var err error
		switch mode {
		case "c-pool":
			err = benchCPool(c, run)
		case "large-only":
			err = benchAllocLargeOnly(c, run)
		case "raw-pool":
			err = benchRawPool(c, run)
		default:
			var v allocVariant
			if v, err = variantByMode(mode); err == nil {
				err = benchAllocVariant(c, run, v)
			}
		}
		if err != nil {
			return fmt.Errorf("mode %s: %w", mode, err)
		}
	}
	return nil
}

// openVariant opens an allocator for v on the run's backend and device.
func openVariant(c *benchContext, v allocVariant) (a *devalloc.Allocator, skip string, err error) {
	backend, device := devalloc.BackendHost, 0
	if c.alloc.Info().Backend == devalloc.BackendCUDA {
		backend, device = devalloc.BackendCUDA, c.alloc.Info().Device
	}
	if v.raw {
		return nil, "", fmt.Errorf("%s has no allocator", v.mode)
	}
	cfg := v.cfg
	a, err = devalloc.Open(devalloc.Options{Backend: backend, Device: device, Config: &cfg, Warn: func(string) {}})
	return a, "", err
}

func (c *benchContext) skipLine(mode, reason string, extra map[string]any) error {
	if extra == nil {
		extra = map[string]any{}
	}
	extra["skipped"] = reason
	return c.emit(Result{Mode: mode, Backend: allockind.Name(c.alloc), Extra: extra})
}

func benchAllocVariant(c *benchContext, run *allocRun, v allocVariant) (err error) {
	if v.raw {
		return benchAllocRaw(c, run, v.mode)
	}
	if v.cudaOnly != "" && c.alloc.Info().Backend != devalloc.BackendCUDA {
		return c.skipLine(v.mode, v.cudaOnly, nil)
	}
	if v.packed {
		return benchAllocPacked(c, run, v)
	}
	a, skip, err := openVariant(c, v)
	if err != nil {
		return err
	}
	if skip != "" {
		return c.skipLine(v.mode, skip, nil)
	}
	defer func() { err = errors.Join(err, a.Close()) }()
	p := allocParams

	run.pair[v.mode] = map[int64]float64{}
	for _, size := range p.pairSizes {
		if !c.want.pair(size) {
			continue
		}
		ours, cpair, err := measurePairs(run.base, a, size)
		if err != nil {
			return err
		}
		med := round3(benchtimer.Median(ours.lat))
		run.pair[v.mode][size] = med
		extra := map[string]any{"case": "pair", "p90_us": round3(percentile(ours.lat, 0.9)), "nosync_median_us": round3(ours.nosync),
			"kind": allockind.Name(a)}
		if v.mode == "retained" {
			addRatios(extra, run.pair["threshold0"][size], run.pair["cudamalloc"][size], med, false)
		}
		addPairVsC(extra, run.base, ours, med, cpair, v.goals)
		if err := c.emit(Result{Mode: v.mode, N: p.pairs, Bytes: size, MedianUS: med,
			Backend: allockind.Name(a), Extra: extra}); err != nil {
			return err
		}
	}

	for _, t := range cycleTouches() {
		if !c.want.cycle(t) {
			continue
		}
		res, cres, err := measureCycles(run.base, newCycleRun(c, a, v, p.large, p.tiny, t, cyclesOn(a, p.deviceCycles)))
		if err != nil {
			return err
		}
		run.cycle[t.key(v.mode)] = res.median
		extra := res.extra()
		if v.mode == "retained" {
			addRatios(extra, run.cycle[t.key("threshold0")], run.cycle[t.key("cudamalloc")], res.median, true)
		}
		addVsC(extra, run.base, res.median, cres, goalIf(v.goals))
		if err := c.emit(Result{Mode: v.mode, N: res.cycles, Bytes: res.bytes, MedianUS: res.median,
			Backend: allockind.Name(a), Extra: extra}); err != nil {
			return err
		}
	}
	return nil
}

// goalIf is the goal against C for a line that has one, else 0.
func goalIf(goals bool) float64 {
	if goals {
		return allocParams.goalVsC
	}
	return 0
}

func benchAllocLargeOnly(c *benchContext, run *allocRun) error {
	p := allocParams
	for _, mode := range []string{"cudamalloc", "threshold0", "retained"} {
		if !c.want.allocatorIs(mode) {
			continue
		}
		v, err := variantByMode(mode)
		if err != nil {
			return err
		}
		if v.raw {
			if err := benchRawLargeOnly(c, run, mode); err != nil {
				return err
			}
			continue
		}
		a, skip, err := openVariant(c, v)
		if err != nil {
			return err
		}
		if skip != "" {
			if err := c.skipLine("large-only", skip, map[string]any{"allocator": mode}); err != nil {
				return err
			}
			continue
		}
		for _, t := range cycleTouches() {
			if !c.want.cycle(t) {
				continue
			}
			res, cres, err := measureCycles(run.base, newCycleRun(c, a, v, p.large, 0, t, cyclesOn(a, p.pairedCycles)))
			if err != nil {
				return errors.Join(err, a.Close())
			}
			run.cycle[t.key("large-only/"+mode)] = res.median
			extra := res.extra()
			extra["allocator"] = mode
			if mode == "retained" {
				addRatios(extra, run.cycle[t.key("large-only/threshold0")], run.cycle[t.key("large-only/cudamalloc")], res.median, true)
			}
			addVsC(extra, run.base, res.median, cres, goalIf(mode == "retained"))
			if err := c.emit(Result{Mode: "large-only", N: res.cycles, Bytes: res.bytes,
				MedianUS: res.median, Backend: allockind.Name(a), Extra: extra}); err != nil {
				return errors.Join(err, a.Close())
			}
		}
		if err := a.Close(); err != nil {
			return err
		}
	}
	return nil
}

// addRatios records how many times faster retained is than the baselines
// measured earlier in the run (absent baselines are said to be absent).
func addRatios(extra map[string]any, threshold0, cudamalloc, retained float64, goals bool) {
	if retained <= 0 {
		return
	}
	missing := []string{}
	for _, b := range []struct {
		name      string
		base, min float64
	}{{"threshold0", threshold0, allocParams.goalVsThreshold0}, {"cudamalloc", cudamalloc, allocParams.goalVsCudaMalloc}} {
		if b.base <= 0 {
			missing = append(missing, b.name)
			continue
		}
		r := b.base / retained
		extra["vs_"+b.name] = round3(r)
		if goals {
			extra["goal_vs_"+b.name] = b.min
			extra["meets_goal_vs_"+b.name] = r >= b.min
		}
	}
	if len(missing) > 0 {
		extra["ratios_missing"] = fmt.Sprintf("no %v baseline in this run (measure it first, in the same Session, on the CUDA backend)", missing)
	}
}

type cycleResult struct {
	cycles                int
	bytes                 int64 // requested per cycle (mean)
	allocs                int
	median, mean, p90     float64
	reservedPeak          int64
	reservedBetweenCycles int64 // the most reserved after a cycle's synchronisation, before its phase ends
	reservedAfterPhase    int64 // reserved after the last phase boundary
	backendCallsPerCycle  float64
	kind                  string
	touch                 cycleTouch
	allocMedian           float64 // allocating every buffer (with the plan, when packed)
	touchMedian           float64 // the memsets and frees
	syncMedian            float64 // waiting for the device at the cycle's end
	planMedian            float64 // the tiny blocks' plan (retained-packed)
	// retained-packed only: allocating the large buffers, allocating the
	// coalesced buffer, and its memset and free.
	largeAllocMedian, coalescedAllocMedian, coalescedTouchMedian float64
	plansBuilt                                                   int                // warm-up included
	driverCalls                                                  map[string]float64 // per measured cycle, by entry point; nil on the host
}

func (r cycleResult) extra() map[string]any {
	e := map[string]any{
		"case": r.touch.kase, "touch_bytes": r.touch.bytes, "kind": r.kind, "allocs_per_cycle": r.allocs, "mean_us": round3(r.mean), "p90_us": round3(r.p90),
		"reserved_peak_bytes": r.reservedPeak, "reserved_between_cycles_max_bytes": r.reservedBetweenCycles,
		"reserved_after_phase_bytes": r.reservedAfterPhase, "backend_calls_per_cycle": round3(r.backendCallsPerCycle),
		"phase_cycles": allocParams.phaseCycles,
	}
	if r.allocMedian > 0 {
		e["alloc_median_us"], e["touch_median_us"] = r.allocMedian, r.touchMedian
	}
	if r.driverCalls != nil {
		e["driver_calls_per_cycle"] = totalCalls(r.driverCalls)
		e["driver_calls_by_entry"] = r.driverCalls
	}
	if r.syncMedian > 0 {
		e["sync_median_us"] = r.syncMedian
	}
	if r.planMedian > 0 {
		e["plan_median_us"] = r.planMedian
		e["large_alloc_median_us"] = r.largeAllocMedian
		e["coalesced_alloc_median_us"] = r.coalescedAllocMedian
		e["coalesced_touch_median_us"] = r.coalescedTouchMedian
		e["plans_built"] = r.plansBuilt
	}
	return e
}

// cycleSizes returns the buffer sizes of cycle i, the same for every
// configuration of the run and for every sweep: large ones uniform, tiny ones
// log-uniform, shuffled.
func cycleSizes(seed uint64, i, large, tiny int) []int64 {
	p := allocParams
	rng := rand.New(rand.NewPCG(seed, uint64(i%p.bonds)))
	sizes := make([]int64, 0, large+tiny)
	for range large {
		sizes = append(sizes, (p.largeMin+rng.Int64N(p.largeMax-p.largeMin+1))/256*256)
	}
	lo, hi := math.Log(float64(p.tinyMin)), math.Log(float64(p.tinyMax))
	for range tiny {
		sizes = append(sizes, int64(math.Exp(lo+rng.Float64()*(hi-lo))))
	}
	rng.Shuffle(len(sizes), func(a, b int) { sizes[a], sizes[b] = sizes[b], sizes[a] })
	return sizes
}

// cyclesOn is the least number of cycles of a measurement on a's
// backend: onDevice on a device, where cycles are cheap and their ratios
// to C's need the samples, allocParams.minCycles on the host.
func cyclesOn(a *devalloc.Allocator, onDevice int) int {
	if a.Info().Backend == devalloc.BackendCUDA && !allocParams.exactCycles {
		return onDevice
	}
	return allocParams.minCycles
}

// solveCyclesInTurns runs cycle measurements taking turns, a batch of
// cycles each, so that all see the same machine: run to run, the GPU
// machine's host moves by up to 40%, which a ratio of two measurements made
// one after the other would carry. A batch is up to ten cycles and ends
// after turnTime, so that long cycles alternate one by one.
func solveCyclesInTurns(runs ...cycleMeasure) ([]cycleResult, error) {
	const batch, turnTime = 10, 2 * time.Millisecond
	for slices.ContainsFunc(runs, func(r cycleMeasure) bool { return !r.done() }) {
		for _, r := range runs {
			start := time.Now()
			for k := 0; k < batch && !r.done() && (k == 0 || time.Since(start) < turnTime); k++ {
				if err := r.step(); err != nil {
					return nil, err
				}
			}
		}
	}
	res := make([]cycleResult, len(runs))
	for k, r := range runs {
		res[k] = r.result()
	}
	return res, nil
}

// cycleMeasure is a measurement of cycles, one cycle a step: devalloc's
// (cycleRun) or the C baseline's (cCycleRun).
type cycleMeasure interface {
	step() error
	done() bool
	result() cycleResult
}

// cycleRun is one measurement of the solve cycle, a cycle per step.
type cycleRun struct {
	c           *benchContext
	a           *devalloc.Allocator
	s           *devalloc.Stream
	v           allocVariant
	large, tiny int
	touch       cycleTouch
	i, total    int // the next cycle; warm-up and measured cycles
	res         cycleResult
	times       []float64
	bufs        []*devalloc.Buffer
	descs       []packing.Desc
	largeSizes  []int64
	tinySizes   []int64
	plans       []bondPlan // by bond; nil when the variant replans
	plansBuilt  int
	// Where a cycle's time goes: allocating (with the tiny blocks' plan,
	// when packed), touching and freeing, waiting for the device; and, when
	// packed, the parts of the first two that the tiny blocks add.
	planTimes, allocTimes, touchTimes, syncTimes              []float64
	largeAllocTimes, coalescedAllocTimes, coalescedTouchTimes []float64
	totalBytes                                                int64
	callsBefore                                               int64
	// The driver calls of the measured cycles, by entry point: counted
	// around the clocked part of each step, so nothing of the benchmark's
	// own (such as reading Stats) is in them. Nil on the host backend.
	driverCalls              *cudart.Tally
	callsAtStart, callsAtEnd cudart.Tally // read around each step, reused
}

func newCycleRun(c *benchContext, a *devalloc.Allocator, v allocVariant, large, tiny int, touch cycleTouch, minCycles int) *cycleRun {
	p := allocParams
	cycles := max(c.cfg.iters, minCycles)
	r := &cycleRun{c: c, a: a, s: a.DefaultStream(), v: v, large: large, tiny: tiny, touch: touch, total: p.warmup + cycles,
		res:   cycleResult{cycles: cycles, allocs: large + tiny, kind: allockind.Name(a), touch: touch},
		times: make([]float64, 0, cycles), bufs: make([]*devalloc.Buffer, 0, large+tiny)}
	if v.packed && !v.replan {
		r.plans = make([]bondPlan, p.bonds)
	}
	if a.Info().Backend == devalloc.BackendCUDA {
		r.driverCalls = &cudart.Tally{}
	}
	a.ResetPeak()
	r.callsBefore = a.Stats().BackendCalls
	return r
}

func (r *cycleRun) done() bool { return r.i >= r.total }

func (r *cycleRun) shape() cycleShape {
	return cycleShape{large: r.large, tiny: r.tiny, packed: r.v.packed}
}

// step runs cycle r.i: allocate, touch and free every buffer, synchronise.
func (r *cycleRun) step() error {
	i := r.i
	r.i++
	sizes := cycleSizes(r.c.cfg.seed, i, r.large, r.tiny)
	phaseEnd := (i+1)%allocParams.phaseCycles == 0
	if r.driverCalls != nil {
		r.callsAtStart.Read()
	}
	start := time.Now()
	filled, err := r.allocate(i, sizes, start)
	if err != nil {
		return err
	}
	allocated := time.Now()
	r.allocTimes = append(r.allocTimes, us(allocated.Sub(start)))
	synced, err := r.touchAndFree(i, filled, allocated)
	if err != nil {
		return err
	}
	// What the pool holds between cycles is read off the clock, and the
	// phase boundary's clock is added to the cycle's.
	reservedSynced := r.a.Stats().ReservedCurrent
	phaseStart := time.Now()
	if phaseEnd {
		if err := r.endPhase(); err != nil {
			return err
		}
	}
	r.record(i, sizes, us(synced.Sub(start))+us(time.Since(phaseStart)), reservedSynced, phaseEnd)
	return nil
}

// allocate takes the cycle's buffers (r.bufs): every size its own buffer,
// or, packed, the large ones each alone and the tiny ones as the views of
// one coalesced buffer, timing its parts. The buffers before filled are
// touched as the cycle's touch says; the rest are filled whole.
func (r *cycleRun) allocate(i int, sizes []int64, start time.Time) (filled int, err error) {
	a, s := r.a, r.s
	if !r.v.packed {
		r.bufs = r.bufs[:0]
		for _, n := range sizes {
			b, err := a.Alloc(n, s)
			if err != nil {
				return 0, err
			}
			r.bufs = append(r.bufs, b)
		}
		return len(r.bufs), nil
	}
	// A solver holds its block list apart from its large buffers, as the
	// large-only cycle is given its large sizes alone: the packed cycle's
	// clock starts on the two lists.
	r.largeSizes, r.tinySizes = r.largeSizes[:0], r.tinySizes[:0]
	for _, n := range sizes {
		if n >= allocParams.largeMin {
			r.largeSizes = append(r.largeSizes, n)
		} else {
			r.tinySizes = append(r.tinySizes, n)
		}
	}
	r.bufs = r.bufs[:0]
	for _, n := range r.largeSizes {
		b, err := a.Alloc(n, s)
		if err != nil {
			return 0, err
		}
		r.bufs = append(r.bufs, b)
	}
	filled = len(r.bufs)
	t0 := time.Now()
	r.largeAllocTimes = append(r.largeAllocTimes, us(t0.Sub(start)))
	if len(r.tinySizes) > 0 {
		plan, err := r.tinyPlan(i % allocParams.bonds)
		t1 := time.Now()
		r.planTimes = append(r.planTimes, us(t1.Sub(t0)))
		if err != nil {
			return 0, err
		}
		co, err := packing.Alloc(a, plan, s)
		if err != nil {
			return 0, err
		}
		r.coalescedAllocTimes = append(r.coalescedAllocTimes, us(time.Since(t1)))
		r.bufs = append(r.bufs, co.Buffer())
	}
	return filled, nil
}

// touchAndFree sets each buffer (the first filled as the touch says, the
// rest whole) and frees it, then synchronises, timing both; it returns
// when the synchronisation ended.
func (r *cycleRun) touchAndFree(i, filled int, allocated time.Time) (time.Time, error) {
	s := r.s
	touchedLarge := allocated
	for k, b := range r.bufs {
		n := b.Size()
		if k == filled {
			touchedLarge = time.Now()
		}
		if r.touch.bytes > 0 && k < filled {
			n = min(n, r.touch.bytes)
		}
		if err := s.Memset(b, 0, n, byte(i)); err != nil {
			return time.Time{}, err
		}
		if err := b.Free(); err != nil {
			return time.Time{}, err
		}
	}
	t0 := time.Now()
	if r.v.packed && filled < len(r.bufs) {
		r.coalescedTouchTimes = append(r.coalescedTouchTimes, us(t0.Sub(touchedLarge)))
	}
	r.touchTimes = append(r.touchTimes, us(t0.Sub(allocated)))
	if err := s.Synchronize(); err != nil {
		return time.Time{}, err
	}
	synced := time.Now()
	r.syncTimes = append(r.syncTimes, us(synced.Sub(t0)))
	return synced, nil
}

// endPhase ends a phase of the solve: a trim first in the trim-phase mode.
func (r *cycleRun) endPhase() error {
	if r.v.trimPhase {
		if err := r.a.Trim(0); err != nil {
			return err
		}
	}
	return r.a.EndPhase()
}

// record keeps cycle i's figures once the warm-up is over, and resets the
// peak and the call count as it ends.
func (r *cycleRun) record(i int, sizes []int64, elapsed float64, reservedSynced int64, phaseEnd bool) {
	p := allocParams
	if r.driverCalls != nil && i >= p.warmup {
		r.callsAtEnd.Read()
		r.driverCalls.AddSince(&r.callsAtEnd, &r.callsAtStart)
	}
	if i < p.warmup {
		if i == p.warmup-1 {
			r.a.ResetPeak()
			r.callsBefore = r.a.Stats().BackendCalls
		}
		return
	}
	r.times = append(r.times, elapsed)
	for _, n := range sizes {
		r.totalBytes += n
	}
	if !phaseEnd {
		r.res.reservedBetweenCycles = max(r.res.reservedBetweenCycles, reservedSynced)
	}
}

// bondPlan is the plan of a bond's tiny blocks and the sizes it was built for.
type bondPlan struct {
	sizes []int64
	plan  *packing.Plan
}

// tinyPlan returns the plan of the cycle's tiny blocks: the bond's plan when
// its blocks kept their sizes, else a new one, kept for the bond's next
// solve unless the variant replans every cycle.
func (r *cycleRun) tinyPlan(bond int) (*packing.Plan, error) {
	var bp *bondPlan
	if r.plans != nil {
		bp = &r.plans[bond]
		if bp.plan != nil && slices.Equal(bp.sizes, r.tinySizes) {
			return bp.plan, nil
		}
	}
	plan, descs, err := packTiny(r.descs, r.tinySizes)
	r.descs = descs
	if err != nil {
		return nil, err
	}
	r.plansBuilt++
	if bp != nil {
		bp.sizes, bp.plan = append(bp.sizes[:0], r.tinySizes...), plan
	}
	return plan, nil
}

// result summarises the measured cycles.
func (r *cycleRun) result() cycleResult {
	p, res := allocParams, r.res
	st := r.a.Stats()
	res.plansBuilt = r.plansBuilt
	res.reservedPeak = st.ReservedPeak
	res.reservedAfterPhase = st.ReservedCurrent
	res.backendCallsPerCycle = float64(st.BackendCalls-r.callsBefore) / float64(res.cycles)
	res.bytes = r.totalBytes / int64(res.cycles)
	summarize(&res, r.times)
	if r.driverCalls != nil {
		res.driverCalls = perCycle(r.driverCalls.Counts(), res.cycles)
	}
	measured := func(xs []float64) []float64 { return xs[min(p.warmup, len(xs)):] }
	res.syncMedian = round3(benchtimer.Median(measured(r.syncTimes)))
	res.allocMedian = round3(benchtimer.Median(measured(r.allocTimes)))
	res.touchMedian = round3(benchtimer.Median(measured(r.touchTimes)))
	if len(r.planTimes) > p.warmup {
		res.planMedian = round3(benchtimer.Median(measured(r.planTimes)))
		res.largeAllocMedian = round3(benchtimer.Median(measured(r.largeAllocTimes)))
		res.coalescedAllocMedian = round3(benchtimer.Median(measured(r.coalescedAllocTimes)))
		res.coalescedTouchMedian = round3(benchtimer.Median(measured(r.coalescedTouchTimes)))
	}
	return res
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

// percentile of xs (nearest rank); it sorts a copy.
func percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// benchAllocRaw measures the cudaMalloc/cudaFree baseline: pairs and cycles.
func benchAllocRaw(c *benchContext, run *allocRun, mode string) (err error) {
	if c.alloc.Info().Backend != devalloc.BackendCUDA {
		return c.skipLine(mode, "needs the CUDA backend (raw cudaMalloc/cudaFree)", nil)
	}
	r, err := openRawCUDA(c.alloc.Info().Device)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, r.close()) }()
	p := allocParams
	run.pair[mode] = map[int64]float64{}
	for _, size := range p.pairSizes {
		if !c.want.pair(size) {
			continue
		}
		lat := make([]float64, 0, p.pairs)
		for i := range p.pairWarmup + p.pairs {
			t, err := r.pair(size)
			if err != nil {
				return err
			}
			if i >= p.pairWarmup {
				lat = append(lat, t)
			}
		}
		med := round3(benchtimer.Median(lat))
		run.pair[mode][size] = med
		if err := c.emit(Result{Mode: mode, N: p.pairs, Bytes: size, MedianUS: med, Backend: "cuda-raw",
			Extra: map[string]any{"case": "pair", "p90_us": round3(percentile(lat, 0.9))}}); err != nil {
			return err
		}
	}
	return rawTouches(c, r.cycle, p.large, p.tiny, func(t cycleTouch, res cycleResult) error {
		run.cycle[t.key(mode)] = res.median
		return c.emit(Result{Mode: mode, N: res.cycles, Bytes: res.bytes, MedianUS: res.median, Backend: "cuda-raw", Extra: res.extra()})
	})
}

// rawTouches runs the cycle on a raw baseline with every touch the
// measure wants, and hands each result to report.
func rawTouches(c *benchContext, cycle func(sizes []int64, val byte, touch int64) error, large, tiny int, report func(cycleTouch, cycleResult) error) error {
	for _, t := range cycleTouches() {
		if !c.want.cycle(t) {
			continue
		}
		res, err := rawCycles(c, cycle, large, tiny, t)
		if err == nil {
			err = report(t, res)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func benchRawLargeOnly(c *benchContext, run *allocRun, mode string) (err error) {
	if c.alloc.Info().Backend != devalloc.BackendCUDA {
		return c.skipLine("large-only", "needs the CUDA backend (raw cudaMalloc/cudaFree)", map[string]any{"allocator": mode})
	}
	r, err := openRawCUDA(c.alloc.Info().Device)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, r.close()) }()
	return rawTouches(c, r.cycle, allocParams.large, 0, func(t cycleTouch, res cycleResult) error {
		run.cycle[t.key("large-only/"+mode)] = res.median
		extra := res.extra()
		extra["allocator"] = mode
		return c.emit(Result{Mode: "large-only", N: res.cycles, Bytes: res.bytes, MedianUS: res.median, Backend: "cuda-raw", Extra: extra})
	})
}

// benchRawPool runs the solve cycle on a cudaMemPool called directly,
// retained and at threshold 0: the platform's own figures, against which
// the allocator's goals can be judged. The retained line carries the
// ratios to threshold 0 and to cudamalloc of the same run.
func benchRawPool(c *benchContext, run *allocRun) (err error) {
	if c.alloc.Info().Backend != devalloc.BackendCUDA {
		return c.skipLine("raw-pool", "needs the CUDA backend (a cudaMemPool called directly)", nil)
	}
	p := allocParams
	for _, retained := range []bool{false, true} {
		name := map[bool]string{false: "threshold0", true: "retained"}[retained]
		if !c.want.allocatorIs(name) {
			continue
		}
		r, err := openRawPool(c.alloc.Info().Device, retained)
		if err != nil {
			return err
		}
		err = rawTouches(c, r.cycle, p.large, p.tiny, func(t cycleTouch, res cycleResult) error {
			res.kind = "cuda-pool-raw"
			run.cycle[t.key("raw-pool/"+name)] = res.median
			extra := res.extra()
			extra["allocator"] = name
			if retained {
				addRatios(extra, run.cycle[t.key("raw-pool/threshold0")], run.cycle[t.key("cudamalloc")], res.median, true)
				if ours := run.cycle[t.key("retained")]; ours > 0 {
					extra["allocator_retained_over_raw"] = round3(ours / res.median)
				}
			}
			return c.emit(Result{Mode: "raw-pool", N: res.cycles, Bytes: res.bytes, MedianUS: res.median, Backend: "cuda-raw", Extra: extra})
		})
		if err = errors.Join(err, r.close()); err != nil {
			return err
		}
	}
	return nil
}

// rawCycles runs the solve cycle of solveCycles on a raw baseline.
func rawCycles(c *benchContext, cycle func(sizes []int64, val byte, touch int64) error, large, tiny int, touch cycleTouch) (cycleResult, error) {
	p := allocParams
	cycles := max(c.cfg.iters, p.minCycles)
	res := cycleResult{cycles: cycles, allocs: large + tiny, kind: "cuda-raw", backendCallsPerCycle: float64(large + tiny), touch: touch}
	times := make([]float64, 0, cycles)
	var totalBytes int64
	for i := range p.warmup + cycles {
		sizes := cycleSizes(c.cfg.seed, i, large, tiny)
		start := time.Now()
		if err := cycle(sizes, byte(i), touch.bytes); err != nil {
			return res, err
		}
		if i < p.warmup {
			continue
		}
		times = append(times, us(time.Since(start)))
		for _, n := range sizes {
			totalBytes += n
		}
	}
	res.bytes = totalBytes / int64(cycles)
	summarize(&res, times)
	return res, nil
}

// benchAllocPacked runs the solve cycle with the tiny blocks packed into one
// coalesced buffer, the plan reused per bond and built every cycle, against
// large-only and cudamalloc of the same run.
func benchAllocPacked(c *benchContext, run *allocRun, v allocVariant) (err error) {
	replan := v
	replan.mode, replan.replan = v.mode+"-replan", true
	// The large-only baseline of the ratios, on its own retained pool.
	lv, err := variantByMode("retained")
	if err != nil {
		return err
	}
	// A second large-only run, the twin, takes its turns too: its ratio to
	// the baseline is the method's own error in this run.
	twin := lv
	twin.mode = "large-only-twin"
	variants := []allocVariant{v, replan, twin, lv}
	pools := make([]*devalloc.Allocator, 0, len(variants))
	defer func() {
		for _, a := range pools {
			err = errors.Join(err, a.Close())
		}
	}()
	for _, v := range variants {
		a, _, err := openVariant(c, v)
		if err != nil {
			return err
		}
		pools = append(pools, a)
	}
	for _, t := range cycleTouches() {
		if !c.want.cycle(t) {
			continue
		}
		if err := benchPackedCycles(c, run, variants, pools, t); err != nil {
			return err
		}
	}
	return nil
}

// benchPackedCycles measures the packed cycles (the plan reused, then built
// every cycle) and the large-only cycle, twice, on the retained pool taking
// turns; the last variant is the baseline, the one before it its twin,
// and gives the ratio of each packed median to the large-only one
// (vs_large_only) and to cudamalloc measured earlier. The goals are the
// reused plan's: a solver plans a block structure once.
func benchPackedCycles(c *benchContext, run *allocRun, variants []allocVariant, pools []*devalloc.Allocator, t cycleTouch) error {
	p := allocParams
	cycles := p.pairedCycles
	if pools[0].Info().Backend != devalloc.BackendCUDA && !p.exactCycles {
		// The host's memsets are slow, and its pool is not the driver's:
		// four sweeps, so that most cycles reuse the plans of the first.
		cycles = max(p.minCycles, 4*p.bonds)
	}
	runs := make([]cycleMeasure, 0, len(variants)+2)
	for k, v := range variants {
		tiny := p.tiny
		if !v.packed {
			tiny = 0 // the large-only baseline
		}
		runs = append(runs, newCycleRun(c, pools[k], v, p.large, tiny, t, cycles))
	}
	// The C packed and large-only cycles take their turns too.
	withC := run.base.pool != nil
	if withC {
		runs = append(runs, newCCycleRun(c, run.base.pool, cycleShape{large: p.large, tiny: p.tiny, packed: true}, t, cycles),
			newCCycleRun(c, run.base.pool, cycleShape{large: p.large}, t, cycles))
	}
	res, err := solveCyclesInTurns(runs...)
	if err != nil {
		return err
	}
	var cPacked, cLarge *cycleResult
	if withC {
		cPacked, cLarge = &res[len(res)-2], &res[len(res)-1]
		res = res[:len(res)-2]
	}
	base, twin := res[len(res)-1], res[len(res)-2]
	for k, v := range variants[:len(variants)-2] {
		extra := res[k].extra()
		r := res[k].median / base.median
		extra["large_only_in_turns_us"] = base.median
		extra["large_only_alloc_median_us"], extra["large_only_touch_median_us"] = base.allocMedian, base.touchMedian
		extra["twin_vs_large_only"] = round3(twin.median / base.median)
		extra["vs_large_only"] = round3(r)
		goals := !v.replan
		if goals {
			extra["goal_vs_large_only_at_most"] = 1.2
			extra["meets_goal_vs_large_only"] = r <= 1.2
		}
		if sep := run.cycle[t.key("large-only/retained")]; sep > 0 {
			// The same ratio against the large-only line measured earlier in
			// the run, not in turns: what the machine's drift does to it.
			extra["vs_large_only_separate"] = round3(res[k].median / sep)
		}
		if cm := run.cycle[t.key("cudamalloc")]; cm > 0 {
			r := cm / res[k].median
			extra["vs_cudamalloc"] = round3(r)
			if goals {
				extra["goal_vs_cudamalloc"] = 100
				extra["meets_goal_vs_cudamalloc"] = r >= 100
			}
		} else {
			extra["ratios_missing"] = "no cudamalloc baseline in this run (measure its cycle first, in the same Session)"
		}
		addVsC(extra, run.base, res[k].median, cPacked, goalIf(goals))
		if cLarge != nil {
			// The large-only baseline of the turns against C's large-only.
			extra["c_large_only_in_turns_us"] = cLarge.median
			extra["c_large_only_alloc_median_us"], extra["c_large_only_touch_median_us"] = cLarge.allocMedian, cLarge.touchMedian
			extra["large_only_vs_c"] = round3(base.median / cLarge.median)
			extra["c_large_only_driver_calls_per_cycle"] = totalCalls(cLarge.driverCalls)
		}
		if err := c.emit(Result{Mode: v.mode, N: res[k].cycles, Bytes: res[k].bytes, MedianUS: res[k].median,
			Backend: allockind.Name(pools[k]), Extra: extra}); err != nil {
			return err
		}
	}
	return nil
}

// packTiny lays out the tiny blocks of a cycle in one plan, each rounded up
// to the 256 B granularity the pool gives every allocation, as a float32
// row: the same footprint as allocating them one by one, in at most 64
// shape classes (a realistic sector spectrum) rather than 2000.
//
// descs is scratch for the descriptors, reused across cycles as a solver
// reuses its block list: the plan keeps none of it.
func packTiny(descs []packing.Desc, sizes []int64) (*packing.Plan, []packing.Desc, error) {
	// Stored by index: append of a 40-byte struct costs 4-5 times as much
	// here, as much as the plan itself.
	descs = slices.Grow(descs[:0], len(sizes))[:len(sizes)]
	for i, n := range sizes {
		descs[i] = packing.Desc{ID: uint64(i), DType: packing.Float32, Rows: 1, Cols: int((n + 255) / 256 * 64)}
	}
	p, err := packing.NewPlan(descs, packing.Options{})
	return p, descs, err
}

package allocbench

import (
	"fmt"
	"time"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/benchtimer"
	"github.com/distbuf/distbuf/internal/cudart"
)

// The C baseline (mode c-pool): the alloc benchmark's cycle and alloc+free
// pair written in C (c.go), on a private pool retained like
// devalloc's, through the libcudart that distbuf's loader opened. Every
// devalloc measurement on the CUDA backend runs in turns with the C
// measurement of the same shape, ten cycles (or a chunk of pairs) at a
// time, so that both see the same machine, and its line reports vs_c
// (devalloc's median over C's) and the C figures beside its own. The mode
// c-pool alone measures the C pairs and cycles by themselves.

// cBaseline is the run's C baseline, or why there is none.
type cBaseline struct {
	pool *cPool
	skip string // why there is no C baseline (the host backend)
}

func openCBaseline(c *benchContext) (*cBaseline, error) {
	if c.alloc.Info().Backend != devalloc.BackendCUDA {
		return &cBaseline{skip: "needs the CUDA backend (the C baseline calls the pool through libcudart)"}, nil
	}
	p, err := openCPool(c.alloc.Info().Device)
	if err != nil {
		return nil, fmt.Errorf("allocbench: the C baseline: %w", err)
	}
	return &cBaseline{pool: p}, nil
}

func (b *cBaseline) close() error {
	if b == nil || b.pool == nil {
		return nil
	}
	return b.pool.close()
}

// cycleShape is what a cycle allocates: its large buffers, and its tiny
// blocks one by one or (packed) as one coalesced buffer.
type cycleShape struct {
	large, tiny int
	packed      bool
}

func (sh cycleShape) String() string {
	switch {
	case sh.tiny == 0:
		return "large-only"
	case sh.packed:
		return "packed"
	}
	return "per-buffer"
}

// cCycleRun is a measurement of the C cycle, a cycle per step, with the
// sizes of the devalloc cycle of the same shape.
type cCycleRun struct {
	c             *benchContext
	pool          *cPool
	shape         cycleShape
	touch         cycleTouch
	i, total      int
	times         []float64
	phases        [3][]float64  // alloc, touch and sync of each measured cycle
	calls         cudart.Counts // over the measured cycles
	sizes, touchB []int64
	bondBytes     []int64 // packed: the coalesced buffer's size of each bond, 0 until planned
	totalBytes    int64
	res           cycleResult
}

func newCCycleRun(c *benchContext, pool *cPool, shape cycleShape, touch cycleTouch, minCycles int) *cCycleRun {
	p := allocParams
	cycles := max(c.cfg.iters, minCycles)
	r := &cCycleRun{c: c, pool: pool, shape: shape, touch: touch, total: p.warmup + cycles, calls: cudart.Counts{},
		times: make([]float64, 0, cycles),
		res:   cycleResult{cycles: cycles, allocs: shape.large + shape.tiny, kind: "c-pool", touch: touch}}
	if shape.packed {
		r.bondBytes = make([]int64, p.bonds)
	}
	return r
}

func (r *cCycleRun) done() bool { return r.i >= r.total }

// step runs cycle r.i in C. A packed cycle allocates the large buffers and
// one buffer of the size the bond's plan gives its tiny blocks, planned
// once per bond outside the clock (the C program is given its layout), and
// fills that buffer whole, as devalloc's packed cycle does.
func (r *cCycleRun) step() error {
	i := r.i
	r.i++
	all := cycleSizes(r.c.cfg.seed, i, r.shape.large, r.shape.tiny)
	r.sizes, r.touchB = r.sizes[:0], r.touchB[:0]
	var tiny []int64
	for _, n := range all {
		if r.shape.packed && n < allocParams.largeMin {
			tiny = append(tiny, n)
			continue
		}
		r.sizes = append(r.sizes, n)
		r.touchB = append(r.touchB, touched(n, r.touch.bytes))
	}
	if r.shape.packed && len(tiny) > 0 {
		bond := i % allocParams.bonds
		if r.bondBytes[bond] == 0 {
			plan, _, err := packTiny(nil, tiny)
			if err != nil {
				return err
			}
			r.bondBytes[bond] = max(plan.Groups()[0].Bytes, 1)
		}
		r.sizes = append(r.sizes, r.bondBytes[bond])
		r.touchB = append(r.touchB, r.bondBytes[bond])
	}
	t, ph, calls, err := r.pool.cycle(r.sizes, r.touchB, byte(i))
	if err != nil {
		return err
	}
	if i < allocParams.warmup {
		return nil
	}
	r.times = append(r.times, t)
	r.phases[0], r.phases[1], r.phases[2] = append(r.phases[0], ph.alloc), append(r.phases[1], ph.touch), append(r.phases[2], ph.sync)
	for name, n := range calls {
		r.calls[name] += n
	}
	for _, n := range all {
		r.totalBytes += n
	}
	return nil
}

func (r *cCycleRun) result() cycleResult {
	res := r.res
	res.bytes = r.totalBytes / int64(res.cycles)
	res.driverCalls = perCycle(r.calls, res.cycles)
	summarize(&res, r.times)
	res.allocMedian = round3(benchtimer.Median(r.phases[0]))
	res.touchMedian = round3(benchtimer.Median(r.phases[1]))
	res.syncMedian = round3(benchtimer.Median(r.phases[2]))
	return res
}

// touched is the bytes a touch sets in a buffer of size bytes: the first
// touch bytes, or all of it for 0.
func touched(size, touch int64) int64 {
	if touch > 0 {
		return min(size, touch)
	}
	return size
}

// perCycle divides counts over n cycles.
func perCycle(calls cudart.Counts, n int) map[string]float64 {
	out := map[string]float64{}
	for name, k := range calls {
		out[name] = round3(float64(k) / float64(n))
	}
	return out
}

func totalCalls(calls map[string]float64) float64 {
	t := 0.0
	for _, n := range calls {
		t += n
	}
	return round3(t)
}

// summarize sets the median, mean and 90th percentile of times.
func summarize(res *cycleResult, times []float64) {
	sum := 0.0
	for _, t := range times {
		sum += t
	}
	res.mean = sum / float64(len(times))
	res.p90 = percentile(times, 0.9)
	res.median = round3(benchtimer.Median(times))
}

// measureCycles runs a devalloc cycle measurement, in turns with the C
// cycle of its shape when there is a C baseline, and returns both results
// (the C one nil without a baseline).
func measureCycles(base *cBaseline, r *cycleRun) (cycleResult, *cycleResult, error) {
	if base.pool == nil {
		res, err := solveCyclesInTurns(r)
		if err != nil {
			return cycleResult{}, nil, err
		}
		return res[0], nil, nil
	}
	cr := newCCycleRun(r.c, base.pool, r.shape(), r.touch, r.total-allocParams.warmup)
	res, err := solveCyclesInTurns(r, cr)
	if err != nil {
		return cycleResult{}, nil, err
	}
	return res[0], &res[1], nil
}

// addVsC puts the C baseline's figures beside a devalloc line: vs_c, the C
// median and driver calls measured in turns, and the goal when there is one
// (goal 0: none), or why there is no C baseline.
func addVsC(extra map[string]any, base *cBaseline, ours float64, cres *cycleResult, goal float64) {
	if cres == nil {
		extra["vs_c_skipped"] = base.skip
		return
	}
	r := ours / cres.median
	extra["vs_c"] = round3(r)
	extra["c_in_turns_us"] = cres.median
	if cres.allocMedian > 0 {
		// Where C's time goes, phase by phase, beside devalloc's
		// alloc_median_us, touch_median_us and sync_median_us.
		extra["c_alloc_median_us"], extra["c_touch_median_us"], extra["c_sync_median_us"] = cres.allocMedian, cres.touchMedian, cres.syncMedian
	}
	extra["c_driver_calls_per_cycle"] = totalCalls(cres.driverCalls)
	extra["c_driver_calls_by_entry"] = cres.driverCalls
	if goal > 0 {
		extra["goal_vs_c_at_most"] = goal
		extra["meets_goal_vs_c"] = r <= goal
	}
}

// pairChunk is how many pairs devalloc and C make in one turn.
const pairChunk = 50

// perChunk adds the counts of one chunk to the total.
func perChunk(total, chunk cudart.Counts) cudart.Counts {
	if total == nil {
		total = cudart.Counts{}
	}
	for name, n := range chunk {
		total[name] += n
	}
	return total
}

// pairFigures are the medians of an alloc+free pair: with a synchronisation
// each (lat) and without (nosync, batches of pairs).
type pairFigures struct {
	lat           []float64
	nosync        float64
	callsPerAlloc map[string]float64 // devalloc only, from a counted pass
	callsPerFree  map[string]float64
	callsPerPair  map[string]float64 // C only
}

// measurePairs times Alloc, Free and a synchronisation, per pair, and the
// pair alone in batches, in turns with the C pair when there is a C
// baseline; then counts the driver calls of an Alloc and of a Free.
func measurePairs(base *cBaseline, a *devalloc.Allocator, size int64) (ours pairFigures, c *pairFigures, err error) {
	p := allocParams
	s := a.DefaultStream()
	if base.pool != nil {
		c = &pairFigures{}
	}
	// Warm-up, then chunks of pairs in turns.
	if _, err := goPairs(a, s, size, p.pairWarmup); err != nil {
		return ours, nil, err
	}
	if c != nil {
		if _, _, err := base.pool.pairs(size, p.pairWarmup, true); err != nil {
			return ours, nil, err
		}
	}
	for done := 0; done < p.pairs; done += pairChunk {
		n := min(pairChunk, p.pairs-done)
		lat, err := goPairs(a, s, size, n)
		if err != nil {
			return ours, nil, err
		}
		ours.lat = append(ours.lat, lat...)
		if c == nil {
			continue
		}
		clat, _, err := base.pool.pairs(size, n, true)
		if err != nil {
			return ours, nil, err
		}
		c.lat = append(c.lat, clat...)
	}
	batches := max(1, p.pairs/p.nosyncBatch)
	var per, cper []float64
	for range batches {
		t, err := goPairsNoSync(a, s, size, p.nosyncBatch)
		if err != nil {
			return ours, nil, err
		}
		per = append(per, t)
		if c != nil {
			ct, calls, err := base.pool.pairs(size, p.nosyncBatch, false)
			if err != nil {
				return ours, nil, err
			}
			cper = append(cper, ct[0])
			c.callsPerPair = perCycle(calls, p.nosyncBatch)
		}
	}
	ours.nosync = benchtimer.Median(per)
	if c != nil {
		c.nosync = benchtimer.Median(cper)
	}
	ours.callsPerAlloc, ours.callsPerFree, err = countPairCalls(a, s, size)
	return ours, c, err
}

// goPairs times n pairs of Alloc, Free and Stream.Synchronize, each.
func goPairs(a *devalloc.Allocator, s *devalloc.Stream, size int64, n int) ([]float64, error) {
	lat := make([]float64, 0, n)
	for range n {
		start := time.Now()
		b, err := a.Alloc(size, s)
		if err != nil {
			return nil, err
		}
		if err := b.Free(); err != nil {
			return nil, err
		}
		if err := s.Synchronize(); err != nil {
			return nil, err
		}
		lat = append(lat, us(time.Since(start)))
	}
	return lat, nil
}

// goPairsNoSync times n pairs of Alloc and Free together and returns the
// time per pair; the synchronisation after them is not timed.
func goPairsNoSync(a *devalloc.Allocator, s *devalloc.Stream, size int64, n int) (float64, error) {
	start := time.Now()
	for range n {
		b, err := a.Alloc(size, s)
		if err != nil {
			return 0, err
		}
		if err := b.Free(); err != nil {
			return 0, err
		}
	}
	t := us(time.Since(start)) / float64(n)
	return t, s.Synchronize()
}

// countPairCalls counts, over a few pairs outside any clock, the driver
// calls of one Alloc and of one Free.
func countPairCalls(a *devalloc.Allocator, s *devalloc.Stream, size int64) (perAlloc, perFree map[string]float64, err error) {
	const n = 20
	allocs, frees := cudart.Counts{}, cudart.Counts{}
	add := func(into cudart.Counts, before cudart.Counts) {
		for name, k := range cudart.Calls().Sub(before) {
			into[name] += k
		}
	}
	for range n {
		before := cudart.Calls()
		b, err := a.Alloc(size, s)
		if err != nil {
			return nil, nil, err
		}
		add(allocs, before)
		before = cudart.Calls()
		if err := b.Free(); err != nil {
			return nil, nil, err
		}
		add(frees, before)
	}
	return perCycle(allocs, n), perCycle(frees, n), s.Synchronize()
}

// addPairVsC puts the C pair's figures beside a devalloc pair line.
func addPairVsC(extra map[string]any, base *cBaseline, ours pairFigures, med float64, c *pairFigures, goals bool) {
	if ours.callsPerAlloc != nil {
		extra["driver_calls_per_alloc"] = totalCalls(ours.callsPerAlloc)
		extra["driver_calls_per_free"] = totalCalls(ours.callsPerFree)
		extra["driver_calls_by_entry_alloc"] = ours.callsPerAlloc
		extra["driver_calls_by_entry_free"] = ours.callsPerFree
	}
	if c == nil {
		extra["vs_c_skipped"] = base.skip
		return
	}
	cmed := round3(benchtimer.Median(c.lat))
	extra["c_in_turns_us"] = cmed
	extra["vs_c"] = round3(med / cmed)
	extra["c_nosync_median_us"] = round3(c.nosync)
	r := ours.nosync / c.nosync
	extra["nosync_vs_c"] = round3(r)
	extra["c_driver_calls_per_pair"] = totalCalls(c.callsPerPair)
	extra["c_driver_calls_by_entry_pair"] = c.callsPerPair
	if goals {
		extra["goal_nosync_vs_c_at_most"] = allocParams.goalPairVsC
		extra["meets_goal_nosync_vs_c"] = r <= allocParams.goalPairVsC
	}
}

// benchCPool is the mode c-pool: the C pairs and cycles by themselves.
func benchCPool(c *benchContext, run *allocRun) error {
	base := run.base
	if base.pool == nil {
		return c.skipLine("c-pool", base.skip, nil)
	}
	p := allocParams
	for _, size := range p.pairSizes {
		if !c.want.pair(size) {
			continue
		}
		if _, _, err := base.pool.pairs(size, p.pairWarmup, true); err != nil {
			return err
		}
		var lat []float64
		var calls cudart.Counts
		for done := 0; done < p.pairs; done += pairChunk {
			n := min(pairChunk, p.pairs-done)
			l, k, err := base.pool.pairs(size, n, true)
			if err != nil {
				return err
			}
			lat = append(lat, l...)
			calls = perChunk(calls, k)
		}
		var nosync []float64
		var pairCalls cudart.Counts
		for range max(1, p.pairs/p.nosyncBatch) {
			t, k, err := base.pool.pairs(size, p.nosyncBatch, false)
			if err != nil {
				return err
			}
			nosync, pairCalls = append(nosync, t[0]), k
		}
		med := round3(benchtimer.Median(lat))
		if err := c.emit(Result{Mode: "c-pool", N: p.pairs, Bytes: size, MedianUS: med, Backend: "c-pool",
			Extra: map[string]any{"case": "pair", "p90_us": round3(percentile(lat, 0.9)), "nosync_median_us": round3(benchtimer.Median(nosync)),
				"driver_calls_per_pair":        totalCalls(perCycle(pairCalls, p.nosyncBatch)),
				"driver_calls_by_entry":        perCycle(pairCalls, p.nosyncBatch),
				"driver_calls_per_synced_pair": totalCalls(perCycle(calls, p.pairs))}}); err != nil {
			return err
		}
	}
	for _, t := range cycleTouches() {
		if !c.want.cycle(t) {
			continue
		}
		for _, sh := range []cycleShape{{large: p.large, tiny: p.tiny}, {large: p.large}, {large: p.large, tiny: p.tiny, packed: true}} {
			if !c.want.allocatorIs(sh.String()) {
				continue
			}
			res, err := solveCyclesInTurns(newCCycleRun(c, base.pool, sh, t, p.minCycles))
			if err != nil {
				return fmt.Errorf("%s cycle: %w", sh, err)
			}
			extra := res[0].extra()
			extra["shape"] = sh.String()
			if err := c.emit(Result{Mode: "c-pool", N: res[0].cycles, Bytes: res[0].bytes,
				MedianUS: res[0].median, Backend: "c-pool", Extra: extra}); err != nil {
				return err
			}
		}
	}
	return nil
}

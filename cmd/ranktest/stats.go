package main

import (
	"math"
	"time"

	"github.com/distbuf/distbuf/cluster"
)

// The phases of a solve, in order (see packed).
const (
	phAlloc = iota
	phUpload
	phPlan
	phGemm
	phExchange
	phFree
	nPhases
)

var phaseNames = [nPhases]string{"alloc", "upload", "gemm_plan", "gemm", "exchange", "free"}

// iterStats is one solve on one rank.
type iterStats struct {
	fresh          bool // the bond's layout was made for this solve
	phase          [nPhases]float64
	solveUS        float64 // the sum of the phases
	verifyUS       float64
	deviceUS       float64 // CUDA events from the upload to the GEMMs' end; -1 on the host
	deviceGemmUS   float64 // the GEMMs' part of it; -1 on the host
	allocCalls     int64
	gemmLaunches   int64
	messages       int64
	bytesMoved     int64
	verifyFailures int64
	// runtimeCalls counts the CUDA runtime and driver calls of the solve
	// (the loader's counters), leaving out the harness's own: the staging
	// of a new layout's operands and the verification.
	runtimeCalls int64
	// workingSet is the bytes of the buffers the solve allocated outside
	// pinned memory, every one live at its peak (before its free).
	workingSet   int64
	firstFailure string
}

// Per-solve times kept for the medians, each the slowest rank's.
const (
	tSolve = nPhases + iota
	tDevice
	tDeviceGemm
	nTimes
)

func (st *iterStats) times() [nTimes]float64 {
	var v [nTimes]float64
	copy(v[:], st.phase[:])
	v[tSolve], v[tDevice], v[tDeviceGemm] = st.solveUS, st.deviceUS, st.deviceGemmUS
	return v
}

// histogram is a streaming median: counts in bins 1% wide on a log scale
// from 10 ns, so a run of any length keeps a few kilobytes per metric and
// its quantiles are exact to half a percent.
type histogram struct {
	counts []uint64
	n      uint64
}

const (
	histMinUS = 0.01
	histGrow  = 1.01
	histBins  = 3000 // up to about 9e10 us
)

var logGrow = math.Log(histGrow)

func (h *histogram) add(us float64) {
	if us < 0 || math.IsNaN(us) {
		return
	}
	if h.counts == nil {
		h.counts = make([]uint64, histBins)
	}
	b := 0
	if us > histMinUS {
		b = min(int(math.Log(us/histMinUS)/logGrow), histBins-1)
	}
	h.counts[b]++
	h.n++
}

// quantile returns the geometric middle of the bin holding quantile q, or
// NaN when empty.
func (h *histogram) quantile(q float64) float64 {
	if h.n == 0 {
		return math.NaN()
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	var seen uint64
	for b, c := range h.counts {
		seen += c
		if seen >= rank {
			if b == 0 {
				return histMinUS
			}
			return histMinUS * math.Pow(histGrow, float64(b)+0.5)
		}
	}
	return math.NaN()
}

// solveStats gathers per-solve figures in bounded memory: totals per rank,
// and for each time the slowest rank's value solve by solve, reduced over
// ranks in batches (outside the solves) into histograms by layout (0:
// repeated, 1: fresh) plus one over every solve.
type solveStats struct {
	world   *cluster.Comm
	timeout time.Duration // bounds the reductions
	batch   [][nTimes]float64
	fresh   []bool
	hist    [3][nTimes]histogram // repeated, fresh, all
	count   [2]int64             // solves by layout

	total  iterStats // sums of the counts and times of this rank (workingSet: the largest)
	solves int64
}

// statsBatch is how many solves are reduced over ranks at once.
const statsBatch = 64

func (s *solveStats) add(st iterStats) error {
	s.solves++
	s.total.allocCalls += st.allocCalls
	s.total.gemmLaunches += st.gemmLaunches
	s.total.messages += st.messages
	s.total.bytesMoved += st.bytesMoved
	s.total.verifyFailures += st.verifyFailures
	s.total.runtimeCalls += st.runtimeCalls
	s.total.verifyUS += st.verifyUS
	s.total.solveUS += st.solveUS
	s.total.workingSet = max(s.total.workingSet, st.workingSet)
	s.batch = append(s.batch, st.times())
	s.fresh = append(s.fresh, st.fresh)
	if len(s.batch) == statsBatch {
		return s.flush()
	}
	return nil
}

// flush reduces the batch over ranks (every rank's batches line up: the
// ranks run the same solves) and files each solve's maxima.
func (s *solveStats) flush() error {
	if len(s.batch) == 0 {
		return nil
	}
	flat := make([]float64, 0, len(s.batch)*nTimes)
	for _, v := range s.batch {
		flat = append(flat, v[:]...)
	}
	if err := cluster.AllreduceWithin(s.world, flat, flat, cluster.Max, s.timeout); err != nil {
		return err
	}
	for i, fresh := range s.fresh {
		k := 0
		if fresh {
			k = 1
		}
		s.count[k]++
		for j := range nTimes {
			v := flat[i*nTimes+j]
			s.hist[k][j].add(v)
			s.hist[2][j].add(v)
		}
	}
	s.batch, s.fresh = s.batch[:0], s.fresh[:0]
	return nil
}

// median of time j over the solves of layout k (0 repeated, 1 fresh, 2
// all), NaN when there are none.
func (s *solveStats) median(k, j int) float64 { return s.hist[k][j].quantile(0.5) }

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

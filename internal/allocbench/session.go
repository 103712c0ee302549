package allocbench

import (
	"errors"
	"fmt"
	"slices"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/allockind"
)

// Result is one measurement: the median of Mode's N pairs or cycles of
// Bytes bytes (a cycle's mean request) on Backend, and in Extra the
// figures beside it (ratios against the baselines measured in the same
// process, the C baseline measured in turns, driver calls, the goals).
// Extra["skipped"] says why a mode could not run on this backend.
type Result struct {
	Bench, Mode string
	N           int
	Bytes       int64
	MedianUS    float64
	Backend     string
	Extra       map[string]any
}

// Modes are the alloc benchmark's modes, in the order that lets each
// ratio find its baseline: c-pool and cudamalloc before the pools,
// threshold0 before retained.
func Modes() []string { return slices.Clone(allocModes) }

// Measure selects what one call of Session.Run measures. The zero Measure
// is everything the mode has: its pairs of every size, its cycles of both
// touches, every allocator.
type Measure struct {
	Pairs     bool   // the Alloc+Free pairs only
	Cycles    bool   // the cycles only
	Size      int64  // pairs of this size only (0: every size)
	Touch     string // cycles of this case only: "cycle" or "cycle-touch" ("": both)
	Allocator string // large-only, raw-pool and c-pool: this allocator or shape only
	// N is the number of pairs or cycles measured (after the warm-up);
	// 0 keeps the benchmark's own counts.
	N int
}

func (m Measure) pair(size int64) bool {
	return !m.Cycles && (m.Size == 0 || m.Size == size)
}

func (m Measure) cycle(t cycleTouch) bool {
	return !m.Pairs && (m.Touch == "" || m.Touch == t.kase)
}

func (m Measure) allocatorIs(name string) bool { return m.Allocator == "" || m.Allocator == name }

// Session runs the alloc benchmark on one backend, mode by mode, and keeps
// the medians it measured, so that a later mode's ratios (retained against
// threshold0 and cudamalloc, packed against cudamalloc) are against
// baselines of the same process.
type Session struct {
	c     *benchContext
	small bool
}

// Shrink makes the session's cycles small (two large buffers of 1 to 2
// MiB and 200 tiny ones, over two bonds): the same structure, in
// milliseconds, for a quick run on a machine without a GPU.
func (s *Session) Shrink() { s.small = true }

// Open opens a session on backend (host or cuda), device 0, with the
// workload of seed.
func Open(backend devalloc.Backend, seed uint64) (*Session, error) {
	a, err := devalloc.Open(devalloc.Options{Backend: backend, Warn: func(string) {}})
	if err != nil {
		return nil, err
	}
	return &Session{c: &benchContext{cfg: config{seed: seed}, alloc: a,
		run: &allocRun{pair: map[string]map[int64]float64{}, cycle: map[string]float64{}}}}, nil
}

// Close closes the session's allocator.
func (s *Session) Close() error { return s.c.alloc.Close() }

// IsDevice reports whether the session runs on device memory.
func (s *Session) IsDevice() bool { return s.c.alloc.Info().Backend == devalloc.BackendCUDA }

// Run runs mode ("" for every mode, in Modes' order) as m selects and
// returns its results.
func (s *Session) Run(mode string, m Measure) ([]Result, error) {
	modes := allocModes
	if mode != "" {
		modes = []string{mode}
	}
	if m.N < 0 {
		return nil, fmt.Errorf("allocbench: %d measurements: %w", m.N, distbuf.ErrInvalid)
	}
	saved := allocParams
	defer func() { allocParams = saved }()
	if s.small {
		allocParams.large, allocParams.tiny, allocParams.bonds = 2, 200, 2
		allocParams.largeMin, allocParams.largeMax = 1<<20, 2<<20
	}
	if m.N > 0 {
		allocParams.pairs = m.N
		allocParams.minCycles, allocParams.pairedCycles, allocParams.deviceCycles = m.N, m.N, m.N
		allocParams.exactCycles = true
	}
	var out []Result
	s.c.want = m
	s.c.out = func(r Result) error {
		out = append(out, r)
		return nil
	}
	err := runModes(s.c, modes)
	s.c.out = nil
	return out, err
}

type config struct {
	seed  uint64
	iters int // the least number of cycles, beside the benchmark's own
}

// benchContext is what every mode receives: the settings, an allocator
// of the run's backend (its kind and device), what to measure, the
// medians measured so far and where results go.
type benchContext struct {
	cfg   config
	alloc *devalloc.Allocator
	want  Measure
	run   *allocRun
	out   func(Result) error
}

func (c *benchContext) emit(r Result) error {
	r.Bench = "alloc"
	if r.Backend == "" {
		r.Backend = allockind.Name(c.alloc)
	}
	if c.out == nil {
		return errors.New("allocbench: a result outside Session.Run")
	}
	return c.out(r)
}

package devalloc_test

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/allocbench"
	"github.com/distbuf/distbuf/internal/gputest"
)

// BenchmarkAlloc compares the allocator's configurations on one device,
// each against baselines measured in the same run (internal/allocbench
// describes every mode). Sub-benchmarks, in the order that lets each ratio
// find its baseline:
//
//	pair/mode=M/size=S         Alloc, Free and a synchronisation per pair (CUDA only),
//	                           in turns with the same pair in C
//	cycle/mode=M/touch=T       a DMRG solve's cycle: 20 large and 2000 tiny buffers
//	large-only/allocator=A/touch=T  the cycle's large buffers alone
//	packed/touch=T             the tiny blocks in one coalesced buffer, in turns
//	                           with large-only on the retained pool (replan-*: the
//	                           plan built every cycle)
//
// b.N is the number of pairs or cycles; ns/op is their median. Every other
// figure of the measurement is a metric named after it (vs-c: devalloc's
// median over C's in turns; c-in-turns-us: C's median; vs-threshold0 and
// vs-cudamalloc: how many times faster than those baselines of this run).
// The goals (logged with -v, checked by scripts/gpu-verify.sh's alloc step):
//
//	cycle retained, large-only retained, packed:  vs-c <= 1.25 (on CUDA)
//	pair retained:                                nosync-vs-c <= 1.3
//	cycle retained:                               vs-threshold0 >= 10, vs-cudamalloc >= 5
//	packed:                                       vs-large-only <= 1.2, vs-cudamalloc >= 100
//
// Run on the GPU machine as
//
//	devalloc.test -test.run '^$' -test.bench 'Alloc/backend=cuda' -test.benchtime 100x
//
// The cycles fill 840 MB each: -test.short shrinks them to a few MiB, the
// same structure in milliseconds, for a run without a GPU.
func BenchmarkAlloc(b *testing.B) {
	for _, backend := range []devalloc.Backend{devalloc.BackendHost, devalloc.BackendCUDA} {
		b.Run("backend="+string(backend), func(b *testing.B) {
			s, err := allocbench.Open(backend, 1)
			if err != nil {
				if backend == devalloc.BackendHost {
					b.Fatal(err)
				}
				gputest.Unavailable(b, "the CUDA backend", err)
			}
			b.Cleanup(func() {
				if err := s.Close(); err != nil {
					b.Error(err)
				}
			})
			if testing.Short() {
				s.Shrink()
			}
			benchAllocModes(b, s)
		})
	}
}

func benchAllocModes(b *testing.B, s *allocbench.Session) {
	device := s.IsDevice()
	touches := []string{"cycle", "cycle-touch"}
	if device {
		for _, mode := range []string{"c-pool", "cudamalloc", "threshold0", "trim-phase", "retained", "retained-noreuse", "fallback"} {
			for _, size := range []int64{256, 64 << 10, 16 << 20} {
				b.Run(fmt.Sprintf("pair/mode=%s/size=%d", mode, size), func(b *testing.B) {
					measureAlloc(b, s, mode, allocbench.Measure{Pairs: true, Size: size, N: b.N})
				})
			}
		}
	}
	cycleModes := []string{"threshold0", "trim-phase", "retained"}
	if device {
		cycleModes = []string{"c-pool", "cudamalloc", "threshold0", "trim-phase", "retained", "retained-noreuse", "fallback",
			"raw-pool/threshold0", "raw-pool/retained"}
	}
	for _, mode := range cycleModes {
		for _, touch := range touches {
			b.Run(fmt.Sprintf("cycle/mode=%s/touch=%s", mode, touch), func(b *testing.B) {
				m := allocbench.Measure{Cycles: true, Touch: touch, N: b.N}
				run := mode
				if mode == "c-pool" {
					m.Allocator = "per-buffer"
				}
				if pool, ok := strings.CutPrefix(mode, "raw-pool/"); ok {
					run, m.Allocator = "raw-pool", pool
				}
				measureAlloc(b, s, run, m)
			})
		}
	}
	largeOnly := []string{"threshold0", "retained"}
	if device {
		largeOnly = []string{"c-pool", "cudamalloc", "threshold0", "retained"}
	}
	for _, alloc := range largeOnly {
		for _, touch := range touches {
			b.Run(fmt.Sprintf("large-only/allocator=%s/touch=%s", alloc, touch), func(b *testing.B) {
				if alloc == "c-pool" {
					measureAlloc(b, s, "c-pool", allocbench.Measure{Cycles: true, Touch: touch, Allocator: "large-only", N: b.N})
					return
				}
				measureAlloc(b, s, "large-only", allocbench.Measure{Touch: touch, Allocator: alloc, N: b.N})
			})
		}
	}
	for _, touch := range touches {
		b.Run("packed/touch="+touch, func(b *testing.B) {
			measureAlloc(b, s, "retained-packed", allocbench.Measure{Touch: touch, N: b.N})
		})
	}
}

// measureAlloc runs one measurement and reports it: the median as ns/op,
// each figure beside it as a metric of its own name (the second result of
// the packed mode, the plan built every cycle, with the prefix replan-),
// and each goal as a log line.
func measureAlloc(b *testing.B, s *allocbench.Session, mode string, m allocbench.Measure) {
	res, err := s.Run(mode, m)
	if err != nil {
		b.Fatal(err)
	}
	if len(res) == 0 {
		b.Fatalf("%s: no result", mode)
	}
	for k, r := range res {
		if why, ok := r.Extra["skipped"]; ok {
			b.Skipf("%s: %v", mode, why)
		}
		prefix := ""
		if k > 0 {
			prefix = strings.TrimPrefix(r.Mode, mode+"-") + "-"
		}
		if k == 0 {
			b.ReportMetric(r.MedianUS*1e3, "ns/op")
		} else {
			b.ReportMetric(r.MedianUS, prefix+"median-us")
		}
		reportFigures(b, prefix, r.Extra)
	}
}

// skippedFigures are the Extra entries that are settings, not
// measurements.
var skippedFigures = map[string]bool{"touch_bytes": true, "phase_cycles": true, "allocs_per_cycle": true}

// reportFigures reports every number of extra as a metric named after its
// key (underscores as dashes), and logs the goals and whether they are met.
func reportFigures(b *testing.B, prefix string, extra map[string]any) {
	keys := make([]string, 0, len(extra))
	for k := range extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		unit := prefix + strings.ReplaceAll(k, "_", "-")
		switch v := extra[k].(type) {
		case bool:
			if goal, ok := strings.CutPrefix(k, "meets_goal_"); ok {
				verdict := map[bool]string{true: "met", false: "MISSED"}[v]
				b.Logf("goal %s%s: %s", prefix, strings.ReplaceAll(goal, "_", "-"), verdict)
			}
			continue
		case float64:
			if !strings.HasPrefix(k, "goal_") && !skippedFigures[k] {
				b.ReportMetric(v, unit)
			}
		case int:
			if !skippedFigures[k] {
				b.ReportMetric(float64(v), unit)
			}
		case int64:
			if !skippedFigures[k] {
				b.ReportMetric(float64(v), unit)
			}
		}
	}
}

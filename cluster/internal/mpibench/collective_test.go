//go:build mpi

package mpibench

import (
	"fmt"
	"testing"
	"time"

	"github.com/distbuf/distbuf/cluster"
)

// collectiveCases are the collectives of an exchange's control path: the
// count exchange and agreement (Alltoall of one int64 per rank), a short
// Allreduce of settings, and a Barrier.
func collectiveCases(timeout time.Duration) []struct {
	name         string
	mpi, bounded func() error
} {
	p := world.Size()
	in, out := make([]int64, p), make([]int64, p)
	v := make([]int64, 7)
	return []struct {
		name         string
		mpi, bounded func() error
	}{
		{"op=alltoall", func() error { return cluster.Alltoall(world, in, out) },
			func() error { return cluster.AlltoallWithin(world, in, out, timeout) }},
		{"op=allreduce/n=7", func() error { return cluster.Allreduce(world, v, v, cluster.Max) },
			func() error { return cluster.AllreduceWithin(world, v, v, cluster.Max, timeout) }},
		{"op=barrier", func() error { return world.Barrier() },
			func() error { return world.BarrierWithin(timeout) }},
	}
}

// BenchmarkCollective: one op is one collective of each kind, MPI's own
// (blocking, or nonblocking and polled in the funnelled design) and
// cluster's bounded one (point-to-point parts, under a deadline), in
// alternating chunks. Reported: each one's time (median over chunks) and
// bounded/mpi, the median ratio over chunk pairs.
func BenchmarkCollective(b *testing.B) {
	needTwoRanks(b)
	for _, tc := range collectiveCases(time.Minute) {
		b.Run(fmt.Sprintf("%s/thread=%s", tc.name, threadLabel()), func(b *testing.B) {
			loop := func(f func() error) func(int) (float64, error) {
				return func(k int) (float64, error) {
					start := time.Now()
					for range k {
						if err := f(); err != nil {
							return 0, err
						}
					}
					return time.Since(start).Seconds(), nil
				}
			}
			if err := world.Barrier(); err != nil {
				b.Fatal(err)
			}
			mpiLoop, boundedLoop := loop(tc.mpi), loop(tc.bounded)
			var mpiTimes, boundedTimes, ratios []float64
			const chunk = 200
			b.ResetTimer()
			for done := 0; done < b.N; done += chunk {
				k := min(chunk, b.N-done)
				ms, err := mpiLoop(k)
				if err != nil {
					b.Fatal(err)
				}
				bs, err := boundedLoop(k)
				if err != nil {
					b.Fatal(err)
				}
				mpiTimes, boundedTimes = append(mpiTimes, ms/float64(k)), append(boundedTimes, bs/float64(k))
				ratios = append(ratios, bs/ms)
			}
			b.StopTimer()
			b.ReportMetric(median(mpiTimes)*1e6, "mpi-us")
			b.ReportMetric(median(boundedTimes)*1e6, "bounded-us")
			b.ReportMetric(median(ratios), "bounded/mpi")
		})
	}
}

// TestCollectiveLoops: both kinds of every benchmarked collective run and
// agree.
func TestCollectiveLoops(t *testing.T) {
	needTwoRanks(t)
	for _, tc := range collectiveCases(time.Minute) {
		if err := tc.mpi(); err != nil {
			t.Fatalf("%s (MPI): %v", tc.name, err)
		}
		if err := tc.bounded(); err != nil {
			t.Fatalf("%s (bounded): %v", tc.name, err)
		}
	}
}

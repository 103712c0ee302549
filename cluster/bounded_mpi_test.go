//go:build mpi

package cluster_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/internal/mpitest"
)

// The stall tests' times. They are correctness tests with generous slack,
// not timings: the deadline is short so that the run stays short, the
// stop is well past it, and slack covers a loaded 2-core machine running
// 4 ranks under the race detector.
const (
	stallDeadline = 600 * time.Millisecond
	stallFor      = 2 * time.Second
	stallSlack    = time.Second
)

// TestBoundedStall: the last rank stops before it enters a bounded
// collective, well past the others' deadline. Every other rank's
// collective fails within the deadline plus slack with a *TimeoutError
// naming that rank alone, and Finalize refuses to wait for it. The
// stopped rank, once resumed, completes its own collective with the right
// data (the others sent their parts before they gave up), and a later
// bounded collective, which every rank joins, brings the ranks back in
// step and resolves the timeout.
func TestBoundedStall(t *testing.T) {
	w := testComm(t)
	p, r := w.Size(), w.Rank()
	if p < 2 {
		t.Skip("needs a rank to wait for")
	}
	stalled := p - 1
	cases := []struct {
		name string
		how  string
		call func(timeout time.Duration) error
	}{
		{"op=Barrier/stop=sleep", "sleep", func(timeout time.Duration) error { return w.BarrierWithin(timeout) }},
		{"op=Alltoall/stop=sigstop", "sigstop", func(timeout time.Duration) error {
			in, out := make([]int64, p), make([]int64, p)
			for j := range in {
				in[j] = int64(r*100 + j)
			}
			if err := cluster.AlltoallWithin(w, in, out, timeout); err != nil {
				return err
			}
			for j := range out {
				if out[j] != int64(j*100+r) {
					return fmt.Errorf("AlltoallWithin gave %v", out)
				}
			}
			return nil
		}},
		{"op=Bcast/root=stalled/stop=sleep", "sleep", func(timeout time.Duration) error {
			buf := make([]byte, 4099)
			if r == stalled {
				fillPattern(buf, stalled, -1, len(buf))
			}
			if err := cluster.BcastWithin(w, buf, stalled, timeout); err != nil {
				return err
			}
			if !slices.Equal(buf, pattern(stalled, -1, len(buf), len(buf))) {
				return errors.New("BcastWithin gave other bytes")
			}
			return nil
		}},
		{"op=Allreduce/stop=sigstop", "sigstop", func(timeout time.Duration) error {
			v := []float64{float64(r), 1}
			if err := cluster.AllreduceWithin(w, v, v, cluster.Sum, timeout); err != nil {
				return err
			}
			if v[0] != float64(p*(p-1)/2) || v[1] != float64(p) {
				return fmt.Errorf("AllreduceWithin gave %v", v)
			}
			return nil
		}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if r == stalled {
				mpitest.Stop(t, tc.how, stallFor)
				if err := tc.call(generous); err != nil {
					t.Fatalf("the stopped rank, resumed: %v", err)
				}
			} else {
				start := time.Now()
				err := tc.call(stallDeadline)
				took := time.Since(start)
				var te *cluster.TimeoutError
				if !errors.As(err, &te) || !errors.Is(err, cluster.ErrTimeout) {
					t.Fatalf("with rank %d stopped for %v: %v, want a *TimeoutError", stalled, stallFor, err)
				}
				if !slices.Equal(te.Missing, []int{stalled}) || te.Rank != r || te.Size != p || te.Timeout != stallDeadline {
					t.Fatalf("%+v: want rank %d alone not heard from", te, stalled)
				}
				if !strings.Contains(err.Error(), fmt.Sprintf("not heard from rank %d of %d", stalled, p)) {
					t.Fatalf("the message does not name rank %d: %v", stalled, err)
				}
				if took < stallDeadline || took > stallDeadline+stallSlack {
					t.Fatalf("returned after %v, want %v to %v", took, stallDeadline, stallDeadline+stallSlack)
				}
				if i == 0 {
					// Finalize would wait for the stopped rank: it refuses.
					if err := cluster.Finalize(); !errors.Is(err, cluster.ErrTimeout) || !cluster.Initialized() {
						t.Fatalf("Finalize after a timeout: %v (initialized %v), want ErrTimeout and MPI left running", err, cluster.Initialized())
					}
				}
			}
			if err := w.BarrierWithin(generous); err != nil {
				t.Fatalf("back in step: %v", err)
			}
		})
	}
}

// TestBoundedShortStall: a rank that stops for less than the deadline
// costs no error.
func TestBoundedShortStall(t *testing.T) {
	w := testComm(t)
	p, r := w.Size(), w.Rank()
	if p < 2 {
		t.Skip("needs a rank to wait for")
	}
	for _, how := range []string{"sleep", "sigstop"} {
		t.Run("stop="+how, func(t *testing.T) {
			if r == p-1 {
				mpitest.Stop(t, how, 300*time.Millisecond)
			}
			out := make([]int64, p)
			if err := cluster.AllgatherWithin(w, []int64{int64(r)}, out, 20*time.Second); err != nil {
				t.Fatal(err)
			}
			for j := range out {
				if out[j] != int64(j) {
					t.Fatalf("AllgatherWithin gave %v", out)
				}
			}
		})
	}
}

// TestBoundedDisagreement: ranks that call different bounded collectives,
// or pass different lengths, fail at once on every rank with an error
// matching distbuf.ErrInvalid that says so, where MPI's collectives would
// hang or mix their data; a later collective finds them in step again.
func TestBoundedDisagreement(t *testing.T) {
	w := testComm(t)
	p, r := w.Size(), w.Rank()
	if p < 2 {
		t.Skip("needs two ranks to disagree")
	}
	var err error
	start := time.Now()
	if r == 0 {
		err = cluster.AllgatherWithin(w, []int64{1}, make([]int64, p), generous)
	} else {
		err = cluster.AlltoallWithin(w, make([]int64, p), make([]int64, p), generous)
	}
	if !errors.Is(err, distbuf.ErrInvalid) || !strings.Contains(err.Error(), "called different collectives") {
		t.Fatalf("Allgather on rank 0 and Alltoall elsewhere: %v", err)
	}
	n := 8
	if r == 1 {
		n = 16
	}
	err = cluster.AllgatherWithin(w, make([]byte, n), make([]byte, n*p), generous)
	if !errors.Is(err, distbuf.ErrInvalid) || !strings.Contains(err.Error(), "same length") {
		t.Fatalf("AllgatherWithin with rank 1's part longer: %v", err)
	}
	if took := time.Since(start); took > generous/2 {
		t.Fatalf("the disagreements took %v to find", took)
	}
	if err := w.BarrierWithin(generous); err != nil {
		t.Fatalf("back in step: %v", err)
	}
}

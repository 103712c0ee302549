package cluster_test

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
)

// generous is the timeout of bounded collectives that must succeed: far
// beyond any skew between the ranks of a test run.
const generous = 60 * time.Second

// TestBoundedCollectives checks every bounded collective against what it
// must give, byte for byte, with a deadline and without (timeout 0), and
// against its blocking counterpart.
func TestBoundedCollectives(t *testing.T) {
	w := testComm(t)
	p, r := w.Size(), w.Rank()
	for _, timeout := range []time.Duration{generous, 0} {
		t.Run(fmt.Sprintf("timeout=%v", timeout), func(t *testing.T) {
			if err := w.BarrierWithin(timeout); err != nil {
				t.Fatal(err)
			}
			for root := range p {
				for _, n := range []int{0, 1, 4099, 1 << 20} {
					buf := make([]byte, n)
					if r == root {
						fillPattern(buf, root, -1, n)
					}
					if err := cluster.BcastWithin(w, buf, root, timeout); err != nil {
						t.Fatal(err)
					}
					sameBytes(t, fmt.Sprintf("BcastWithin of %d bytes from %d", n, root), buf, pattern(root, -1, n, n))
				}
				v := []float64{0, 0}
				if r == root {
					v = []float64{math.Pi * float64(root+1), math.Inf(-1)}
				}
				if err := cluster.BcastWithin(w, v, root, timeout); err != nil {
					t.Fatal(err)
				}
				if v[0] != math.Pi*float64(root+1) || !math.IsInf(v[1], -1) {
					t.Fatalf("BcastWithin of float64 from %d: %v", root, v)
				}
			}
			for _, n := range []int{0, 1, 777, 100_000} {
				out := make([]byte, p*n)
				if err := cluster.AllgatherWithin(w, pattern(r, -2, 0, n), out, timeout); err != nil {
					t.Fatal(err)
				}
				for j := range p {
					sameBytes(t, fmt.Sprintf("AllgatherWithin part %d of %d bytes", j, n), out[j*n:(j+1)*n], pattern(j, -2, 0, n))
				}
			}
			ints := make([]int64, 2*p)
			if err := cluster.AllgatherWithin(w, []int64{int64(r), -int64(r) << 40}, ints, timeout); err != nil {
				t.Fatal(err)
			}
			for j := range p {
				if ints[2*j] != int64(j) || ints[2*j+1] != -int64(j)<<40 {
					t.Fatalf("AllgatherWithin of int64 = %v", ints)
				}
			}
			in, out := make([]int64, p), make([]int64, p)
			for j := range in {
				in[j] = int64(r)<<32 | int64(j)
			}
			if err := cluster.AlltoallWithin(w, in, out, timeout); err != nil {
				t.Fatal(err)
			}
			for j := range out {
				if want := int64(j)<<32 | int64(r); out[j] != want {
					t.Fatalf("AlltoallWithin: out[%d] = %#x, want %#x", j, out[j], want)
				}
			}
			fin, fout := make([]float64, p), make([]float64, p)
			for j := range fin {
				fin[j] = float64(r) + float64(j)/1024 + math.SmallestNonzeroFloat64
			}
			if err := cluster.AlltoallWithin(w, fin, fout, timeout); err != nil {
				t.Fatal(err)
			}
			for j := range fout {
				if want := float64(j) + float64(r)/1024 + math.SmallestNonzeroFloat64; fout[j] != want {
					t.Fatalf("AlltoallWithin of float64: out[%d] = %v, want %v", j, fout[j], want)
				}
			}
			checkAllreduceWithin(t, w, timeout)
		})
	}
}

// checkAllreduceWithin compares AllreduceWithin with Allreduce for every
// operator and type, in place and not.
func checkAllreduceWithin(t *testing.T, w *cluster.Comm, timeout time.Duration) {
	t.Helper()
	r := int64(w.Rank())
	const n = 300
	ints := make([]int64, n)
	floats := make([]float64, n)
	for i := range ints {
		ints[i] = (r*7919+int64(i)*104729)%1000 - 500 + int64(i)<<40
		floats[i] = float64(ints[i]>>20) / 4 // exactly representable: no rounding
	}
	for _, op := range []cluster.Op{cluster.Sum, cluster.Min, cluster.Max} {
		want := make([]int64, n)
		if err := cluster.Allreduce(w, ints, want, op); err != nil {
			t.Fatal(err)
		}
		got := make([]int64, n)
		if err := cluster.AllreduceWithin(w, ints, got, op, timeout); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("AllreduceWithin(%v) of int64 differs from Allreduce", op)
		}
		inPlace := slices.Clone(ints)
		if err := cluster.AllreduceWithin(w, inPlace, inPlace, op, timeout); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(inPlace, want) {
			t.Fatalf("AllreduceWithin(%v) in place differs from Allreduce", op)
		}
		wantF := make([]float64, n)
		if err := cluster.Allreduce(w, floats, wantF, op); err != nil {
			t.Fatal(err)
		}
		gotF := make([]float64, n)
		if err := cluster.AllreduceWithin(w, floats, gotF, op, timeout); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(gotF, wantF) {
			t.Fatalf("AllreduceWithin(%v) of float64 differs from Allreduce", op)
		}
	}
}

// TestBoundedCollectiveArguments: bad arguments are refused on the rank
// that passes them, before anything is sent, so every rank can pass them
// alike and go on.
func TestBoundedCollectiveArguments(t *testing.T) {
	w := testComm(t)
	p := w.Size()
	x := make([]int64, 2*p+4)
	for name, err := range map[string]error{
		"AlltoallWithin with a short in":     cluster.AlltoallWithin(w, x[:p-1], x[p:2*p], generous),
		"AlltoallWithin with overlap":        cluster.AlltoallWithin(w, x[:p], x[p-1:2*p-1], generous),
		"AllgatherWithin with a wrong out":   cluster.AllgatherWithin(w, make([]byte, 3), make([]byte, 3*p+1), generous),
		"AllgatherWithin with in inside out": cluster.AllgatherWithin(w, x[:1], x[:p], generous),
		"AllreduceWithin with a bad op":      cluster.AllreduceWithin(w, x[:1], x[1:2], cluster.Op(9), generous),
		"AllreduceWithin with overlap":       cluster.AllreduceWithin(w, x[:2], x[1:3], cluster.Sum, generous),
		"BcastWithin from a rank outside":    cluster.BcastWithin(w, x, p, generous),
		"BcastWithin from rank -1":           cluster.BcastWithin(w, x, -1, generous),
	} {
		if !errors.Is(err, distbuf.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	// The ranks are still in step: nothing was sent.
	if err := w.BarrierWithin(generous); err != nil {
		t.Fatal(err)
	}
}

// TestBoundedAfterFree: a freed communicator refuses bounded collectives.
func TestBoundedAfterFree(t *testing.T) {
	d, err := mustWorld(t).Dup()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.BarrierWithin(generous); err != nil {
		t.Fatal(err)
	}
	if err := d.Free(); err != nil {
		t.Fatal(err)
	}
	if err := d.BarrierWithin(generous); !errors.Is(err, distbuf.ErrClosed) {
		t.Fatalf("BarrierWithin after Free: %v, want ErrClosed", err)
	}
	if err := cluster.AlltoallWithin(d.Local(), []int64{0}, []int64{0}, generous); !errors.Is(err, distbuf.ErrClosed) {
		t.Fatalf("AlltoallWithin on a freed communicator's local part: %v, want ErrClosed", err)
	}
}

// TestTimeoutErrorText: the error names the operation, the ranks not
// heard from (with their world ranks when those differ) and what to do.
func TestTimeoutErrorText(t *testing.T) {
	e := &cluster.TimeoutError{Op: "Alltoall", Seq: 7, Timeout: 5 * time.Second, Rank: 0, Size: 4,
		Missing: []int{2}, WorldMissing: []int{2}}
	want := "cluster: Alltoall #7 timed out after 5s: not heard from rank 2 of 4 (this rank is 0)"
	if !strings.HasPrefix(e.Error(), want) || !strings.Contains(e.Error(), "Abort") {
		t.Fatalf("%q, want it to start %q and say to Abort", e.Error(), want)
	}
	e.Missing, e.WorldMissing = []int{1, 3}, []int{5, 7}
	if !strings.Contains(e.Error(), "not heard from ranks 1, 3 (world 5, 7) of 4") {
		t.Fatalf("%q does not name both ranks and their world ranks", e.Error())
	}
	wrapped := fmt.Errorf("msg: exchange: %w", e)
	if !errors.Is(wrapped, cluster.ErrTimeout) || errors.Is(wrapped, cluster.ErrMPI) {
		t.Fatal("a wrapped *TimeoutError must match ErrTimeout and not ErrMPI")
	}
	var te *cluster.TimeoutError
	if !errors.As(wrapped, &te) || te.Missing[0] != 1 {
		t.Fatal("errors.As does not reach the *TimeoutError")
	}
}

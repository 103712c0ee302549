package cluster_test

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
)

func TestBarrierBcast(t *testing.T) {
	w := testComm(t)
	if err := w.Barrier(); err != nil {
		t.Fatal(err)
	}
	for root := range w.Size() {
		for _, n := range []int{0, 1, 4099, 1 << 20} {
			buf := make([]byte, n)
			if w.Rank() == root {
				fillPattern(buf, root, -1, n)
			}
			if err := cluster.Bcast(w, buf, root); err != nil {
				t.Fatal(err)
			}
			sameBytes(t, fmt.Sprintf("Bcast of %d bytes from %d", n, root), buf, pattern(root, -1, n, n))
		}
	}
}

func TestAllreduce(t *testing.T) {
	w := testComm(t)
	r, p := int64(w.Rank()), int64(w.Size())
	const n = 1000
	vals := func(r int64) []int64 {
		v := make([]int64, n)
		for i := range v {
			v[i] = (r*7919+int64(i)*104729)%1000 - 500 + int64(i)<<40
		}
		return v
	}
	want := map[cluster.Op][]int64{}
	for _, op := range []cluster.Op{cluster.Sum, cluster.Min, cluster.Max} {
		acc := vals(0)
		for q := int64(1); q < p; q++ {
			for i, x := range vals(q) {
				switch op {
				case cluster.Sum:
					acc[i] += x
				case cluster.Min:
					acc[i] = min(acc[i], x)
				case cluster.Max:
					acc[i] = max(acc[i], x)
				}
			}
		}
		want[op] = acc
	}
	for _, op := range []cluster.Op{cluster.Sum, cluster.Min, cluster.Max} {
		t.Run("type=int64/op="+op.String(), func(t *testing.T) {
			in, out := vals(r), make([]int64, n)
			if err := cluster.Allreduce(w, in, out, op); err != nil {
				t.Fatal(err)
			}
			checkInts(t, out, want[op])
			if err := cluster.Allreduce(w, in, in, op); err != nil { // in place
				t.Fatal(err)
			}
			checkInts(t, in, want[op])
		})
		t.Run("type=float64/op="+op.String(), func(t *testing.T) {
			in, out := make([]float64, n), make([]float64, n)
			wantF := make([]float64, n)
			for i := range in {
				// Exactly representable, so the sum's order cannot matter.
				in[i] = float64(vals(r)[i]>>20) / 4
				var acc float64
				for q := range p {
					x := float64(vals(q)[i]>>20) / 4
					switch {
					case q == 0:
						acc = x
					case op == cluster.Sum:
						acc += x
					case op == cluster.Min:
						acc = math.Min(acc, x)
					default:
						acc = math.Max(acc, x)
					}
				}
				wantF[i] = acc
			}
			if err := cluster.Allreduce(w, in, out, op); err != nil {
				t.Fatal(err)
			}
			for i := range out {
				if out[i] != wantF[i] {
					t.Fatalf("element %d: %v, want %v", i, out[i], wantF[i])
				}
			}
		})
	}
	x := make([]int64, 4)
	if err := cluster.Allreduce(w, x[:3], x[1:], cluster.Sum); !errors.Is(err, distbuf.ErrInvalid) {
		t.Fatalf("overlapping in and out: %v", err)
	}
	if err := cluster.Allreduce(w, x, x[:2], cluster.Sum); !errors.Is(err, distbuf.ErrInvalid) {
		t.Fatalf("length mismatch: %v", err)
	}
	if err := cluster.Allreduce(w, x, x, cluster.Op(9)); !errors.Is(err, distbuf.ErrInvalid) {
		t.Fatalf("bad operator: %v", err)
	}
}

func checkInts(t *testing.T, got, want []int64) {
	t.Helper()
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("element %d: %d, want %d", i, got[i], want[i])
		}
	}
}

func TestAlltoallInt64(t *testing.T) {
	w := testComm(t)
	p := w.Size()
	in, out := make([]int64, p), make([]int64, p)
	for j := range in {
		in[j] = int64(w.Rank())<<32 | int64(j)
	}
	if err := cluster.Alltoall(w, in, out); err != nil {
		t.Fatal(err)
	}
	for j := range out {
		if want := int64(j)<<32 | int64(w.Rank()); out[j] != want {
			t.Fatalf("out[%d] = %#x, want %#x", j, out[j], want)
		}
	}
	if err := cluster.Alltoall(w, in[:p-1], out); !errors.Is(err, distbuf.ErrInvalid) {
		t.Fatalf("short in: %v", err)
	}
}

func TestAllgather(t *testing.T) {
	w := testComm(t)
	p, r := w.Size(), w.Rank()
	const n = 777
	out := make([]byte, p*n)
	if err := cluster.Allgather(w, pattern(r, -2, 0, n), out); err != nil {
		t.Fatal(err)
	}
	for j := range p {
		sameBytes(t, fmt.Sprintf("Allgather part %d", j), out[j*n:(j+1)*n], pattern(j, -2, 0, n))
	}
	ints := make([]int64, 2*p)
	if err := cluster.Allgather(w, []int64{int64(r), -int64(r)}, ints); err != nil {
		t.Fatal(err)
	}
	for j := range p {
		if ints[2*j] != int64(j) || ints[2*j+1] != -int64(j) {
			t.Fatalf("AllgatherInt64 = %v", ints)
		}
	}
	floats := make([]float64, p)
	if err := cluster.Allgather(w, []float64{float64(r) + 0.5}, floats); err != nil {
		t.Fatal(err)
	}
	for j := range p {
		if floats[j] != float64(j)+0.5 {
			t.Fatalf("Allgather of float64 = %v", floats)
		}
	}
	if err := cluster.Allgather(w, make([]byte, 3), make([]byte, 3*p+1)); !errors.Is(err, distbuf.ErrInvalid) {
		t.Fatalf("Allgather with a wrong out length: %v", err)
	}
	if err := cluster.Allgather(w, ints[:2], ints); !errors.Is(err, distbuf.ErrInvalid) {
		t.Fatalf("Allgather with in inside out: %v", err)
	}
}

// TestTypedCollectives checks the element types that travel as bytes or
// as int64s: each value must arrive bit for bit.
func TestTypedCollectives(t *testing.T) {
	w := testComm(t)
	p, r := w.Size(), w.Rank()
	for root := range p {
		v := []int64{0, 0, 0}
		if r == root {
			v = []int64{int64(root), -1 << 62, math.MaxInt64}
		}
		if err := cluster.Bcast(w, v, root); err != nil {
			t.Fatal(err)
		}
		if v[0] != int64(root) || v[1] != -1<<62 || v[2] != math.MaxInt64 {
			t.Fatalf("Bcast of int64 from %d: %v", root, v)
		}
		f := []float64{0}
		if r == root {
			f[0] = math.Pi * float64(root+1)
		}
		if err := cluster.Bcast(w, f, root); err != nil {
			t.Fatal(err)
		}
		if f[0] != math.Pi*float64(root+1) {
			t.Fatalf("Bcast of float64 from %d: %v", root, f)
		}
	}
	in, out := make([]float64, p), make([]float64, p)
	for j := range in {
		in[j] = float64(r) + float64(j)/1024 + math.SmallestNonzeroFloat64
	}
	if err := cluster.Alltoall(w, in, out); err != nil {
		t.Fatal(err)
	}
	for j := range out {
		if want := float64(j) + float64(r)/1024 + math.SmallestNonzeroFloat64; out[j] != want {
			t.Fatalf("Alltoall of float64: out[%d] = %v, want %v", j, out[j], want)
		}
	}
	if err := cluster.Bcast(w, in, p); !errors.Is(err, distbuf.ErrInvalid) {
		t.Fatalf("Bcast from rank %d of %d: %v", p, p, err)
	}
}

func TestDupSplitLocal(t *testing.T) {
	w := testComm(t)
	left, right := ring(w)
	d, err := w.Dup()
	if err != nil {
		t.Fatal(err)
	}
	if d.Rank() != w.Rank() || d.Size() != w.Size() || d.Local().Size() != w.Local().Size() {
		t.Fatalf("Dup is rank %d of %d", d.Rank(), d.Size())
	}
	// Same peer and tag on both communicators: each message stays in its own.
	const tag, n = 5, 100
	wIn, dIn := pinned(t, make([]byte, n)), pinned(t, make([]byte, n))
	reqs := make([]*cluster.Request, 0, 4)
	for _, op := range []func() (*cluster.Request, error){
		func() (*cluster.Request, error) { return d.Irecv(dIn, left, tag) },
		func() (*cluster.Request, error) { return w.Irecv(wIn, left, tag) },
		func() (*cluster.Request, error) {
			return w.Isend(pinned(t, pattern(w.Rank(), right, 1, n)), right, tag)
		},
		func() (*cluster.Request, error) {
			return d.Isend(pinned(t, pattern(w.Rank(), right, 2, n)), right, tag)
		},
	} {
		r, err := op()
		if err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, r)
	}
	if err := cluster.Waitall(reqs); err != nil {
		t.Fatal(err)
	}
	sameBytes(t, "world message", wIn.Bytes(), pattern(left, w.Rank(), 1, n))
	sameBytes(t, "dup message", dIn.Bytes(), pattern(left, w.Rank(), 2, n))

	// Split by parity, ordered by descending world rank.
	s, err := w.Split(w.Rank()%2, -w.Rank())
	if err != nil {
		t.Fatal(err)
	}
	wantSize := (w.Size() + 1 - w.Rank()%2) / 2
	if s.Size() != wantSize {
		t.Fatalf("Split part has %d ranks, want %d", s.Size(), wantSize)
	}
	members := make([]int64, s.Size())
	if err := cluster.Allgather(s, []int64{int64(w.Rank())}, members); err != nil {
		t.Fatal(err)
	}
	for i, m := range members {
		if int(m)%2 != w.Rank()%2 || i > 0 && m >= members[i-1] {
			t.Fatalf("Split members in rank order: %v", members)
		}
		if int(m) == w.Rank() && i != s.Rank() {
			t.Fatalf("Split rank %d but listed at %d in %v", s.Rank(), i, members)
		}
	}

	color := 0
	if w.Rank() != 0 {
		color = cluster.Undefined
	}
	only0, err := w.Split(color, 0)
	if err != nil {
		t.Fatal(err)
	}
	if (w.Rank() == 0) != (only0 != nil) {
		t.Fatalf("Split with Undefined color: %v on rank %d", only0, w.Rank())
	}
	if only0 != nil {
		if only0.Size() != 1 {
			t.Fatalf("singleton split has %d ranks", only0.Size())
		}
		if err := only0.Free(); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []*cluster.Comm{s, d} {
		if err := c.Free(); err != nil {
			t.Fatal(err)
		}
		if err := c.Barrier(); !errors.Is(err, distbuf.ErrClosed) {
			t.Fatalf("Barrier on a freed communicator: %v", err)
		}
		if err := c.Local().Barrier(); !errors.Is(err, distbuf.ErrClosed) {
			t.Fatalf("Barrier on a freed communicator's local part: %v", err)
		}
		if err := c.Free(); !errors.Is(err, distbuf.ErrClosed) {
			t.Fatalf("second Free: %v", err)
		}
	}
}

package packing

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/distbuf/distbuf/devalloc"
)

// mixedDescs is a DMRG-like block list: ids in list order, shapes drawn
// from a few dozen classes, a mix of dtypes.
func mixedDescs(n int, seed uint64) []Desc {
	rng := rand.New(rand.NewPCG(seed, 7))
	dims := []int{1, 2, 3, 4, 6, 8, 12, 16}
	out := make([]Desc, n)
	for i := range out {
		out[i] = Desc{ID: uint64(i)*3 + 1, DType: Float64, Rows: dims[rng.IntN(len(dims))], Cols: dims[rng.IntN(len(dims))]}
		if rng.IntN(8) == 0 {
			out[i].DType = Complex128
		}
	}
	return out
}

// benchPlan runs build (plan plus views of every block) b.N times over n
// blocks and reports ns/block. The buffer is allocated once outside the
// loop: it is one allocator call per plan, not per block.
func benchPlan(b *testing.B, n int, build func(descs []Desc, buf *devalloc.Buffer) error) {
	descs := mixedDescs(n, 1)
	p0, err := NewPlan(descs, Options{})
	if err != nil {
		b.Fatal(err)
	}
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost, Warn: func(string) {}})
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	buf, err := a.Alloc(p0.Groups()[0].Bytes, a.DefaultStream())
	if err != nil {
		b.Fatal(err)
	}
	defer buf.Free()
	b.ResetTimer()
	for range b.N {
		if err := build(descs, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/block")
}

var sink uintptr

// BenchmarkPlanViews is the plan plus one View per block whose address and
// shape are read, the way a solver walks its blocks: the goal is at most
// 15 ns/block at 1e5 blocks.
func BenchmarkPlanViews(b *testing.B) {
	for _, n := range []int{1000, 100000} {
		b.Run(fmt.Sprintf("blocks=%d", n), func(b *testing.B) {
			benchPlan(b, n, func(descs []Desc, buf *devalloc.Buffer) error {
				p, err := NewPlan(descs, Options{})
				if err != nil {
					return err
				}
				c, err := wrap(buf, p, 0)
				if err != nil {
					return err
				}
				for k := range c.Len() {
					v, err := c.View(k)
					if err != nil {
						return err
					}
					sink += v.Addr() + uintptr(v.Rows()*v.Cols())
				}
				return nil
			})
		})
	}
}

// BenchmarkPlanViewSlice is the plan plus Views, which materialises a slice
// of every view (16 bytes per block on the heap).
func BenchmarkPlanViewSlice(b *testing.B) {
	benchPlan(b, 100000, func(descs []Desc, buf *devalloc.Buffer) error {
		p, err := NewPlan(descs, Options{})
		if err != nil {
			return err
		}
		c, err := wrap(buf, p, 0)
		if err != nil {
			return err
		}
		_, err = c.Views()
		return err
	})
}

// BenchmarkPlan is the plan alone.
func BenchmarkPlan(b *testing.B) {
	benchPlan(b, 100000, func(descs []Desc, _ *devalloc.Buffer) error {
		_, err := NewPlan(descs, Options{})
		return err
	})
}

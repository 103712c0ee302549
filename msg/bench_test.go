package msg

import (
	"fmt"
	"testing"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/packing"
)

// BenchmarkSelfExchange measures the CPU cost of an exchange on one rank:
// the message to self goes through MPI (the in-process world without the
// mpi tag), so everything but the transfer between processes is in it:
// manifest, count exchange, decoding, plan and views.
func BenchmarkSelfExchange(b *testing.B) {
	for _, n := range []int{1000, 100000} {
		for _, persistent := range []bool{false, true} {
			b.Run(fmt.Sprintf("blocks=%d/persistent=%v", n, persistent), func(b *testing.B) {
				a := hostB(b)
				comm, err := worldB()
				if err != nil {
					b.Fatal(err)
				}
				x, err := New(Options{Comm: comm, Alloc: a, SelfViaMPI: true, Tag: 100 + n%7})
				if err != nil {
					b.Fatal(err)
				}
				defer func() { _ = x.Close() }()
				bufs, free := benchSend(b, a, n, comm.Rank())
				defer free()
				benchExchanges(b, x, bufs, persistent)
			})
		}
	}
}

// benchExchanges times b.N exchanges of bufs, with a pattern learned in the
// first when persistent.
func benchExchanges(b *testing.B, x *Exchanger, bufs []*packing.Coalesced, persistent bool) {
	exchange := x.Exchange
	if persistent {
		exchange = x.NewPattern().Exchange
	}
	b.SetBytes(bufs[0].Size())
	b.ResetTimer()
	for range b.N {
		r, err := exchange(bufs)
		if err != nil {
			b.Fatal(err)
		}
		_ = r.Free()
	}
}

// benchSend allocates the send buffer of n float64 blocks of 256 B for
// rank dest (none when n is 0), and returns it with what frees it.
func benchSend(b *testing.B, a *devalloc.Allocator, n, dest int) ([]*packing.Coalesced, func()) {
	descs := make([]packing.Desc, n)
	for i := range descs {
		descs[i] = packing.Desc{ID: uint64(i), DType: packing.Float64, Rows: 1, Cols: 32, Dest: dest}
	}
	p, err := packing.NewPlan(descs, packing.Options{})
	if err != nil {
		b.Fatal(err)
	}
	bufs, err := AllocSend(a, p, a.DefaultStream())
	if err != nil {
		b.Fatal(err)
	}
	return bufs, func() { _ = bufs[0].Free() }
}

// hostB opens a host allocator, closed at the end of the benchmark.
func hostB(b *testing.B) *devalloc.Allocator {
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = a.Close() })
	return a
}

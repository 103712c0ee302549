//go:build mpi

package msg

import (
	"testing"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/packing"
	"github.com/stretchr/testify/require"
)

// Helpers of the MPI tests alone.

// requireContent checks that every block of c, received from src, holds
// what tr says src sent in it.
func requireContent(t testing.TB, s *devalloc.Stream, tr traffic, src int, c *packing.Coalesced) {
	t.Helper()
	got := readBlocks(t, s, c)
	for _, v := range c.All() {
		if string(got[v.Desc().ID]) != string(tr.content(src, v.Desc().ID, v.Desc().Bytes())) {
			t.Fatalf("block %d from rank %d differs", v.Desc().ID, src)
		}
	}
}

// eachVariant runs f as a subtest for every variant, on its allocator and
// an exchanger made with o.
func eachVariant(t *testing.T, o Options, f func(t *testing.T, v variant, a *devalloc.Allocator, x *Exchanger)) {
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			a := v.open(t)
			o := o
			o.Comm, o.Alloc = world(t), a
			f(t, v, a, newExchanger(t, o))
		})
	}
}

// fromEach is what r holds from each of the size ranks, each required.
func fromEach(t *testing.T, r *Received, size int) []*packing.Coalesced {
	t.Helper()
	out := make([]*packing.Coalesced, size)
	for src := range size {
		out[src] = r.From(src)
		require.NotNil(t, out[src], "nothing from rank %d", src)
	}
	return out
}

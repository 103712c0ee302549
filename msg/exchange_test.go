package msg

import (
	"testing"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/packing"
	"github.com/stretchr/testify/require"
)

// These tests run on any number of ranks (one without the mpi tag): each
// rank exchanges with itself only, which every rank does at once.

func selfTraffic(seed uint64) traffic {
	return traffic{seed: seed, density: 1, maxBlocks: 300, selfOnly: true, dims: []int{1, 2, 3, 5, 8},
		dtypes: []packing.DType{packing.Float32, packing.Float64, packing.Complex64, packing.Complex128}}
}

func TestSelfExchange(t *testing.T) {
	for _, v := range variants(t) {
		for _, viaMPI := range []bool{false, true} {
			name := v.name + "/copy"
			if viaMPI {
				name = v.name + "/mpi"
			}
			t.Run(name, func(t *testing.T) {
				a := v.open(t)
				comm := world(t)
				rank, size := comm.Rank(), comm.Size()
				x := newExchanger(t, Options{Comm: comm, Alloc: a, PayloadChecksum: true, SelfViaMPI: viaMPI})
				s := a.DefaultStream()
				tr := selfTraffic(7)
				bufs, err := AllocSend(a, tr.plan(t, rank, size), s)
				require.NoError(t, err)
				tr.fill(t, s, rank, bufs)
				r, err := x.Exchange(bufs)
				require.NoError(t, err)
				require.Equal(t, []int{rank}, r.Sources())
				require.EqualValues(t, 1, r.Epoch())
				tr.verify(t, s, rank, size, r)
				require.NoError(t, r.Free())
				for _, b := range bufs {
					require.NoError(t, b.Free())
				}
				st := x.Stats()
				if v.kind == devalloc.BackendCUDA && viaMPI {
					require.Positive(t, st.BytesStaged, "device memory goes through pinned staging")
				}
				if viaMPI {
					require.EqualValues(t, 1, st.Messages, "one MPI message to self")
					require.Zero(t, st.SelfCopies)
				} else {
					require.EqualValues(t, 1, st.SelfCopies)
					require.Zero(t, st.Messages, "no MPI for a message to self")
				}
			})
		}
	}
}

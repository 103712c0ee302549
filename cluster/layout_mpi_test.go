//go:build mpi

package cluster

import "testing"

// TestLayoutDatatypes builds the MPI datatype for each boundary size and
// checks it describes exactly n bytes, contiguously (extent n), without
// moving any data.
func TestLayoutDatatypes(t *testing.T) {
	for _, n := range layoutCases {
		l, err := layoutFor(n)
		if err != nil {
			t.Fatal(err)
		}
		size, extent, err := layoutTypeInfo(l)
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if size != n || extent != n {
			t.Fatalf("%d bytes (%+v): datatype size %d, extent %d", n, l, size, extent)
		}
	}
}

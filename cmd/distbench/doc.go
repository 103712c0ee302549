// Command distbench runs distbuf's multi-rank benchmarks under mpirun:
// `distbench exchange` measures package msg's exchange between two ranks
// against one MPI message per block and a raw MPI exchange of the same
// bytes, all taking turns in the same run, and device buffers against
// pinned copies. Rank 0 prints one JSON object per result line; the ratios
// against the baselines and their goals are in each line's extra. Built
// without -tags mpi it is one rank, which the exchange refuses.
//
// The single-rank benchmarks are testing.B benchmarks in their packages
// (go test -run '^$' -bench . ./devalloc ./packing ./gemm); the solve
// itself, and its sweeps over block counts, are cmd/ranktest's.
package main

// Command distbench runs distbuf's multi-rank benchmarks under mpirun:
// `distbench exchange` measures package msg's exchange between two ranks
// against one MPI message per block and a raw MPI exchange of the same
// bytes, all taking turns in the same run, and device buffers against
// pinned copies. Rank 0 prints one JSON object per result line; the ratios
// against the baselines and their goals are in each line's extra. Built
// without -tags mpi it is one rank, which the exchange refuses.
//
// Before anything else the ranks compare the settings each resolved from
// its flags and environment (internal/ranksettings): the benchmark, the
// backend asked for, the modes, block counts and sizes after their
// defaults, and the repetitions. A flag given at its default agrees with
// the flag left out; ranks that would run different work, or a rank that
// cannot resolve its flags, end the job at once with every rank naming
// the difference or the rank. The comparison waits at most
// DISTBUF_MSG_TIMEOUT (msg's timeout, 120 s by default) for a rank that
// does not arrive, and names it.
//
// The single-rank benchmarks are testing.B benchmarks in their packages
// (go test -run '^$' -bench . ./devalloc ./packing ./gemm); the solve
// itself, and its sweeps over block counts, are cmd/ranktest's.
package main

// Command ranktest is the solver-rank harness: run under mpirun (or alone as
// one rank), it drives a synthetic DMRG-like workload through distbuf's
// layers and prints allocator statistics (with -json, a summary object as
// its last line). The benchmarks are testing.B benchmarks in their
// packages and, for several ranks, cmd/distbench.
package main

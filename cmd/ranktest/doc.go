// Command ranktest is the solver-rank harness: run under mpirun (or alone as
// one rank), it drives a synthetic DMRG-like workload through distbuf's
// layers and prints allocator statistics, and with -bench it runs the
// benchmark modes, printing one JSON object per line.
package main

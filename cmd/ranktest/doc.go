// Command ranktest is the solver-rank harness: run under mpirun (or alone as
// one rank), it drives a DMRG-like workload through distbuf's layers and
// prints allocator statistics (with -json, a summary object as its last
// line). The benchmarks are testing.B benchmarks in their packages and,
// for several ranks, cmd/distbench.
//
// Two workloads (-workload):
//
//   - synthetic: each rank multiplies random-sized blocks, a few large
//     and thousands tiny (-blocks), one product per block, and sends each
//     result to a random rank, which checks it against a host product.
//   - sectors: the two-site H·psi of a spin-1/2 Heisenberg chain with U(1)
//     symmetry at bond dimension -m (sectors.go, mpo.go, structure.go): the
//     bond's charge sectors, the environments' and the wavefunction's
//     blocks, and the three block-sparse steps L·psi, the two-site MPO, and
//     ·R, through gemm on pooled operands, the partial results sent to the
//     rank owning their output sector; every H·psi block is checked by a
//     Freivalds product (sectorref.go).
//
// Both run a sweep over -bonds bonds, each with its own block structure,
// planned at its first solve (fresh) and reused at the later ones
// (repeated). The solver owns what it plans for a structure (packing and
// GEMM plans, the exchange pattern, the operands staged in pinned memory,
// the check's references) and keeps the layouts of the latest
// maxCachedLayouts structures; a solve owns the buffers it allocates,
// freed at its end, on success or failure (the sectors workload frees its
// temporaries as soon as the next step has read them). For a run that changes the
// sectors workload's m as it goes, solveSectors runs one collective solve
// at any (m, bond), reports its working set, and returns an out-of-memory
// on any rank as an error matching distbuf.ErrOutOfMemory on every rank;
// dropSectors lets a structure's layout go.
package main

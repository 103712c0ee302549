// Package mpibench measures the cost of reaching MPI through package
// cluster: the same ping-pong and message-rate loops written once in C
// against MPI directly and once in Go against cluster, in one binary, so
// the ratio between them is the binding's overhead (cgo calls, request
// bookkeeping, the funnel in the funnelled design). BenchmarkCollective
// times MPI's own collectives against cluster's bounded ones (the
// ...Within functions, built from point-to-point messages) in the same
// way: what a deadline costs on an exchange's control path.
//
// Everything here needs the mpi build tag and exactly two ranks. The
// benchmarks must run with a fixed iteration count (-test.benchtime=Nx), so
// both ranks run the same number of iterations; scripts/bench-mpi.sh does
// that:
//
//	go test -c -tags mpi -o mpibench.test ./cluster/internal/mpibench
//	mpirun -n 2 ./mpibench.test -test.run '^$' -test.bench . -test.benchtime 2000x
//
// Buffers are allocated with C malloc and owned by the benchmark; the C
// loops use MPI_COMM_WORLD, the Go loops cluster.World, with distinct tags.
package mpibench

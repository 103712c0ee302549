// Package rawmpi is the baseline of the exchange benchmark (distbench
// exchange -mode raw), not part of the exchange API: the same
// exchange written straight against MPI's C API, one MPI_Irecv and one
// MPI_Isend per peer and one MPI_Waitall, with none of package msg's work
// (no manifest, no count exchange, no ledger); and Protocol, the MPI calls
// of msg's exchange over MPI in the same C (count exchange, send, probe,
// matched receive, agreement), the floor of msg's protocol. It needs the mpi build tag;
// without it every call returns ErrNoMPI. MPI must have been initialised
// (cluster.Init); the loop uses MPI_COMM_WORLD.
//
// The memory passed in must be memory MPI may hold during the call: devalloc
// host or pinned buffers, C memory. The call returns once both requests
// have completed, so nothing is held afterwards.
//
// It is internal to the module, and outside msg/internal so that
// cmd/distbench, which runs the benchmark, can import it.
package rawmpi

//go:build mpi && !mpich && !mpi_manual

package rawmpi

// The MPI pkg-config calls "mpi", as for package cluster.

// #cgo pkg-config: mpi
import "C"

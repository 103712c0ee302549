//go:build mpi && mpich && !mpi_manual

package rawmpi

// -tags "mpi mpich" builds against MPICH's pkg-config module.

// #cgo pkg-config: mpich
import "C"

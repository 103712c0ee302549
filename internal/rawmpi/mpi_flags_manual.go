//go:build mpi && mpi_manual

package rawmpi

// -tags "mpi mpi_manual" takes the MPI flags from CGO_CFLAGS and CGO_LDFLAGS.

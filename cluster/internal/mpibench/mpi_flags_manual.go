//go:build mpi && mpi_manual

package mpibench

// -tags "mpi mpi_manual" takes the MPI flags only from the environment, for
// systems without a pkg-config module (compiler wrappers, Cray):
//
//	CGO_CFLAGS="$(mpicc --showme:compile)" CGO_LDFLAGS="$(mpicc --showme:link)" \
//	    go build -tags "mpi mpi_manual" ./...

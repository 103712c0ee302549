//go:build mpi && !mpich && !mpi_manual

package mpibench

// The default MPI: whatever pkg-config calls "mpi" (Open MPI's alias on
// Debian and Ubuntu; point PKG_CONFIG_PATH at another mpi.pc to change it).

// #cgo pkg-config: mpi
import "C"

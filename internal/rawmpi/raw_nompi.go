//go:build !mpi

package rawmpi

// Exchange needs the mpi build tag.
func Exchange(send uintptr, sendBytes int64, recv uintptr, recvBytes int64, peer, tag int) (int64, error) {
	return 0, ErrNoMPI
}

// Protocol needs the mpi build tag.
func Protocol(send uintptr, sendBytes int64, recv uintptr, recvBytes int64, peer, tag int) (int64, error) {
	return 0, ErrNoMPI
}

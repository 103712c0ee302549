//go:build mpi

package rawmpi

/*
#include <stdint.h>
#include <mpi.h>

// One exchange with one peer: post the receive, send, wait for both.
static int raw_exchange(uintptr_t sbuf, int sbytes, uintptr_t rbuf, int rbytes, int peer, int tag, int *got) {
	MPI_Request r[2];
	MPI_Status st[2];
	int rc = MPI_Irecv((void *)rbuf, rbytes, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r[0]);
	if (rc != MPI_SUCCESS) return rc;
	rc = MPI_Isend((void *)sbuf, sbytes, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r[1]);
	if (rc != MPI_SUCCESS) {
		MPI_Cancel(&r[0]);
		MPI_Wait(&r[0], MPI_STATUS_IGNORE);
		return rc;
	}
	rc = MPI_Waitall(2, r, st);
	if (rc == MPI_SUCCESS) MPI_Get_count(&st[0], MPI_BYTE, got);
	return rc;
}
*/
import "C"

import (
	"fmt"
	"math"
)

// Exchange sends sendBytes from send to peer and receives up to recvBytes
// from peer into recv, with tag, on MPI_COMM_WORLD, and returns the bytes
// received.
func Exchange(send uintptr, sendBytes int64, recv uintptr, recvBytes int64, peer, tag int) (int64, error) {
	if sendBytes < 0 || recvBytes < 0 || sendBytes > math.MaxInt32 || recvBytes > math.MaxInt32 {
		return 0, fmt.Errorf("rawmpi: %d and %d bytes: want [0, 2^31)", sendBytes, recvBytes)
	}
	var got C.int
	if rc := C.raw_exchange(C.uintptr_t(send), C.int(sendBytes), C.uintptr_t(recv), C.int(recvBytes), C.int(peer), C.int(tag), &got); rc != 0 {
		return 0, fmt.Errorf("rawmpi: MPI error %d", int(rc))
	}
	return int64(got), nil
}

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

// The calls msg's exchange makes for one peer over MPI, and nothing else:
// the count exchange (an Alltoall of one int64 per rank), the send, a
// probe for the peer's message and its matched receive into a buffer of
// the length probed, and the agreement (a second Alltoall). Two ranks.
static int raw_protocol(uintptr_t sbuf, int sbytes, uintptr_t rbuf, int rbytes, int peer, int tag, int *got) {
	int64_t out[2] = {sbytes, sbytes}, in[2];
	int rc = MPI_Alltoall(out, 1, MPI_INT64_T, in, 1, MPI_INT64_T, MPI_COMM_WORLD);
	if (rc != MPI_SUCCESS) return rc;
	MPI_Request r[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
	MPI_Status st[2];
	if ((rc = MPI_Isend((void *)sbuf, sbytes, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r[0])) != MPI_SUCCESS) return rc;
	MPI_Message m;
	int flag = 0, sent = 0;
	while (!flag) {
		if ((rc = MPI_Improbe(peer, tag, MPI_COMM_WORLD, &flag, &m, &st[1])) != MPI_SUCCESS) return rc;
		if (!flag && !sent && (rc = MPI_Test(&r[0], &sent, MPI_STATUS_IGNORE)) != MPI_SUCCESS) return rc;
	}
	int n;
	MPI_Get_count(&st[1], MPI_BYTE, &n);
	if (n > rbytes) return MPI_ERR_TRUNCATE;
	if ((rc = MPI_Imrecv((void *)rbuf, n, MPI_BYTE, &m, &r[1])) != MPI_SUCCESS) return rc;
	if ((rc = MPI_Wait(&r[1], &st[1])) != MPI_SUCCESS) return rc;
	MPI_Get_count(&st[1], MPI_BYTE, got);
	out[0] = out[1] = 0;
	if ((rc = MPI_Alltoall(out, 1, MPI_INT64_T, in, 1, MPI_INT64_T, MPI_COMM_WORLD)) != MPI_SUCCESS) return rc;
	return MPI_Wait(&r[0], MPI_STATUS_IGNORE);
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
	return run(false, send, sendBytes, recv, recvBytes, peer, tag)
}

// Protocol is Exchange by the steps of msg's exchange over MPI, written
// straight in C: the count exchange, the send, the probe and the matched
// receive, and the agreement. Its time is the floor of that protocol, so
// msg's time over it is msg's own work. It needs exactly two ranks in
// MPI_COMM_WORLD.
func Protocol(send uintptr, sendBytes int64, recv uintptr, recvBytes int64, peer, tag int) (int64, error) {
	return run(true, send, sendBytes, recv, recvBytes, peer, tag)
}

func run(protocol bool, send uintptr, sendBytes int64, recv uintptr, recvBytes int64, peer, tag int) (int64, error) {
	if sendBytes < 0 || recvBytes < 0 || sendBytes > math.MaxInt32 || recvBytes > math.MaxInt32 {
		return 0, fmt.Errorf("rawmpi: %d and %d bytes: want [0, 2^31)", sendBytes, recvBytes)
	}
	var got C.int
	var rc C.int
	if protocol {
		rc = C.raw_protocol(C.uintptr_t(send), C.int(sendBytes), C.uintptr_t(recv), C.int(recvBytes), C.int(peer), C.int(tag), &got)
	} else {
		rc = C.raw_exchange(C.uintptr_t(send), C.int(sendBytes), C.uintptr_t(recv), C.int(recvBytes), C.int(peer), C.int(tag), &got)
	}
	if rc != 0 {
		return 0, fmt.Errorf("rawmpi: MPI error %d", int(rc))
	}
	return int64(got), nil
}

//go:build mpi

package mpibench

/*
#include <stdint.h>
#include <stdlib.h>
#include <mpi.h>

// MPICH defines MPI_STATUSES_IGNORE as (MPI_Status *)1, which gcc (12, on
// Debian 12) takes for an empty array passed to MPI_Waitall's MPI_Status[]
// parameter and warns about (-Wstringop-overflow) on every build. MPI
// defines the value as "no statuses": MPI_Waitall writes nothing there.
#if defined(MPICH) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif

enum { TAG_PINGPONG = 101, TAG_RATE = 102, TAG_ACK = 103 };

// Ping-pong between ranks 0 and 1: rank 0 posts its receive, sends, and
// waits for both; rank 1 receives, then sends back. Returns seconds.
static double c_pingpong(void *sbuf, void *rbuf, int bytes, int iters) {
	int rank;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	int peer = 1 - rank;
	MPI_Request r[2];
	double t0 = MPI_Wtime();
	for (int i = 0; i < iters; i++) {
		if (rank == 0) {
			MPI_Irecv(rbuf, bytes, MPI_BYTE, peer, TAG_PINGPONG, MPI_COMM_WORLD, &r[0]);
			MPI_Isend(sbuf, bytes, MPI_BYTE, peer, TAG_PINGPONG, MPI_COMM_WORLD, &r[1]);
			MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
		} else {
			MPI_Irecv(rbuf, bytes, MPI_BYTE, peer, TAG_PINGPONG, MPI_COMM_WORLD, &r[0]);
			MPI_Wait(&r[0], MPI_STATUS_IGNORE);
			MPI_Isend(sbuf, bytes, MPI_BYTE, peer, TAG_PINGPONG, MPI_COMM_WORLD, &r[1]);
			MPI_Wait(&r[1], MPI_STATUS_IGNORE);
		}
	}
	return MPI_Wtime() - t0;
}

// Message rate: rank 0 sends windows of `window` messages, each to its own
// slot of the buffer; rank 1 posts the matching receives and acknowledges
// each window with an empty message. Returns seconds.
static double c_rate(char *buf, int bytes, int window, int iters, MPI_Request *reqs) {
	int rank;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	int peer = 1 - rank;
	MPI_Request ack;
	double t0 = MPI_Wtime();
	for (int i = 0; i < iters; i++) {
		if (rank == 0) {
			for (int k = 0; k < window; k++)
				MPI_Isend(buf + (size_t)k * bytes, bytes, MPI_BYTE, peer, TAG_RATE, MPI_COMM_WORLD, &reqs[k]);
			MPI_Waitall(window, reqs, MPI_STATUSES_IGNORE);
			MPI_Irecv(NULL, 0, MPI_BYTE, peer, TAG_ACK, MPI_COMM_WORLD, &ack);
			MPI_Wait(&ack, MPI_STATUS_IGNORE);
		} else {
			for (int k = 0; k < window; k++)
				MPI_Irecv(buf + (size_t)k * bytes, bytes, MPI_BYTE, peer, TAG_RATE, MPI_COMM_WORLD, &reqs[k]);
			MPI_Waitall(window, reqs, MPI_STATUSES_IGNORE);
			MPI_Isend(NULL, 0, MPI_BYTE, peer, TAG_ACK, MPI_COMM_WORLD, &ack);
			MPI_Wait(&ack, MPI_STATUS_IGNORE);
		}
	}
	return MPI_Wtime() - t0;
}

static double c_rate_alloc(char *buf, int bytes, int window, int iters) {
	MPI_Request *reqs = malloc((size_t)window * sizeof *reqs);
	if (!reqs) return -1;
	double s = c_rate(buf, bytes, window, iters, reqs);
	free(reqs);
	return s;
}
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// Buffer is C memory for the loops; it implements cluster.Memory.
type Buffer struct {
	p unsafe.Pointer
	n int
}

// NewBuffer allocates n bytes (at least 1) with C malloc.
func NewBuffer(n int) (*Buffer, error) {
	p := C.malloc(C.size_t(max(n, 1)))
	if p == nil {
		return nil, fmt.Errorf("mpibench: malloc %d bytes failed", n)
	}
	return &Buffer{p: p, n: n}, nil
}

// Bytes views the buffer from Go.
func (b *Buffer) Bytes() []byte { return unsafe.Slice((*byte)(b.p), b.n) }

// Region implements cluster.Memory.
func (b *Buffer) Region() (uintptr, int64, bool, error) {
	return uintptr(b.p), int64(b.n), false, nil
}

// Free releases the buffer.
func (b *Buffer) Free() { C.free(b.p); b.p = nil }

// PingPongC runs iters round trips of bytes in C and returns the seconds
// they took on this rank.
func PingPongC(send, recv *Buffer, bytes, iters int) float64 {
	return float64(C.c_pingpong(send.p, recv.p, C.int(bytes), C.int(iters)))
}

// MessageRateC runs iters windows of window messages in C; buf holds
// window slots of bytes each.
func MessageRateC(buf *Buffer, bytes, window, iters int) float64 {
	return float64(C.c_rate_alloc((*C.char)(buf.p), C.int(bytes), C.int(window), C.int(iters)))
}

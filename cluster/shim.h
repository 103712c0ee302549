//go:build mpi

// The C side of the MPI binding. Every function performs one whole MPI
// operation and returns an MPI error code. Handles (MPI_Comm, MPI_Request)
// live in C memory owned by the Go side; their representation (a pointer in
// Open MPI, an int in MPICH) never crosses into Go.

#ifndef DISTBUF_CLUSTER_SHIM_H
#define DISTBUF_CLUSTER_SHIM_H

#include <stdint.h>
#include <mpi.h>

// What a completed or probed message looks like to Go.
typedef struct {
	int64_t source;
	int64_t tag;
	int64_t bytes; // -1 if MPI cannot count it
	int64_t err;   // per-request error code (Waitall)
} dist_status;

// A byte count as (block_bytes, blocks, tail); see layout.go.
typedef struct {
	int block_bytes;
	int blocks;
	int tail;
} dist_layout;

enum { DIST_INT64 = 0, DIST_DOUBLE = 1 };
enum { DIST_SUM = 0, DIST_MIN = 1, DIST_MAX = 2 };

int dist_init(int required, int *provided, int *already);
int dist_finalize(void);
int dist_tag_ub(int *tag_ub);
int dist_cuda_query(void);
int dist_online_cpus(void);
int dist_error_info(int code, int *cls, char *buf, int buflen);

MPI_Comm *dist_comm_new(void);
void dist_comm_delete(MPI_Comm *c);
void dist_comm_world(MPI_Comm *c);
int dist_comm_rank_size(MPI_Comm *c, int *rank, int *size);
int dist_comm_dup(MPI_Comm *c, MPI_Comm *out);
int dist_comm_split(MPI_Comm *c, int color, int key, MPI_Comm *out, int *is_null);
int dist_comm_split_shared(MPI_Comm *c, MPI_Comm *out);
int dist_comm_free(MPI_Comm *c);
// The rank in MPI_COMM_WORLD of each of the n ranks of c, into out.
int dist_comm_world_ranks(MPI_Comm *c, int n, int *out);

// A request handle lives in its own malloc'd cell from posting until the
// call that observes its completion (wait, a successful test, waitall,
// await) frees it.
MPI_Request *dist_request_new(void);
void dist_request_free(MPI_Request *req);

// NULL with *rc set on failure.
MPI_Request *dist_isend(MPI_Comm *c, uintptr_t buf, dist_layout lay, int dest, int tag, int *rc);
MPI_Request *dist_irecv(MPI_Comm *c, uintptr_t buf, dist_layout lay, int source, int tag, int *rc);
int dist_wait(MPI_Request *req, int is_recv, dist_status *st);
int dist_test(MPI_Request *req, int is_recv, int *flag, dist_status *st);

// dist_bounded_fast runs the usual case of a bounded collective's round
// in one call; see shim.c and bounded_fast.go.
typedef struct {
	int posted;          // sends posted
	int extra;           // a matched message the round cannot take, in extra_msg
	MPI_Message *extra_msg;
	dist_status extra_st;
} dist_round_out;

int dist_bounded_fast(MPI_Comm *c, int tag, uintptr_t send, int nsend, const int *send_peer, const int64_t *send_off,
                      const int64_t *send_len, uintptr_t recv, int nfrom, const int *slot_of, int size, int64_t stride,
                      int64_t spin_ns, MPI_Request **send_req, int *send_err, MPI_Request **recv_req, int *recv_state,
                      dist_status *recv_st, dist_round_out *out);

// Tests req until it completes (*flag = 1) or spin_ns have passed.
int dist_test_for(MPI_Request *req, int is_recv, int64_t spin_ns, int *flag, dist_status *st);
// Waitall and its polling form skip NULL entries and set completed ones to
// NULL; dist_test_all_for stops after spin_ns with *left requests pending.
int dist_waitall(int n, MPI_Request **reqs, const int *is_recv, dist_status *sts);
int dist_test_all_for(int n, MPI_Request **reqs, const int *is_recv, dist_status *sts, int64_t spin_ns, int *left);
// Matched probes: a message handle lives in its own malloc'd cell from the
// probe that matches it until the receive that takes it is posted.
MPI_Message *dist_message_new(void);
void dist_message_free(MPI_Message *m);
// Posts the receive of a matched message (MPI_Imrecv) into buf; *msg
// becomes MPI_MESSAGE_NULL. NULL with *rc set on failure.
MPI_Request *dist_imrecv(MPI_Message *msg, uintptr_t buf, dist_layout lay, int *rc);
// dist_await tests the requests (NULL entries skipped) and, when probe_comm
// is not NULL, matches the next message from source with tag on it, until
// something completed or matched or spin_ns have passed. Each completed
// request gets its status and code in sts[i], its cell freed, reqs[i] set
// to NULL and i listed in idx; *done is how many (possibly 0). A matched
// message is stored in *msg (a cell from dist_message_new) with *matched
// set and its status in *mst.
int dist_await(int n, MPI_Request **reqs, const int *is_recv, dist_status *sts, MPI_Comm *probe_comm, int source, int tag,
               int64_t spin_ns, int *idx, int *done, MPI_Message *msg, int *matched, dist_status *mst);
// MPI_Abort on MPI_COMM_WORLD: ends every process of the job.
int dist_abort(int code);

// Collectives: blocking when nb is NULL, otherwise started as the
// nonblocking variant with its request stored in *nb.
int dist_barrier(MPI_Comm *c, MPI_Request *nb);
int dist_bcast(MPI_Comm *c, void *buf, dist_layout lay, int root, MPI_Request *nb);
int dist_allreduce(MPI_Comm *c, const void *in, void *out, int count, int dtype, int op, MPI_Request *nb);
int dist_alltoall_int64(MPI_Comm *c, const int64_t *in, int64_t *out, MPI_Request *nb);
int dist_allgather(MPI_Comm *c, const void *in, void *out, dist_layout lay, MPI_Request *nb);

// The datatype a layout builds, for tests: its size and extent in bytes.
int dist_layout_type_info(dist_layout lay, int64_t *size, int64_t *extent);

void dist_yield(void);

#endif

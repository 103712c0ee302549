//go:build mpi

#include "shim.h"

#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

// Open MPI declares its CUDA extension in mpi-ext.h; MPICH (4.0 and later)
// declares MPIX_GPU_query_support in mpi.h.
#if defined(OPEN_MPI) && defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

int dist_init(int required, int *provided, int *already) {
	int flag = 0;
	int rc = MPI_Initialized(&flag);
	if (rc != MPI_SUCCESS) return rc;
	if (!flag) {
		rc = MPI_Finalized(&flag);
		if (rc != MPI_SUCCESS) return rc;
	}
	*already = flag;
	if (flag) return MPI_SUCCESS;
	rc = MPI_Init_thread(NULL, NULL, required, provided);
	if (rc != MPI_SUCCESS) return rc;
	rc = MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
	if (rc != MPI_SUCCESS) return rc;
	return MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
}

int dist_finalize(void) { return MPI_Finalize(); }

int dist_tag_ub(int *tag_ub) {
	void *v = NULL;
	int flag = 0;
	int rc = MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &v, &flag);
	if (rc != MPI_SUCCESS) return rc;
	*tag_ub = flag && v ? *(int *)v : 32767; // 32767 is the least MPI guarantees
	return MPI_SUCCESS;
}

int dist_cuda_query(void) {
#if defined(OPEN_MPI) && defined(MPIX_CUDA_AWARE_SUPPORT)
	return MPIX_Query_cuda_support() ? 1 : 0;
#elif !defined(OPEN_MPI) && defined(MPIX_GPU_SUPPORT_CUDA)
	int ok = 0;
	if (MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &ok) != MPI_SUCCESS) return 0;
	return ok ? 1 : 0;
#else
	return 0;
#endif
}

int dist_error_info(int code, int *cls, char *buf, int buflen) {
	char msg[MPI_MAX_ERROR_STRING];
	int len = 0;
	*cls = MPI_ERR_OTHER;
	MPI_Error_class(code, cls);
	if (MPI_Error_string(code, msg, &len) != MPI_SUCCESS) len = 0;
	if (len >= buflen) len = buflen - 1;
	memcpy(buf, msg, (size_t)len);
	buf[len] = 0;
	return len;
}

MPI_Comm *dist_comm_new(void) {
	MPI_Comm *c = malloc(sizeof *c);
	if (c) *c = MPI_COMM_NULL;
	return c;
}

void dist_comm_delete(MPI_Comm *c) { free(c); }

void dist_comm_world(MPI_Comm *c) { *c = MPI_COMM_WORLD; }

int dist_comm_rank_size(MPI_Comm *c, int *rank, int *size) {
	int rc = MPI_Comm_rank(*c, rank);
	if (rc != MPI_SUCCESS) return rc;
	return MPI_Comm_size(*c, size);
}

int dist_comm_dup(MPI_Comm *c, MPI_Comm *out) {
	int rc = MPI_Comm_dup(*c, out);
	if (rc != MPI_SUCCESS) return rc;
	return MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
}

int dist_comm_split(MPI_Comm *c, int color, int key, MPI_Comm *out, int *is_null) {
	int rc = MPI_Comm_split(*c, color < 0 ? MPI_UNDEFINED : color, key, out);
	if (rc != MPI_SUCCESS) return rc;
	*is_null = *out == MPI_COMM_NULL;
	if (*is_null) return MPI_SUCCESS;
	return MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
}

int dist_comm_split_shared(MPI_Comm *c, MPI_Comm *out) {
	int rank = 0;
	int rc = MPI_Comm_rank(*c, &rank);
	if (rc != MPI_SUCCESS) return rc;
	rc = MPI_Comm_split_type(*c, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, out);
	if (rc != MPI_SUCCESS) return rc;
	return MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
}

int dist_comm_free(MPI_Comm *c) { return MPI_Comm_free(c); }

int dist_comm_world_ranks(MPI_Comm *c, int n, int *out) {
	MPI_Group g, w;
	int rc = MPI_Comm_group(*c, &g);
	if (rc != MPI_SUCCESS) return rc;
	rc = MPI_Comm_group(MPI_COMM_WORLD, &w);
	if (rc != MPI_SUCCESS) {
		MPI_Group_free(&g);
		return rc;
	}
	int *in = malloc((size_t)(n > 0 ? n : 1) * sizeof *in);
	if (!in) {
		rc = MPI_ERR_NO_MEM;
	} else {
		for (int i = 0; i < n; i++) in[i] = i;
		rc = MPI_Group_translate_ranks(g, n, in, w, out);
		free(in);
	}
	MPI_Group_free(&w);
	MPI_Group_free(&g);
	return rc;
}

MPI_Request *dist_request_new(void) {
	MPI_Request *r = malloc(sizeof *r);
	if (r) *r = MPI_REQUEST_NULL;
	return r;
}

void dist_request_free(MPI_Request *req) { free(req); }

// make_type turns a layout into (count, type). *created says whether the
// type must be freed; freeing it right after posting is allowed, the
// operation keeps what it needs.
static int make_type(dist_layout lay, int *count, MPI_Datatype *type, int *created) {
	*created = 0;
	if (lay.block_bytes == 0) {
		*count = lay.tail;
		*type = MPI_BYTE;
		return MPI_SUCCESS;
	}
	MPI_Datatype block, body;
	int rc = MPI_Type_contiguous(lay.block_bytes, MPI_BYTE, &block);
	if (rc != MPI_SUCCESS) return rc;
	rc = MPI_Type_contiguous(lay.blocks, block, &body);
	MPI_Type_free(&block);
	if (rc != MPI_SUCCESS) return rc;
	if (lay.tail == 0) {
		*type = body;
	} else {
		int lens[2] = {1, lay.tail};
		MPI_Aint disps[2] = {0, (MPI_Aint)lay.block_bytes * (MPI_Aint)lay.blocks};
		MPI_Datatype types[2] = {body, MPI_BYTE};
		rc = MPI_Type_create_struct(2, lens, disps, types, type);
		MPI_Type_free(&body);
		if (rc != MPI_SUCCESS) return rc;
	}
	rc = MPI_Type_commit(type);
	if (rc != MPI_SUCCESS) {
		MPI_Type_free(type);
		return rc;
	}
	*count = 1;
	*created = 1;
	return MPI_SUCCESS;
}

int dist_layout_type_info(dist_layout lay, int64_t *size, int64_t *extent) {
	int count, created;
	MPI_Datatype t;
	int rc = make_type(lay, &count, &t, &created);
	if (rc != MPI_SUCCESS) return rc;
	MPI_Count sz = 0, lb = 0, ext = 0;
	rc = MPI_Type_size_x(t, &sz);
	if (rc == MPI_SUCCESS) rc = MPI_Type_get_extent_x(t, &lb, &ext);
	*size = (int64_t)sz * count;
	*extent = (int64_t)ext * count;
	if (created) MPI_Type_free(&t);
	return rc;
}

enum { POST_SEND, POST_RECV, POST_MRECV };

// post starts a send, a receive, or the receive of matched message *msg,
// of the bytes lay describes, in a request cell of its own.
static MPI_Request *post(int what, MPI_Comm *c, MPI_Message *msg, uintptr_t buf, dist_layout lay, int peer, int tag, int *rc) {
	MPI_Request *req = malloc(sizeof *req);
	if (!req) {
		*rc = MPI_ERR_NO_MEM;
		return NULL;
	}
	int count, created;
	MPI_Datatype t;
	*rc = make_type(lay, &count, &t, &created);
	if (*rc != MPI_SUCCESS) {
		free(req);
		return NULL;
	}
	switch (what) {
	case POST_SEND:
		*rc = MPI_Isend((void *)buf, count, t, peer, tag, *c, req);
		break;
	case POST_RECV:
		*rc = MPI_Irecv((void *)buf, count, t, peer < 0 ? MPI_ANY_SOURCE : peer, tag < 0 ? MPI_ANY_TAG : tag, *c, req);
		break;
	default:
		*rc = MPI_Imrecv((void *)buf, count, t, msg, req);
	}
	if (created) MPI_Type_free(&t);
	if (*rc != MPI_SUCCESS) {
		free(req);
		return NULL;
	}
	return req;
}

MPI_Request *dist_isend(MPI_Comm *c, uintptr_t buf, dist_layout lay, int dest, int tag, int *rc) {
	return post(POST_SEND, c, NULL, buf, lay, dest, tag, rc);
}

MPI_Request *dist_irecv(MPI_Comm *c, uintptr_t buf, dist_layout lay, int source, int tag, int *rc) {
	return post(POST_RECV, c, NULL, buf, lay, source, tag, rc);
}

static void fill_status(const MPI_Status *s, int counted, dist_status *out) {
	out->source = s->MPI_SOURCE;
	out->tag = s->MPI_TAG;
	out->bytes = -1;
	if (counted) {
		MPI_Count n = 0;
		if (MPI_Get_elements_x(s, MPI_BYTE, &n) == MPI_SUCCESS && n != MPI_UNDEFINED) out->bytes = (int64_t)n;
	}
}

int dist_wait(MPI_Request *req, int is_recv, dist_status *st) {
	MPI_Status s;
	int rc = MPI_Wait(req, &s);
	fill_status(&s, is_recv && rc == MPI_SUCCESS, st);
	st->err = rc;
	free(req);
	return rc;
}

int dist_test(MPI_Request *req, int is_recv, int *flag, dist_status *st) {
	MPI_Status s;
	*flag = 0;
	int rc = MPI_Test(req, flag, &s);
	if (rc != MPI_SUCCESS) *flag = 1; // the request is finished, with an error
	if (*flag) {
		fill_status(&s, is_recv && rc == MPI_SUCCESS, st);
		free(req);
	}
	st->err = rc;
	return rc;
}

int dist_online_cpus(void) {
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? (int)n : 1;
}

static int64_t now_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

int dist_test_for(MPI_Request *req, int is_recv, int64_t spin_ns, int *flag, dist_status *st) {
	int64_t end = now_ns() + spin_ns;
	for (;;) {
		int rc = dist_test(req, is_recv, flag, st);
		if (*flag || now_ns() >= end) return rc;
	}
}

enum { STACK_REQS = 32 };

// dist_bounded_fast posts a bounded collective's sends and takes its parts
// (MPI_Improbe on any source with the round's tag, MPI_Imrecv into the
// part's slot), testing everything in one loop until the round is complete
// or spin_ns have passed. Every request lives in a heap cell from the
// start, as dist_isend's do: what is still pending at the end is handed
// back in its cell for the Go side's requests, and the cells of the
// completed ones are freed. A matched message the round cannot take (an
// unexpected source, a second part, a wrong length) stops the loop and is
// handed back in a cell of its own, made before anything is matched so
// that such a message always has a handle to be received through. It returns the first MPI error of posting or probing
// (MPI_ERR_NO_MEM, before anything is posted, when the cells cannot be
// had); a request's own error is in its entry.
int dist_bounded_fast(MPI_Comm *c, int tag, uintptr_t send, int nsend, const int *send_peer, const int64_t *send_off,
                      const int64_t *send_len, uintptr_t recv, int nfrom, const int *slot_of, int size, int64_t stride,
                      int64_t spin_ns, MPI_Request **send_req, int *send_err, MPI_Request **recv_req, int *recv_state,
                      dist_status *recv_st, dist_round_out *out) {
	out->posted = 0;
	out->extra = 0;
	MPI_Message *msg = malloc(sizeof *msg);
	if (!msg) return MPI_ERR_NO_MEM;
	*msg = MPI_MESSAGE_NULL;
	out->extra_msg = NULL;
	for (int i = 0; i < nsend; i++) {
		send_err[i] = MPI_SUCCESS;
		send_req[i] = malloc(sizeof(MPI_Request));
	}
	for (int j = 0; j < nfrom; j++) {
		recv_state[j] = 0;
		recv_req[j] = malloc(sizeof(MPI_Request));
	}
	int ok = 1;
	for (int i = 0; i < nsend; i++) ok = ok && send_req[i];
	for (int j = 0; j < nfrom; j++) ok = ok && recv_req[j];
	if (!ok) {
		for (int i = 0; i < nsend; i++) free(send_req[i]), send_req[i] = NULL;
		for (int j = 0; j < nfrom; j++) free(recv_req[j]), recv_req[j] = NULL;
		free(msg);
		return MPI_ERR_NO_MEM;
	}
	int rc = MPI_SUCCESS;
	for (int i = 0; i < nsend && rc == MPI_SUCCESS; i++) {
		rc = MPI_Isend((void *)(send + (uintptr_t)send_off[i]), (int)send_len[i], MPI_BYTE, send_peer[i], tag, *c, send_req[i]);
		if (rc == MPI_SUCCESS) out->posted = i + 1;
	}
	for (int i = out->posted; i < nsend; i++) free(send_req[i]), send_req[i] = NULL;
	int sends_left = out->posted, unmatched = nfrom, recvs_left = 0;
	int64_t end = now_ns() + spin_ns;
	while (rc == MPI_SUCCESS && (sends_left > 0 || unmatched > 0 || recvs_left > 0)) {
		for (int i = 0; i < out->posted && sends_left > 0; i++) {
			if (!send_req[i]) continue;
			int flag = 0;
			int trc = MPI_Test(send_req[i], &flag, MPI_STATUS_IGNORE);
			if (trc != MPI_SUCCESS || flag) {
				send_err[i] = trc;
				free(send_req[i]);
				send_req[i] = NULL;
				sends_left--;
			}
		}
		if (unmatched > 0) {
			int flag = 0;
			MPI_Status ps;
			rc = MPI_Improbe(MPI_ANY_SOURCE, tag, *c, &flag, msg, &ps);
			if (rc != MPI_SUCCESS) break;
			if (flag) {
				MPI_Count n = -1;
				if (MPI_Get_elements_x(&ps, MPI_BYTE, &n) != MPI_SUCCESS || n == MPI_UNDEFINED) n = -1;
				int src = ps.MPI_SOURCE;
				int j = src >= 0 && src < size ? slot_of[src] : -1;
				if (j < 0 || recv_state[j] != 0 || (int64_t)n != stride) {
					out->extra = 1;
					out->extra_msg = msg;
					fill_status(&ps, 1, &out->extra_st);
					break;
				}
				rc = MPI_Imrecv((void *)(recv + (uintptr_t)((int64_t)j * stride)), (int)stride, MPI_BYTE, msg, recv_req[j]);
				if (rc != MPI_SUCCESS) break;
				recv_state[j] = 1;
				unmatched--;
				recvs_left++;
			}
		}
		for (int j = 0; j < nfrom && recvs_left > 0; j++) {
			if (recv_state[j] != 1) continue;
			int flag = 0;
			MPI_Status s;
			int trc = MPI_Test(recv_req[j], &flag, &s);
			if (trc != MPI_SUCCESS || flag) {
				if (trc == MPI_SUCCESS) fill_status(&s, 1, &recv_st[j]);
				else recv_st[j].source = recv_st[j].tag = recv_st[j].bytes = -1;
				recv_st[j].err = trc;
				recv_state[j] = 2;
				recvs_left--;
			}
		}
		if (now_ns() >= end) break;
	}
	for (int j = 0; j < nfrom; j++) {
		if (recv_state[j] == 1) continue;
		free(recv_req[j]);
		recv_req[j] = NULL;
	}
	if (!out->extra) free(msg);
	return rc;
}



// dist_waitall completes every request, each with its own code in
// sts[i].err. It loops on MPI_Waitsome rather than calling MPI_Waitall:
// Open MPI 4.1 under MPI_THREAD_MULTIPLE never returns from MPI_Waitall
// when a request completes in error (a truncated receive), while
// MPI_Waitsome reports it.
int dist_waitall(int n, MPI_Request **reqs, const int *is_recv, dist_status *sts) {
	MPI_Request rbuf[STACK_REQS];
	MPI_Status sbuf[STACK_REQS];
	int ibuf[STACK_REQS], mbuf[STACK_REQS];
	MPI_Request *r = rbuf;
	MPI_Status *s = sbuf;
	int *idx = ibuf, *map = mbuf;
	if (n > STACK_REQS) {
		r = malloc((size_t)n * sizeof *r);
		s = malloc((size_t)n * sizeof *s);
		idx = malloc((size_t)n * sizeof *idx);
		map = malloc((size_t)n * sizeof *map);
		if (!r || !s || !idx || !map) {
			free(r);
			free(s);
			free(idx);
			free(map);
			// No memory for the arrays: wait for each request alone.
			int first = MPI_SUCCESS;
			for (int i = 0; i < n; i++) {
				if (!reqs[i]) continue;
				int rc = dist_wait(reqs[i], is_recv[i], &sts[i]);
				reqs[i] = NULL;
				if (rc != MPI_SUCCESS && first == MPI_SUCCESS) first = rc;
			}
			return first;
		}
	}
	int m = 0;
	for (int i = 0; i < n; i++) {
		if (!reqs[i]) continue;
		r[m] = *reqs[i];
		map[m++] = i;
	}
	int left = m, first = MPI_SUCCESS;
	while (left > 0) {
		int out = MPI_UNDEFINED;
		int rc = MPI_Waitsome(m, r, &out, idx, s);
		if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
			// Not tied to one request: report it on every one not yet done.
			for (int k = 0; k < m; k++)
				if (r[k] != MPI_REQUEST_NULL) {
					int i = map[k];
					sts[i].source = sts[i].tag = sts[i].bytes = -1;
					sts[i].err = rc;
					r[k] = MPI_REQUEST_NULL;
				}
			if (first == MPI_SUCCESS) first = rc;
			break;
		}
		if (out == MPI_UNDEFINED) break;
		for (int k = 0; k < out; k++) {
			int i = map[idx[k]];
			int code = rc == MPI_SUCCESS ? MPI_SUCCESS : s[k].MPI_ERROR;
			fill_status(&s[k], is_recv[i] && code == MPI_SUCCESS, &sts[i]);
			sts[i].err = code;
			if (code != MPI_SUCCESS && first == MPI_SUCCESS) first = code;
		}
		left -= out;
	}
	for (int k = 0; k < m; k++) {
		free(reqs[map[k]]);
		reqs[map[k]] = NULL;
	}
	if (n > STACK_REQS) {
		free(r);
		free(s);
		free(idx);
		free(map);
	}
	return first;
}

// dist_test_all_for drives progress once per round with MPI_Testsome (a
// test per request would progress once per request).
int dist_test_all_for(int n, MPI_Request **reqs, const int *is_recv, dist_status *sts, int64_t spin_ns, int *left) {
	MPI_Request rbuf[STACK_REQS];
	MPI_Status sbuf[STACK_REQS];
	int ibuf[STACK_REQS], mbuf[STACK_REQS];
	*left = 0;
	for (int i = 0; i < n; i++) *left += reqs[i] != NULL;
	if (*left == 0) return MPI_SUCCESS;
	if (n > STACK_REQS) {
		// Rare and large: test one by one rather than allocate.
		int64_t end = now_ns() + spin_ns;
		for (;;) {
			*left = 0;
			for (int i = 0; i < n; i++) {
				if (!reqs[i]) continue;
				int flag;
				dist_test(reqs[i], is_recv[i], &flag, &sts[i]);
				if (flag)
					reqs[i] = NULL;
				else
					(*left)++;
			}
			if (*left == 0 || now_ns() >= end) return MPI_SUCCESS;
		}
	}
	int m = 0;
	for (int i = 0; i < n; i++) {
		if (!reqs[i]) continue;
		rbuf[m] = *reqs[i];
		mbuf[m++] = i;
	}
	int64_t end = now_ns() + spin_ns;
	for (;;) {
		int out = MPI_UNDEFINED;
		int rc = MPI_Testsome(m, rbuf, &out, ibuf, sbuf);
		if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
			for (int k = 0; k < m; k++) {
				int i = mbuf[k];
				if (!reqs[i]) continue;
				sts[i].source = sts[i].tag = sts[i].bytes = -1;
				sts[i].err = rc;
				free(reqs[i]);
				reqs[i] = NULL;
			}
			*left = 0;
			return rc;
		}
		if (out != MPI_UNDEFINED) {
			for (int k = 0; k < out; k++) {
				int i = mbuf[ibuf[k]];
				int code = rc == MPI_SUCCESS ? MPI_SUCCESS : sbuf[k].MPI_ERROR;
				fill_status(&sbuf[k], is_recv[i] && code == MPI_SUCCESS, &sts[i]);
				sts[i].err = code;
				free(reqs[i]);
				reqs[i] = NULL;
			}
			*left -= out;
		}
		if (*left == 0 || now_ns() >= end) break;
	}
	// Requests still pending keep their handles, updated by MPI.
	for (int k = 0; k < m; k++)
		if (reqs[mbuf[k]]) *reqs[mbuf[k]] = rbuf[k];
	return MPI_SUCCESS;
}

// dist_await tests the requests with MPI_Testsome (which drives progress
// once per call for all of them) and, when probe_comm is set, matches the
// next message with MPI_Improbe, until something completed or matched or
// spin_ns have passed.
int dist_await(int n, MPI_Request **reqs, const int *is_recv, dist_status *sts, MPI_Comm *probe_comm, int source, int tag,
               int64_t spin_ns, int *idx, int *done, MPI_Message *msg, int *matched, dist_status *mst) {
	MPI_Request rbuf[STACK_REQS];
	MPI_Status sbuf[STACK_REQS];
	int ibuf[STACK_REQS], mbuf[STACK_REQS];
	MPI_Request *r = rbuf;
	MPI_Status *s = sbuf;
	int *got = ibuf, *map = mbuf;
	*done = 0;
	if (matched) *matched = 0;
	if (n > STACK_REQS) {
		r = malloc((size_t)n * sizeof *r);
		s = malloc((size_t)n * sizeof *s);
		got = malloc((size_t)n * sizeof *got);
		map = malloc((size_t)n * sizeof *map);
		if (!r || !s || !got || !map) {
			free(r);
			free(s);
			free(got);
			free(map);
			return MPI_ERR_NO_MEM;
		}
	}
	int m = 0;
	for (int i = 0; i < n; i++) {
		if (!reqs[i]) continue;
		r[m] = *reqs[i];
		map[m++] = i;
	}
	int rc = MPI_SUCCESS, probe_rc = MPI_SUCCESS, out = MPI_UNDEFINED;
	if (m > 0 || probe_comm) {
		int64_t end = now_ns() + spin_ns;
		for (;;) {
			out = MPI_UNDEFINED;
			if (m > 0) {
				rc = MPI_Testsome(m, r, &out, got, s);
				if ((rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) || (out != MPI_UNDEFINED && out > 0)) break;
			}
			if (probe_comm) {
				int flag = 0;
				MPI_Status ps;
				probe_rc = MPI_Improbe(source < 0 ? MPI_ANY_SOURCE : source, tag < 0 ? MPI_ANY_TAG : tag, *probe_comm, &flag, msg, &ps);
				if (probe_rc != MPI_SUCCESS) break;
				if (flag) {
					*matched = 1;
					fill_status(&ps, 1, mst);
					break;
				}
			}
			if (now_ns() >= end) break;
		}
	}
	if (m > 0 && rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
		// Not tied to one request: every pending one ends with it.
		for (int k = 0; k < m; k++) {
			int i = map[k];
			sts[i].source = sts[i].tag = sts[i].bytes = -1;
			sts[i].err = rc;
			free(reqs[i]);
			reqs[i] = NULL;
			idx[(*done)++] = i;
		}
	} else if (m > 0) {
		for (int k = 0; out != MPI_UNDEFINED && k < out; k++) {
			int i = map[got[k]];
			int code = rc == MPI_SUCCESS ? MPI_SUCCESS : s[k].MPI_ERROR;
			fill_status(&s[k], is_recv[i] && code == MPI_SUCCESS, &sts[i]);
			sts[i].err = code;
			free(reqs[i]);
			reqs[i] = NULL;
			idx[(*done)++] = i;
		}
		// Requests still pending keep their handles, updated by MPI.
		for (int k = 0; k < m; k++)
			if (reqs[map[k]]) *reqs[map[k]] = r[k];
	}
	if (n > STACK_REQS) {
		free(r);
		free(s);
		free(got);
		free(map);
	}
	if (rc == MPI_ERR_IN_STATUS) rc = MPI_SUCCESS;
	return rc != MPI_SUCCESS ? rc : probe_rc;
}

MPI_Message *dist_message_new(void) {
	MPI_Message *m = malloc(sizeof *m);
	if (m) *m = MPI_MESSAGE_NULL;
	return m;
}

void dist_message_free(MPI_Message *m) { free(m); }

MPI_Request *dist_imrecv(MPI_Message *msg, uintptr_t buf, dist_layout lay, int *rc) {
	return post(POST_MRECV, NULL, msg, buf, lay, 0, 0, rc);
}

int dist_abort(int code) { return MPI_Abort(MPI_COMM_WORLD, code); }

int dist_barrier(MPI_Comm *c, MPI_Request *nb) {
	return nb ? MPI_Ibarrier(*c, nb) : MPI_Barrier(*c);
}

int dist_bcast(MPI_Comm *c, void *buf, dist_layout lay, int root, MPI_Request *nb) {
	int count, created;
	MPI_Datatype t;
	int rc = make_type(lay, &count, &t, &created);
	if (rc != MPI_SUCCESS) return rc;
	rc = nb ? MPI_Ibcast(buf, count, t, root, *c, nb) : MPI_Bcast(buf, count, t, root, *c);
	if (created) MPI_Type_free(&t);
	return rc;
}

int dist_allreduce(MPI_Comm *c, const void *in, void *out, int count, int dtype, int op, MPI_Request *nb) {
	MPI_Datatype t = dtype == DIST_DOUBLE ? MPI_DOUBLE : MPI_INT64_T;
	MPI_Op o = op == DIST_MIN ? MPI_MIN : op == DIST_MAX ? MPI_MAX : MPI_SUM;
	const void *send = in == out ? MPI_IN_PLACE : in;
	return nb ? MPI_Iallreduce(send, out, count, t, o, *c, nb) : MPI_Allreduce(send, out, count, t, o, *c);
}

int dist_alltoall_int64(MPI_Comm *c, const int64_t *in, int64_t *out, MPI_Request *nb) {
	return nb ? MPI_Ialltoall(in, 1, MPI_INT64_T, out, 1, MPI_INT64_T, *c, nb)
	          : MPI_Alltoall(in, 1, MPI_INT64_T, out, 1, MPI_INT64_T, *c);
}

int dist_allgather(MPI_Comm *c, const void *in, void *out, dist_layout lay, MPI_Request *nb) {
	int count, created;
	MPI_Datatype t;
	int rc = make_type(lay, &count, &t, &created);
	if (rc != MPI_SUCCESS) return rc;
	// The type's extent is the per-rank byte count, so rank j's part lands
	// at j times that in out.
	rc = nb ? MPI_Iallgather(in, count, t, out, count, t, *c, nb) : MPI_Allgather(in, count, t, out, count, t, *c);
	if (created) MPI_Type_free(&t);
	return rc;
}

void dist_yield(void) { sched_yield(); }

//go:build mpi

package cluster

/*
#include <stdlib.h>
#include "shim.h"

#cgo noescape dist_init
#cgo nocallback dist_init
#cgo noescape dist_tag_ub
#cgo nocallback dist_tag_ub
#cgo noescape dist_error_info
#cgo nocallback dist_error_info
#cgo noescape dist_comm_rank_size
#cgo nocallback dist_comm_rank_size
#cgo noescape dist_comm_split
#cgo nocallback dist_comm_split
#cgo noescape dist_bounded_fast
#cgo nocallback dist_bounded_fast
#cgo noescape dist_isend
#cgo nocallback dist_isend
#cgo noescape dist_irecv
#cgo nocallback dist_irecv
#cgo noescape dist_wait
#cgo nocallback dist_wait
#cgo noescape dist_test_for
#cgo nocallback dist_test_for
#cgo noescape dist_test_all_for
#cgo nocallback dist_test_all_for
#cgo noescape dist_test
#cgo nocallback dist_test
#cgo noescape dist_waitall
#cgo nocallback dist_waitall
#cgo noescape dist_layout_type_info
#cgo nocallback dist_layout_type_info
#cgo noescape dist_imrecv
#cgo nocallback dist_imrecv
#cgo noescape dist_await
#cgo nocallback dist_await
#cgo noescape dist_comm_world_ranks
#cgo nocallback dist_comm_world_ranks
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"time"
	"unsafe"

	"github.com/distbuf/distbuf"
)

const haveMPI = true

// Communicator and request handles live in C memory (dist_comm_new, and a
// cell per request from posting to completion), so Go never depends on
// their representation and MPI may write them from any thread.
type commImpl struct{ h *C.MPI_Comm }

type reqImpl struct{ h *C.MPI_Request }

// msgImpl is a matched message's handle, in its own C cell until the
// receive that takes it is posted.
type msgImpl struct{ h *C.MPI_Message }

var mpiEngine struct {
	main *funnel // the thread that called MPI_Init_thread; it calls MPI_Finalize
	fun  *funnel // main when every call is funnelled to it, else nil
}

// onMPI runs fn where MPI may be called: on the calling thread under
// MPI_THREAD_MULTIPLE, on the funnel thread otherwise. The hot paths
// (Isend, Irecv, Wait, Test) branch by hand instead, so the multiple
// design allocates no closure.
func onMPI(fn func()) {
	if f := mpiEngine.fun; f != nil {
		f.run(fn)
		return
	}
	fn()
}

func funneled(f *funnel, fn func() C.int) C.int {
	var rc C.int
	f.run(func() { rc = fn() })
	return rc
}

// errorInfo describes an MPI error code. Call it where MPI may be called.
func errorInfo(op string, rc C.int) *MPIError {
	var cls C.int
	var buf [512]C.char
	C.dist_error_info(rc, &cls, &buf[0], C.int(len(buf)))
	msg := C.GoString(&buf[0])
	if msg == "" {
		msg = fmt.Sprintf("MPI error code %d", int(rc))
	}
	return &MPIError{Op: op, Code: int(rc), Class: classOf(cls), Message: msg}
}

func mpiErr(op string, rc C.int) error {
	if rc == C.MPI_SUCCESS {
		return nil
	}
	var e *MPIError
	onMPI(func() { e = errorInfo(op, rc) })
	return e
}

func classOf(cls C.int) string {
	switch cls {
	case C.MPI_ERR_TRUNCATE:
		return classTruncate
	case C.MPI_ERR_RANK:
		return classRank
	case C.MPI_ERR_TAG:
		return classTag
	case C.MPI_ERR_COUNT:
		return "MPI_ERR_COUNT"
	case C.MPI_ERR_BUFFER:
		return "MPI_ERR_BUFFER"
	case C.MPI_ERR_COMM:
		return "MPI_ERR_COMM"
	case C.MPI_ERR_TYPE:
		return "MPI_ERR_TYPE"
	case C.MPI_ERR_REQUEST:
		return "MPI_ERR_REQUEST"
	case C.MPI_ERR_ROOT:
		return "MPI_ERR_ROOT"
	case C.MPI_ERR_ARG:
		return "MPI_ERR_ARG"
	case C.MPI_ERR_NO_MEM:
		return "MPI_ERR_NO_MEM"
	case C.MPI_ERR_INTERN:
		return "MPI_ERR_INTERN"
	}
	return fmt.Sprintf("MPI error class %d", int(cls))
}

func threadLevelName(l C.int) string {
	switch l {
	case C.MPI_THREAD_SINGLE:
		return "MPI_THREAD_SINGLE"
	case C.MPI_THREAD_FUNNELED:
		return "MPI_THREAD_FUNNELED"
	case C.MPI_THREAD_SERIALIZED:
		return "MPI_THREAD_SERIALIZED"
	case C.MPI_THREAD_MULTIPLE:
		return "MPI_THREAD_MULTIPLE"
	}
	return fmt.Sprintf("thread level %d", int(l))
}

func backendInit(mode ThreadMode) (initInfo, error) {
	required := C.int(C.MPI_THREAD_MULTIPLE)
	if mode == ThreadFunneled {
		required = C.MPI_THREAD_FUNNELED
	}
	main := startFunnel(func() { C.dist_yield() })
	var rc, provided, already C.int
	var initErr *MPIError
	main.run(func() {
		rc = C.dist_init(required, &provided, &already)
		if rc != C.MPI_SUCCESS {
			initErr = errorInfo("MPI_Init_thread", rc)
		}
	})
	if already != 0 {
		main.stop(func() {})
		return initInfo{}, fmt.Errorf("cluster: MPI was initialized or finalized outside this package: %w", distbuf.ErrInvalid)
	}
	info := initInfo{attempted: true, provided: threadLevelName(provided)}
	if initErr != nil {
		main.stop(func() {})
		return info, initErr
	}
	multiple := provided >= C.MPI_THREAD_MULTIPLE && mode != ThreadFunneled
	if mode == ThreadMultiple && !multiple {
		main.stop(func() { C.dist_finalize() })
		return info, fmt.Errorf("cluster: ThreadMultiple required but MPI provides only %s: %w", info.provided, distbuf.ErrUnavailable)
	}
	mpiEngine.main = main
	info.thread = ThreadMultiple
	if !multiple {
		mpiEngine.fun = main
		info.thread = ThreadFunneled
	}
	var tagUB C.int
	var cuda C.int
	onMPI(func() {
		rc = C.dist_tag_ub(&tagUB)
		cuda = C.dist_cuda_query()
	})
	if err := mpiErr("MPI_Comm_get_attr(MPI_TAG_UB)", rc); err != nil {
		return info, err
	}
	info.maxTag, info.cudaAware = int(tagUB), cuda != 0
	h := C.dist_comm_new()
	if h == nil {
		return info, fmt.Errorf("cluster: allocating the world handle: %w", ErrMPI)
	}
	C.dist_comm_world(h)
	info.world = commImpl{h}
	return info, nil
}

func backendFinalize() error {
	var err error
	mpiEngine.main.stop(func() {
		if rc := C.dist_finalize(); rc != C.MPI_SUCCESS {
			err = errorInfo("MPI_Finalize", rc)
		}
	})
	mpiEngine.main, mpiEngine.fun = nil, nil
	return err
}

func backendRankSize(c commImpl) (int, int, error) {
	var rank, size, rc C.int
	onMPI(func() { rc = C.dist_comm_rank_size(c.h, &rank, &size) })
	if err := mpiErr("MPI_Comm_rank", rc); err != nil {
		return 0, 0, err
	}
	return int(rank), int(size), nil
}

func backendWorldRanks(c commImpl, size int) ([]int, error) {
	out := make([]C.int, size)
	var rc C.int
	onMPI(func() { rc = C.dist_comm_world_ranks(c.h, C.int(size), unsafe.SliceData(out)) })
	if err := mpiErr("MPI_Group_translate_ranks", rc); err != nil {
		return nil, err
	}
	ranks := make([]int, size)
	for i, r := range out {
		ranks[i] = int(r)
	}
	return ranks, nil
}

func newCommHandle() (*C.MPI_Comm, error) {
	h := C.dist_comm_new()
	if h == nil {
		return nil, fmt.Errorf("cluster: allocating a communicator handle: %w", ErrMPI)
	}
	return h, nil
}

func backendDup(c commImpl) (commImpl, error) {
	h, err := newCommHandle()
	if err != nil {
		return commImpl{}, err
	}
	var rc C.int
	onMPI(func() { rc = C.dist_comm_dup(c.h, h) })
	if err := mpiErr("MPI_Comm_dup", rc); err != nil {
		C.dist_comm_delete(h)
		return commImpl{}, err
	}
	return commImpl{h}, nil
}

func backendSplit(c commImpl, color, key int) (commImpl, bool, error) {
	h, err := newCommHandle()
	if err != nil {
		return commImpl{}, false, err
	}
	var rc, null C.int
	onMPI(func() { rc = C.dist_comm_split(c.h, C.int(color), C.int(key), h, &null) })
	if err := mpiErr("MPI_Comm_split", rc); err != nil || null != 0 {
		C.dist_comm_delete(h)
		return commImpl{}, null != 0, err
	}
	return commImpl{h}, false, nil
}

func backendSplitShared(c commImpl) (commImpl, error) {
	h, err := newCommHandle()
	if err != nil {
		return commImpl{}, err
	}
	var rc C.int
	onMPI(func() { rc = C.dist_comm_split_shared(c.h, h) })
	if err := mpiErr("MPI_Comm_split_type", rc); err != nil {
		C.dist_comm_delete(h)
		return commImpl{}, err
	}
	return commImpl{h}, nil
}

func backendFree(c commImpl) error {
	var rc C.int
	onMPI(func() { rc = C.dist_comm_free(c.h) })
	if err := mpiErr("MPI_Comm_free", rc); err != nil {
		return err
	}
	C.dist_comm_delete(c.h)
	return nil
}

func cLayout(l byteLayout) C.dist_layout {
	return C.dist_layout{block_bytes: C.int(l.blockBytes), blocks: C.int(l.blocks), tail: C.int(l.tail)}
}

func goStatus(st *C.dist_status) Status {
	return Status{Source: int(st.source), Tag: int(st.tag), Bytes: int64(st.bytes)}
}

func cBool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

func post(send bool, c commImpl, addr uintptr, lay byteLayout, peer, tag int) (*C.MPI_Request, C.int) {
	cl := cLayout(lay)
	var rc C.int
	var h *C.MPI_Request
	if f := mpiEngine.fun; f != nil {
		h, rc = postFunneled(f, send, c.h, C.uintptr_t(addr), cl, C.int(peer), C.int(tag))
	} else if send {
		h = C.dist_isend(c.h, C.uintptr_t(addr), cl, C.int(peer), C.int(tag), &rc)
	} else {
		h = C.dist_irecv(c.h, C.uintptr_t(addr), cl, C.int(peer), C.int(tag), &rc)
	}
	return h, rc
}

func postFunneled(f *funnel, send bool, c *C.MPI_Comm, addr C.uintptr_t, cl C.dist_layout, peer, tag C.int) (*C.MPI_Request, C.int) {
	var rc C.int
	var h *C.MPI_Request
	f.run(func() {
		if send {
			h = C.dist_isend(c, addr, cl, peer, tag, &rc)
		} else {
			h = C.dist_irecv(c, addr, cl, peer, tag, &rc)
		}
	})
	return h, rc
}

func backendIsend(c commImpl, addr uintptr, lay byteLayout, dest, tag int, r *Request) error {
	h, rc := post(true, c, addr, lay, dest, tag)
	if h == nil {
		return mpiErr("MPI_Isend", rc)
	}
	r.impl.h = h
	return nil
}

func backendIrecv(c commImpl, addr uintptr, lay byteLayout, source, tag int, r *Request) error {
	h, rc := post(false, c, addr, lay, source, tag)
	if h == nil {
		return mpiErr("MPI_Irecv", rc)
	}
	r.impl.h = h
	return nil
}

// pollRequest is a funnel poll that tests one request until it completes
// (and dist_test frees it).
func pollRequest(f *funnel, h *C.MPI_Request, isRecv C.int, st *C.dist_status) C.int {
	var rc C.int
	f.until(func() bool {
		var flag C.int
		rc = C.dist_test(h, isRecv, &flag, st)
		return flag != 0
	})
	return rc
}

// Waiting in the multiple design polls before it blocks, for messages
// under blockingBytes. A cgo call that outlasts two ticks of the runtime's
// sysmon (20 µs) has its P taken away; with GOMAXPROCS=1, which a rank
// bound to one core gets, the runtime starts a spinning thread on that same
// core and keeps sysmon waking every 20 µs, both taking time from the MPI
// progress being waited for. So a wait tests the request in C for slices
// of pollSlice, yields to other goroutines between slices, and blocks in
// MPI_Wait only after pollSlices of them. Large messages are the exception:
// their single-copy transfer runs inside one long MPI call whatever the
// caller does, and returning to Go after it only adds a thread switch, so
// they block at once. Measured with 2 ranks here (Go/C time, median go/c of
// paired runs, polling against blocking): 8-byte message rate 4.1-4.5 vs
// 4.6-7.9, 8-byte ping-pong 2.1-2.2 vs 2.6-3.1, 1 MiB ping-pong 1.38-1.47
// vs 1.19-1.25.
const (
	pollSlice     = 10_000 // ns, half a sysmon tick
	pollSlices    = 100    // 1 ms of polling before blocking
	blockingBytes = 256 << 10
)

func waitPolling(h *C.MPI_Request, isRecv C.int, st *C.dist_status) C.int {
	for range pollSlices {
		var flag C.int
		rc := C.dist_test_for(h, isRecv, pollSlice, &flag, st)
		if flag != 0 {
			return rc
		}
		runtime.Gosched()
	}
	return C.dist_wait(h, isRecv, st)
}

func waitFunneled(f *funnel, h *C.MPI_Request, isRecv C.int) (C.dist_status, C.int) {
	st := new(C.dist_status)
	rc := pollRequest(f, h, isRecv, st)
	return *st, rc
}

func backendWait(r *Request) (Status, error) {
	var st C.dist_status
	var rc C.int
	if f := mpiEngine.fun; f != nil {
		st, rc = waitFunneled(f, r.impl.h, cBool(!r.send))
	} else if r.size >= blockingBytes {
		rc = C.dist_wait(r.impl.h, cBool(!r.send), &st)
	} else {
		rc = waitPolling(r.impl.h, cBool(!r.send), &st)
	}
	r.impl.h = nil
	return goStatus(&st), mpiErr("MPI_Wait", rc)
}

func backendWaitall(rs []*Request, sts []Status, errs []error) {
	n := len(rs)
	var hsBuf [smallBatch]*C.MPI_Request
	var recvBuf [smallBatch]C.int
	var cstBuf [smallBatch]C.dist_status
	hs, recv, cst := hsBuf[:0], recvBuf[:0], cstBuf[:0]
	if n > smallBatch {
		hs, recv, cst = make([]*C.MPI_Request, 0, n), make([]C.int, 0, n), make([]C.dist_status, 0, n)
	}
	var largest int64
	for _, r := range rs {
		hs, recv = append(hs, r.impl.h), append(recv, cBool(!r.send))
		r.impl.h = nil
		largest = max(largest, r.size)
	}
	cst = cst[:n]
	if f := mpiEngine.fun; f != nil {
		waitallFunneled(f, hs, recv, cst)
	} else if largest >= blockingBytes {
		C.dist_waitall(C.int(n), &hs[0], &recv[0], &cst[0])
	} else {
		waitallPolling(hs, recv, cst)
	}
	for i := range rs {
		sts[i] = goStatus(&cst[i])
		errs[i] = mpiErr("MPI_Waitall", C.int(cst[i].err))
	}
}

func waitallPolling(hs []*C.MPI_Request, recv []C.int, cst []C.dist_status) {
	n := C.int(len(hs))
	for range pollSlices {
		var left C.int
		if C.dist_test_all_for(n, &hs[0], &recv[0], &cst[0], pollSlice, &left); left == 0 {
			return
		}
		runtime.Gosched()
	}
	C.dist_waitall(n, &hs[0], &recv[0], &cst[0])
}

// waitallFunneled tests each request in turn between other calls: a
// blocking MPI_Waitall on the funnel thread would stall every other
// goroutine's calls. It works on copies so the caller's arrays stay on its
// stack.
func waitallFunneled(f *funnel, hs0 []*C.MPI_Request, recv0 []C.int, cst0 []C.dist_status) {
	n := len(hs0)
	hs := append([]*C.MPI_Request(nil), hs0...)
	recv := append([]C.int(nil), recv0...)
	cst := make([]C.dist_status, n)
	left := make([]int, n)
	for i := range left {
		left[i] = i
	}
	f.until(func() bool {
		kept := left[:0]
		for _, i := range left {
			var flag C.int
			if C.dist_test(hs[i], recv[i], &flag, &cst[i]); flag == 0 {
				kept = append(kept, i)
			}
		}
		left = kept
		return len(left) == 0
	})
	copy(cst0, cst)
}

// collective runs one collective. Under MPI_THREAD_MULTIPLE it is the
// blocking call. Funnelled, it is started as the nonblocking variant on the
// funnel thread and polled there, so other goroutines' calls (the sends a
// peer needs before it can join) still go through; MPI then holds the
// buffers past the starting call, so they are pinned until completion.
func collective(op string, start func(nb *C.MPI_Request) C.int, buffers ...unsafe.Pointer) error {
	f := mpiEngine.fun
	if f == nil {
		return mpiErr(op, start(nil))
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	for _, p := range buffers {
		if p != nil {
			pin.Pin(p)
		}
	}
	h := C.dist_request_new()
	if h == nil {
		return fmt.Errorf("cluster: %s: allocating a request handle: %w", op, ErrMPI)
	}
	var rc C.int
	f.run(func() { rc = start(h) })
	if rc != C.MPI_SUCCESS {
		C.dist_request_free(h)
		return mpiErr(op, rc)
	}
	var st C.dist_status
	return mpiErr(op, pollRequest(f, h, 0, &st))
}

func ptr[T any](s []T) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Pointer(&s[0])
}

func backendBarrier(c commImpl) error {
	return collective("MPI_Barrier", func(nb *C.MPI_Request) C.int { return C.dist_barrier(c.h, nb) })
}

func backendBcast(c commImpl, buf []byte, lay byteLayout, root int) error {
	p := ptr(buf)
	return collective("MPI_Bcast", func(nb *C.MPI_Request) C.int {
		return C.dist_bcast(c.h, p, cLayout(lay), C.int(root), nb)
	}, p)
}

func cOp(op Op) C.int {
	switch op {
	case Min:
		return C.DIST_MIN
	case Max:
		return C.DIST_MAX
	}
	return C.DIST_SUM
}

func allreduce(c commImpl, in, out unsafe.Pointer, n int, dtype C.int, op Op) error {
	return collective("MPI_Allreduce", func(nb *C.MPI_Request) C.int {
		return C.dist_allreduce(c.h, in, out, C.int(n), dtype, cOp(op), nb)
	}, in, out)
}

func backendAllreduceInt64(c commImpl, in, out []int64, op Op, _ bool) error {
	return allreduce(c, ptr(in), ptr(out), len(in), C.DIST_INT64, op)
}

func backendAllreduceFloat64(c commImpl, in, out []float64, op Op, _ bool) error {
	return allreduce(c, ptr(in), ptr(out), len(in), C.DIST_DOUBLE, op)
}

func backendAlltoallInt64(c commImpl, in, out []int64) error {
	pi, po := ptr(in), ptr(out)
	return collective("MPI_Alltoall", func(nb *C.MPI_Request) C.int {
		return C.dist_alltoall_int64(c.h, (*C.int64_t)(pi), (*C.int64_t)(po), nb)
	}, pi, po)
}

func backendAllgather(c commImpl, in, out []byte, lay byteLayout) error {
	pi, po := ptr(in), ptr(out)
	return collective("MPI_Allgather", func(nb *C.MPI_Request) C.int {
		return C.dist_allgather(c.h, pi, po, cLayout(lay), nb)
	}, pi, po)
}

// layoutTypeInfo builds the datatype for a layout and reports its size and
// extent, so tests can check the large-message arithmetic without moving
// gigabytes.
func layoutTypeInfo(l byteLayout) (size, extent int64, err error) {
	var s, e C.int64_t
	var rc C.int
	onMPI(func() { rc = C.dist_layout_type_info(cLayout(l), &s, &e) })
	if err := mpiErr("MPI_Type_size_x", rc); err != nil {
		return 0, 0, err
	}
	return int64(s), int64(e), nil
}

func imrecv(m msgImpl, addr uintptr, lay byteLayout) (*C.MPI_Request, C.int) {
	cl := cLayout(lay)
	var rc C.int
	var h *C.MPI_Request
	onMPI(func() { h = C.dist_imrecv(m.h, C.uintptr_t(addr), cl, &rc) })
	return h, rc
}

func backendImrecv(m msgImpl, addr uintptr, lay byteLayout, r *Request) error {
	h, rc := imrecv(m, addr, lay)
	C.dist_message_free(m.h)
	if h == nil {
		return mpiErr("MPI_Imrecv", rc)
	}
	r.impl.h = h
	return nil
}

// cScratch is C memory a discarded message is received into, freed when
// the receive completes.
type cScratch struct{ p unsafe.Pointer }

func (s cScratch) Release() error {
	C.free(s.p)
	return nil
}

func backendDiscard(m msgImpl, lay byteLayout, r *Request) error {
	var p unsafe.Pointer
	if n := lay.bytes(); n > 0 {
		if p = C.malloc(C.size_t(n)); p == nil {
			return fmt.Errorf("cluster: Message.Discard: no scratch memory for %d bytes: %w", n, distbuf.ErrOutOfMemory)
		}
	}
	h, rc := imrecv(m, uintptr(p), lay)
	C.dist_message_free(m.h)
	if h == nil {
		C.free(p)
		return mpiErr("MPI_Imrecv", rc)
	}
	r.impl.h = h
	if p != nil {
		r.holds = append(r.holdBuf[:0], cScratch{p})
	}
	return nil
}

// awaitSlice is the length of the next polling slice of a wait that has
// run slices slices so far, given the largest pending message: short
// slices first, as Wait polls before it blocks, then long ones once the
// wait has lasted (or at once for a large message, whose transfer runs
// inside long MPI calls anyway).
func awaitSlice(slices int, largest int64) time.Duration {
	if slices < pollSlices && largest < blockingBytes {
		return pollSlice * time.Nanosecond
	}
	return time.Millisecond
}

func backendAwait(rs []*Request, sts []Status, errs []error, idx []int, p *awaitProbe, timeout time.Duration) awaitResult {
	n := len(rs)
	var hsBuf [smallBatch + 1]*C.MPI_Request
	var recvBuf [smallBatch + 1]C.int
	var cstBuf [smallBatch + 1]C.dist_status
	var idxBuf [smallBatch + 1]C.int
	hs, recv, cst, cidx := hsBuf[:0], recvBuf[:0], cstBuf[:0], idxBuf[:0]
	if n > smallBatch {
		hs, recv, cst, cidx = make([]*C.MPI_Request, 0, n+1), make([]C.int, 0, n+1), make([]C.dist_status, 0, n+1), make([]C.int, 0, n+1)
	}
	var largest int64
	for _, r := range rs {
		hs, recv = append(hs, r.impl.h), append(recv, cBool(!r.send))
		largest = max(largest, r.size)
	}
	// One more slot, so that C gets valid arrays when no request is pending.
	hs, recv, cst, cidx = append(hs, nil), append(recv, 0), cst[:n+1], cidx[:n+1]
	var a cAwait
	if p != nil {
		a.pc, a.source, a.tag = p.c.h, C.int(p.source), C.int(p.tag)
	}
	if f := mpiEngine.fun; f != nil {
		a = awaitFunneled(f, hs, recv, cst, cidx, a, timeout)
	} else {
		start := time.Now()
		for slices := 0; ; slices++ {
			spin := awaitSlice(slices, largest)
			if timeout >= 0 {
				spin = max(min(spin, timeout-time.Since(start)), 0)
			}
			a.rc = C.dist_await(C.int(n), &hs[0], &recv[0], &cst[0], a.pc, a.source, a.tag, C.int64_t(spin), &cidx[0], &a.done, &a.msg, &a.matched, &a.mst)
			if a.done > 0 || a.matched != 0 || a.rc != C.MPI_SUCCESS || timeout >= 0 && time.Since(start) >= timeout {
				break
			}
			runtime.Gosched()
		}
	}
	var res awaitResult
	for _, i := range cidx[:a.done] {
		rs[i].impl.h = nil
		sts[i] = goStatus(&cst[i])
		errs[i] = mpiErr("MPI_Testsome", C.int(cst[i].err))
		idx[res.done] = int(i)
		res.done++
	}
	if a.matched != 0 {
		// The handle moves to a C cell of its own, as a matched message's does.
		cell := C.dist_message_new()
		if cell == nil {
			res.err = fmt.Errorf("cluster: allocating a message handle: %w", ErrMPI)
			return res
		}
		*cell = a.msg
		res.matched, res.msg, res.status = true, msgImpl{cell}, goStatus(&a.mst)
	}
	if res.done == 0 && !res.matched {
		res.err = mpiErr("MPI_Improbe", a.rc)
	}
	return res
}

// cAwait is what one dist_await call takes and reports besides the
// request arrays.
type cAwait struct {
	pc          *C.MPI_Comm
	source, tag C.int
	rc, done    C.int
	matched     C.int
	msg         C.MPI_Message
	mst         C.dist_status
}

// awaitFunneled runs dist_await passes on the funnel thread, between the
// other calls it is handed, on copies of the arrays so that the caller's
// stay on its stack.
func awaitFunneled(f *funnel, hs0 []*C.MPI_Request, recv0 []C.int, cst0 []C.dist_status, idx0 []C.int, a cAwait, timeout time.Duration) cAwait {
	n := len(hs0) - 1
	hs := append([]*C.MPI_Request(nil), hs0...)
	recv := append([]C.int(nil), recv0...)
	cst := make([]C.dist_status, n+1)
	idx := make([]C.int, n+1)
	res := new(cAwait)
	*res = a
	start := time.Now()
	f.until(func() bool {
		res.rc = C.dist_await(C.int(n), &hs[0], &recv[0], &cst[0], res.pc, res.source, res.tag, 0, &idx[0], &res.done, &res.msg, &res.matched, &res.mst)
		return res.done > 0 || res.matched != 0 || res.rc != C.MPI_SUCCESS || timeout >= 0 && time.Since(start) >= timeout
	})
	copy(hs0, hs)
	copy(cst0, cst)
	copy(idx0, idx)
	return *res
}

// backendAbort calls MPI_Abort on MPI_COMM_WORLD. Funnelled, it is handed
// to the funnel thread, unless that thread does not take it within a
// second (a stuck call there): the job is ending either way.
func backendAbort(code int) {
	if f := mpiEngine.fun; f != nil {
		done := make(chan struct{})
		go func() {
			f.run(func() { C.dist_abort(C.int(code)) })
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(time.Second):
		}
	}
	C.dist_abort(C.int(code))
	os.Exit(code)
}

// fastStack is how many peers a round may have for its C arrays to stay
// on the stack.
const fastStack = 16

type fastArrays struct {
	peer, serr, rstate, slots [fastStack]C.int
	off, n                    [fastStack]C.int64_t
	sreq, rreq                [fastStack]*C.MPI_Request
	rst                       [fastStack]C.dist_status
}

// boundedFastAvailable: the all-in-C round runs on the calling thread,
// which a funnelled MPI does not allow.
func boundedFastAvailable() bool { return mpiEngine.fun == nil }

// backendBoundedFast runs dist_bounded_fast for a round (see
// bounded_fast.go) and reports what it left in res.
func backendBoundedFast(c commImpl, tag int, send uintptr, sends []span, recv uintptr, from, slotOf []int, stride int64, spin time.Duration, res *fastResult) error {
	ns, nf := len(sends), len(from)
	// The usual rounds' arrays stay on the stack.
	var f fastArrays
	peer, off, n := f.peer[:0], f.off[:0], f.n[:0]
	sreq, serr := f.sreq[:0], f.serr[:0]
	rreq, rstate, rst := f.rreq[:0], f.rstate[:0], f.rst[:0]
	slots := f.slots[:0]
	if ns >= fastStack || nf >= fastStack || len(slotOf) >= fastStack {
		peer, off, n = make([]C.int, 0, ns+1), make([]C.int64_t, 0, ns+1), make([]C.int64_t, 0, ns+1)
		sreq, serr = make([]*C.MPI_Request, 0, ns+1), make([]C.int, 0, ns+1)
		rreq, rstate, rst = make([]*C.MPI_Request, 0, nf+1), make([]C.int, 0, nf+1), make([]C.dist_status, 0, nf+1)
		slots = make([]C.int, 0, len(slotOf)+1)
	}
	for _, s := range sends {
		peer, off, n = append(peer, C.int(s.peer)), append(off, C.int64_t(s.off)), append(n, C.int64_t(s.n))
	}
	for _, v := range slotOf {
		slots = append(slots, C.int(v))
	}
	// One more slot each, so that C gets valid arrays when a side is empty.
	peer, off, n, slots = peer[:ns+1], off[:ns+1], n[:ns+1], slots[:len(slotOf)+1]
	sreq, serr = sreq[:ns+1], serr[:ns+1]
	rreq, rstate, rst = rreq[:nf+1], rstate[:nf+1], rst[:nf+1]
	var out C.dist_round_out
	rc := C.dist_bounded_fast(c.h, C.int(tag), C.uintptr_t(send), C.int(ns), &peer[0], &off[0], &n[0],
		C.uintptr_t(recv), C.int(nf), &slots[0], C.int(len(slotOf)), C.int64_t(stride), C.int64_t(spin),
		&sreq[0], &serr[0], &rreq[0], &rstate[0], &rst[0], &out)
	posted := int(out.posted)
	res.sends, res.recvs = slices.Grow(res.sends[:0], posted)[:posted], slices.Grow(res.recvs[:0], nf)[:nf]
	for i := range res.sends {
		res.sends[i] = fastPart{pending: sreq[i] != nil, handle: reqImpl{sreq[i]}, err: mpiErr("MPI_Isend", serr[i])}
		res.pending = res.pending || sreq[i] != nil
	}
	for j := range res.recvs {
		p := &res.recvs[j]
		*p = fastPart{}
		switch rstate[j] {
		case 1:
			p.matched, p.pending, p.handle = true, true, reqImpl{rreq[j]}
			res.pending = true
		case 2:
			p.matched, p.complete, p.status, p.err = true, true, goStatus(&rst[j]), mpiErr("MPI_Imrecv", C.int(rst[j].err))
		}
	}
	if out.extra != 0 {
		res.extra, res.extraStatus = &msgImpl{out.extra_msg}, goStatus(&out.extra_st)
	}
	op := "MPI_Improbe or MPI_Imrecv"
	if posted < len(sends) {
		op = "MPI_Isend"
	}
	return mpiErr(op, rc)
}

// backendNodeCPUs is how many CPUs the node has online, whatever this
// process is bound to.
func backendNodeCPUs() int { return int(C.dist_online_cpus()) }

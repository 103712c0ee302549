//go:build cgo

package nccl

/*
#cgo CFLAGS: -I${SRCDIR} -I${SRCDIR}/../cudart
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "decl.h"
#include "cudart_setdev.h"

// DEVICE sets the device through internal/cudart (Runtime.SetDeviceFunc).
#define DEVICE() do { if (DBC_SET_DEVICE(setdev, dev) != 0) return -1; } while (0)

static int n_version(void *f, int *v) { return ((dbn_GetVersion_fn)f)(v); }
static int n_unique_id(void *f, char *out) {
	dbn_unique_id id;
	int r = ((dbn_GetUniqueId_fn)f)(&id);
	memcpy(out, id.internal, DBN_UNIQUE_ID_BYTES);
	return r;
}
static int n_init(void *setdev, void *f, int dev, uintptr_t *comm, int nranks, const char *idb, int rank) {
	DEVICE();
	dbn_unique_id id;
	memcpy(id.internal, idb, DBN_UNIQUE_ID_BYTES);
	dbn_comm c = 0;
	int r = ((dbn_CommInitRank_fn)f)(&c, nranks, id, rank);
	*comm = (uintptr_t)c;
	return r;
}
static int n_destroy(void *setdev, void *f, int dev, uintptr_t comm) {
	DEVICE();
	return ((dbn_CommDestroy_fn)f)((dbn_comm)comm);
}
// n_sendrecv posts one grouped send to and receive from each peer.
static int n_sendrecv(void *setdev, void *gs, void *ge, void *sendf, void *recvf, int dev, uintptr_t comm, uintptr_t stream,
		int n, const uintptr_t *sbuf, const uint64_t *scount, const int *speer,
		int m, const uintptr_t *rbuf, const uint64_t *rcount, const int *rpeer) {
	DEVICE();
	int r = ((dbn_GroupStart_fn)gs)();
	if (r != 0) return r;
	for (int i = 0; i < n && r == 0; i++)
		r = ((dbn_Send_fn)sendf)((const void *)sbuf[i], scount[i], DBN_UINT8, speer[i], (dbn_comm)comm, (dbn_stream)stream);
	for (int i = 0; i < m && r == 0; i++)
		r = ((dbn_Recv_fn)recvf)((void *)rbuf[i], rcount[i], DBN_UINT8, rpeer[i], (dbn_comm)comm, (dbn_stream)stream);
	int e = ((dbn_GroupEnd_fn)ge)();
	return r != 0 ? r : e;
}
static const char *n_error_string(void *f, int r) { return f ? ((dbn_GetErrorString_fn)f)(r) : ""; }
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/dl"
)

// Lib is a loaded libnccl: its functions, and the CUDA runtime's device
// setter every call goes through first.
type Lib struct {
	version, uniqueID, initRank, destroy unsafe.Pointer
	groupStart, groupEnd, send, recv     unsafe.Pointer
	errorString, setDev                  unsafe.Pointer
	lib                                  *dl.Library
}

var loaded = dl.Lazy[*Lib]{Retry: true}

// Load opens libnccl (DISTBUF_NCCL, else libnccl.so.2) on first use; a
// failure is reported each time and retried on the next call.
func Load() (*Lib, error) { return loaded.Get(load) }

func load() (*Lib, error) {
	l := &Lib{}
	var err error
	l.lib, err = dl.Load(ErrUnavailable, EnvNCCL, []string{"libnccl.so.2", "libnccl.so"}, []dl.Symbol{
		{Name: "ncclGetVersion", Ptr: &l.version},
		{Name: "ncclGetUniqueId", Ptr: &l.uniqueID},
		{Name: "ncclCommInitRank", Ptr: &l.initRank},
		{Name: "ncclCommDestroy", Ptr: &l.destroy},
		{Name: "ncclGroupStart", Ptr: &l.groupStart},
		{Name: "ncclGroupEnd", Ptr: &l.groupEnd},
		{Name: "ncclSend", Ptr: &l.send},
		{Name: "ncclRecv", Ptr: &l.recv},
		{Name: "ncclGetErrorString", Ptr: &l.errorString},
	})
	if err != nil {
		return nil, err
	}
	// Every call sets the device first, through the CUDA runtime's cudaSetDevice.
	rt, err := cudart.Load()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	l.setDev = rt.SetDeviceFunc()
	return l, nil
}

func (l *Lib) check(call string, r C.int) error {
	if r == 0 {
		return nil
	}
	msg := "cudaSetDevice failed"
	if r != -1 {
		msg = C.GoString(C.n_error_string(l.errorString, r))
	}
	return &Error{Lib: "nccl", Call: call, Code: int(r), Msg: msg, Kind: ErrNCCL}
}

// Version is NCCL's version code, e.g. 22703 for 2.27.3.
func (l *Lib) Version() (int, error) {
	var v C.int
	err := l.check("ncclGetVersion", C.n_version(l.version, &v))
	return int(v), err
}

// Library is the name NCCL was loaded from.
func (l *Lib) Library() string { return l.lib.Name }

// UniqueIDBytes is the size of the bootstrap identifier rank 0 broadcasts.
const UniqueIDBytes = C.DBN_UNIQUE_ID_BYTES

// UniqueID makes the identifier that rank 0 broadcasts to the others.
func (l *Lib) UniqueID() ([]byte, error) {
	out := make([]byte, UniqueIDBytes)
	err := l.check("ncclGetUniqueId", C.n_unique_id(l.uniqueID, (*C.char)(unsafe.Pointer(&out[0]))))
	return out, err
}

// Comm is one rank's NCCL communicator on one device.
type Comm struct {
	l    *Lib
	dev  C.int
	comm C.uintptr_t
}

// NewComm joins the communicator of nranks ranks identified by id (every
// rank passes the same id) as rank, on device dev. It is collective.
func (l *Lib) NewComm(id []byte, nranks, rank, dev int) (*Comm, error) {
	if len(id) != UniqueIDBytes {
		return nil, fmt.Errorf("nccl: unique id of %d bytes, want %d: %w", len(id), UniqueIDBytes, ErrInvalid)
	}
	if nranks < 1 || rank < 0 || rank >= nranks {
		return nil, fmt.Errorf("nccl: rank %d of %d: %w", rank, nranks, ErrInvalid)
	}
	c := &Comm{l: l, dev: C.int(dev)}
	cid := C.CBytes(id)
	defer C.free(cid)
	if err := l.check("ncclCommInitRank", C.n_init(l.setDev, l.initRank, c.dev, &c.comm, C.int(nranks), (*C.char)(cid), C.int(rank))); err != nil {
		return nil, err
	}
	return c, nil
}

// Transfer is one buffer of a SendRecv: device memory and its peer.
type Transfer struct {
	Addr  uintptr
	Bytes int64
	Peer  int
}

// SendRecv enqueues, as one NCCL group on stream, every send and receive.
// The buffers must stay valid until the stream reaches the end of the
// group.
func (c *Comm) SendRecv(stream uintptr, sends, recvs []Transfer) error {
	if c.comm == 0 {
		return fmt.Errorf("nccl: communicator closed: %w", ErrInvalid)
	}
	n, m := len(sends), len(recvs)
	// One slot more than the transfers, so that the receives' part
	// (starting at index n) exists even when there are none.
	slots := n + m + 1
	arr := C.malloc(C.size_t(slots) * (8 + 8 + 4))
	if arr == nil {
		return errors.New("nccl: out of host memory")
	}
	defer C.free(arr)
	bufs := unsafe.Slice((*C.uintptr_t)(arr), slots)
	counts := unsafe.Slice((*C.uint64_t)(unsafe.Add(arr, 8*slots)), slots)
	peers := unsafe.Slice((*C.int)(unsafe.Add(arr, 16*slots)), slots)
	for i, t := range append(append([]Transfer(nil), sends...), recvs...) {
		if t.Bytes < 0 {
			return fmt.Errorf("nccl: transfer of %d bytes: %w", t.Bytes, ErrInvalid)
		}
		bufs[i], counts[i], peers[i] = C.uintptr_t(t.Addr), C.uint64_t(t.Bytes), C.int(t.Peer)
	}
	return c.l.check("ncclGroup(Send/Recv)", C.n_sendrecv(c.l.setDev, c.l.groupStart, c.l.groupEnd, c.l.send, c.l.recv, c.dev, c.comm,
		C.uintptr_t(stream), C.int(n), &bufs[0], &counts[0], &peers[0], C.int(m), &bufs[n], &counts[n], &peers[n]))
}

// Close destroys the communicator.
func (c *Comm) Close() error {
	comm := c.comm
	c.comm = 0
	if comm == 0 {
		return fmt.Errorf("nccl: communicator closed twice: %w", ErrInvalid)
	}
	return c.l.check("ncclCommDestroy", C.n_destroy(c.l.setDev, c.l.destroy, c.dev, comm))
}

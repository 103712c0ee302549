package ipcwin

import (
	"errors"
	"unsafe"

	"github.com/distbuf/distbuf/internal/cudart"
)

// Notice is a pinned buffer a notice travels in: page-locked host memory
// of the link's own (cudaHostAlloc), outside any allocator's ledger and
// budget, so that what the link keeps from one exchange to the next is not
// counted among the caller's buffers.
type Notice struct {
	p     unsafe.Pointer
	n     int64
	owner *Notices
}

// KeepSent keeps b, from which a notice to dest was posted, for dest's
// next notice.
func (b *Notice) KeepSent(dest int) error { return b.owner.keep(&b.owner.sent, dest, b) }

// KeepReceived keeps b, whose notice from src was read and whose receive
// completed, for src's next notice.
func (b *Notice) KeepReceived(src int) error { return b.owner.keep(&b.owner.received, src, b) }

// Drop frees b, which nothing reads or writes any more.
func (b *Notice) Drop() error { return b.owner.dev.FreeHost(b.p) }

// Bytes is the notice's memory.
func (b *Notice) Bytes() []byte { return unsafe.Slice((*byte)(b.p), b.n) }

// Addr is where the notice lies: host memory a device copy may read.
func (b *Notice) Addr() uintptr { return uintptr(b.p) }

// Region makes the notice memory MPI may hold until its request
// completes.
func (b *Notice) Region() (uintptr, int64, bool, error) { return uintptr(b.p), b.n, false, nil }

// Notices keeps, per peer, the buffer its last notice arrived in and the
// one this rank's last notice to it went out from, for the next notice.
type Notices struct {
	dev            *cudart.Device
	ready          cudart.Event // recorded after the copies that read sent notices
	sent, received map[int]*Notice
}

// Sent returns a buffer of at least n bytes for a notice to dest, ready
// for the host to write: the one its last notice went out from when large
// enough, once the device's copy of its manifest into the window has run
// (the send that read it completed in its exchange), else a new one.
func (k *Notices) Sent(dest int, n int64) (*Notice, error) {
	b, err := k.take(k.sent, dest, n)
	if b != nil {
		if err := k.dev.EventSynchronize(k.ready); err != nil {
			return nil, errors.Join(err, b.Drop())
		}
		return b, nil
	}
	if err != nil {
		return nil, err
	}
	return k.alloc(n)
}

// Received returns a buffer of at least n bytes for a notice from src: the
// one its last notice arrived in when large enough, else a new one.
func (k *Notices) Received(src int, n int64) (*Notice, error) {
	b, err := k.take(k.received, src, n)
	if b != nil || err != nil {
		return b, err
	}
	return k.alloc(n)
}

// take removes peer's kept buffer and returns it when it holds n bytes; a
// shorter one is freed.
func (k *Notices) take(kept map[int]*Notice, peer int, n int64) (*Notice, error) {
	b := kept[peer]
	delete(kept, peer)
	switch {
	case b == nil:
		return nil, nil
	case b.n < n:
		return nil, b.Drop()
	}
	return b, nil
}

func (k *Notices) alloc(n int64) (*Notice, error) {
	p, err := k.dev.HostAlloc(n, cudart.HostAllocPortable)
	if err != nil {
		return nil, err
	}
	return &Notice{p: p, n: n, owner: k}, nil
}

// Buffers are the kept buffers, by peer: those notices to it went out
// from, and those its notices arrived in.
func (k *Notices) Buffers() (sent, received map[int]*Notice) { return k.sent, k.received }

// Free frees every kept buffer.
func (k *Notices) Free() error {
	var errs []error
	for _, m := range []map[int]*Notice{k.sent, k.received} {
		for p, b := range m {
			errs = append(errs, b.Drop())
			delete(m, p)
		}
	}
	return errors.Join(errs...)
}

// keep keeps b as peer's buffer in kept, freeing the one it replaces.
func (k *Notices) keep(kept *map[int]*Notice, peer int, b *Notice) error {
	if old := (*kept)[peer]; old != nil && old != b {
		if err := old.Drop(); err != nil {
			return err
		}
	}
	if *kept == nil {
		*kept = map[int]*Notice{}
	}
	(*kept)[peer] = b
	return nil
}

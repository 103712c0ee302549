package ipcwin

import (
	"errors"

	"github.com/distbuf/distbuf/devalloc"
)

// Notices keeps, per peer, the pinned buffer its last notice arrived in
// and the one this rank's last notice to it went out from, for the next
// notice: reusing one waits for nothing but its last use, where a new one
// costs a pool query and its free an event.
type Notices struct {
	a              *devalloc.Allocator
	send, recv     *devalloc.Stream
	sent, received map[int]*devalloc.Buffer
}

// Sent returns a pinned buffer of at least n bytes for a notice to dest,
// ready for the host to write: the one its last notice went out from when
// large enough (once the device has read it), else a new one.
func (k *Notices) Sent(dest int, n int64) (*devalloc.Buffer, error) {
	if b := k.sent[dest]; b != nil {
		delete(k.sent, dest)
		if b.Size() >= n {
			h, err := b.Hold(devalloc.Write)
			if err == nil {
				err = errors.Join(h.Wait(), h.Release())
			}
			if err == nil {
				return b, nil
			}
		}
		if err := b.Free(); err != nil {
			return nil, err
		}
	}
	return k.a.AllocPinned(n, k.send)
}

// Received returns a pinned buffer of at least n bytes for a notice from
// src: the one its last notice arrived in when large enough, else a new
// one.
func (k *Notices) Received(src int, n int64) (*devalloc.Buffer, error) {
	if b := k.received[src]; b != nil {
		delete(k.received, src)
		if b.Size() >= n {
			return b, nil
		}
		if err := b.Free(); err != nil {
			return nil, err
		}
	}
	return k.a.AllocPinned(n, k.recv)
}

// KeepSent keeps b, from which a notice to dest was posted, for dest's
// next notice. The send's hold keeps it from being rewritten until the
// send completes.
func (k *Notices) KeepSent(dest int, b *devalloc.Buffer) error { return keep(&k.sent, dest, b) }

// KeepReceived keeps b, whose notice from src was read and whose receive
// completed, for src's next notice.
func (k *Notices) KeepReceived(src int, b *devalloc.Buffer) error {
	return keep(&k.received, src, b)
}

// Buffers are the kept buffers, by peer: those notices to it went out
// from, and those its notices arrived in.
func (k *Notices) Buffers() (sent, received map[int]*devalloc.Buffer) { return k.sent, k.received }

// Free frees every kept buffer.
func (k *Notices) Free() error {
	var errs []error
	for _, m := range []map[int]*devalloc.Buffer{k.sent, k.received} {
		for p, b := range m {
			errs = append(errs, b.Free())
			delete(m, p)
		}
	}
	return errors.Join(errs...)
}

// keep keeps b as peer's buffer in kept, freeing the one it replaces.
func keep(kept *map[int]*devalloc.Buffer, peer int, b *devalloc.Buffer) error {
	if old := (*kept)[peer]; old != nil {
		if err := old.Free(); err != nil {
			return err
		}
	}
	if *kept == nil {
		*kept = map[int]*devalloc.Buffer{}
	}
	(*kept)[peer] = b
	return nil
}

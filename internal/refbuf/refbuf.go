// Package refbuf shares one devalloc Buffer among several owners and frees
// it with the last of them: the receive buffer of several messages in msg,
// each message's Coalesced owning one reference (packing.Wrap with the
// Shared's Release). The creator holds a reference too, so that the buffer
// outlives the making of its owners.
package refbuf

import (
	"fmt"
	"sync/atomic"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
)

// Shared is one buffer owned by reference count.
type Shared struct {
	buf  *devalloc.Buffer
	refs atomic.Int64
}

// New starts sharing buf, holding the caller's reference: give it back with
// Release once every owner is made.
func New(buf *devalloc.Buffer) (*Shared, error) {
	if buf == nil {
		return nil, fmt.Errorf("refbuf: nil buffer: %w", distbuf.ErrInvalid)
	}
	s := &Shared{buf: buf}
	s.refs.Store(1)
	return s, nil
}

// Buffer is the shared buffer.
func (s *Shared) Buffer() *devalloc.Buffer { return s.buf }

// Acquire takes one more reference, to be given back by one Release. Call
// it while holding a reference: once the last is released the buffer is
// gone, and Acquire reports distbuf.ErrFreed.
func (s *Shared) Acquire() error {
	for {
		n := s.refs.Load()
		if n <= 0 {
			return fmt.Errorf("refbuf: acquire of buffer #%d: %w", s.buf.ID(), distbuf.ErrFreed)
		}
		if s.refs.CompareAndSwap(n, n+1) {
			return nil
		}
	}
}

// Release gives one reference back; the last frees the buffer. A Release
// beyond the references taken reports distbuf.ErrFreed.
func (s *Shared) Release() error {
	switch n := s.refs.Add(-1); {
	case n == 0:
		if err := s.buf.Free(); err != nil {
			return fmt.Errorf("refbuf: free of shared buffer: %w", err)
		}
	case n < 0:
		return fmt.Errorf("refbuf: shared buffer #%d released once too often: %w", s.buf.ID(), distbuf.ErrFreed)
	}
	return nil
}

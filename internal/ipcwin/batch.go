package ipcwin

import (
	"errors"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/gather"
)

// Batch is device copies enqueued together on one stream, and the ledger
// accesses of the buffers they read or write, which end with them.
type Batch struct {
	dsts, srcs, sizes []uintptr
	accesses          []*devalloc.Access
}

// Mark is a batch's length, for Undo.
type Mark struct{ copies, accesses int }

// Add adds a copy of n bytes from src to dst.
func (b *Batch) Add(dst, src uintptr, n int64) {
	b.dsts, b.srcs, b.sizes = append(b.dsts, dst), append(b.srcs, src), append(b.sizes, uintptr(n))
}

// Access adds an access that ends once the copies are enqueued.
func (b *Batch) Access(a *devalloc.Access) { b.accesses = append(b.accesses, a) }

// Len is the number of copies in the batch.
func (b *Batch) Len() int { return len(b.dsts) }

// Mark returns the batch's length now.
func (b *Batch) Mark() Mark { return Mark{len(b.dsts), len(b.accesses)} }

// Undo drops what was added since m, ending its accesses: one message's
// copies after a failure of its own.
func (b *Batch) Undo(m Mark) error {
	err := devalloc.DoneAll(b.accesses[m.accesses:]...)
	clear(b.accesses[m.accesses:])
	b.dsts, b.srcs, b.sizes, b.accesses = b.dsts[:m.copies], b.srcs[:m.copies], b.sizes[:m.copies], b.accesses[:m.accesses]
	return err
}

// Drop empties the batch without enqueuing anything.
func (b *Batch) Drop() error { return b.Undo(Mark{}) }

// Flush enqueues the batch's copies on s and ends its accesses after them,
// emptying it. Several copies go in one cudaMemcpyBatchAsync, or with
// l.Kernel in one launch of the gather kernel; a lone copy is one
// cudaMemcpyAsync.
func (l *Link) Flush(b *Batch, s *devalloc.Stream) error {
	cs := cudart.Stream(s.Handle())
	var err error
	if len(b.dsts) > 1 && l.Kernel {
		if err = gather.CopySpans(s, b.dsts, b.srcs, b.sizes); errors.Is(err, distbuf.ErrUnavailable) {
			l.Kernel, err = false, nil // nothing was enqueued: the runtime's copies instead
		} else {
			b.dsts = b.dsts[:0] // enqueued, or failed
		}
	}
	switch {
	case err != nil || len(b.dsts) == 0:
	case len(b.dsts) == 1:
		err = l.dev.MemcpyAsync(b.dsts[0], b.srcs[0], int64(b.sizes[0]), cs)
	case l.dev.Runtime().Capabilities().MemcpyBatch:
		err = l.dev.MemcpyBatch(cs, b.dsts, b.srcs, b.sizes)
	default:
		err = l.dev.MemcpyEach(cs, b.dsts, b.srcs, b.sizes)
	}
	return errors.Join(err, b.Drop())
}

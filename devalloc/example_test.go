package devalloc_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/devalloc"
)

// Allocate on a stream, fill the buffer in stream order, read it from Go
// under a hold, free it and close without a leak. The host backend runs the
// same stream-ordered semantics as CUDA on a machine without a GPU.
func Example() {
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost})
	if err != nil {
		log.Fatal(err)
	}
	s := a.DefaultStream()

	buf, err := a.Alloc(4096, s)
	if err != nil {
		log.Fatal(err)
	}
	// Memset is stream work, like a kernel on a GPU: it runs after the
	// allocation and before whatever is enqueued on s later.
	if err := s.Memset(buf, 0, buf.Size(), 0x2a); err != nil {
		log.Fatal(err)
	}

	// Go code is an agent outside the streams: a read hold waits for the
	// buffer's last writer (the memset) before the bytes are touched.
	h, err := buf.Hold(devalloc.Read)
	if err != nil {
		log.Fatal(err)
	}
	if err := h.Wait(); err != nil {
		log.Fatal(err)
	}
	b, err := buf.Bytes()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(b), b[0], b[len(b)-1])
	if err := h.Release(); err != nil {
		log.Fatal(err)
	}

	// Free never blocks; the memory returns to the pool in stream order.
	if err := buf.Free(); err != nil {
		log.Fatal(err)
	}
	if err := a.Close(); err != nil {
		log.Fatal(err) // a *LeakError if a buffer had not been freed
	}
	st := a.Stats() // Stats and Info still answer after Close
	fmt.Println(a.Info().Backend, st.AllocCalls, st.Frees, st.LiveBuffers)
	// Output:
	// 4096 42 42
	// host 1 1 0
}

// Writing from Go in stream order: declare the write on the stream, enqueue
// the host function, then mark the declaration done. Work declared later on
// another stream (here a read) is ordered after it by the buffer's ledger.
func ExampleStream_Enqueue() {
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost})
	if err != nil {
		log.Fatal(err)
	}
	s := a.DefaultStream()
	other, err := a.NewStream()
	if err != nil {
		log.Fatal(err)
	}
	buf, err := a.Alloc(8, s)
	if err != nil {
		log.Fatal(err)
	}

	w, err := buf.Write(s)
	if err != nil {
		log.Fatal(err)
	}
	err = s.Enqueue(func() error {
		b, err := buf.Bytes()
		copy(b, "distbuf!")
		return err
	})
	if err := errors.Join(err, w.Done()); err != nil {
		log.Fatal(err)
	}

	r, err := buf.Read(other) // other waits for the write on s; the host does not
	if err != nil {
		log.Fatal(err)
	}
	var got string
	err = other.Enqueue(func() error {
		b, err := buf.Bytes()
		got = string(b)
		return err
	})
	// Synchronize returns the first error of the stream's work.
	err = errors.Join(err, r.Done(), other.Synchronize(), s.Synchronize())
	if err := errors.Join(err, buf.Free(), a.Close()); err != nil {
		log.Fatal(err)
	}
	fmt.Println(got)
	// Output: distbuf!
}

// Close reports buffers that were never freed as a *LeakError, naming them
// by their ID and size; their memory is deliberately kept.
func ExampleLeakError() {
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost})
	if err != nil {
		log.Fatal(err)
	}
	buf, err := a.Alloc(1<<20, a.DefaultStream())
	if err != nil {
		log.Fatal(err)
	}

	err = a.Close() // buf was never freed
	var leak *devalloc.LeakError
	if errors.As(err, &leak) {
		fmt.Println(errors.Is(err, distbuf.ErrLeak), leak.Count, leak.Bytes, leak.Buffers[0].ID == buf.ID())
	}
	// Output: true 1 1048576 true
}

// A per-rank budget caps the bytes of live buffers. An allocation past it
// climbs the out-of-memory ladder (synchronise, trim, the callback) and
// then fails with an *OutOfMemoryError that carries the figures.
func ExampleOutOfMemoryError() {
	a, err := devalloc.Open(devalloc.Options{
		Backend: devalloc.BackendHost,
		Config:  &devalloc.Config{Limit: 1 << 20},
		// The callback may free memory and ask for another attempt.
		OnOutOfMemory: func(report *devalloc.OutOfMemoryError) bool { return false },
	})
	if err != nil {
		log.Fatal(err)
	}
	s := a.DefaultStream()
	held, err := a.Alloc(768<<10, s)
	if err != nil {
		log.Fatal(err)
	}
	_, err = a.Alloc(512<<10, s)
	var oom *devalloc.OutOfMemoryError
	if errors.As(err, &oom) {
		fmt.Println(errors.Is(err, distbuf.ErrOutOfMemory), oom.Requested, oom.Limit, oom.Used)
	}
	if err := errors.Join(held.Free(), a.Close()); err != nil {
		log.Fatal(err)
	}
	// Output: true 524288 1048576 786432
}

// Package distbuf holds the errors every distbuf package reports, one
// sentinel per meaning, so that a caller tests a failure the same way
// whichever package found it:
//
//	if errors.Is(err, distbuf.ErrFreed) { ... }
//
// An error names its package and the problem in its text ("packing: block
// id 7 appears twice: distbuf: invalid argument") and matches one of these
// sentinels, or a sentinel of its own package where the meaning belongs to
// that package alone (a malformed message in msg, an MPI failure in
// cluster). Errors that carry figures (an out-of-memory report, a leak
// list, a configuration error) are typed and match their sentinel too.
//
// The packages, from the bottom up:
//
//   - cluster: MPI for the ranks of one job: start, communicators, abort.
//   - devalloc: one rank's stream-ordered allocator (CUDA pool, cudaMalloc
//     fallback, or host memory).
//   - packing: many small blocks laid out in one pooled buffer.
//   - gemm: batched products over packed buffers.
//   - msg: one message per peer rank, sent straight from packed buffers.
package distbuf

import "errors"

var (
	// ErrInvalid reports a bad argument: a wrong size, shape, dtype, block
	// id, range, rank or tag, or a value a call cannot take.
	ErrInvalid = errors.New("distbuf: invalid argument")
	// ErrBadConfig reports a bad configuration file, environment variable
	// or flag value.
	ErrBadConfig = errors.New("distbuf: bad configuration")
	// ErrClosed reports use of an allocator, stream, exchanger or
	// communicator after it was closed, freed or finalized.
	ErrClosed = errors.New("distbuf: used after close")
	// ErrFreed reports use of a buffer after Free, a second Free included.
	ErrFreed = errors.New("distbuf: buffer already freed")
	// ErrOutOfMemory reports memory that could not be had within the
	// rank's budget or from the device or host.
	ErrOutOfMemory = errors.New("distbuf: out of memory")
	// ErrUnavailable reports something this machine or backend does not
	// have: no GPU, no runtime library, a method the backend cannot do.
	ErrUnavailable = errors.New("distbuf: unavailable on this machine or backend")
	// ErrConflict reports an access that would race with an access still
	// open on another stream.
	ErrConflict = errors.New("distbuf: conflicting open access")
	// ErrNotHostAccessible reports a host access to memory Go cannot
	// address (device memory); use a staged access instead.
	ErrNotHostAccessible = errors.New("distbuf: memory not addressable from Go")
	// ErrLeak reports buffers still live when their owner closed.
	ErrLeak = errors.New("distbuf: leaked buffers")
)

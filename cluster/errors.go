package cluster

import (
	"errors"
	"fmt"

	"github.com/distbuf/distbuf"
)

// Errors. Every error this package returns matches, with errors.Is, one of
// the module's shared sentinels or one of this package's own two,
// ErrNotInitialized and ErrMPI, whose meanings are cluster's alone:
//
//   - distbuf.ErrInvalid: a rank or tag outside its range, a bad argument
//     (mismatched lengths, a nil request, a negative color, a second Init),
//     a receive smaller than its message, a size MPI cannot describe.
//   - distbuf.ErrClosed: a communicator used after Free, any call after
//     Finalize.
//   - distbuf.ErrFreed: a PinnedBytes used after Release.
//   - distbuf.ErrConflict: a request used by two calls at once, or
//     Finalize while requests or matched messages are still open.
//   - distbuf.ErrUnavailable: no visible GPU, device memory given to an MPI
//     that is not CUDA-aware, or an MPI without the thread level
//     ThreadMultiple requires.
//   - distbuf.ErrOutOfMemory: no scratch memory to discard a message.
//   - distbuf.ErrBadConfig: a malformed DISTBUF_* environment variable.
//
// A Memory whose Region fails is refused with that error wrapped, so it
// matches what its owner reports (devalloc's use after Free, say).
var (
	// ErrNotInitialized is returned by every call made before Init, and
	// by every call after an Init that failed (wrapping that failure).
	ErrNotInitialized = errors.New("cluster: MPI not initialized")
	// ErrMPI matches every *MPIError: an error code MPI returned.
	ErrMPI = errors.New("cluster: MPI error")
)

// MPIError is an error code returned by MPI (under MPI_ERRORS_RETURN), or
// the same condition detected by the in-process world.
type MPIError struct {
	Op      string // the MPI function, e.g. "MPI_Wait"
	Code    int    // the implementation's error code; -1 from the in-process world
	Class   string // the portable class (MPI_Error_class), e.g. "MPI_ERR_TRUNCATE"
	Message string // MPI_Error_string of Code
}

func (e *MPIError) Error() string {
	return fmt.Sprintf("cluster: %s failed: %s (%s)", e.Op, e.Message, e.Class)
}

// Is matches ErrMPI, and distbuf.ErrInvalid for the classes that report a
// bad argument: a truncated receive, a bad rank or a bad tag.
func (e *MPIError) Is(target error) bool {
	switch target {
	case ErrMPI:
		return true
	case distbuf.ErrInvalid:
		return e.Class == classTruncate || e.Class == classRank || e.Class == classTag
	}
	return false
}

// The classes MPIError.Is matches by; the MPI build names every class MPI
// reports.
const (
	classTruncate = "MPI_ERR_TRUNCATE"
	classRank     = "MPI_ERR_RANK"
	classTag      = "MPI_ERR_TAG"
)

// envError reports a malformed environment variable, naming it and its
// value.
func envError(name, value, reason string) error {
	return fmt.Errorf("cluster: %s=%q: %s: %w", name, value, reason, distbuf.ErrBadConfig)
}

package cluster

import (
	"fmt"
	"os"
	"strings"

	"github.com/distbuf/distbuf"
)

// Wildcards and the null color. They are this package's values; the MPI
// build translates them to MPI_ANY_SOURCE, MPI_ANY_TAG and MPI_UNDEFINED.
const (
	AnySource = -1 // Irecv, Probe: match any source rank
	AnyTag    = -1 // Irecv, Probe: match any tag
	Undefined = -1 // Split color: this rank joins no new communicator
)

// Status describes a received or probed message. For a completed send,
// Source is -1, Tag the tag sent and Bytes the length sent.
type Status struct {
	Source int
	Tag    int
	Bytes  int64
}

// Op is a reduction operator for Allreduce.
type Op int

// Reduction operators.
const (
	Sum Op = iota
	Min
	Max
)

func (o Op) String() string {
	switch o {
	case Sum:
		return "sum"
	case Min:
		return "min"
	case Max:
		return "max"
	}
	return fmt.Sprintf("Op(%d)", int(o))
}

func (o Op) valid() bool { return o == Sum || o == Min || o == Max }

// The environment variables this package reads (doc.go describes them).
const (
	envThread    = "DISTBUF_MPI_THREAD"
	envCUDAAware = "DISTBUF_MPI_CUDA_AWARE"
	envGPUMap    = "DISTBUF_GPU_MAP"
	envDevice    = "DISTBUF_DEVICE"
)

// ThreadMode is how Go's goroutines reach MPI.
type ThreadMode int

const (
	// ThreadAuto asks for MPI_THREAD_MULTIPLE and funnels when MPI
	// provides less.
	ThreadAuto ThreadMode = iota
	// ThreadMultiple requires MPI_THREAD_MULTIPLE: every goroutine calls
	// MPI directly, from whatever OS thread it runs on. Init fails if MPI
	// provides less.
	ThreadMultiple
	// ThreadFunneled asks for MPI_THREAD_FUNNELED and runs every MPI call
	// on the one locked OS thread that called MPI_Init_thread.
	ThreadFunneled
)

func (m ThreadMode) String() string {
	switch m {
	case ThreadAuto:
		return "auto"
	case ThreadMultiple:
		return "multiple"
	case ThreadFunneled:
		return "funneled"
	}
	return fmt.Sprintf("ThreadMode(%d)", int(m))
}

// parseThreadMode parses "auto", "multiple" or "funneled".
func parseThreadMode(s string) (ThreadMode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "auto":
		return ThreadAuto, nil
	case "multiple":
		return ThreadMultiple, nil
	case "funneled", "funnelled":
		return ThreadFunneled, nil
	}
	return ThreadAuto, fmt.Errorf("cluster: thread mode %q (want auto, multiple or funneled): %w", s, distbuf.ErrInvalid)
}

// Options configures Init. The zero value asks for the thread mode named
// by DISTBUF_MPI_THREAD, else ThreadAuto.
type Options struct {
	Thread ThreadMode
}

func (o Options) threadMode() (ThreadMode, error) {
	if o.Thread != ThreadAuto {
		if o.Thread < ThreadAuto || o.Thread > ThreadFunneled {
			return 0, fmt.Errorf("cluster: Options.Thread %v: %w", o.Thread, distbuf.ErrInvalid)
		}
		return o.Thread, nil
	}
	v, ok := os.LookupEnv(envThread)
	if !ok {
		return ThreadAuto, nil
	}
	m, err := parseThreadMode(v)
	if err != nil {
		return 0, envError(envThread, v, "want auto, multiple or funneled")
	}
	return m, nil
}

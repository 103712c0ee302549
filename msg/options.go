package msg

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/bytesize"
)

// Defaults of Options.
const (
	// DefaultTag is the MPI tag of exchange messages when Options.Tag is 0.
	// It is below 32767, the smallest MPI_TAG_UB the MPI standard allows.
	DefaultTag = 0x4442 // "DB"
	// DefaultWindow bounds the outstanding receive requests, and separately
	// the outstanding send requests, of one exchange.
	DefaultWindow = 32
	// DefaultChunkBytes is the size of the MPI messages a large logical
	// message is cut into (docs/WIRE.md, "Transport").
	DefaultChunkBytes = 4 << 20
	// MinChunkBytes is the smallest chunk size accepted.
	MinChunkBytes = 64 << 10
	// DefaultTimeout bounds every wait of an exchanger when Options.Timeout
	// and EnvTimeout leave it unset: a data phase in which nothing moves,
	// and each collective step (New's setup, the count exchange, the
	// agreement, Close). Long enough that the ranks' ordinary imbalance
	// (one rank's local work between two exchanges taking longer than
	// another's) and the slowest data phase of a rank stay well inside it;
	// short against the hours of an HPC job's allocation, so that a rank
	// that stops for good costs the job two minutes of it instead of the
	// rest. A solver whose ranks may arrive at an exchange further apart
	// than that raises it.
	DefaultTimeout = 120 * time.Second
	// maxTimeout bounds a timeout given as a number of seconds, far
	// beyond any job and below what a time.Duration holds.
	maxTimeout = 1e9 * time.Second

	maxChunk = math.MaxInt64 // no chunking
)

// Environment variables read by New when the matching option is zero.
const (
	// EnvChunk sets the chunk size, e.g. "8MiB", or "off" for no chunking.
	EnvChunk = "DISTBUF_MSG_CHUNK"
	// EnvWindow sets the request window, e.g. "16".
	EnvWindow = "DISTBUF_MSG_WINDOW"
	// EnvTransport sets the transport of an Options.Transport left at
	// TransportAuto: "auto", "mpi", "staged" or "nccl".
	EnvTransport = "DISTBUF_MSG_TRANSPORT"
	// EnvTimeout sets the timeout of an Options.Timeout left at 0: see
	// ParseTimeout.
	EnvTimeout = "DISTBUF_MSG_TIMEOUT"
)

// Transport says how messages travel between ranks: through MPI, or,
// between ranks of one node, through CUDA IPC windows (device memory) or
// by reads of the sender's memory (host memory).
type Transport int

const (
	// TransportAuto moves device memory between two ranks of one node
	// that both use TransportAuto on a GPU through CUDA IPC windows (two
	// device-to-device copies and an MPI notice: RouteWindow,
	// docs/WIRE.md, rule 9), host memory between two such ranks on host
	// memory by a read of the sender's memory (one copy and an MPI notice:
	// RouteRead, rule 10), and otherwise as TransportMPI.
	// Exchanger.Routes says which peers take which route.
	TransportAuto Transport = iota
	// TransportStaged always stages device memory through pinned host
	// memory, even with a CUDA-aware MPI (for measurements, or an MPI whose
	// device path is slower than staging).
	TransportStaged
	// TransportNCCL moves every message between two ranks GPU to GPU
	// through NCCL, when every rank has its own GPU and loads libnccl (New
	// decides, collectively); otherwise it is TransportMPI, and
	// Exchanger.Routes says why.
	TransportNCCL
	// TransportMPI hands device memory to MPI directly when
	// cluster.CUDAAware reports true, and stages it through pinned host
	// memory otherwise: never through node-local windows, and host memory
	// always through MPI, never by node-local reads.
	TransportMPI
)

var transportNames = []string{"auto", "staged", "nccl", "mpi"}

func (t Transport) String() string { return enumName(t, "Transport", transportNames) }

// enumName is names[v], or the type's name and the number for a value
// outside them.
func enumName[T ~int](v T, typ string, names []string) string {
	if v >= 0 && int(v) < len(names) {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", typ, int(v))
}

// Options configures an Exchanger. Comm and Alloc are required; the rest
// has defaults. Tag and the chunk size must be the same on every rank (New
// checks).
type Options struct {
	Comm  *cluster.Comm
	Alloc *devalloc.Allocator
	// Tag is the MPI tag of every message of the exchanger's exchanges; 0
	// means DefaultTag. Every rank must give the same (New checks). Each
	// exchanger has a communicator of its own (New duplicates Comm), so
	// exchangers made on one communicator may share a tag, and run at once.
	Tag int
	// Window bounds the outstanding receive requests, and separately the
	// outstanding send requests; 0 means EnvWindow, else DefaultWindow.
	Window int
	// ChunkBytes is the size of the MPI messages a logical message larger
	// than it is cut into, so that staging copies overlap the transfer. 0
	// means EnvChunk, else DefaultChunkBytes; negative means never cut.
	ChunkBytes int64
	// PayloadChecksum adds a CRC-32C of the payload to every message and
	// checks it on receipt. On device memory without staging it costs a
	// copy of the payload to the host on both sides.
	PayloadChecksum bool
	// Transport chooses how device memory travels: see Transport; 0 means
	// EnvTransport, else TransportAuto.
	Transport Transport
	// SelfViaMPI sends a rank's message to itself through MPI like any
	// other. By default it is one stream-ordered copy, without MPI.
	SelfViaMPI bool
	// Timeout bounds every wait of the exchanger, so that a rank that
	// stops (a hung driver call, a lost node) cannot hold the others for
	// ever. In a data phase it is measured from the last progress: a peer
	// that sends fewer MPI messages than it announced, or takes none of
	// this rank's, makes the exchange fail with ErrTimeout after it, while
	// a long transfer that keeps moving never times out. Each collective
	// step (New's setup, the count exchange, the agreement that ends every
	// exchange, Close) waits at most Timeout for every rank to arrive
	// (the agreement a little longer: see the package documentation,
	// "Failures"), and then fails with an error matching ErrTimeout and
	// cluster.ErrTimeout that names the ranks not heard from. So Timeout
	// must exceed how far apart the ranks arrive at an exchange, and the
	// longest data phase of any rank; a learned Pattern, which skips the
	// count exchange, waits as long in its data phase for a peer that has
	// not reached the exchange. It need not be the same on every rank. 0
	// means EnvTimeout, else DefaultTimeout; negative means no limit.
	Timeout time.Duration
}

// resolve fills in the defaults of o and checks it: the options, and the
// limits they give (the chunk size, maxChunk for none, and the timeout, 0
// for none). The timeout is resolved whatever else fails, and is
// DefaultTimeout when it cannot be: a rank whose options are bad still
// takes part in New's collectives, within a bound.
func (o Options) resolve() (Options, limits, error) {
	timeout, terr := o.resolveTimeout()
	o, chunk, err := o.resolveChunks()
	return o, limits{chunk: chunk, timeout: timeout}, errors.Join(err, terr)
}

func (o Options) resolveTimeout() (time.Duration, error) {
	t := o.Timeout
	if t == 0 {
		t = DefaultTimeout
		if v, ok := os.LookupEnv(EnvTimeout); ok {
			var err error
			if t, err = ParseTimeout(v); err != nil {
				return DefaultTimeout, err
			}
		}
	}
	return max(t, 0), nil
}

// ParseTimeout reads a timeout as EnvTimeout takes it: a Go duration
// ("90s", "2m30s"), a number of seconds ("90", "0.5"), or "off" for none
// (returned as a negative duration). Anything else is an error naming
// EnvTimeout and matching distbuf.ErrBadConfig: a timeout is positive and
// finite, so NaN, infinities, zero, negative values and values that round
// to zero nanoseconds are refused rather than read as no limit; so are
// more than a billion seconds.
func ParseTimeout(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if v == "off" {
		return -1, nil
	}
	bad := func(why string) (time.Duration, error) {
		return 0, fmt.Errorf("msg: %s=%q: %s; want a positive number of seconds, a duration such as 90s, or off: %w", EnvTimeout, v, why, distbuf.ErrBadConfig)
	}
	if secs, err := strconv.ParseFloat(v, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		ns := math.Round(secs * float64(time.Second))
		switch {
		case math.IsNaN(secs):
			return bad("not a number")
		case secs < 0 || math.Signbit(secs):
			return bad("negative")
		case math.IsInf(secs, 0) || secs > maxTimeout.Seconds():
			return bad("beyond a billion seconds")
		case secs == 0 && strings.Trim(strings.SplitN(strings.ToLower(v), "e", 2)[0], "+-0.") == "":
			return bad("zero")
		case ns < 1:
			return bad("rounds to zero nanoseconds")
		}
		return time.Duration(ns), nil
	}
	d, err := time.ParseDuration(v)
	switch {
	case err != nil:
		return bad("not a duration")
	case d < 0:
		return bad("negative")
	case d == 0:
		return bad("zero")
	}
	return d, nil
}

func (o Options) resolveChunks() (Options, int64, error) {
	if o.Comm == nil || o.Alloc == nil {
		return o, 0, fmt.Errorf("msg: Options.Comm and Options.Alloc are required: %w", distbuf.ErrInvalid)
	}
	if o.Tag == 0 {
		o.Tag = DefaultTag
	}
	maxTag, err := cluster.MaxTag()
	if err != nil {
		return o, 0, fmt.Errorf("msg: %w", err)
	}
	if o.Tag < 0 || o.Tag > maxTag {
		return o, 0, fmt.Errorf("msg: Options.Tag %d outside 0..%d: %w", o.Tag, maxTag, distbuf.ErrInvalid)
	}
	if o.Window == 0 {
		o.Window = DefaultWindow
		if v, ok := os.LookupEnv(EnvWindow); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil || n < 1 {
				return o, 0, fmt.Errorf("msg: %s=%q: want a positive number of requests: %w", EnvWindow, v, distbuf.ErrBadConfig)
			}
			o.Window = n
		}
	}
	if o.Window < 1 {
		return o, 0, fmt.Errorf("msg: Options.Window %d: want at least 1: %w", o.Window, distbuf.ErrInvalid)
	}
	chunk := o.ChunkBytes
	if chunk == 0 {
		chunk = DefaultChunkBytes
		if v, ok := os.LookupEnv(EnvChunk); ok {
			if strings.TrimSpace(v) == "off" {
				chunk = -1
			} else if chunk, err = bytesize.Parse(v); err != nil || chunk < MinChunkBytes {
				return o, 0, fmt.Errorf("msg: %s=%q: want a size of at least %s, or off: %w", EnvChunk, v, bytesize.Format(MinChunkBytes), errors.Join(distbuf.ErrBadConfig, err))
			}
		}
	}
	if chunk < 0 {
		chunk = maxChunk
	}
	if chunk < MinChunkBytes {
		return o, 0, fmt.Errorf("msg: Options.ChunkBytes %d: want at least %d bytes, or negative for none: %w", chunk, MinChunkBytes, distbuf.ErrInvalid)
	}
	if v, ok := os.LookupEnv(EnvTransport); ok && o.Transport == TransportAuto {
		switch strings.TrimSpace(v) {
		case "auto", "":
		case "staged":
			o.Transport = TransportStaged
		case "nccl":
			o.Transport = TransportNCCL
		case "mpi":
			o.Transport = TransportMPI
		default:
			return o, 0, fmt.Errorf("msg: %s=%q: want auto, mpi, staged or nccl: %w", EnvTransport, v, distbuf.ErrBadConfig)
		}
	}
	if o.Transport < TransportAuto || o.Transport > TransportMPI {
		return o, 0, fmt.Errorf("msg: Options.Transport %v: %w", o.Transport, distbuf.ErrInvalid)
	}
	return o, chunk, nil
}

package cluster

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/distbuf/distbuf"
)

// Collectives block until this rank's part is done and take Go slices: MPI
// does not keep their addresses past the call (in the funnelled design the
// slices are pinned while the nonblocking collective that carries them is
// in flight). Every rank of the communicator must call the same
// collectives in the same order with matching lengths. They are functions
// rather than methods because Go methods cannot have type parameters.

// Barrier returns once every rank of c has entered it (MPI_Barrier).
func (c *Comm) Barrier() error {
	if err := c.enter("Barrier"); err != nil {
		return err
	}
	defer exit()
	return backendBarrier(c.impl)
}

// Bcast copies root's buf into buf on every other rank of c (MPI_Bcast).
// Every rank passes the same length, which may exceed 2^31 bytes.
func Bcast[T byte | int64 | float64](c *Comm, buf []T, root int) error {
	if err := c.enter("Bcast"); err != nil {
		return err
	}
	defer exit()
	if err := c.checkPeer("Bcast root", root, false); err != nil {
		return err
	}
	b := asBytes(buf)
	lay, err := layoutFor(int64(len(b)))
	if err != nil {
		return err
	}
	return backendBcast(c.impl, b, lay, root)
}

// Allreduce combines in element-wise over all ranks of c with op and puts
// the result in out on every rank (MPI_Allreduce on MPI_INT64_T or
// MPI_DOUBLE). in and out have the same length; they may be the same
// slice (MPI_IN_PLACE) but must not otherwise overlap. For float64, Min
// and Max follow MPI: the result for a NaN input is whatever the library
// gives.
func Allreduce[T int64 | float64](c *Comm, in, out []T, op Op) error {
	if err := c.enter("Allreduce"); err != nil {
		return err
	}
	defer exit()
	inPlace, err := checkReduce("Allreduce", in, out, op)
	if err != nil {
		return err
	}
	switch in := any(in).(type) {
	case []int64:
		return backendAllreduceInt64(c.impl, in, any(out).([]int64), op, inPlace)
	case []float64:
		return backendAllreduceFloat64(c.impl, in, any(out).([]float64), op, inPlace)
	}
	panic("unreachable: Allreduce's type set is int64 and float64")
}

// Alltoall sends in[j] to rank j of c and receives rank j's value for this
// rank in out[j] (MPI_Alltoall of one 8-byte element per rank): the
// exchange of counts that precedes a variable-size exchange. in and out
// have one entry per rank.
func Alltoall[T int64 | float64](c *Comm, in, out []T) error {
	if err := c.enter("Alltoall"); err != nil {
		return err
	}
	defer exit()
	if len(in) != c.size || len(out) != c.size {
		return fmt.Errorf("cluster: Alltoall: in has %d and out %d entries, want %d (one per rank): %w", len(in), len(out), c.size, distbuf.ErrInvalid)
	}
	if overlap(in, out) {
		return fmt.Errorf("cluster: Alltoall: in and out overlap: %w", distbuf.ErrInvalid)
	}
	// Both types are 8 bytes and MPI moves them unconverted between ranks
	// of one machine type, so float64s travel as their bit patterns.
	return backendAlltoallInt64(c.impl, asInt64s(in), asInt64s(out))
}

// Allgather concatenates every rank's in, in rank order, into out on every
// rank of c (MPI_Allgather). Every rank passes the same len(in), and
// len(out) == c.Size()*len(in).
func Allgather[T byte | int64 | float64](c *Comm, in, out []T) error {
	if err := c.enter("Allgather"); err != nil {
		return err
	}
	defer exit()
	if int64(len(out)) != int64(c.size)*int64(len(in)) {
		return fmt.Errorf("cluster: Allgather: out has %d entries, want %d ranks x %d: %w", len(out), c.size, len(in), distbuf.ErrInvalid)
	}
	if overlap(in, out) {
		return fmt.Errorf("cluster: Allgather: in and out overlap: %w", distbuf.ErrInvalid)
	}
	bin := asBytes(in)
	lay, err := layoutFor(int64(len(bin)))
	if err != nil {
		return err
	}
	return backendAllgather(c.impl, bin, asBytes(out), lay)
}

// asBytes is s's memory as bytes.
func asBytes[T byte | int64 | float64](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var zero T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(zero)))
}

// asInt64s is s's memory as int64s.
func asInt64s[T int64 | float64](s []T) []int64 {
	return unsafe.Slice((*int64)(unsafe.Pointer(unsafe.SliceData(s))), len(s))
}

func checkReduce[T int64 | float64](op string, in, out []T, o Op) (inPlace bool, err error) {
	if !o.valid() {
		return false, fmt.Errorf("cluster: %s: operator %v: %w", op, o, distbuf.ErrInvalid)
	}
	if len(in) != len(out) {
		return false, fmt.Errorf("cluster: %s: in has %d and out %d entries: %w", op, len(in), len(out), distbuf.ErrInvalid)
	}
	if len(in) > math.MaxInt32 {
		return false, fmt.Errorf("cluster: %s: %d entries exceed MPI's int count: %w", op, len(in), distbuf.ErrInvalid)
	}
	if len(in) > 0 && &in[0] == &out[0] {
		return true, nil
	}
	if overlap(in, out) {
		return false, fmt.Errorf("cluster: %s: in and out overlap without being the same slice: %w", op, distbuf.ErrInvalid)
	}
	return false, nil
}

func overlap[T any](a, b []T) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	var zero T
	sz := unsafe.Sizeof(zero)
	a0 := uintptr(unsafe.Pointer(unsafe.SliceData(a)))
	b0 := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return a0 < b0+uintptr(len(b))*sz && b0 < a0+uintptr(len(a))*sz
}

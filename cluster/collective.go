package cluster

import (
	"fmt"
	"math"
	"unsafe"
)

// Collectives block until this rank's part is done and take Go slices: MPI
// does not keep their addresses past the call (in the funnelled design the
// slices are pinned while the nonblocking collective that carries them is
// in flight). Every rank of the communicator must call the same
// collectives in the same order with matching lengths.

// Barrier returns once every rank of c has entered it (MPI_Barrier).
func (c *Comm) Barrier() error {
	if err := c.enter("Barrier"); err != nil {
		return err
	}
	defer exit()
	return backendBarrier(c.impl)
}

// Bcast copies root's buf into buf on every other rank (MPI_Bcast). Every
// rank passes the same length, which may exceed 2^31 bytes.
func (c *Comm) Bcast(buf []byte, root int) error {
	if err := c.enter("Bcast"); err != nil {
		return err
	}
	defer exit()
	if err := c.checkPeer("Bcast root", root, false); err != nil {
		return err
	}
	lay, err := layoutFor(int64(len(buf)))
	if err != nil {
		return err
	}
	return backendBcast(c.impl, buf, lay, root)
}

// AllreduceInt64 combines in element-wise over all ranks with op and puts
// the result in out on every rank (MPI_Allreduce on MPI_INT64_T). in and
// out have the same length; they may be the same slice (MPI_IN_PLACE) but
// must not otherwise overlap.
func (c *Comm) AllreduceInt64(in, out []int64, op Op) error {
	if err := c.enter("AllreduceInt64"); err != nil {
		return err
	}
	defer exit()
	inPlace, err := checkReduce("AllreduceInt64", in, out, op)
	if err != nil {
		return err
	}
	return backendAllreduceInt64(c.impl, in, out, op, inPlace)
}

// AllreduceFloat64 is AllreduceInt64 on MPI_DOUBLE. Min and Max follow
// MPI: the result for a NaN input is whatever the library gives.
func (c *Comm) AllreduceFloat64(in, out []float64, op Op) error {
	if err := c.enter("AllreduceFloat64"); err != nil {
		return err
	}
	defer exit()
	inPlace, err := checkReduce("AllreduceFloat64", in, out, op)
	if err != nil {
		return err
	}
	return backendAllreduceFloat64(c.impl, in, out, op, inPlace)
}

// AlltoallInt64 sends in[j] to rank j and receives rank j's value for this
// rank in out[j] (MPI_Alltoall of one MPI_INT64_T per rank): the exchange
// of counts that precedes a variable-size exchange.
func (c *Comm) AlltoallInt64(in, out []int64) error {
	if err := c.enter("AlltoallInt64"); err != nil {
		return err
	}
	defer exit()
	if len(in) != c.size || len(out) != c.size {
		return fmt.Errorf("cluster: AlltoallInt64: in has %d and out %d entries, want %d (one per rank): %w", len(in), len(out), c.size, ErrInvalid)
	}
	if overlap(in, out) {
		return fmt.Errorf("cluster: AlltoallInt64: in and out overlap: %w", ErrInvalid)
	}
	return backendAlltoallInt64(c.impl, in, out)
}

// Allgather concatenates every rank's in, in rank order, into out on every
// rank (MPI_Allgather). Every rank passes the same len(in), and
// len(out) == Size()*len(in).
func (c *Comm) Allgather(in, out []byte) error {
	if err := c.enter("Allgather"); err != nil {
		return err
	}
	defer exit()
	if int64(len(out)) != int64(c.size)*int64(len(in)) {
		return fmt.Errorf("cluster: Allgather: out has %d bytes, want %d ranks x %d: %w", len(out), c.size, len(in), ErrInvalid)
	}
	if overlap(in, out) {
		return fmt.Errorf("cluster: Allgather: in and out overlap: %w", ErrInvalid)
	}
	lay, err := layoutFor(int64(len(in)))
	if err != nil {
		return err
	}
	return backendAllgather(c.impl, in, out, lay)
}

// AllgatherInt64 is Allgather of int64 values.
func (c *Comm) AllgatherInt64(in, out []int64) error {
	if err := c.enter("AllgatherInt64"); err != nil {
		return err
	}
	defer exit()
	if int64(len(out)) != int64(c.size)*int64(len(in)) {
		return fmt.Errorf("cluster: AllgatherInt64: out has %d entries, want %d ranks x %d: %w", len(out), c.size, len(in), ErrInvalid)
	}
	if len(in) > math.MaxInt32 {
		return fmt.Errorf("cluster: AllgatherInt64: %d entries per rank: %w", len(in), ErrTooLarge)
	}
	if overlap(in, out) {
		return fmt.Errorf("cluster: AllgatherInt64: in and out overlap: %w", ErrInvalid)
	}
	return backendAllgatherInt64(c.impl, in, out)
}

// Allgatherv concatenates every rank's in, in rank order, into out on
// every rank, where rank j contributes counts[j] bytes (MPI_Allgatherv).
// Every rank passes the same counts; counts[Rank()] == len(in) and
// len(out) is their sum, which must fit MPI's int displacements (2^31-1).
func (c *Comm) Allgatherv(in, out []byte, counts []int) error {
	if err := c.enter("Allgatherv"); err != nil {
		return err
	}
	defer exit()
	if len(counts) != c.size {
		return fmt.Errorf("cluster: Allgatherv: %d counts for %d ranks: %w", len(counts), c.size, ErrInvalid)
	}
	if counts[c.rank] != len(in) {
		return fmt.Errorf("cluster: Allgatherv: counts[%d] = %d but this rank contributes %d bytes: %w", c.rank, counts[c.rank], len(in), ErrInvalid)
	}
	c32 := make([]int32, c.size)
	d32 := make([]int32, c.size)
	var total int64
	for j, n := range counts {
		if n < 0 {
			return fmt.Errorf("cluster: Allgatherv: counts[%d] = %d: %w", j, n, ErrInvalid)
		}
		d32[j] = int32(total)
		total += int64(n)
		if total > math.MaxInt32 {
			return fmt.Errorf("cluster: Allgatherv: %d bytes or more in all exceed MPI's int displacements: %w", total, ErrTooLarge)
		}
		c32[j] = int32(n)
	}
	if total != int64(len(out)) {
		return fmt.Errorf("cluster: Allgatherv: out has %d bytes, counts sum to %d: %w", len(out), total, ErrInvalid)
	}
	if overlap(in, out) {
		return fmt.Errorf("cluster: Allgatherv: in and out overlap: %w", ErrInvalid)
	}
	return backendAllgatherv(c.impl, in, out, c32, d32)
}

func checkReduce[T int64 | float64](op string, in, out []T, o Op) (inPlace bool, err error) {
	if !o.valid() {
		return false, fmt.Errorf("cluster: %s: operator %v: %w", op, o, ErrInvalid)
	}
	if len(in) != len(out) {
		return false, fmt.Errorf("cluster: %s: in has %d and out %d entries: %w", op, len(in), len(out), ErrInvalid)
	}
	if len(in) > math.MaxInt32 {
		return false, fmt.Errorf("cluster: %s: %d entries: %w", op, len(in), ErrTooLarge)
	}
	if len(in) > 0 && &in[0] == &out[0] {
		return true, nil
	}
	if overlap(in, out) {
		return false, fmt.Errorf("cluster: %s: in and out overlap without being the same slice: %w", op, ErrInvalid)
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

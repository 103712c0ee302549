//go:build mpi

package cluster_test

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/distbuf/distbuf/cluster"
)

func unsetenv(name string) { syscall.Unsetenv(name) }

// checkLauncherLocalRank compares the node-local rank with what Open MPI's
// launcher says, when it says anything.
func checkLauncherLocalRank(t *testing.T, w *cluster.Comm) {
	for name, got := range map[string]int{
		"OMPI_COMM_WORLD_LOCAL_RANK": w.Local().Rank(),
		"OMPI_COMM_WORLD_LOCAL_SIZE": w.Local().Size(),
		"OMPI_COMM_WORLD_RANK":       w.Rank(),
		"OMPI_COMM_WORLD_SIZE":       w.Size(),
	} {
		v, ok := os.LookupEnv(name)
		if !ok {
			continue
		}
		if want, err := strconv.Atoi(v); err != nil || want != got {
			t.Errorf("%s=%s but cluster says %d", name, v, got)
		}
	}
}

func checkCUDAAwareOn(t *testing.T) {
	if aware, err := cluster.CUDAAware(); err != nil || !aware {
		t.Fatalf("%s=1: %v, %v", "DISTBUF_MPI_CUDA_AWARE", aware, err)
	}
}

// TestThreadLevel checks the design against DISTBUF_MPI_THREAD and logs it
// with the rank and world size: scripts/test-mpi.sh runs it with -test.v in
// each pass and checks the line on every rank, which shows the setting
// reached every rank and the ranks form one world (a binary launched by
// another MPI's launcher starts as separate one-rank worlds).
func TestThreadLevel(t *testing.T) {
	w := mustWorld(t)
	mode, provided, err := cluster.Threading()
	if err != nil {
		t.Fatal(err)
	}
	want := cluster.ThreadMultiple
	if m, _ := cluster.ParseThreadMode(os.Getenv("DISTBUF_MPI_THREAD")); m == cluster.ThreadFunneled {
		want = cluster.ThreadFunneled
	}
	if mode != want {
		t.Fatalf("Threading() = %v (MPI provided %s), want %v", mode, provided, want)
	}
	if mode == cluster.ThreadMultiple && provided != "MPI_THREAD_MULTIPLE" {
		t.Fatalf("multiple design with MPI providing %s", provided)
	}
	t.Logf("rank %d of %d: design %v, MPI provided %s", w.Rank(), w.Size(), mode, provided)
}

// TestGoPanicsStayRecoverable: MPI must leave Go's signal handlers in
// place (Open MPI installs its own only where none exists), or a nil
// dereference would abort the rank instead of panicking.
func TestGoPanicsStayRecoverable(t *testing.T) {
	var recovered any
	func() {
		defer func() { recovered = recover() }()
		var p *int
		_ = *p
	}()
	if recovered == nil {
		t.Fatal("nil dereference did not panic")
	}
}

func TestCUDAQuery(t *testing.T) {
	t.Setenv("DISTBUF_MPI_CUDA_AWARE", "")
	unsetenv("DISTBUF_MPI_CUDA_AWARE")
	aware, err := cluster.CUDAAware()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the MPI library reports CUDA-awareness %v", aware)
}

// hugeBytes is just over 2^31, so the count no longer fits a C int and the
// derived-datatype path carries the message.
const hugeBytes = 1<<31 + 4099

// EnvTestHuge turns on TestHugeMessage. It is off by default because on the
// CI machines (virtual machines whose first touch of fresh memory costs
// about 20 µs a page) it takes 10 to 60 seconds; the datatype arithmetic it
// relies on is checked without it by TestLayoutDatatypes.
const EnvTestHuge = "DISTBUF_TEST_HUGE"

const hugeBlock = 1 << 20

// hugeBlockPattern is block k of the message: a pattern that depends on
// sender and receiver with the block number stamped into its first bytes.
func hugeBlockPattern(dst []byte, base []byte, k int) {
	copy(dst, base)
	stamp := uint64(k) ^ 0x5a5a5a5a5a5a5a5a
	for i := 0; i < 8 && i < len(dst); i++ {
		dst[i] = byte(stamp >> (8 * i))
	}
}

// mapped is memory outside the Go heap, as devalloc's host backend hands
// out; the race detector does not shadow it, which keeps gigabyte copies
// fast.
type mapped []byte

func (m mapped) Region() (uintptr, int64, bool, error) {
	return uintptr(unsafe.Pointer(unsafe.SliceData(m))), int64(len(m)), false, nil
}

func mmapBytes(t *testing.T, n int) mapped {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_POPULATE)
	if err != nil {
		t.Fatalf("mmap %d bytes: %v", n, err)
	}
	t.Cleanup(func() {
		if !t.Failed() { // a failed test may leave MPI writing into it
			_ = syscall.Munmap(b)
		}
	})
	return b
}

// TestHugeMessage moves one message of more than 2^31 bytes: to self on
// one rank, from rank 0 to rank 1 otherwise (the other ranks stand by, to
// bound memory), and verifies it byte for byte. Opt in with
// DISTBUF_TEST_HUGE=1 (exported to every rank).
func TestHugeMessage(t *testing.T) {
	if os.Getenv(EnvTestHuge) != "1" {
		t.Skipf("set %s=1 to move a %d-byte message (10-60 s here)", EnvTestHuge, int64(hugeBytes))
	}
	w := testComm(t)
	src, dst := 0, 0
	if w.Size() > 1 {
		dst = 1
	}
	if w.Rank() != src && w.Rank() != dst {
		return
	}
	const tag = 88
	base := pattern(src, dst, tag, hugeBlock)
	var reqs []*cluster.Request
	var in mapped
	if w.Rank() == dst {
		in = mmapBytes(t, hugeBytes)
		r, err := w.Irecv(in, src, tag)
		if err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, r)
	}
	if w.Rank() == src {
		out := mmapBytes(t, hugeBytes)
		for off := 0; off < hugeBytes; off += hugeBlock {
			hugeBlockPattern(out[off:min(off+hugeBlock, hugeBytes)], base, off/hugeBlock)
		}
		r, err := w.Isend(out, dst, tag)
		if err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, r)
	}
	start := time.Now()
	if err := cluster.Waitall(reqs); err != nil {
		t.Fatal(err)
	}
	t.Logf("rank %d: Waitall took %v", w.Rank(), time.Since(start))
	if in == nil {
		return
	}
	if st, _ := reqs[0].Wait(); st != (cluster.Status{Source: src, Tag: tag, Bytes: hugeBytes}) {
		t.Fatalf("status %+v, want %d bytes from %d", st, int64(hugeBytes), src)
	}
	want := make([]byte, hugeBlock)
	for off := 0; off < hugeBytes; off += hugeBlock {
		end := min(off+hugeBlock, hugeBytes)
		hugeBlockPattern(want[:end-off], base, off/hugeBlock)
		sameBytes(t, fmt.Sprintf("message over 2^31 bytes at offset %d", off), in[off:end], want[:end-off])
	}
}

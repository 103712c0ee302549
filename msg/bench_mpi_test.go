//go:build mpi

package msg

import (
	"fmt"
	"testing"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/rawmpi"
	"github.com/distbuf/distbuf/internal/wire"
)

// BenchmarkPairExchange runs exchanges between ranks 0 and 1 (other ranks
// take part with nothing to send). Both ranks must run the same number of
// iterations, so use a fixed -test.benchtime=Nx:
//
//	go test -c -tags mpi -o msg-mpi.test ./msg
//	mpirun -n 2 msg-mpi.test -test.run '^$' -test.bench PairExchange -test.benchtime 2000x
func BenchmarkPairExchange(b *testing.B) {
	comm, err := worldB()
	if err != nil {
		b.Fatal(err)
	}
	rank := comm.Rank()
	b.Run("raw/blocks=1000", func(b *testing.B) {
		a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost})
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = a.Close() }()
		size := int64(wire.PayloadOffset(1000)) + 256000
		send, _ := a.Alloc(size, a.DefaultStream())
		recv, _ := a.Alloc(size, a.DefaultStream())
		_ = a.Sync()
		sa, _, _, _ := send.Region()
		ra, _, _, _ := recv.Region()
		b.SetBytes(size)
		_ = comm.Barrier()
		b.ResetTimer()
		for range b.N {
			if rank <= 1 {
				if _, err := rawmpi.Exchange(sa, size, ra, size, 1-rank, 5); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.StopTimer()
		_ = send.Free()
		_ = recv.Free()
	})
	for _, n := range []int{1000} {
		for _, persistent := range []bool{false, true} {
			b.Run(fmt.Sprintf("blocks=%d/persistent=%v", n, persistent), func(b *testing.B) {
				a := hostB(b)
				x, err := New(Options{Comm: comm, Alloc: a})
				if err != nil {
					b.Fatal(err)
				}
				defer func() { _ = x.Close() }()
				blocks := 0
				if rank <= 1 {
					blocks = n
				}
				bufs, free := benchSend(b, a, blocks, 1-rank)
				defer free()
				if err := comm.Barrier(); err != nil {
					b.Fatal(err)
				}
				benchExchanges(b, x, bufs, persistent)
			})
		}
	}
}

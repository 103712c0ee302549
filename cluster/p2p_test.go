package cluster_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
)

func TestWorld(t *testing.T) {
	w := mustWorld(t)
	if w.Size() < 1 || w.Rank() < 0 || w.Rank() >= w.Size() {
		t.Fatalf("rank %d of %d", w.Rank(), w.Size())
	}
	if w.Local().Size() < 1 || w.Local().Size() > w.Size() || w.Local().Rank() < 0 || w.Local().Rank() >= w.Local().Size() {
		t.Fatalf("local rank %d of %d in a world of %d", w.Local().Rank(), w.Local().Size(), w.Size())
	}
	l := w.Local()
	if l.Rank() != w.Local().Rank() || l.Size() != w.Local().Size() {
		t.Fatalf("Local() is rank %d of %d, Local().Rank()/Size() say %d of %d", l.Rank(), l.Size(), w.Local().Rank(), w.Local().Size())
	}
	// Every rank is seen exactly once.
	ranks := make([]int64, w.Size())
	if err := cluster.Allgather(w, []int64{int64(w.Rank())}, ranks); err != nil {
		t.Fatal(err)
	}
	for i, r := range ranks {
		if r != int64(i) {
			t.Fatalf("Allgather of ranks = %v", ranks)
		}
	}
	// The local communicator really counts the ranks it contains.
	n := []int64{1}
	if err := cluster.Allreduce(l, n, n, cluster.Sum); err != nil {
		t.Fatal(err)
	}
	if n[0] != int64(w.Local().Size()) {
		t.Fatalf("local communicator holds %d ranks, Local().Size() says %d", n[0], w.Local().Size())
	}
	// WorldRanks ties each local rank to its world rank: what every local
	// rank says its world rank is.
	says := make([]int64, l.Size())
	if err := cluster.Allgather(l, []int64{int64(w.Rank())}, says); err != nil {
		t.Fatal(err)
	}
	got := l.WorldRanks()
	for i, r := range says {
		if got[i] != int(r) {
			t.Fatalf("Local().WorldRanks() = %v, the local ranks say %v", got, says)
		}
	}
	if wr := w.WorldRanks(); len(wr) != w.Size() || wr[w.Rank()] != w.Rank() {
		t.Fatalf("World().WorldRanks() = %v", wr)
	}
	got[0] = -1
	if l.WorldRanks()[0] == -1 {
		t.Fatal("WorldRanks hands out the communicator's own slice")
	}
	checkLauncherLocalRank(t, w)
}

func TestRingExchange(t *testing.T) {
	w := testComm(t)
	left, right := ring(w)
	for _, n := range []int{0, 1, 7, 4096, 65536 + 3, 1<<20 + 5} {
		t.Run(fmt.Sprintf("bytes=%d", n), func(t *testing.T) {
			tag := 100 + n%1000
			out := pinned(t, pattern(w.Rank(), right, tag, n))
			in := pinned(t, make([]byte, n))
			rr, err := w.Irecv(in, left, tag)
			if err != nil {
				t.Fatal(err)
			}
			sr, err := w.Isend(out, right, tag)
			if err != nil {
				t.Fatal(err)
			}
			if err := cluster.Waitall([]*cluster.Request{rr, sr}); err != nil {
				t.Fatal(err)
			}
			// Wait on a completed request returns its status at once.
			if st := wait(t, rr); st != (cluster.Status{Source: left, Tag: tag, Bytes: int64(n)}) {
				t.Fatalf("receive status %+v, want source %d tag %d bytes %d", st, left, tag, n)
			}
			if st := wait(t, sr); st != (cluster.Status{Source: -1, Tag: tag, Bytes: int64(n)}) {
				t.Fatalf("send status %+v", st)
			}
			sameBytes(t, "received", in.Bytes(), pattern(left, w.Rank(), tag, n))
		})
	}
}

// TestSubRegion sends the middle of a buffer into the middle of another.
func TestSubRegion(t *testing.T) {
	w := testComm(t)
	left, right := ring(w)
	const tag, n = 7, 1000
	src := make([]byte, 3*n)
	copy(src[n:], pattern(w.Rank(), right, tag, n))
	out := pinned(t, src)
	dst := make([]byte, 3*n)
	in := pinned(t, dst)
	rr, err := w.Irecv(cluster.Sub(in, n, n), left, tag)
	if err != nil {
		t.Fatal(err)
	}
	sr, err := w.Isend(cluster.Sub(out, n, n), right, tag)
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.Waitall([]*cluster.Request{sr, rr}); err != nil {
		t.Fatal(err)
	}
	sameBytes(t, "middle", dst[n:2*n], pattern(left, w.Rank(), tag, n))
	sameBytes(t, "around", append(dst[:n:n], dst[2*n:]...), make([]byte, 2*n))
	if _, err := w.Isend(cluster.Sub(out, 2*n, n+1), right, tag); !errors.Is(err, distbuf.ErrInvalid) {
		t.Fatalf("Sub past the end: %v, want ErrInvalid", err)
	}
}

// TestAnySource has every rank send two tagged messages to rank 0, which
// receives them with wildcards and checks each against its status.
func TestAnySource(t *testing.T) {
	w := testComm(t)
	const n = 333
	var sends []*cluster.Request
	for k := range 2 {
		tag := 10 + k
		r, err := w.Isend(pinned(t, pattern(w.Rank(), 0, tag, n)), 0, tag)
		if err != nil {
			t.Fatal(err)
		}
		sends = append(sends, r)
	}
	if w.Rank() == 0 {
		seen := map[[2]int]bool{}
		for range 2 * w.Size() {
			buf := pinned(t, make([]byte, n))
			r, err := w.Irecv(buf, cluster.AnySource, cluster.AnyTag)
			if err != nil {
				t.Fatal(err)
			}
			st := wait(t, r)
			key := [2]int{st.Source, st.Tag}
			if seen[key] || st.Tag < 10 || st.Tag > 11 || st.Bytes != n {
				t.Fatalf("unexpected status %+v", st)
			}
			seen[key] = true
			sameBytes(t, fmt.Sprintf("from %d tag %d", st.Source, st.Tag), buf.Bytes(), pattern(st.Source, 0, st.Tag, n))
		}
	}
	if err := cluster.Waitall(sends); err != nil {
		t.Fatal(err)
	}
}

func TestTruncatedReceive(t *testing.T) {
	w := testComm(t)
	left, right := ring(w)
	for _, how := range []string{"Wait", "Waitall", "Await", "Await once"} {
		t.Run("by="+how, func(t *testing.T) {
			const tag = 31
			sr, err := w.Isend(pinned(t, pattern(w.Rank(), right, tag, 100)), right, tag)
			if err != nil {
				t.Fatal(err)
			}
			rr, err := w.Irecv(pinned(t, make([]byte, 50)), left, tag)
			if err != nil {
				t.Fatal(err)
			}
			switch how {
			case "Wait":
				_, err = rr.Wait()
			case "Waitall":
				err = cluster.Waitall([]*cluster.Request{rr})
			case "Await":
				// The call succeeds; the request carries the failure.
				done, werr := waitsome([]*cluster.Request{nil, rr}, nil)
				if werr != nil || !slices.Equal(done, []int{1}) {
					t.Fatalf("Await on a truncated receive: %v, %v; want [1] and no error", done, werr)
				}
				_, err = rr.Wait()
			case "Await once":
				for done := false; !done && err == nil; {
					done, err = completed(rr)
				}
				if err == nil {
					_, err = rr.Wait()
				}
			}
			if !errors.Is(err, distbuf.ErrInvalid) || !errors.Is(err, cluster.ErrMPI) {
				t.Fatalf("truncated receive: %v, want ErrInvalid and ErrMPI", err)
			}
			var me *cluster.MPIError
			if !errors.As(err, &me) || me.Class != "MPI_ERR_TRUNCATE" || me.Message == "" {
				t.Fatalf("error %v: want an *MPIError of class MPI_ERR_TRUNCATE with MPI's message", err)
			}
			if _, err2 := rr.Wait(); !errors.Is(err2, distbuf.ErrInvalid) {
				t.Fatalf("second Wait on the failed request: %v, want the same error", err2)
			}
			wait(t, sr)
		})
	}
}

func TestBadArguments(t *testing.T) {
	w := testComm(t)
	maxTag, err := cluster.MaxTag()
	if err != nil {
		t.Fatal(err)
	}
	if maxTag < 32767 {
		t.Fatalf("MaxTag %d below MPI's guaranteed 32767", maxTag)
	}
	buf := pinned(t, make([]byte, 8))
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"Isend to Size()", second(w.Isend(buf, w.Size(), 0)), distbuf.ErrInvalid},
		{"Isend to AnySource", second(w.Isend(buf, cluster.AnySource, 0)), distbuf.ErrInvalid},
		{"Irecv from -5", second(w.Irecv(buf, -5, 0)), distbuf.ErrInvalid},
		{"Await probing Size()+3", third(cluster.Await(nil, nil, &cluster.Probe{Comm: w, Source: w.Size() + 3}, 0)), distbuf.ErrInvalid},
		{"Bcast root Size()", cluster.Bcast(w, make([]byte, 4), w.Size()), distbuf.ErrInvalid},
		{"Isend tag -1", second(w.Isend(buf, 0, -1)), distbuf.ErrInvalid},
		{"Isend tag MaxTag+1", second(w.Isend(buf, 0, maxTag+1)), distbuf.ErrInvalid},
		{"Irecv tag -7", second(w.Irecv(buf, 0, -7)), distbuf.ErrInvalid},
		{"Isend nil memory", second(w.Isend(nil, 0, 0)), distbuf.ErrInvalid},
		{"Split color -2", second(w.Split(-2, 0)), distbuf.ErrInvalid},
		{"Free World", mustWorld(t).Free(), distbuf.ErrInvalid},
		{"Free Local", w.Local().Free(), distbuf.ErrInvalid},
		{"nil Comm", second((*cluster.Comm)(nil).Isend(buf, 0, 0)), distbuf.ErrInvalid},
		{"Wait nil", second((*cluster.Request)(nil).Wait()), distbuf.ErrInvalid},
		{"Wait zero Request", second(new(cluster.Request).Wait()), distbuf.ErrInvalid},
		{"Waitall zero Request", cluster.Waitall([]*cluster.Request{nil, {}}), distbuf.ErrInvalid},
		{"Attach to zero Request", new(cluster.Request).Attach(&countingReleaser{}), distbuf.ErrInvalid},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		} else if c.err.Error() == "" {
			t.Errorf("%s: empty message", c.name)
		}
	}
	if aware, err := cluster.CUDAAware(); err != nil {
		t.Fatal(err)
	} else if !aware {
		if _, err := w.Isend(fakeDevice{}, 0, 0); !errors.Is(err, distbuf.ErrUnavailable) {
			t.Errorf("Isend of device memory to an MPI that is not CUDA-aware: %v, want ErrUnavailable", err)
		}
	}
	released := cluster.PinBytes(make([]byte, 8))
	if err := released.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Isend(released, 0, 0); !errors.Is(err, distbuf.ErrFreed) {
		t.Errorf("Isend of released PinnedBytes: %v, want ErrFreed", err)
	}
	if err := released.Release(); !errors.Is(err, distbuf.ErrInvalid) {
		t.Errorf("second Release: %v, want ErrInvalid", err)
	}
}

func second[T any](_ T, err error) error { return err }

func third[T, U any](_ T, _ U, err error) error { return err }

func TestCUDAAwareOverride(t *testing.T) {
	w := testComm(t)
	t.Setenv("DISTBUF_MPI_CUDA_AWARE", "0")
	if aware, err := cluster.CUDAAware(); err != nil || aware {
		t.Fatalf("with DISTBUF_MPI_CUDA_AWARE=0: %v, %v", aware, err)
	}
	if _, err := w.Isend(fakeDevice{}, 0, 0); !errors.Is(err, distbuf.ErrUnavailable) {
		t.Fatalf("device memory with CUDA-awareness off: %v", err)
	}
	for _, bad := range []string{"2", "yes", ""} {
		t.Setenv("DISTBUF_MPI_CUDA_AWARE", bad)
		_, err := cluster.CUDAAware()
		if !errors.Is(err, distbuf.ErrBadConfig) || !strings.Contains(fmt.Sprint(err), fmt.Sprintf("DISTBUF_MPI_CUDA_AWARE=%q", bad)) {
			t.Fatalf("DISTBUF_MPI_CUDA_AWARE=%q: %v, want ErrBadConfig naming the variable and its value", bad, err)
		}
		if _, err := w.Isend(fakeDevice{}, 0, 0); !errors.Is(err, distbuf.ErrBadConfig) {
			t.Fatalf("device Isend with DISTBUF_MPI_CUDA_AWARE=%q: %v, want ErrBadConfig", bad, err)
		}
	}
	t.Setenv("DISTBUF_MPI_CUDA_AWARE", "1")
	checkCUDAAwareOn(t)
}

// postRecvs posts k receives from src, of 64, 128, ... bytes with tags
// tag0, tag0+1, ..., as entries 1..k of a list with a nil entry at each end.
func postRecvs(t *testing.T, w *cluster.Comm, src, tag0, k int) ([]*cluster.Request, []*cluster.PinnedBytes) {
	t.Helper()
	recvs := make([]*cluster.Request, k+2)
	bufs := make([]*cluster.PinnedBytes, k)
	for i := range k {
		bufs[i] = pinned(t, make([]byte, 64*(i+1)))
		r, err := w.Irecv(bufs[i], src, tag0+i)
		if err != nil {
			t.Fatal(err)
		}
		recvs[i+1] = r
	}
	return recvs, bufs
}

func TestWaitallAwait(t *testing.T) {
	w := testComm(t)
	left, right := ring(w)
	const k = 6
	recvs, bufs := postRecvs(t, w, left, 40, k)
	var sends []*cluster.Request
	for i := k - 1; i >= 0; i-- {
		r, err := w.Isend(pinned(t, pattern(w.Rank(), right, 40+i, 64*(i+1))), right, 40+i)
		if err != nil {
			t.Fatal(err)
		}
		sends = append(sends, r)
	}
	// Await testing once, polled: each request is reported once, when it
	// completes.
	seen := map[int]bool{}
	for len(seen) < k {
		done, m, err := cluster.Await(recvs, nil, nil, 0)
		if err != nil || m != nil {
			t.Fatal(m, err)
		}
		for _, idx := range done {
			if idx < 1 || idx > k || seen[idx] {
				t.Fatalf("Await returned index %d (seen %v)", idx, seen)
			}
			seen[idx] = true
			i := idx - 1
			if st := wait(t, recvs[idx]); st != (cluster.Status{Source: left, Tag: 40 + i, Bytes: int64(64 * (i + 1))}) {
				t.Fatalf("status %+v for request %d", st, idx)
			}
			sameBytes(t, fmt.Sprintf("message %d", i), bufs[i].Bytes(), pattern(left, w.Rank(), 40+i, 64*(i+1)))
		}
	}
	if done, m, err := cluster.Await(recvs, nil, nil, -1); len(done) != 0 || m != nil || err != nil {
		t.Fatalf("Await with nothing pending: %v %v %v, want nothing at once", done, m, err)
	}
	if err := cluster.Waitall(sends); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Waitall(nil); err != nil {
		t.Fatalf("Waitall(nil): %v", err)
	}
}

// TestAwaitSome completes receives as they arrive, some sent only after
// earlier ones were seen, so that a call returns with part of the list
// still pending; every request completes exactly once, with its status.
func TestAwaitSome(t *testing.T) {
	w := testComm(t)
	left, right := ring(w)
	const k = 6
	recvs, bufs := postRecvs(t, w, left, 60, k)
	// The first half now; the rest once Await has returned them.
	var sends []*cluster.Request
	send := func(i int) {
		r, err := w.Isend(pinned(t, pattern(w.Rank(), right, 60+i, 64*(i+1))), right, 60+i)
		if err != nil {
			t.Fatal(err)
		}
		sends = append(sends, r)
	}
	for i := range k / 2 {
		send(i)
	}
	seen := map[int]bool{}
	var done []int
	for len(seen) < k {
		var err error
		before := len(done)
		if done, err = waitsome(recvs, done); err != nil {
			t.Fatal(err)
		}
		got := done[before:]
		if len(got) == 0 || !slices.IsSorted(got) {
			t.Fatalf("Await returned %v", got)
		}
		for _, idx := range got {
			if idx < 1 || idx > k || seen[idx] {
				t.Fatalf("Await returned index %d (seen %v)", idx, seen)
			}
			seen[idx] = true
			i := idx - 1
			if st := wait(t, recvs[idx]); st != (cluster.Status{Source: left, Tag: 60 + i, Bytes: int64(64 * (i + 1))}) {
				t.Fatalf("status %+v for request %d", st, idx)
			}
			sameBytes(t, fmt.Sprintf("message %d", i), bufs[i].Bytes(), pattern(left, w.Rank(), 60+i, 64*(i+1)))
		}
		if len(seen) >= k/2 && len(sends) == k/2 {
			for i := k / 2; i < k; i++ {
				send(i)
			}
		}
	}
	if again, err := waitsome(recvs, nil); len(again) != 0 || err != nil {
		t.Fatalf("Await with nothing pending: %v %v, want nothing", again, err)
	}
	if err := cluster.Waitall(sends); err != nil {
		t.Fatal(err)
	}
}

func TestRequestMisuse(t *testing.T) {
	w := testComm(t)
	left, right := ring(w)
	const tag = 50
	rr, err := w.Irecv(pinned(t, make([]byte, 16)), left, tag)
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.Waitall([]*cluster.Request{rr, rr}); !errors.Is(err, distbuf.ErrConflict) {
		t.Fatalf("Waitall listing a request twice: %v, want ErrConflict", err)
	}
	if _, _, err := cluster.Await([]*cluster.Request{rr, nil, rr}, nil, nil, 0); !errors.Is(err, distbuf.ErrConflict) {
		t.Fatalf("Await listing a request twice: %v, want ErrConflict", err)
	}
	if err := rr.Attach(nil); !errors.Is(err, distbuf.ErrInvalid) {
		t.Fatalf("Attach(nil): %v", err)
	}
	if err := cluster.Finalize(); !errors.Is(err, distbuf.ErrConflict) {
		t.Fatalf("Finalize with a receive pending: %v, want ErrConflict", err)
	}
	if !cluster.Initialized() {
		t.Fatal("a refused Finalize shut MPI down")
	}
	before := &countingReleaser{}
	if err := rr.Attach(before); err != nil {
		t.Fatal(err)
	}
	sr, err := w.Isend(pinned(t, pattern(w.Rank(), right, tag, 16)), right, tag)
	if err != nil {
		t.Fatal(err)
	}
	st1 := wait(t, rr)
	if before.n != 1 {
		t.Fatalf("attached releaser released %d times at completion, want 1", before.n)
	}
	st2 := wait(t, rr)
	if st1 != st2 || before.n != 1 {
		t.Fatalf("second Wait: %+v then %+v, releases %d", st1, st2, before.n)
	}
	after := &countingReleaser{}
	if err := rr.Attach(after); err != nil || after.n != 1 {
		t.Fatalf("Attach after completion: err %v, releases %d, want an immediate release", err, after.n)
	}
	wait(t, sr)
}

// TestConcurrentGoroutines runs independent ring exchanges from many
// goroutines at once: the thread-safety the threading design promises.
func TestConcurrentGoroutines(t *testing.T) {
	w := testComm(t)
	left, right := ring(w)
	const workers, rounds, n = 8, 25, 512
	errc := make(chan error, workers)
	for g := range workers {
		go func() {
			errc <- func() error {
				for i := range rounds {
					tag := 1000 + g*rounds + i
					in := cluster.PinBytes(make([]byte, n))
					out := cluster.PinBytes(pattern(w.Rank(), right, tag, n))
					rr, err := w.Irecv(in, left, tag)
					if err != nil {
						return err
					}
					if err := rr.Attach(in); err != nil {
						return err
					}
					sr, err := w.Isend(out, right, tag)
					if err != nil {
						return err
					}
					if err := sr.Attach(out); err != nil {
						return err
					}
					if err := cluster.Waitall([]*cluster.Request{sr, rr}); err != nil {
						return err
					}
					want := pattern(left, w.Rank(), tag, n)
					if string(in.Bytes()) != string(want) {
						return fmt.Errorf("goroutine %d round %d: wrong bytes", g, i)
					}
				}
				return nil
			}()
		}()
	}
	for range workers {
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
}

// TestAttachDevallocHold: a buffer freed while an MPI request uses it is
// not released, nor its memory reused, until the request completes.
func TestAttachDevallocHold(t *testing.T) {
	w := testComm(t)
	left, right := ring(w)
	for _, observe := range []string{"Wait", "Await once", "Await"} {
		t.Run("by="+observe, func(t *testing.T) {
			a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost, Warn: func(string) {}})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := a.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			}()
			const n = 1 << 16
			const tag = 60
			s := a.DefaultStream()

			// The send side.
			sendBuf, err := a.Alloc(n, s)
			if err != nil {
				t.Fatal(err)
			}
			if err := a.Sync(); err != nil {
				t.Fatal(err)
			}
			raw, err := sendBuf.Bytes()
			if err != nil {
				t.Fatal(err)
			}
			fillPattern(raw, w.Rank(), right, tag)
			sendAddr, _, _, _ := sendBuf.Region()
			hold, err := sendBuf.Hold(devalloc.Read)
			if err != nil {
				t.Fatal(err)
			}
			if err := hold.Wait(); err != nil {
				t.Fatal(err)
			}
			sr, err := w.Isend(sendBuf, right, tag)
			if err != nil {
				t.Fatal(err)
			}
			if err := sr.Attach(hold); err != nil {
				t.Fatal(err)
			}
			if err := sendBuf.Free(); err != nil {
				t.Fatal(err)
			}
			if got := a.Stats().PendingFrees; got != 1 {
				t.Fatalf("PendingFrees after freeing a buffer under an Isend = %d, want 1", got)
			}
			other, err := a.Alloc(n, s)
			if err != nil {
				t.Fatal(err)
			}
			if addr, _, _, _ := other.Region(); addr == sendAddr {
				t.Fatal("memory of a buffer still held by an Isend was handed out again")
			}

			// The receive side, freed before its message arrives.
			recvBuf, err := a.Alloc(n, s)
			if err != nil {
				t.Fatal(err)
			}
			whold, err := recvBuf.Hold(devalloc.Write)
			if err != nil {
				t.Fatal(err)
			}
			if err := whold.Wait(); err != nil {
				t.Fatal(err)
			}
			rr, err := w.Irecv(recvBuf, left, tag+1)
			if err != nil {
				t.Fatal(err)
			}
			if err := rr.Attach(whold); err != nil {
				t.Fatal(err)
			}
			if err := recvBuf.Free(); err != nil {
				t.Fatal(err)
			}
			if got := a.Stats().PendingFrees; got != 2 {
				t.Fatalf("PendingFrees after freeing a buffer under an Irecv = %d, want 2", got)
			}

			// The matching receive and send, on plain pinned memory.
			got := pinned(t, make([]byte, n))
			mr, err := w.Irecv(got, left, tag)
			if err != nil {
				t.Fatal(err)
			}
			ms, err := w.Isend(pinned(t, make([]byte, n)), right, tag+1)
			if err != nil {
				t.Fatal(err)
			}
			wait(t, mr)
			wait(t, ms)
			sameBytes(t, "sent from a freed, held buffer", got.Bytes(), pattern(left, w.Rank(), tag, n))
			if got := a.Stats().PendingFrees; got != 2 {
				t.Fatalf("PendingFrees = %d before the requests were observed complete, want 2", got)
			}
			switch observe {
			case "Wait":
				wait(t, sr)
				if got := a.Stats().PendingFrees; got != 1 {
					t.Fatalf("PendingFrees after the Isend completed = %d, want 1", got)
				}
				wait(t, rr)
			case "Await once":
				for _, r := range []*cluster.Request{sr, rr} {
					for done := false; !done; {
						if done, err = completed(r); err != nil {
							t.Fatal(err)
						}
					}
				}
			case "Await":
				reqs := []*cluster.Request{sr, rr}
				var done []int
				for len(done) < 2 {
					if done, err = waitsome(reqs, done); err != nil {
						t.Fatal(err)
					}
				}
			}
			if got := a.Stats().PendingFrees; got != 0 {
				t.Fatalf("PendingFrees after both requests completed = %d, want 0", got)
			}
			if err := other.Free(); err != nil {
				t.Fatal(err)
			}
			if err := a.Sync(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestLateMessage waits for messages sent only after the waiting rank has
// given up polling and blocked (after 1 ms in the multiple design), with
// each way of waiting.
func TestLateMessage(t *testing.T) {
	w := testComm(t)
	left, right := ring(w)
	const n = 100
	for _, how := range []string{"Wait", "Waitall", "Await"} {
		t.Run("by="+how, func(t *testing.T) {
			tag := 70 + len(how)
			in := pinned(t, make([]byte, n))
			sent := make(chan *cluster.Request, 1)
			go func() {
				time.Sleep(5 * time.Millisecond)
				r, err := w.Isend(pinned(t, pattern(w.Rank(), right, tag, n)), right, tag)
				if err != nil {
					t.Error(err)
				}
				sent <- r
			}()
			var err error
			switch how {
			case "Wait", "Waitall":
				var rr *cluster.Request
				if rr, err = w.Irecv(in, left, tag); err != nil {
					t.Fatal(err)
				}
				if how == "Wait" {
					_, err = rr.Wait()
				} else {
					err = cluster.Waitall([]*cluster.Request{rr})
				}
			case "Await":
				var m *cluster.Message
				_, m, err = cluster.Await(nil, nil, &cluster.Probe{Comm: w, Source: left, Tag: tag}, -1)
				if err == nil && m.Status().Bytes != n {
					t.Fatalf("matched status %+v", m.Status())
				}
				var rr *cluster.Request
				if rr, err = m.Recv(in); err == nil {
					_, err = rr.Wait()
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			sr := <-sent
			if sr == nil {
				t.Fatal("send failed")
			}
			wait(t, sr)
			sameBytes(t, "late message", in.Bytes(), pattern(left, w.Rank(), tag, n))
		})
	}
}

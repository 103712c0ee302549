package cluster_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
)

// TestMatchedProbe receives messages of several sizes (below and far above
// Open MPI's eager limit) by matched probe: a region smaller than the
// message is refused without posting anything, and the message is then
// received whole, with the bytes around it untouched.
func TestMatchedProbe(t *testing.T) {
	w := testComm(t)
	left, right := ring(w)
	for i, n := range []int{0, 100, 5000, 1 << 20} {
		tag := 40 + i
		sr, err := w.Isend(pinned(t, pattern(w.Rank(), right, tag, n)), right, tag)
		if err != nil {
			t.Fatal(err)
		}
		var m *cluster.Message
		within(t, 30*time.Second, "Await", func() {
			for ok := false; !ok; {
				if m, ok, err = improbe(w, left, tag); err != nil {
					t.Fatal(err)
				}
			}
		})
		if st := m.Status(); st != (cluster.Status{Source: left, Tag: tag, Bytes: int64(n)}) {
			t.Fatalf("matched status %+v, want %d bytes from %d tag %d", st, n, left, tag)
		}
		if _, ok, err := improbe(w, left, tag); ok || err != nil {
			t.Fatalf("the matched message was matched again: %v %v", ok, err)
		}
		// Canaries on both sides of the region the message goes to.
		const canary = 4096
		mem := make([]byte, canary+n+canary)
		for j := range mem {
			mem[j] = 0xA5
		}
		whole := pinned(t, mem)
		if n > 0 {
			if _, err := m.Recv(cluster.Sub(whole, canary, int64(n-1))); !errors.Is(err, distbuf.ErrInvalid) {
				t.Fatalf("Recv into %d bytes of a %d-byte message: %v, want ErrInvalid", n-1, n, err)
			}
		}
		rr, err := m.Recv(cluster.Sub(whole, canary, int64(n+7)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Recv(whole); !errors.Is(err, distbuf.ErrInvalid) {
			t.Fatalf("second Recv: %v, want ErrInvalid", err)
		}
		if _, err := m.Discard(); !errors.Is(err, distbuf.ErrInvalid) {
			t.Fatalf("Discard after Recv: %v, want ErrInvalid", err)
		}
		if st := wait(t, rr); st.Bytes != int64(n) || st.Source != left {
			t.Fatalf("receive status %+v", st)
		}
		wait(t, sr)
		sameBytes(t, "matched message", mem[canary:canary+n], pattern(left, w.Rank(), tag, n))
		for j, b := range slices.Concat(mem[:canary], mem[canary+n:]) {
			if b != 0xA5 {
				t.Fatalf("message of %d bytes: canary byte %d overwritten", n, j)
			}
		}
	}
}

func TestDiscardAndAwait(t *testing.T) {
	w := testComm(t)
	left, right := ring(w)
	const tag = 50
	probe := &cluster.Probe{Comm: w, Source: cluster.AnySource, Tag: tag}
	// Nothing arrives: a timeout is neither a completion nor an error.
	start := time.Now()
	done, m, err := cluster.Await(nil, nil, probe, 30*time.Millisecond)
	if err != nil || m != nil || len(done) != 0 {
		t.Fatalf("Await with nothing sent: %v %v %v", done, m, err)
	}
	if d := time.Since(start); d < 30*time.Millisecond || d > 10*time.Second {
		t.Fatalf("Await of 30 ms returned after %v", d)
	}
	if _, m, err := cluster.Await(nil, nil, probe, 0); m != nil || err != nil {
		t.Fatalf("Await testing once: %v %v", m, err)
	}
	// No rank sends before every rank has seen nothing arrive: a rank that
	// ran ahead would put its message in a slower neighbour's empty wait.
	if err := w.Barrier(); err != nil {
		t.Fatal(err)
	}
	// A large message is matched by Await while the send is pending, then
	// discarded: the send completes and nothing else is touched.
	const n = 3 << 20
	sr, err := w.Isend(pinned(t, pattern(w.Rank(), right, tag, n)), right, tag)
	if err != nil {
		t.Fatal(err)
	}
	reqs := []*cluster.Request{nil, sr}
	var got *cluster.Message
	var dr *cluster.Request
	within(t, 60*time.Second, "Await", func() {
		for got == nil || !slices.Contains(done, 1) {
			var m *cluster.Message
			if done, m, err = cluster.Await(reqs, done, probe, -1); err != nil {
				t.Fatal(err)
			}
			if m != nil {
				if got != nil {
					t.Fatal("a second message matched")
				}
				got = m
				if st := m.Status(); st != (cluster.Status{Source: left, Tag: tag, Bytes: n}) {
					t.Fatalf("Await matched %+v", st)
				}
				if dr, err = m.Discard(); err != nil {
					t.Fatal(err)
				}
				reqs[0] = dr
			}
		}
	})
	wait(t, dr)
	if _, ok, err := improbe(w, cluster.AnySource, cluster.AnyTag); ok || err != nil {
		t.Fatalf("a message is left after the discard: %v %v", ok, err)
	}
	if _, err := got.Recv(pinned(t, make([]byte, n))); !errors.Is(err, distbuf.ErrInvalid) {
		t.Fatalf("Recv after Discard: %v, want ErrInvalid", err)
	}
	if _, _, err := cluster.Await(nil, nil, &cluster.Probe{Comm: w, Source: w.Size(), Tag: tag}, 0); !errors.Is(err, distbuf.ErrInvalid) {
		t.Fatalf("Await probing rank %d: %v, want ErrInvalid", w.Size(), err)
	}
}

package cluster_test

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/distbuf/distbuf/cluster"
)

func mustWorld(t testing.TB) *cluster.Comm {
	t.Helper()
	w, err := cluster.World()
	if err != nil {
		t.Fatalf("World: %v", err)
	}
	return w
}

// ring gives the neighbours of this rank: messages go right and come from
// the left, which on one rank is a send to self.
func ring(c *cluster.Comm) (left, right int) {
	return (c.Rank() + c.Size() - 1) % c.Size(), (c.Rank() + 1) % c.Size()
}

// pattern is the content a message from src to dst with tag carries, so a
// misrouted or reordered message cannot verify.
func pattern(src, dst, tag, n int) []byte {
	b := make([]byte, n)
	fillPattern(b, src, dst, tag)
	return b
}

func fillPattern(b []byte, src, dst, tag int) {
	r := rand.New(rand.NewPCG(uint64(src)<<40|uint64(dst)<<20|uint64(tag), uint64(len(b))))
	i := 0
	for ; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	for ; i < len(b); i++ {
		b[i] = byte(r.Uint32())
	}
}

// sameBytes fails the test at the first differing byte.
func sameBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d bytes, want %d", what, len(got), len(want))
	}
	if bytes.Equal(got, want) {
		return
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: byte %d of %d is %#x, want %#x", what, i, len(got), got[i], want[i])
		}
	}
}

// testComm is a duplicate of World for one test, freed after it, so that
// a rank running ahead into the next test cannot have its messages matched
// by this test's wildcard receives.
func testComm(t testing.TB) *cluster.Comm {
	t.Helper()
	d, err := mustWorld(t).Dup()
	if err != nil {
		t.Fatalf("Dup: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Free(); err != nil {
			t.Errorf("Free: %v", err)
		}
	})
	return d
}

// keptPinned holds the memory of tests that failed with requests possibly
// still pending: MPI may yet write into it, so it stays pinned for the
// rest of the run.
var keptPinned []*cluster.PinnedBytes

func pinned(t testing.TB, b []byte) *cluster.PinnedBytes {
	t.Helper()
	p := cluster.PinBytes(b)
	t.Cleanup(func() {
		if t.Failed() {
			keptPinned = append(keptPinned, p)
			return
		}
		_ = p.Release()
	})
	return p
}

func wait(t testing.TB, r *cluster.Request) cluster.Status {
	t.Helper()
	st, err := r.Wait()
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	return st
}

// within fails the test if fn does not return in time: a lost message
// must fail a test, not hang the run.
func within(t testing.TB, d time.Duration, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); fn() }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not finish within %v", what, d)
	}
}

// countingReleaser records releases, for Attach tests.
type countingReleaser struct{ n int }

func (c *countingReleaser) Release() error { c.n++; return nil }

// fakeDevice is device memory that must never reach MPI.
type fakeDevice struct{}

func (fakeDevice) Region() (uintptr, int64, bool, error) { return 0xdead0000, 4096, true, nil }

// completed completes r if it has completed (Await testing once) and
// reports whether it did; r's status and error then come from Wait.
func completed(r *cluster.Request) (bool, error) {
	done, _, err := cluster.Await([]*cluster.Request{r}, nil, nil, 0)
	return len(done) > 0, err
}

// waitsome waits, without a deadline, until at least one of reqs has
// completed.
func waitsome(reqs []*cluster.Request, done []int) ([]int, error) {
	done, _, err := cluster.Await(reqs, done, nil, -1)
	return done, err
}

// improbe matches a message from source with tag on c if one has arrived.
func improbe(c *cluster.Comm, source, tag int) (*cluster.Message, bool, error) {
	_, m, err := cluster.Await(nil, nil, &cluster.Probe{Comm: c, Source: source, Tag: tag}, 0)
	return m, m != nil, err
}

package cluster

import (
	"sync"
	"syscall"
	"testing"
)

// TestFunnelOneThread: every closure, polls included, runs on the one OS
// thread the funnel locked, whichever goroutine hands it over.
func TestFunnelOneThread(t *testing.T) {
	f := startFunnel(nil)
	var tid int
	f.run(func() { tid = syscall.Gettid() })
	var wg sync.WaitGroup
	var mu sync.Mutex
	var wrong int
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				check := func() {
					if syscall.Gettid() != tid {
						mu.Lock()
						wrong++
						mu.Unlock()
					}
				}
				if (g+i)%2 == 0 {
					f.run(check)
				} else {
					n := 0
					f.until(func() bool { check(); n++; return n == 3 })
				}
			}
		}()
	}
	wg.Wait()
	var stopTid int
	f.stop(func() { stopTid = syscall.Gettid() })
	if wrong != 0 || stopTid != tid {
		t.Fatalf("%d closures ran off the funnel thread; stop ran on %d, funnel on %d", wrong, stopTid, tid)
	}
}

// TestFunnelPollsInterleave: a poll waiting for something does not block
// calls handed over meanwhile, one of which makes the poll succeed (the
// case of a Wait on a receive whose matching send another goroutine posts).
func TestFunnelPollsInterleave(t *testing.T) {
	f := startFunnel(nil)
	defer f.stop(func() {})
	ready := false // touched only on the funnel thread
	done := make(chan struct{})
	go func() {
		f.until(func() bool { return ready })
		close(done)
	}()
	for range 100 {
		f.run(func() {})
	}
	f.run(func() { ready = true })
	<-done
	// Several polls complete independently.
	var wg sync.WaitGroup
	counts := make([]int, 8)
	for i := range counts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.until(func() bool { counts[i]++; return counts[i] == 10*(i+1) })
		}()
	}
	wg.Wait()
	for i, c := range counts {
		if c != 10*(i+1) {
			t.Fatalf("poll %d ran %d times", i, c)
		}
	}
}

package devalloc

import (
	"testing"
)

// An event recorded on an idle host stream is complete at once: waiting for
// it (as a hold on a fresh allocation does) wakes no goroutine.
func TestHostStreamIdleRecordCompletes(t *testing.T) {
	s := newHostStream()
	defer func() { _ = s.destroy() }()
	ev, err := s.record()
	if err != nil {
		t.Fatal(err)
	}
	if done, _ := ev.query(); !done {
		t.Fatal("an event recorded on an idle stream is not complete")
	}
	block := make(chan struct{})
	if err := s.push(func() { <-block }); err != nil {
		t.Fatal(err)
	}
	ev, err = s.record()
	if err != nil {
		t.Fatal(err)
	}
	if done, _ := ev.query(); done {
		t.Fatal("an event after pending work completed early")
	}
	close(block)
	if err := ev.synchronize(); err != nil {
		t.Fatal(err)
	}
}

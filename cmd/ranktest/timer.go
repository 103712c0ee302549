package main

import (
	"errors"
	"fmt"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cukernel"
)

// deviceTimer measures the device side of a solve with CUDA events on the
// solve's stream: mark 0 before the upload, 1 between the upload and the
// GEMMs, 2 after the GEMMs. The marks are recorded outside the timed phases.
type deviceTimer struct {
	rt     *cukernel.Runtime
	dev    int
	stream uintptr
	ev     [3]cukernel.Event
}

func newDeviceTimer(s *devalloc.Stream) (*deviceTimer, error) {
	rt, err := cukernel.Load()
	if err != nil {
		return nil, fmt.Errorf("device timer: %w", err)
	}
	t := &deviceTimer{rt: rt, dev: s.Allocator().Device(), stream: s.Handle()}
	for i := range t.ev {
		if t.ev[i], err = rt.NewEvent(t.dev); err != nil {
			return nil, errors.Join(fmt.Errorf("device timer: %w", err), t.close())
		}
	}
	return t, nil
}

// mark records event i on the stream; a nil timer (host backend) does nothing.
func (t *deviceTimer) mark(i int) error {
	if t == nil {
		return nil
	}
	return t.rt.Record(t.dev, t.ev[i], t.stream)
}

// read returns the device time from mark 0 to mark 2 and from mark 1 to
// mark 2 in microseconds, once mark 2 has completed; -1 without a timer.
func (t *deviceTimer) read() (solveUS, gemmUS float64, err error) {
	if t == nil {
		return -1, -1, nil
	}
	if err := t.rt.WaitEvent(t.dev, t.ev[2]); err != nil {
		return 0, 0, err
	}
	all, err := t.rt.Elapsed(t.dev, t.ev[0], t.ev[2])
	if err != nil {
		return 0, 0, err
	}
	g, err := t.rt.Elapsed(t.dev, t.ev[1], t.ev[2])
	return all * 1e3, g * 1e3, err
}

func (t *deviceTimer) close() error {
	var errs []error
	for _, ev := range t.ev {
		if ev != 0 {
			errs = append(errs, t.rt.DestroyEvent(t.dev, ev))
		}
	}
	return errors.Join(errs...)
}

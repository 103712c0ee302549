package main

import (
	"errors"
	"fmt"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cudart"
)

// deviceTimer measures the device side of a solve with CUDA events on the
// solve's stream: mark 0 before the upload, 1 between the upload and the
// GEMMs, 2 after the GEMMs. The marks are recorded outside the timed phases.
type deviceTimer struct {
	dev    *cudart.Device
	stream cudart.Stream
	ev     [3]cudart.Event
}

func newDeviceTimer(s *devalloc.Stream) (*deviceTimer, error) {
	rt, err := cudart.Load()
	if err != nil {
		return nil, fmt.Errorf("device timer: %w", err)
	}
	t := &deviceTimer{dev: rt.Device(s.Allocator().Info().Device), stream: cudart.Stream(s.Handle())}
	for i := range t.ev {
		if t.ev[i], err = t.dev.EventCreateTiming(); err != nil {
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
	return t.dev.EventRecord(t.ev[i], t.stream)
}

// read returns the device time from mark 0 to mark 2 and from mark 1 to
// mark 2 in microseconds, once mark 2 has completed; -1 without a timer.
func (t *deviceTimer) read() (solveUS, gemmUS float64, err error) {
	if t == nil {
		return -1, -1, nil
	}
	if err := t.dev.EventSynchronize(t.ev[2]); err != nil {
		return 0, 0, err
	}
	all, err := t.dev.EventElapsedTime(t.ev[0], t.ev[2])
	if err != nil {
		return 0, 0, err
	}
	g, err := t.dev.EventElapsedTime(t.ev[1], t.ev[2])
	return all * 1e3, g * 1e3, err
}

func (t *deviceTimer) close() error {
	var errs []error
	for _, ev := range t.ev {
		if ev != 0 {
			errs = append(errs, t.dev.EventDestroy(ev))
		}
	}
	return errors.Join(errs...)
}

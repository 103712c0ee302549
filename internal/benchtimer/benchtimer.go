// Package benchtimer times work enqueued on a devalloc stream, for the
// benchmarks of packing and gemm: between two CUDA timing events around
// the work on a device stream, by the wall clock around the work and a
// synchronisation on the host. A Timer belongs to one stream and is used
// from one goroutine; it holds no resources between calls (each device
// measurement creates and destroys its own events). ProcessCPU is the
// process's CPU time, for host benchmarks on cores that other processes
// share.
package benchtimer

import (
	"errors"
	"sort"
	"syscall"
	"time"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cudart"
)

// Timer times work on one stream.
type Timer struct {
	s   *devalloc.Stream
	dev *cudart.Device // nil on the host backend
}

// New returns a timer for work on s, a stream of a.
func New(a *devalloc.Allocator, s *devalloc.Stream) (*Timer, error) {
	t := &Timer{s: s}
	if a.Info().Backend == devalloc.BackendCUDA {
		rt, err := cudart.Load()
		if err != nil {
			return nil, err
		}
		t.dev = rt.Device(a.Info().Device)
	}
	return t, nil
}

// Name says how the timer measures: "cuda-events" or "wall-clock".
func (t *Timer) Name() string {
	if t.dev != nil {
		return "cuda-events"
	}
	return "wall-clock"
}

// MedianUS is the median time of one call of f, with the work it
// enqueues, in microseconds over n calls after one warm-up call.
func (t *Timer) MedianUS(n int, f func() error) (float64, error) {
	if err := f(); err != nil {
		return 0, err
	}
	if err := t.s.Synchronize(); err != nil {
		return 0, err
	}
	samples := make([]float64, 0, n)
	for range n {
		us, err := t.once(f)
		if err != nil {
			return 0, err
		}
		samples = append(samples, us)
	}
	return Median(samples), t.s.Synchronize()
}

func (t *Timer) once(f func() error) (float64, error) {
	if t.dev == nil {
		start := time.Now()
		if err := f(); err != nil {
			return 0, err
		}
		if err := t.s.Synchronize(); err != nil {
			return 0, err
		}
		return float64(time.Since(start).Nanoseconds()) / 1e3, nil
	}
	ms, err := t.onDevice(f)
	return ms * 1e3, err
}

// onDevice is the device time of f's work on the stream in milliseconds,
// between two timing events around it.
func (t *Timer) onDevice(f func() error) (ms float64, err error) {
	var ev [2]cudart.Event
	defer func() {
		for _, e := range ev {
			if e != 0 {
				err = errors.Join(err, t.dev.EventDestroy(e))
			}
		}
	}()
	for i := range ev {
		if ev[i], err = t.dev.EventCreateTiming(); err != nil {
			return 0, err
		}
	}
	s := cudart.Stream(t.s.Handle())
	if err := t.dev.EventRecord(ev[0], s); err != nil {
		return 0, err
	}
	if err := f(); err != nil {
		return 0, err
	}
	if err := t.dev.EventRecord(ev[1], s); err != nil {
		return 0, err
	}
	if err := t.dev.EventSynchronize(ev[1]); err != nil {
		return 0, err
	}
	return t.dev.EventElapsedTime(ev[0], ev[1])
}

// Median of xs; it sorts xs.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	m := len(xs) / 2
	if len(xs)%2 == 1 {
		return xs[m]
	}
	return (xs[m-1] + xs[m]) / 2
}

// ProcessCPU is the CPU time the process has used, user and system, every
// thread and the collector included: steadier than the wall clock for host
// work when other processes share the cores, since time spent waiting for
// a core is not counted. 0 where the system does not say.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

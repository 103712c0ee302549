package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distbuf/distbuf/devalloc"
)

// timelineEvery is the sampling period of -timeline.
const timelineEvery = 2 * time.Millisecond

// timelineSample is one line of a -timeline file. Memory lines carry the
// device's memory in use (NVML where it loads, else the allocator's
// MemInfo) and the pool's reservation and live bytes; utilization lines
// carry NVML's GPU utilization samples (the share of its sampling period in
// which a kernel ran), at the driver's own instants.
type timelineSample struct {
	T            float64 `json:"t"` // seconds since the run began
	M            int64   `json:"m"`
	Solve        int64   `json:"solve"` // solves begun
	DeviceUsed   *int64  `json:"device_used,omitempty"`
	DeviceTotal  *int64  `json:"device_total,omitempty"`
	PoolReserved *int64  `json:"pool_reserved,omitempty"`
	PoolLive     *int64  `json:"pool_live,omitempty"`
	GPUUtil      *int64  `json:"gpu_util,omitempty"` // percent
}

// deviceMonitor reads a device's memory and utilization (NVML).
type deviceMonitor interface {
	memory() (used, total int64, err error)
	// utilization returns the samples taken since the last call, each at
	// its time and in percent.
	utilization() ([]utilSample, error)
	name() string
	close() error
}

type utilSample struct {
	at  time.Time
	pct int64
}

// timeline samples rank 0's device and pool while the run goes, into a file.
type timeline struct {
	f      *os.File
	w      *bufio.Writer
	enc    *json.Encoder
	a      *devalloc.Allocator
	mon    deviceMonitor // nil where NVML is unavailable
	start  time.Time
	m      atomic.Int64
	solves atomic.Int64
	stop   chan struct{}
	done   sync.WaitGroup
	err    error
}

// timelineHeader is the first line of a -timeline file.
type timelineHeader struct {
	Policy   string `json:"policy"`
	Workload string `json:"workload"`
	Device   string `json:"device"` // the GPU's name (NVML), else the allocator's description
	Ranks    int    `json:"ranks"`
	// BallastBytes is the ballast on rank 0's device (-ballast-free),
	// part of the device memory in use.
	BallastBytes int64 `json:"ballast_bytes"`
}

// startTimeline opens path, writes the header and samples every
// timelineEvery until close. note receives the reason NVML is not used, if
// it is not.
func startTimeline(path string, a *devalloc.Allocator, header timelineHeader, note func(string)) (*timeline, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("-timeline: %w", err)
	}
	tl := &timeline{f: f, w: bufio.NewWriter(f), a: a, start: time.Now(), stop: make(chan struct{})}
	tl.enc = json.NewEncoder(tl.w)
	if a.Info().Backend == devalloc.BackendCUDA {
		if tl.mon, err = openDeviceMonitor(a.Info().Device); err != nil {
			note(fmt.Sprintf("-timeline: device memory from the CUDA runtime, no utilization: %v", err))
			tl.mon = nil
		}
	}
	if tl.mon != nil {
		header.Device = tl.mon.name()
	}
	if err := tl.enc.Encode(header); err != nil {
		return nil, errors.Join(fmt.Errorf("-timeline: %w", err), tl.closeMonitor(), f.Close())
	}
	tl.done.Add(1)
	go tl.run()
	return tl, nil
}

// at tells the timeline which solve the run is in.
func (tl *timeline) at(m int, solve int) {
	if tl == nil {
		return
	}
	tl.m.Store(int64(m))
	tl.solves.Store(int64(solve))
}

func (tl *timeline) run() {
	defer tl.done.Done()
	tick := time.NewTicker(timelineEvery)
	defer tick.Stop()
	for n := 0; ; n++ {
		tl.sample(n%100 == 0)
		select {
		case <-tl.stop:
			tl.sample(true)
			return
		case <-tick.C:
		}
	}
}

// sample writes one memory line and, when util is set, the utilization
// samples gathered since the last.
func (tl *timeline) sample(util bool) {
	if tl.err != nil {
		return
	}
	s := timelineSample{T: time.Since(tl.start).Seconds(), M: tl.m.Load(), Solve: tl.solves.Load()}
	var used, total int64
	var err error
	if tl.mon != nil {
		used, total, err = tl.mon.memory()
	} else {
		var free int64
		free, total = tl.a.MemInfo()
		used = total - free
	}
	if err == nil && total > 0 {
		s.DeviceUsed, s.DeviceTotal = &used, &total
	}
	st := tl.a.Stats()
	s.PoolReserved, s.PoolLive = &st.ReservedCurrent, &st.RequestedCurrent
	tl.err = tl.enc.Encode(s)
	if !util || tl.mon == nil || tl.err != nil {
		return
	}
	samples, err := tl.mon.utilization()
	if err != nil {
		return
	}
	for _, u := range samples {
		if u.at.Before(tl.start) {
			continue // the driver's buffer holds samples from before the run
		}
		pct := u.pct
		tl.err = errors.Join(tl.err, tl.enc.Encode(timelineSample{T: u.at.Sub(tl.start).Seconds(), M: s.M, Solve: s.Solve, GPUUtil: &pct}))
	}
}

// close stops the sampling and closes the file.
func (tl *timeline) close() error {
	if tl == nil {
		return nil
	}
	close(tl.stop)
	tl.done.Wait()
	if err := errors.Join(tl.err, tl.w.Flush(), tl.f.Close(), tl.closeMonitor()); err != nil {
		return fmt.Errorf("-timeline: %w", err)
	}
	return nil
}

func (tl *timeline) closeMonitor() error {
	if tl.mon == nil {
		return nil
	}
	return tl.mon.close()
}

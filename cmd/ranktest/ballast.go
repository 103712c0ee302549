package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/bytesize"
	"github.com/distbuf/distbuf/internal/cudart"
)

// ballastSlack is left free beside the asked-for memory: the CUDA context's
// own allocations as the run goes.
const ballastSlack = 256 << 20

// placeBallast makes each device of the job have only leaveFree bytes free,
// as maxm.cu's ballast does, so that a growing run meets the device's limit
// in a few steps: on each device the lowest rank placed on it takes the rest
// with cudaMalloc, outside every pool. It comes before the allocators open,
// so that what they reserve at once (Config.Prime) counts against the
// memory left. It is collective. The holders' release frees the ballast;
// bytes is this rank's.
func placeBallast(world *cluster.Comm, cfg config) (release func() error, bytes int64, err error) {
	none := func() error { return nil }
	if cfg.ballastFree == 0 {
		return none, 0, nil
	}
	backend := strings.ToLower(strings.TrimSpace(cfg.backend))
	if backend == "" {
		backend = strings.ToLower(strings.TrimSpace(os.Getenv("DISTBUF_BACKEND")))
	}
	if n, _ := devalloc.DeviceCount(); n == 0 || backend == string(devalloc.BackendHost) {
		return nil, 0, fmt.Errorf("-ballast-free: the host backend has no device to fill: set DISTBUF_HOST_MEMORY to the memory the run should meet")
	}
	devices := make([]int64, world.Size())
	if err := cluster.AllgatherWithin(world, []int64{int64(cfg.device)}, devices, cfg.timeout); err != nil {
		return nil, 0, err
	}
	holder := true
	for r := range world.Rank() {
		if devices[r] == devices[world.Rank()] {
			holder = false
		}
	}
	release = none
	if holder {
		if release, bytes, err = takeBallast(cfg.device, cfg.ballastFree); err != nil {
			return nil, 0, err
		}
	}
	if err := world.BarrierWithin(cfg.timeout); err != nil {
		return nil, 0, fmt.Errorf("-ballast-free: %w", err)
	}
	return release, bytes, nil
}

func takeBallast(device int, leaveFree int64) (func() error, int64, error) {
	rt, err := cudart.Load()
	if err != nil {
		return nil, 0, fmt.Errorf("-ballast-free: %w", err)
	}
	dev := rt.Device(device)
	free, _, err := dev.MemGetInfo()
	if err != nil {
		return nil, 0, fmt.Errorf("-ballast-free: %w", err)
	}
	if free <= leaveFree+ballastSlack {
		return func() error { return nil }, 0, nil
	}
	n := free - leaveFree
	p, err := dev.Malloc(n)
	if err != nil {
		return nil, 0, fmt.Errorf("-ballast-free: a ballast of %s: %w", bytesize.Format(n), err)
	}
	return func() error { return dev.Free(p) }, n, nil
}

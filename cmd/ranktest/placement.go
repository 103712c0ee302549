package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/cudart"
)

// MPS states of a rank's device, as gathered by warnSharedGPU.
const (
	mpsUnknown = -1 // the runtime cannot say (before CUDA 12.3)
	mpsOff     = 0
	mpsOn      = 1
)

// warnSharedGPU tells, once per node, which ranks share a GPU without
// NVIDIA's Multi-Process Service: the GPU then runs their processes' work in
// turns, and a solve waits for every sharing rank's turn (on an H200, 8
// ranks took 17x as long a solve as 2, against 1.85-2.60x under MPS:
// docs/PERFORMANCE.md). Collective over the node's ranks.
func warnSharedGPU(world *cluster.Comm, a *devalloc.Allocator, timeout time.Duration, out io.Writer) error {
	local := world.Local()
	row := []int64{int64(world.Rank()), placementOf(a), mpsUnknown}
	if a.Info().Backend == devalloc.BackendCUDA {
		if rt, err := cudart.Load(); err == nil {
			if v, err := rt.Device(a.Info().Device).Attribute(cudart.AttrMPSEnabled); err == nil {
				row[2] = mpsOff
				if v == 1 {
					row[2] = mpsOn
				}
			}
		}
	}
	rows := make([]int64, 3*local.Size())
	if err := cluster.AllgatherWithin(local, row, rows, timeout); err != nil {
		return fmt.Errorf("placement: %w", err)
	}
	if local.Rank() != 0 {
		return nil
	}
	byDevice := map[int64][]string{}
	var order []int64
	for i := range local.Size() {
		r := rows[3*i : 3*i+3]
		if r[1] < 0 || r[2] != mpsOff {
			continue
		}
		if _, ok := byDevice[r[1]]; !ok {
			order = append(order, r[1])
		}
		byDevice[r[1]] = append(byDevice[r[1]], fmt.Sprint(r[0]))
	}
	for _, dev := range order {
		if ranks := byDevice[dev]; len(ranks) > 1 {
			fmt.Fprintf(out, "ranktest: ranks %s share CUDA device %d without MPS: the GPU runs their processes' work in turns, and each solve waits for every one's turn; start the MPS daemon (nvidia-cuda-mps-control -d) before mpirun, or run one rank per GPU\n",
				strings.Join(ranks, ", "), dev)
		}
	}
	return nil
}

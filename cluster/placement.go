package cluster

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/distbuf/distbuf"
)

// deviceFor maps a local rank (the rank within the node) to a GPU ordinal
// among the visible GPUs: round robin, localRank % visible, unless the
// environment says otherwise.
//
// DISTBUF_GPU_MAP="0,1,1,0" gives the ordinal of each local rank in turn (it
// must have an entry for this rank); DISTBUF_DEVICE="N" puts every rank on
// ordinal N. Setting both is an error, as is an ordinal outside
// 0..visible-1.
func deviceFor(localRank, visible int) (int, error) {
	if localRank < 0 {
		return 0, fmt.Errorf("cluster: Device: local rank %d: %w", localRank, distbuf.ErrInvalid)
	}
	if visible <= 0 {
		return 0, fmt.Errorf("cluster: Device: %d visible GPUs: %w", visible, distbuf.ErrUnavailable)
	}
	mapping, haveMap := os.LookupEnv(envGPUMap)
	device, haveDevice := os.LookupEnv(envDevice)
	if haveMap && haveDevice {
		return 0, envError(envGPUMap, mapping, "set together with "+envDevice+"; set only one")
	}
	if haveDevice {
		d, err := parseOrdinal(device, visible)
		if err != nil {
			return 0, envError(envDevice, device, err.Error())
		}
		return d, nil
	}
	if haveMap {
		fields := strings.Split(mapping, ",")
		ords := make([]int, len(fields))
		for i, f := range fields {
			d, err := parseOrdinal(f, visible)
			if err != nil {
				return 0, envError(envGPUMap, mapping, fmt.Sprintf("entry %d: %v", i, err))
			}
			ords[i] = d
		}
		if localRank >= len(ords) {
			return 0, envError(envGPUMap, mapping, fmt.Sprintf("%d entries, but local rank %d needs entry %d", len(ords), localRank, localRank))
		}
		return ords[localRank], nil
	}
	return localRank % visible, nil
}

func parseOrdinal(s string, visible int) (int, error) {
	d, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("%q is not a GPU ordinal", s)
	}
	if d < 0 || d >= visible {
		return 0, fmt.Errorf("ordinal %d outside 0..%d (%d visible GPUs)", d, visible-1, visible)
	}
	return d, nil
}

// Device is the GPU ordinal this rank should use among the visible GPUs:
// round robin over the ranks of c on this node (c.Local().Rank() %
// visible), unless DISTBUF_GPU_MAP or DISTBUF_DEVICE says otherwise (see
// the package documentation). visible is the number of GPUs the process
// sees (after CUDA_VISIBLE_DEVICES); this package does not call CUDA, so
// the caller passes it. No visible GPU is an error matching
// distbuf.ErrUnavailable, a malformed variable one matching
// distbuf.ErrBadConfig.
func (c *Comm) Device(visible int) (int, error) {
	if c == nil {
		return 0, fmt.Errorf("cluster: Device on a nil communicator: %w", distbuf.ErrInvalid)
	}
	return deviceFor(c.local.rank, visible)
}

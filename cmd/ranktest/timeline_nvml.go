//go:build cgo

package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvmlMonitor reads one device through NVML, which go-nvml loads
// (libnvidia-ml.so.1) at Init, so that the program builds and runs where
// there is none.
type nvmlMonitor struct {
	dev      nvml.Device
	lastSeen uint64
}

// openDeviceMonitor opens the NVML device of CUDA ordinal ord: the NVML
// index CUDA_VISIBLE_DEVICES maps it to, or ord itself (the two orders
// agree on a node of one kind of GPU).
func openDeviceMonitor(ord int) (deviceMonitor, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml: init: %s", nvml.ErrorString(ret))
	}
	index := ord
	if v := os.Getenv("CUDA_VISIBLE_DEVICES"); v != "" {
		list := strings.Split(v, ",")
		if ord < len(list) {
			if i, err := strconv.Atoi(strings.TrimSpace(list[ord])); err == nil {
				index = i
			}
		}
	}
	dev, ret := nvml.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		_ = nvml.Shutdown()
		return nil, fmt.Errorf("nvml: device %d: %s", index, nvml.ErrorString(ret))
	}
	return &nvmlMonitor{dev: dev}, nil
}

func (n *nvmlMonitor) memory() (used, total int64, err error) {
	mem, ret := n.dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return 0, 0, fmt.Errorf("nvml: memory: %s", nvml.ErrorString(ret))
	}
	return int64(mem.Used), int64(mem.Total), nil
}

func (n *nvmlMonitor) utilization() ([]utilSample, error) {
	_, samples, ret := n.dev.GetSamples(nvml.GPU_UTILIZATION_SAMPLES, n.lastSeen)
	if ret == nvml.ERROR_NOT_FOUND {
		return nil, nil // no sample since the last call
	}
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml: utilization samples: %s", nvml.ErrorString(ret))
	}
	out := make([]utilSample, 0, len(samples))
	for _, s := range samples {
		if s.TimeStamp <= n.lastSeen {
			continue
		}
		n.lastSeen = s.TimeStamp
		// Utilization samples are unsigned ints, in the value's first word.
		pct := int64(uint32(s.SampleValue[0]) | uint32(s.SampleValue[1])<<8 | uint32(s.SampleValue[2])<<16 | uint32(s.SampleValue[3])<<24)
		out = append(out, utilSample{at: time.UnixMicro(int64(s.TimeStamp)), pct: pct})
	}
	return out, nil
}

func (n *nvmlMonitor) name() string {
	name, ret := n.dev.GetName()
	if ret != nvml.SUCCESS {
		return "unnamed GPU"
	}
	return name
}

func (n *nvmlMonitor) close() error {
	if ret := nvml.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("nvml: shutdown: %s", nvml.ErrorString(ret))
	}
	return nil
}

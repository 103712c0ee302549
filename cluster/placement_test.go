package cluster_test

import (
	"errors"
	"testing"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
)

func TestDeviceFor(t *testing.T) {
	cases := []struct {
		gpuMap, device string // "-" leaves the variable unset
		localRank, vis int
		want           int
		err            error
	}{
		{"-", "-", 0, 1, 0, nil},
		{"-", "-", 5, 4, 1, nil},
		{"-", "-", 3, 8, 3, nil},
		{"-", "-", 0, 0, 0, distbuf.ErrUnavailable},
		{"-", "-", -1, 2, 0, distbuf.ErrInvalid},
		{"1,0", "-", 0, 2, 1, nil},
		{" 1 , 0 ", "-", 1, 2, 0, nil},
		{"1,0", "-", 2, 2, 0, distbuf.ErrBadConfig},
		{"0,2", "-", 0, 2, 0, distbuf.ErrBadConfig},
		{"0,x", "-", 0, 2, 0, distbuf.ErrBadConfig},
		{"", "-", 0, 2, 0, distbuf.ErrBadConfig},
		{"-", "1", 3, 2, 1, nil},
		{"-", "2", 0, 2, 0, distbuf.ErrBadConfig},
		{"-", "-1", 0, 2, 0, distbuf.ErrBadConfig},
		{"0", "0", 0, 2, 0, distbuf.ErrBadConfig},
	}
	for _, c := range cases {
		setOrUnset(t, "DISTBUF_GPU_MAP", c.gpuMap)
		setOrUnset(t, "DISTBUF_DEVICE", c.device)
		got, err := cluster.DeviceFor(c.localRank, c.vis)
		if c.err != nil {
			if !errors.Is(err, c.err) {
				t.Errorf("map %q device %q rank %d of %d GPUs: %v, want %v", c.gpuMap, c.device, c.localRank, c.vis, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("map %q device %q rank %d of %d GPUs: %d, %v; want %d", c.gpuMap, c.device, c.localRank, c.vis, got, err, c.want)
		}
	}
	setOrUnset(t, "DISTBUF_GPU_MAP", "-")
	setOrUnset(t, "DISTBUF_DEVICE", "-")
	w := mustWorld(t)
	if d, err := w.Device(1); err != nil || d != 0 {
		t.Fatalf("Device(1) = %d, %v", d, err)
	}
	if d, err := w.Device(w.Local().Size()); err != nil || d != w.Local().Rank() {
		t.Fatalf("Device(LocalSize) = %d, %v; want the local rank %d", d, err, w.Local().Rank())
	}
}

func setOrUnset(t *testing.T, name, v string) {
	t.Setenv(name, v) // registers the restore
	if v == "-" {
		unsetenv(name)
	}
}

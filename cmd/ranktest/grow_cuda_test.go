//go:build cgo

package main

import (
	"testing"

	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/cudart/cudarttest"
	"github.com/stretchr/testify/require"
)

// TestGrowingRunFakeCUDA: on the fake driver's 2 GiB device, a ballast
// leaves 512 MiB free and the growing run ends when that is full, under
// every policy, with the ballast counted and the device's free memory never
// above what the ballast left.
func TestGrowingRunFakeCUDA(t *testing.T) {
	t.Setenv(cudart.EnvCUDART, cudarttest.Build(t, "FAKE_MEMORY=2147483648"))
	for _, p := range []string{"free", "retain", "auto"} {
		sum, out := growRun(t, config{backend: "cuda", policy: p, m: 256, growConfig: growConfig{grow: 1.12, probe: true, ballastFree: 512 << 20}})
		require.Equal(t, "cuda-pool", sum.Backend, out)
		require.Equal(t, "out of memory", sum.EndedBy, out)
		require.EqualValues(t, 2<<30-512<<20, sum.BallastBytes)
		last := sum.Steps[len(sum.Steps)-1]
		require.LessOrEqual(t, last.WorkingSetBytes, int64(512<<20), out)
		require.Greater(t, last.WorkingSetBytes, int64(256<<20), "%s: the run got near the ballast's limit:\n%s", p, out)
		for _, s := range sum.Steps {
			require.LessOrEqual(t, s.DeviceFreeBytes, int64(512<<20))
			require.LessOrEqual(t, s.LargestAllocBytes, int64(512<<20))
		}
	}
}

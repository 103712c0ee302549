//go:build cgo

package nvrtc

import (
	"bytes"
	"testing"

	"github.com/distbuf/distbuf/internal/gputest"
	"github.com/stretchr/testify/require"
)

func loadOrSkip(t *testing.T) *Lib {
	t.Helper()
	l, err := Load()
	if err != nil {
		gputest.Unavailable(t, "NVRTC", err)
	}
	return l
}

func TestLoadMissingLibrary(t *testing.T) {
	t.Setenv(EnvNVRTC, "libnvrtc-does-not-exist.so.99")
	_, err := load()
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorContains(t, err, "libnvrtc-does-not-exist.so.99")
}

const src = `extern "C" __global__ void add_one(float *x, int n) {
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) x[i] += 1.0f;
}`

func TestCompile(t *testing.T) {
	l := loadOrSkip(t)
	major, minor := l.Version()
	t.Logf("%s %d.%d", l.Library(), major, minor)
	ptx, err := l.Compile(src, "add_one.cu", []string{"--gpu-architecture=compute_90"}, false)
	require.NoError(t, err)
	require.True(t, bytes.Contains(ptx, []byte(".entry add_one")), "PTX names the kernel")
	cubin, err := l.Compile(src, "add_one.cu", []string{"--gpu-architecture=sm_90"}, true)
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(cubin, []byte("\x7fELF")), "a CUBIN is an ELF image")
	_, err = l.Compile("this is not CUDA", "bad.cu", []string{"--gpu-architecture=sm_90"}, true)
	require.ErrorIs(t, err, ErrCompile)
	require.ErrorContains(t, err, "bad.cu")
}

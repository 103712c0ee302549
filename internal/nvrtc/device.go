package nvrtc

import (
	"fmt"

	"github.com/distbuf/distbuf/internal/cudart"
)

// CompileFor compiles src to a cubin for d's architecture, after checking
// that d's runtime can launch kernels from a library: the one way the
// project's kernels reach a device. file names the source in compile logs.
func CompileFor(d *cudart.Device, src, file string) ([]byte, error) {
	rt := d.Runtime()
	if !rt.Capabilities().KernelLaunch {
		return nil, fmt.Errorf("%s (runtime %s) cannot launch library kernels (CUDA 12.8 or later needed): %w",
			rt.Path(), cudart.FormatVersion(rt.RuntimeVersion()), cudart.ErrNotSupported)
	}
	major, minor, err := d.ComputeCapability()
	if err != nil {
		return nil, err
	}
	nv, err := Load()
	if err != nil {
		return nil, err
	}
	return nv.Compile(src, file, []string{fmt.Sprintf("--gpu-architecture=sm_%d%d", major, minor)}, true)
}

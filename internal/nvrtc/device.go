package nvrtc

import (
	"fmt"
	"sync"

	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/dl"
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

// Kernels compiles src (file names it in compile logs) for d's
// architecture and loads the named kernels from the image, once per
// runtime, device and file: a failure is kept too, so that a caller falls
// back without compiling again.
func Kernels(d *cudart.Device, src, file string, names ...string) ([]cudart.Kernel, error) {
	v, _ := loadedKernels.LoadOrStore(kernelsKey{d.Runtime(), d.Ordinal(), file}, new(dl.Lazy[[]cudart.Kernel]))
	return v.(*dl.Lazy[[]cudart.Kernel]).Get(func() ([]cudart.Kernel, error) {
		image, err := CompileFor(d, src, file)
		if err != nil {
			return nil, err
		}
		return d.LoadKernels(image, names...)
	})
}

// kernelsKey names a source on a device of one loaded runtime: a kernel
// loaded through one libcudart is not a handle another knows.
type kernelsKey struct {
	rt   *cudart.Runtime
	dev  int
	file string
}

var loadedKernels sync.Map // kernelsKey -> *dl.Lazy[[]cudart.Kernel]

// Package cudafake builds CPU stand-ins for libcudart, libnvrtc and
// libcublas (the subsets distbuf's loaders bind) so that the loaders' C
// trampolines, argument order and error paths are exercised on machines
// without a GPU. The stand-ins are C sources compiled with the system C
// compiler when a test asks for them; they follow the documented prototypes
// and reject the arguments the real libraries reject. Tests only: the real
// libraries are always preferred, and never replaced when
// DISTBUF_REQUIRE_GPU=1.
package cudafake

import (
	"embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/distbuf/distbuf/internal/dl"
)

//go:embed csrc/*.c
var sources embed.FS

// The loaders' override variables (internal/cukernel, internal/nvrtc,
// internal/cublas).
const (
	envCUDART = "DISTBUF_CUDART"
	envNVRTC  = "DISTBUF_NVRTC"
	envCUBLAS = "DISTBUF_CUBLAS"
)

// Setup decides, for a test binary, between the real CUDA libraries and the
// stand-ins: when DISTBUF_REQUIRE_GPU is not 1, no override is set and no
// CUDA runtime loads, it builds the stand-ins into a temporary directory and
// points the loaders' override variables at them. It returns a description
// of the choice and a cleanup function.
func Setup() (string, func(), error) {
	nothing := func() {}
	if os.Getenv("DISTBUF_REQUIRE_GPU") == "1" {
		return "real CUDA libraries (DISTBUF_REQUIRE_GPU=1)", nothing, nil
	}
	if os.Getenv(envCUDART) != "" {
		return "CUDA runtime from " + envCUDART, nothing, nil
	}
	if lib, err := dl.Open("", "libcudart.so.13", "libcudart.so.12"); err == nil {
		_ = lib.Close()
		return "real CUDA libraries", nothing, nil
	}
	dir, err := os.MkdirTemp("", "cudafake")
	if err != nil {
		return "", nothing, err
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	for _, lib := range []struct{ src, env string }{
		{"fakecudart.c", envCUDART}, {"fakenvrtc.c", envNVRTC}, {"fakecublas.c", envCUBLAS},
	} {
		out, err := build(dir, lib.src)
		if err != nil {
			cleanup()
			return "", nothing, err
		}
		if err := os.Setenv(lib.env, out); err != nil {
			cleanup()
			return "", nothing, err
		}
	}
	return "CPU stand-ins for libcudart, libnvrtc and libcublas in " + dir, cleanup, nil
}

func build(dir, name string) (string, error) {
	src, err := sources.ReadFile("csrc/" + name)
	if err != nil {
		return "", err
	}
	cfile := filepath.Join(dir, name)
	if err := os.WriteFile(cfile, src, 0o600); err != nil {
		return "", err
	}
	out := filepath.Join(dir, "lib"+name[:len(name)-2]+".so")
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	cmd := exec.Command(cc, "-shared", "-fPIC", "-O1", "-o", out, cfile, "-lm")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("cudafake: %s: %v: %s", cmd, err, msg)
	}
	return out, nil
}

// Main is the TestMain of a package whose tests load CUDA libraries: it runs
// them on the real libraries when they load and on the stand-ins otherwise,
// so the loaders' C trampolines run on machines without a GPU too.
// DISTBUF_TEST_SAY_CUDA=1 prints which it chose.
func Main(m *testing.M) {
	how, cleanup, err := Setup()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cudafake:", err)
	} else if os.Getenv("DISTBUF_TEST_SAY_CUDA") != "" {
		fmt.Println("CUDA:", how)
	}
	code := m.Run()
	cleanup()
	os.Exit(code)
}

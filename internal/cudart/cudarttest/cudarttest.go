// Package cudarttest builds the fake CUDA libraries of internal/cudart/testdata
// for tests: a libcudart that runs "device" work on the host with
// asynchronous streams, events, kernels and IPC between processes
// (fakecudart.c), and stand-ins for libnvrtc (fakenvrtc.c) and libcublas
// (fakecublas.c) that work with it. With them the CUDA code paths of
// devalloc, packing, gemm and msg run on machines without a GPU.
//
// The libraries are compiled with the system C compiler from the sources in
// the repository, so a test binary must run inside it. Build and its
// siblings put a library in the test's temporary directory, which owns it;
// Main builds all three once for a test binary and removes them when the
// binary exits. A missing compiler or source fails the test: a build that
// can run cgo has a compiler, and silently dropping the CUDA variants would
// hide what they test.
package cudarttest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/gputest"
)

// The fakes' sources, relative to the module root.
const (
	Source       = "internal/cudart/testdata/fakecudart.c"
	SourceNVRTC  = "internal/cudart/testdata/fakenvrtc.c"
	SourceCUBLAS = "internal/cudart/testdata/fakecublas.c"
)

// The loaders' override variables, which Main points at the fakes
// (internal/cudart, internal/nvrtc, internal/cublas).
const (
	EnvNVRTC  = "DISTBUF_NVRTC"
	EnvCUBLAS = "DISTBUF_CUBLAS"
)

// FindSource looks for the fake libcudart's source from the working
// directory up to the module root (go test runs in the package directory;
// a prebuilt test binary must be started inside the repository).
func FindSource() (string, error) { return find(Source) }

func find(rel string) (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, rel)
			if _, err := os.Stat(p); err != nil {
				return "", err
			}
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// compile builds the source rel into out as a shared library.
func compile(rel, out string, defines []string, libs ...string) error {
	src, err := find(rel)
	if err != nil {
		return fmt.Errorf("cudarttest: the fake's source %s is not found (run the test inside the repository): %w", rel, err)
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		if cc, err = exec.LookPath("cc"); err != nil {
			return fmt.Errorf("cudarttest: no C compiler (gcc or cc) to build %s: %w", rel, err)
		}
	}
	args := []string{"-shared", "-fPIC", "-O1", "-Wall", "-o", out, src}
	for _, d := range defines {
		args = append(args, "-D"+d)
	}
	args = append(args, libs...)
	cmd := exec.Command(cc, args...)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("cudarttest: %s %s: %w\n%s", cc, strings.Join(args, " "), err, msg)
	}
	return nil
}

// Build compiles the fake libcudart with the given -D definitions (without
// the -D; fakecudart.c lists them) into the test's temporary directory and
// returns the library's path.
func Build(tb testing.TB, defines ...string) string {
	tb.Helper()
	out := filepath.Join(tb.TempDir(), "libcudart-fake.so")
	if err := compile(Source, out, defines, "-lpthread"); err != nil {
		tb.Fatal(err)
	}
	return out
}

// BuildNVRTC compiles the fake libnvrtc into the test's temporary directory.
func BuildNVRTC(tb testing.TB) string {
	tb.Helper()
	out := filepath.Join(tb.TempDir(), "libnvrtc-fake.so")
	if err := compile(SourceNVRTC, out, nil); err != nil {
		tb.Fatal(err)
	}
	return out
}

// BuildCUBLAS compiles the fake libcublas into the test's temporary
// directory. It works on the streams of the fake libcudart named by
// DISTBUF_CUDART, which must be loaded before the first cublasCreate.
func BuildCUBLAS(tb testing.TB) string {
	tb.Helper()
	out := filepath.Join(tb.TempDir(), "libcublas-fake.so")
	if err := compile(SourceCUBLAS, out, nil, "-ldl", "-lpthread"); err != nil {
		tb.Fatal(err)
	}
	return out
}

// Libraries is Setup's choice of CUDA libraries for a test binary.
type Libraries struct {
	// Fake: the fakes are in use, at the paths below, which Setup also put
	// in DISTBUF_CUDART, DISTBUF_NVRTC and DISTBUF_CUBLAS.
	Fake                  bool
	CUDART, NVRTC, CUBLAS string
	// How says which libraries and why, for a log line.
	How string
}

// Setup chooses, for a test binary, between the real CUDA libraries and the
// fakes: the real ones under DISTBUF_REQUIRE_GPU=1, when DISTBUF_CUDART
// names a runtime, or when the machine's libcudart loads and sees a device;
// otherwise it builds the three fakes into a temporary directory and points
// DISTBUF_CUDART, DISTBUF_NVRTC and DISTBUF_CUBLAS at them. It returns the
// choice and a cleanup function that removes the fakes; an error means the
// fakes could not be built (no compiler, no source), which a test binary
// must report as a failure.
func Setup() (Libraries, func(), error) {
	nothing := func() {}
	switch {
	case gputest.Required():
		return Libraries{How: "real CUDA libraries (" + gputest.EnvRequireGPU + "=1)"}, nothing, nil
	case os.Getenv(cudart.EnvCUDART) != "":
		return Libraries{How: "the CUDA runtime in " + cudart.EnvCUDART}, nothing, nil
	}
	if rt, err := cudart.Load(); err == nil {
		if n, err := rt.DeviceCount(); err == nil && n > 0 {
			return Libraries{How: "real CUDA libraries (" + rt.Path() + ")"}, nothing, nil
		}
	}
	dir, err := os.MkdirTemp("", "cudarttest")
	if err != nil {
		return Libraries{}, nothing, fmt.Errorf("cudarttest: %w", err)
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	libs := Libraries{Fake: true, How: "fake libcudart, libnvrtc and libcublas in " + dir}
	for _, lib := range []struct {
		src, env, name string
		path           *string
		libs           []string
	}{
		{Source, cudart.EnvCUDART, "libcudart-fake.so", &libs.CUDART, []string{"-lpthread"}},
		{SourceNVRTC, EnvNVRTC, "libnvrtc-fake.so", &libs.NVRTC, nil},
		{SourceCUBLAS, EnvCUBLAS, "libcublas-fake.so", &libs.CUBLAS, []string{"-ldl", "-lpthread"}},
	} {
		out := filepath.Join(dir, lib.name)
		if err := compile(lib.src, out, nil, lib.libs...); err != nil {
			cleanup()
			return Libraries{}, nothing, err
		}
		if err := os.Setenv(lib.env, out); err != nil {
			cleanup()
			return Libraries{}, nothing, fmt.Errorf("cudarttest: %w", err)
		}
		*lib.path = out
	}
	return libs, cleanup, nil
}

// Main is the TestMain of a package whose tests use the CUDA libraries: it
// runs them on the real libraries or the fakes as Setup decides, and fails
// the binary when the fakes cannot be built. DISTBUF_TEST_SAY_CUDA=1 prints
// the choice.
func Main(m *testing.M) {
	libs, cleanup, err := Setup()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if os.Getenv("DISTBUF_TEST_SAY_CUDA") != "" {
		fmt.Println("CUDA:", libs.How)
	}
	code := m.Run()
	cleanup()
	os.Exit(code)
}

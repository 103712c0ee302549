// Package cudarttest builds the fake libcudart of internal/cudart/testdata
// for tests: a host-memory stand-in with asynchronous streams, so the CUDA
// code paths run on machines without a GPU. The built library belongs to
// the test's temporary directory.
package cudarttest

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Source is the fake's C source, relative to the module root.
const Source = "internal/cudart/testdata/fakecudart.c"

// FindSource looks for the fake's source from the working directory up to
// the module root (go test runs in the package directory; a prebuilt test
// binary must be started inside the repository).
func FindSource() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, Source)
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

// Build compiles the fake with gcc and the given -D definitions (without
// the -D) into a temporary directory and returns the library's path. It
// skips the test, with the reason, when gcc or the source is missing.
func Build(tb testing.TB, defines ...string) string {
	tb.Helper()
	src, err := FindSource()
	if err != nil {
		tb.Skipf("fake libcudart source not found (%v): run the test inside the repository", err)
	}
	cc, err := exec.LookPath("gcc")
	if err != nil {
		if cc, err = exec.LookPath("cc"); err != nil {
			tb.Skip("no C compiler (gcc or cc) to build the fake libcudart")
		}
	}
	out := filepath.Join(tb.TempDir(), "libcudart-fake.so")
	args := []string{"-shared", "-fPIC", "-O1", "-Wall", "-o", out, src, "-lpthread"}
	for _, d := range defines {
		args = append(args, "-D"+d)
	}
	cmd := exec.Command(cc, args...)
	if msg, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("build fake libcudart (%s %s): %v\n%s", cc, strings.Join(args, " "), err, msg)
	}
	return out
}

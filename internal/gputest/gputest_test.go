package gputest

import (
	"errors"
	"fmt"
	"testing"

	"github.com/distbuf/distbuf/internal/cudart"
	"github.com/distbuf/distbuf/internal/dl"
)

func TestAbsent(t *testing.T) {
	notFound := &dl.NotFoundError{Candidates: []string{"libcudart.so.13"}, Reasons: []string{"cannot open shared object file"}}
	for _, tc := range []struct {
		name   string
		err    error
		absent bool
	}{
		{"no library", &cudart.LoadError{Cause: notFound}, true},
		{"no library, wrapped", fmt.Errorf("devalloc: open: %w", &cudart.LoadError{Cause: notFound}), true},
		{"no cgo", &cudart.LoadError{Cause: dl.ErrNoCgo}, true},
		{"no device", &cudart.Error{Op: "cudaGetDeviceCount", Code: 100}, true},
		{"old driver", &cudart.Error{Op: "cudaGetDeviceCount", Code: 35}, true},
		{"marked", fmt.Errorf("%w: one device, the test needs two", ErrAbsent), true},
		{"missing symbol", &cudart.LoadError{Cause: &dl.MissingSymbolsError{Library: "libcudart.so.13", Names: []string{"cudaMalloc"}}}, false},
		{"out of memory", &cudart.Error{Op: "cudaMalloc", Code: 2}, false},
		{"not supported", &cudart.Error{Op: "cudaLaunchKernel", Code: 801}, false},
		{"any other", errors.New("cuda: something broke"), false},
		{"nil", nil, false},
	} {
		if got := Absent(tc.err); got != tc.absent {
			t.Errorf("%s: Absent(%v) = %v, want %v", tc.name, tc.err, got, tc.absent)
		}
	}
}

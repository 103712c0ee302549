package nvrtc

import (
	"errors"
	"fmt"
)

// ErrUnavailable means NVRTC cannot be loaded.
var ErrUnavailable = errors.New("nvrtc: library unavailable")

// ErrCompile matches every *CompileError.
var ErrCompile = errors.New("nvrtc: compilation failed")

// CompileError carries NVRTC's status and the program log.
type CompileError struct {
	Call string
	Code int
	Msg  string
	Log  string
}

func (e *CompileError) Error() string {
	s := fmt.Sprintf("nvrtc: %s: %s (%d)", e.Call, e.Msg, e.Code)
	if e.Log != "" {
		s += ": " + e.Log
	}
	return s
}

// Is makes errors.Is(err, ErrCompile) true.
func (e *CompileError) Is(target error) bool { return target == ErrCompile }

// EnvNVRTC overrides the library path.
const EnvNVRTC = "DISTBUF_NVRTC"

var libNames = []string{"libnvrtc.so.13", "libnvrtc.so.12"}

package nvrtc

import (
	"errors"

	"github.com/distbuf/distbuf/internal/dl"
)

// ErrUnavailable means NVRTC cannot be loaded.
var ErrUnavailable = errors.New("nvrtc: library unavailable")

// ErrCompile matches every *CompileError.
var ErrCompile = errors.New("nvrtc: compilation failed")

// CompileError carries NVRTC's status and the program log, matching
// ErrCompile.
type CompileError = dl.CallError

// EnvNVRTC overrides the library path.
const EnvNVRTC = "DISTBUF_NVRTC"

var libNames = []string{"libnvrtc.so.13", "libnvrtc.so.12"}

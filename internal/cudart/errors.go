package cudart

import (
	"errors"
	"fmt"
)

// EnvCUDART names a libcudart to load instead of the default candidates.
const EnvCUDART = "DISTBUF_CUDART"

// EnvSetDevice chooses when a call sets its device: "auto" (the default)
// skips cudaSetDevice when the device's primary context is already current
// to the calling thread, "always" calls it before every call. It is read
// when the runtime is loaded.
const EnvSetDevice = "DISTBUF_CUDA_SETDEVICE"

// Candidates are the libraries Load tries, in order, when DISTBUF_CUDART is unset.
var Candidates = []string{
	"libcudart.so.13", "libcudart.so.12",
	"/usr/local/cuda/lib64/libcudart.so.13", "/usr/local/cuda/lib64/libcudart.so.12",
}

var (
	// ErrUnavailable matches failures that mean CUDA cannot be used on this
	// machine: no library, a library lacking required symbols, no device,
	// an insufficient or mismatched driver.
	ErrUnavailable = errors.New("cudart: CUDA unavailable")
	// ErrOutOfMemory matches cudaErrorMemoryAllocation.
	ErrOutOfMemory = errors.New("cudart: out of memory")
	// ErrNotSupported is returned when a capability the call needs is
	// absent, and matches cudaErrorNotSupported.
	ErrNotSupported = errors.New("cudart: not supported by this runtime or device")
	// ErrInvalid reports a bad argument caught before calling the runtime.
	ErrInvalid = errors.New("cudart: invalid argument")
)

// Error codes the package interprets (values of cudaError_t; checked against
// cudart_decl.h at compile time and against the toolkit by abicheck).
const (
	codeSuccess                  = 0
	codeMemoryAllocation         = 2
	codeInitialization           = 3
	codeStubLibrary              = 34
	codeInsufficientDriver       = 35
	codeDevicesUnavailable       = 46
	codeNoDevice                 = 100
	codeNotReady                 = 600
	codeNotSupported             = 801
	codeSystemDriverMismatch     = 803
	codeCompatNotSupportedDevice = 804
)

// Error is a failed runtime call.
type Error struct {
	Op     string // the runtime function, e.g. "cudaMallocFromPoolAsync"
	Device int    // the device ordinal, or -1 when the call names none
	Code   int    // the cudaError_t value
	Name   string // cudaGetErrorName, e.g. "cudaErrorMemoryAllocation"
	Text   string // cudaGetErrorString
}

func (e *Error) Error() string {
	dev := ""
	if e.Device >= 0 {
		dev = fmt.Sprintf(" on device %d", e.Device)
	}
	return fmt.Sprintf("cudart: %s%s: %s (%d): %s", e.Op, dev, e.Name, e.Code, e.Text)
}

// Is makes errors.Is match ErrOutOfMemory, ErrUnavailable and
// ErrNotSupported (cudaErrorNotSupported) by code.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrOutOfMemory:
		return e.Code == codeMemoryAllocation
	case ErrNotSupported:
		return e.Code == codeNotSupported
	case ErrUnavailable:
		return unavailableCode(e.Code)
	}
	return false
}

func unavailableCode(code int) bool {
	switch code {
	case codeNoDevice, codeInsufficientDriver, codeStubLibrary, codeDevicesUnavailable,
		codeInitialization, codeSystemDriverMismatch, codeCompatNotSupportedDevice:
		return true
	}
	return false
}

// DriverError is a failed driver call (a CUresult, not a cudaError_t).
type DriverError struct {
	Op     string
	Device int
	Code   int // the CUresult value
}

func (e *DriverError) Error() string {
	return fmt.Sprintf("cudart: %s on device %d: CUresult %d", e.Op, e.Device, e.Code)
}

// LoadError is a failure to open the library or bind its required symbols.
type LoadError struct {
	Cause error // a dl.NotFoundError, dl.MissingSymbolsError or dl.ErrNoCgo
}

func (e *LoadError) Error() string { return "cudart: cannot load the CUDA runtime: " + e.Cause.Error() }

// Is makes errors.Is(err, ErrUnavailable) true.
func (e *LoadError) Is(target error) bool { return target == ErrUnavailable }

// Unwrap exposes the loader's error.
func (e *LoadError) Unwrap() error { return e.Cause }

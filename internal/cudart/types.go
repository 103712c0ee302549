package cudart

import "fmt"

// The types here do not depend on cgo, so that code calling the runtime
// compiles (and reports ErrUnavailable) where cgo is off.

// Capabilities says which optional parts of the runtime resolved.
type Capabilities struct {
	// MemoryPools: cudaMemPoolCreate, cudaMallocFromPoolAsync, cudaFreeAsync
	// and the other pool functions are all present. Whether a device
	// supports pools is a separate question (AttrMemoryPoolsSupported).
	MemoryPools bool
	// DriverEntryPoint: cudaGetDriverEntryPointByVersion or
	// cudaGetDriverEntryPoint is present.
	DriverEntryPoint bool
	// StreamWaitValue: cuStreamWaitValue32 was obtained from the driver.
	StreamWaitValue bool
	// DeviceName: cuDeviceGet and cuDeviceGetName were obtained.
	DeviceName bool
	// CurrentContext: cuCtxGetCurrent was obtained, so a call skips
	// cudaSetDevice when the device's primary context is already current
	// to the thread (unless DISTBUF_CUDA_SETDEVICE=always).
	CurrentContext bool
	// AddressRange: cuMemGetAddressRange was obtained (AddressRange).
	AddressRange bool
	// KernelLaunch: cudaLibraryLoadData, cudaLibraryGetKernel and
	// cudaLaunchKernel are present and the runtime is 12.8 or later, which
	// launching a library's cudaKernel_t needs (LoadKernels, Launch).
	KernelLaunch bool
	// MemcpyBatch: cudaMemcpyBatchAsync is present and the runtime is 12.8
	// or later (MemcpyBatch).
	MemcpyBatch bool
	// IPC: the legacy interprocess functions (cudaIpcGetMemHandle,
	// cudaIpcOpenMemHandle, cudaIpcCloseMemHandle, cudaIpcGetEventHandle,
	// cudaIpcOpenEventHandle) are present. Whether the device and the
	// platform allow IPC is learnt from the calls themselves.
	IPC bool
	// Absent lists the optional symbols that did not resolve.
	Absent []string
}

// Stream, Event, MemPool and Kernel are runtime handles (cudaStream_t,
// cudaEvent_t, cudaMemPool_t, cudaKernel_t).
type (
	Stream  uintptr
	Event   uintptr
	MemPool uintptr
	Kernel  uintptr
)

// IpcMemHandle is a cudaIpcMemHandle_t: an opaque name for device memory
// that another process can open (IpcOpenMemHandle). Its size is
// CUDA_IPC_HANDLE_SIZE, checked against the headers by the abicheck.
type IpcMemHandle [64]byte

// IpcEventHandle is a cudaIpcEventHandle_t: an opaque name for an
// interprocess event that another process can open (IpcOpenEventHandle).
type IpcEventHandle [64]byte

// MaxLaunchArgs is the most kernel parameters Launch passes.
const MaxLaunchArgs = 16

// FormatVersion renders a CUDA version number such as 13000 as "13.0".
func FormatVersion(v int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }

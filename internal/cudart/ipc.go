//go:build cgo

package cudart

/*
#include "cudart_calls.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// Compile-time proof that the handle types have the header's size.
var (
	_ [C.DBC_IPC_HANDLE_SIZE]byte = IpcMemHandle{}
	_ [C.DBC_IPC_HANDLE_SIZE]byte = IpcEventHandle{}
)

func (d *Device) needIPC(op string) error {
	if !d.rt.caps.IPC {
		return fmt.Errorf("cudart: %s: the runtime has no interprocess (cudaIpc*) functions: %w", op, ErrNotSupported)
	}
	return nil
}

// IpcGetMemHandle is cudaIpcGetMemHandle: a handle another process opens
// with IpcOpenMemHandle to reach the memory at p, which must be the start of
// an allocation from Malloc (cudaMalloc; pool and pinned memory cannot be
// shared this way). The handle stays valid until p is freed; freeing p
// while another process has it open is undefined, so the owner frees only
// after every peer has closed it.
func (d *Device) IpcGetMemHandle(p uintptr) (IpcMemHandle, error) {
	return ipcHandle[IpcMemHandle](d, "cudaIpcGetMemHandle", func(h *C.char) C.int {
		return C.dbc_ipc_get_mem_handle(d.rt.api, d.ord, C.uintptr_t(p), h)
	})
}

// ipcHandle makes a handle of type H by get, the runtime call op, which
// writes it.
func ipcHandle[H IpcMemHandle | IpcEventHandle](d *Device, op string, get func(h *C.char) C.int) (H, error) {
	var h H
	if err := d.needIPC(op); err != nil {
		return h, err
	}
	return h, d.fail(op, get((*C.char)(unsafe.Pointer(&h[0]))))
}

// IpcOpenMemHandle is cudaIpcOpenMemHandle with
// cudaIpcMemLazyEnablePeerAccess: the address, in this process, of the
// memory another process exported with IpcGetMemHandle. Opening a handle
// the calling process made fails (cudaErrorDeviceUninitialized); opening
// one handle again in the same process returns the same address and counts
// a reference. Opening is slow on a GPU (docs/PERFORMANCE.md), so a caller
// opens each peer's memory once and keeps it. IpcCloseMemHandle releases it.
func (d *Device) IpcOpenMemHandle(h IpcMemHandle) (uintptr, error) {
	return d.ipcOpenMemHandle(h, C.DBC_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
}

// ipcOpenMemHandle passes any flags, for the tests of the fake's checks.
func (d *Device) ipcOpenMemHandle(h IpcMemHandle, flags uint) (uintptr, error) {
	const op = "cudaIpcOpenMemHandle"
	if err := d.needIPC(op); err != nil {
		return 0, err
	}
	var p C.uintptr_t
	if err := d.fail(op, C.dbc_ipc_open_mem_handle(d.rt.api, d.ord, (*C.char)(unsafe.Pointer(&h[0])), C.unsigned(flags), &p)); err != nil {
		return 0, err
	}
	return uintptr(p), nil
}

// IpcCloseMemHandle is cudaIpcCloseMemHandle: it drops one reference to
// memory opened with IpcOpenMemHandle and unmaps it with the last. The
// exporting process's memory is not affected.
func (d *Device) IpcCloseMemHandle(p uintptr) error {
	const op = "cudaIpcCloseMemHandle"
	if err := d.needIPC(op); err != nil {
		return err
	}
	return d.fail(op, C.dbc_ipc_close_mem_handle(d.rt.api, d.ord, C.uintptr_t(p)))
}

// EventCreateInterprocess makes an event another process can open
// (cudaEventInterprocess | cudaEventDisableTiming): record it with
// EventRecord, export it with IpcGetEventHandle. Destroy it with
// EventDestroy once no peer uses it.
func (d *Device) EventCreateInterprocess() (Event, error) {
	const op = "cudaEventCreateWithFlags"
	if err := d.needIPC(op); err != nil {
		return 0, err
	}
	var ev C.uintptr_t
	flags := C.unsigned(C.DBC_EVENT_INTERPROCESS | C.DBC_EVENT_DISABLE_TIMING)
	if err := d.fail(op, C.dbc_event_create(d.rt.api, d.ord, flags, &ev)); err != nil {
		return 0, err
	}
	return Event(ev), nil
}

// IpcGetEventHandle is cudaIpcGetEventHandle for an event from
// EventCreateInterprocess.
func (d *Device) IpcGetEventHandle(ev Event) (IpcEventHandle, error) {
	return ipcHandle[IpcEventHandle](d, "cudaIpcGetEventHandle", func(h *C.char) C.int {
		return C.dbc_ipc_get_event_handle(d.rt.api, d.ord, C.uintptr_t(ev), h)
	})
}

// IpcOpenEventHandle is cudaIpcOpenEventHandle: an event of this process
// that stands for another process's interprocess event. EventRecord,
// EventQuery, EventSynchronize and StreamWaitEvent work on it in either
// process; it has no timing. Destroy it with EventDestroy, before the
// exporting process destroys the original.
func (d *Device) IpcOpenEventHandle(h IpcEventHandle) (Event, error) {
	const op = "cudaIpcOpenEventHandle"
	if err := d.needIPC(op); err != nil {
		return 0, err
	}
	var ev C.uintptr_t
	if err := d.fail(op, C.dbc_ipc_open_event_handle(d.rt.api, d.ord, (*C.char)(unsafe.Pointer(&h[0])), &ev)); err != nil {
		return 0, err
	}
	return Event(ev), nil
}

// AddressRange is cuMemGetAddressRange: the start and size of the device
// allocation that contains p, in this process's address space (also for
// memory opened with IpcOpenMemHandle, whose size a peer cannot make up).
func (d *Device) AddressRange(p uintptr) (base uintptr, size int64, err error) {
	if !d.rt.caps.AddressRange {
		return 0, 0, fmt.Errorf("cudart: address range: cuMemGetAddressRange not available: %w", ErrNotSupported)
	}
	var b C.uintptr_t
	var n C.size_t
	if err := d.rt.failDriver("cuMemGetAddressRange", int(d.ord), C.dbc_cu_address_range(d.rt.api, d.ord, C.uintptr_t(p), &b, &n)); err != nil {
		return 0, 0, err
	}
	return uintptr(b), int64(n), nil
}

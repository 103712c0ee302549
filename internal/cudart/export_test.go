//go:build cgo

package cudart

// IpcOpenMemHandleFlags opens a handle with any flags, for the tests of what
// the runtime refuses.
func (d *Device) IpcOpenMemHandleFlags(h IpcMemHandle, flags uint) (uintptr, error) {
	return d.ipcOpenMemHandle(h, flags)
}

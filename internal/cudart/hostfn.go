//go:build cgo

package cudart

// #include <stdint.h>
import "C"

import "runtime/cgo"

// distbufCudartHostFn is the Go side of every cudaLaunchHostFunc made by this
// package: the runtime calls it on its own thread with the handle of the
// function to run. The handle is used once.
//
//export distbufCudartHostFn
func distbufCudartHostFn(h C.uintptr_t) {
	hd := cgo.Handle(uintptr(h))
	fn, _ := hd.Value().(func())
	hd.Delete()
	if fn != nil {
		fn()
	}
}

//go:build cgo

package nvrtc

/*
#cgo CFLAGS: -I${SRCDIR}
#include <stdlib.h>
#include "decl.h"

static dbn_result n_version(void *f, int *major, int *minor) { return ((dbn_Version_fn)f)(major, minor); }
static const char *n_error(void *f, int r) { return ((dbn_GetErrorString_fn)f)(r); }
static dbn_result n_create(void *f, dbn_program *p, const char *src, const char *name) {
	return ((dbn_CreateProgram_fn)f)(p, src, name, 0, NULL, NULL);
}
static dbn_result n_compile(void *f, dbn_program p, int n, char **opts) {
	return ((dbn_CompileProgram_fn)f)(p, n, (const char *const *)opts);
}
static dbn_result n_size(void *f, dbn_program p, size_t *n) { return ((dbn_GetSize_fn)f)(p, n); }
static dbn_result n_bytes(void *f, dbn_program p, char *out) { return ((dbn_GetBytes_fn)f)(p, out); }
static dbn_result n_destroy(void *f, dbn_program *p) { return ((dbn_DestroyProgram_fn)f)(p); }
*/
import "C"

import (
	"strings"
	"unsafe"

	"github.com/distbuf/distbuf/internal/dl"
)

// Lib is the loaded NVRTC library.
type Lib struct {
	lib          *dl.Library
	major, minor int

	version, errorString, create, compile, logSize, log unsafe.Pointer
	cubinSize, cubin, ptxSize, ptx, destroy             unsafe.Pointer
}

var loaded dl.Lazy[*Lib]

// Load opens NVRTC on first use.
func Load() (*Lib, error) { return loaded.Get(load) }

func load() (*Lib, error) {
	l := &Lib{}
	var err error
	if l.lib, err = dl.Load(ErrUnavailable, EnvNVRTC, libNames, []dl.Symbol{
		{Name: "nvrtcVersion", Ptr: &l.version},
		{Name: "nvrtcGetErrorString", Ptr: &l.errorString},
		{Name: "nvrtcCreateProgram", Ptr: &l.create},
		{Name: "nvrtcCompileProgram", Ptr: &l.compile},
		{Name: "nvrtcGetProgramLogSize", Ptr: &l.logSize},
		{Name: "nvrtcGetProgramLog", Ptr: &l.log},
		{Name: "nvrtcGetCUBINSize", Ptr: &l.cubinSize},
		{Name: "nvrtcGetCUBIN", Ptr: &l.cubin},
		{Name: "nvrtcGetPTXSize", Ptr: &l.ptxSize},
		{Name: "nvrtcGetPTX", Ptr: &l.ptx},
		{Name: "nvrtcDestroyProgram", Ptr: &l.destroy},
	}); err != nil {
		return nil, err
	}
	var major, minor C.int
	if r := C.n_version(l.version, &major, &minor); r != 0 {
		return nil, l.fail("nvrtcVersion", r, "")
	}
	l.major, l.minor = int(major), int(minor)
	return l, nil
}

func (l *Lib) fail(call string, r C.dbn_result, log string) error {
	return &CompileError{Lib: "nvrtc", Call: call, Code: int(r), Msg: C.GoString(C.n_error(l.errorString, C.int(r))), Log: log, Kind: ErrCompile}
}

// Version is NVRTC's major and minor version.
func (l *Lib) Version() (major, minor int) { return l.major, l.minor }

// Library is the name NVRTC was loaded from.
func (l *Lib) Library() string { return l.lib.Name }

// Compile compiles src (a translation unit named name) with the given
// options. With an --gpu-architecture=sm_XY option it returns a CUBIN for
// that architecture; with compute_XY, PTX. The log is returned with a
// failure.
func (l *Lib) Compile(src, name string, opts []string, cubin bool) ([]byte, error) {
	csrc, cname := C.CString(src), C.CString(name)
	defer C.free(unsafe.Pointer(csrc))
	defer C.free(unsafe.Pointer(cname))
	var prog C.dbn_program
	if r := C.n_create(l.create, &prog, csrc, cname); r != 0 {
		return nil, l.fail("nvrtcCreateProgram", r, "")
	}
	defer C.n_destroy(l.destroy, &prog)
	copts := (**C.char)(C.malloc(C.size_t(max(len(opts), 1)) * C.size_t(unsafe.Sizeof(uintptr(0)))))
	defer C.free(unsafe.Pointer(copts))
	list := unsafe.Slice(copts, max(len(opts), 1))
	for i, o := range opts {
		list[i] = C.CString(o)
		defer C.free(unsafe.Pointer(list[i]))
	}
	if r := C.n_compile(l.compile, prog, C.int(len(opts)), copts); r != 0 {
		return nil, l.fail("nvrtcCompileProgram "+strings.Join(opts, " "), r, l.programLog(prog))
	}
	sizeFn, getFn, what := l.ptxSize, l.ptx, "PTX"
	if cubin {
		sizeFn, getFn, what = l.cubinSize, l.cubin, "CUBIN"
	}
	var n C.size_t
	if r := C.n_size(sizeFn, prog, &n); r != 0 {
		return nil, l.fail("nvrtcGet"+what+"Size", r, "")
	}
	if n == 0 {
		return nil, &CompileError{Lib: "nvrtc", Call: "nvrtcGet" + what + "Size", Msg: "empty image (was the option for " + what + " given?)", Kind: ErrCompile}
	}
	buf := C.malloc(n)
	defer C.free(buf)
	if r := C.n_bytes(getFn, prog, (*C.char)(buf)); r != 0 {
		return nil, l.fail("nvrtcGet"+what, r, "")
	}
	return C.GoBytes(buf, C.int(n)), nil
}

func (l *Lib) programLog(prog C.dbn_program) string {
	var n C.size_t
	if C.n_size(l.logSize, prog, &n) != 0 || n <= 1 {
		return ""
	}
	buf := C.malloc(n)
	defer C.free(buf)
	if C.n_bytes(l.log, prog, (*C.char)(buf)) != 0 {
		return ""
	}
	return strings.TrimSpace(C.GoString((*C.char)(buf)))
}

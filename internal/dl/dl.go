//go:build cgo

package dl

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

// dlerror's message belongs to the calling thread and to the last failed
// call: each wrapper reads it in the same C call as the failure, so a
// goroutine moved to another thread between two cgo calls cannot lose it or
// read another call's. The message is copied into buf (or left empty).
static void take_error(char *buf, size_t n) {
	const char *e = dlerror();
	if (n == 0) return;
	buf[0] = 0;
	if (e) { strncpy(buf, e, n - 1); buf[n - 1] = 0; }
}
static void *dl_open(const char *name, char *err, size_t n) {
	dlerror();
	void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (!h) take_error(err, n);
	return h;
}
static void *dl_sym(void *h, const char *name) { dlerror(); return dlsym(h, name); }
static int dl_close(void *h, char *err, size_t n) {
	dlerror();
	int rc = dlclose(h);
	if (rc != 0) take_error(err, n);
	return rc;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"unsafe"
)

// errLen bounds a dlerror message kept for an error.
const errLen = 512

// Library is an open shared library.
type Library struct {
	Name   string // the name that dlopen accepted
	handle unsafe.Pointer
}

// Open tries the candidates in order, or only the path in the environment
// variable envOverride when it is set, and returns the first that loads. The
// error names every attempt and why it failed.
func Open(envOverride string, candidates ...string) (*Library, error) {
	if envOverride != "" {
		if p := strings.TrimSpace(os.Getenv(envOverride)); p != "" {
			candidates = []string{p}
		}
	}
	var tried []string
	var msg [errLen]C.char
	for _, name := range candidates {
		cname := C.CString(name)
		h := C.dl_open(cname, &msg[0], errLen)
		C.free(unsafe.Pointer(cname))
		if h != nil {
			return &Library{Name: name, handle: h}, nil
		}
		tried = append(tried, C.GoString(&msg[0]))
	}
	return nil, &NotFoundError{Candidates: candidates, Reasons: tried}
}

// Sym returns the address of a symbol.
func (l *Library) Sym(name string) (unsafe.Pointer, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	p := C.dl_sym(l.handle, cname)
	if p == nil {
		return nil, fmt.Errorf("dl: %s: symbol %s: %w", l.Name, name, ErrMissingSymbol)
	}
	return p, nil
}

// Bind resolves a symbol table. It returns the names of optional symbols
// that are absent; a missing required symbol is a *MissingSymbolsError
// naming all of them.
func (l *Library) Bind(table []Symbol) (absent []string, err error) {
	var missing []string
	for _, s := range table {
		p, err := l.Sym(s.Name)
		if err != nil {
			if s.Optional {
				absent = append(absent, s.Name)
				*s.Ptr = nil
				continue
			}
			missing = append(missing, s.Name)
			continue
		}
		*s.Ptr = p
	}
	if len(missing) > 0 {
		return absent, &MissingSymbolsError{Library: l.Name, Names: missing}
	}
	return absent, nil
}

// Close unloads the library. Function pointers from it become invalid.
func (l *Library) Close() error {
	var msg [errLen]C.char
	if C.dl_close(l.handle, &msg[0], errLen) != 0 {
		return errors.New("dl: dlclose " + l.Name + ": " + C.GoString(&msg[0]))
	}
	return nil
}

package dl

import (
	"errors"
	"fmt"
	"strings"
	"unsafe"
)

var (
	// ErrNotFound matches a *NotFoundError: no candidate library loaded.
	ErrNotFound = errors.New("dl: library not found")
	// ErrMissingSymbol matches a *MissingSymbolsError.
	ErrMissingSymbol = errors.New("dl: missing symbol")
	// ErrNoCgo is returned when the binary was built without cgo.
	ErrNoCgo = errors.New("dl: built without cgo, cannot load shared libraries")
)

// Symbol is one row of a loader's table.
type Symbol struct {
	Name     string
	Ptr      *unsafe.Pointer
	Optional bool
}

// NotFoundError lists the libraries tried and why each failed.
type NotFoundError struct {
	Candidates []string
	Reasons    []string
}

func (e *NotFoundError) Error() string {
	msg := "dl: cannot load any of " + strings.Join(e.Candidates, ", ")
	// dlopen's reasons differ only when a library was found but unusable
	// (wrong architecture, missing dependency): show those, else the first.
	seen := map[string]bool{}
	var reasons []string
	for _, r := range e.Reasons {
		if !strings.Contains(r, "cannot open shared object file") && !seen[r] {
			seen[r] = true
			reasons = append(reasons, r)
		}
	}
	if len(reasons) == 0 && len(e.Reasons) > 0 {
		reasons = e.Reasons[:1]
	}
	if len(reasons) > 0 {
		msg += ": " + strings.Join(reasons, "; ")
	}
	return msg
}

// Is makes errors.Is(err, ErrNotFound) true.
func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

// MissingSymbolsError names the required symbols a library lacks.
type MissingSymbolsError struct {
	Library string
	Names   []string
}

func (e *MissingSymbolsError) Error() string {
	return fmt.Sprintf("dl: %s lacks required symbol(s): %s", e.Library, strings.Join(e.Names, ", "))
}

// Is makes errors.Is(err, ErrMissingSymbol) true.
func (e *MissingSymbolsError) Is(target error) bool { return target == ErrMissingSymbol }

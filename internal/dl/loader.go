package dl

import (
	"fmt"
	"sync"
)

// Load opens the first of names that loads, or the path in the
// environment variable env when it is set, and binds table; any failure
// is wrapped in unavailable, the loading package's sentinel, so that its
// callers can tell "no library" from a failed call.
func Load(unavailable error, env string, names []string, table []Symbol) (*Library, error) {
	lib, err := Open(env, names...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", unavailable, err)
	}
	if _, err := lib.Bind(table); err != nil {
		return nil, fmt.Errorf("%w: %w", unavailable, err)
	}
	return lib, nil
}

// Lazy is a library loaded on first use, never in init, and kept for the
// life of the process. A failure is kept too, unless Retry: then the next
// Get tries again (a library installed, or an environment fixed, since).
type Lazy[T any] struct {
	Retry bool

	mu   sync.Mutex
	done bool
	v    T
	err  error
}

// Get returns the loaded value, calling load the first time (and after a
// failure, with Retry).
func (l *Lazy[T]) Get(load func() (T, error)) (T, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.v, l.err = load()
		l.done = l.err == nil || !l.Retry
	}
	return l.v, l.err
}

// Done reports whether the value is loaded (or its failure kept).
func (l *Lazy[T]) Done() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.done
}

// CallError is a failed call of a loaded library: the function, its
// status code and the library's text for it, and what else the library
// said (a compiler's log). It matches its library's sentinel (Kind) with
// errors.Is.
type CallError struct {
	Lib  string // the library's package, which prefixes the message
	Call string
	Code int
	Msg  string
	Log  string
	Kind error
}

func (e *CallError) Error() string {
	s := fmt.Sprintf("%s: %s: status %d: %s", e.Lib, e.Call, e.Code, e.Msg)
	if e.Log != "" {
		s += ": " + e.Log
	}
	return s
}

// Is makes errors.Is(err, e.Kind) true.
func (e *CallError) Is(target error) bool { return target == e.Kind }

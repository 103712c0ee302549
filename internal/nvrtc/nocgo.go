//go:build !cgo

package nvrtc

import "fmt"

// Lib is unavailable without cgo.
type Lib struct{}

// Load always fails without cgo.
func Load() (*Lib, error) { return nil, fmt.Errorf("%w: built without cgo", ErrUnavailable) }

func (l *Lib) Version() (int, int) { return 0, 0 }
func (l *Lib) Library() string     { return "" }
func (l *Lib) Compile(string, string, []string, bool) ([]byte, error) {
	return nil, fmt.Errorf("%w: built without cgo", ErrUnavailable)
}

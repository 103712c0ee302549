package allockind

import (
	"testing"

	"github.com/distbuf/distbuf/devalloc"
)

func TestHostIsNamedHost(t *testing.T) {
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.BackendHost})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if got := Name(a); got != "host" {
		t.Fatalf("Name of a host allocator = %q, want host", got)
	}
}

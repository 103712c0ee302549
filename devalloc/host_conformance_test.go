package devalloc_test

import (
	"testing"

	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/alloctest"
)

func TestHostConformance(t *testing.T) {
	alloctest.Run(t, alloctest.Harness{Backend: devalloc.BackendHost})
}

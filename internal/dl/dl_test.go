//go:build cgo

package dl

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

func TestOpenAndBind(t *testing.T) {
	lib, err := Open("", "libdoes-not-exist.so.9", "libc.so.6")
	require.NoError(t, err)
	require.Equal(t, "libc.so.6", lib.Name)
	var strlen, nope, opt unsafe.Pointer
	absent, err := lib.Bind([]Symbol{{Name: "strlen", Ptr: &strlen}, {Name: "no_such_fn_xyz", Ptr: &opt, Optional: true}})
	require.NoError(t, err)
	require.NotNil(t, strlen)
	require.Equal(t, []string{"no_such_fn_xyz"}, absent)
	_, err = lib.Bind([]Symbol{{Name: "strlen", Ptr: &strlen}, {Name: "also_missing_abc", Ptr: &nope}})
	require.ErrorIs(t, err, ErrMissingSymbol)
	require.ErrorContains(t, err, "also_missing_abc")
}

func TestOpenNotFound(t *testing.T) {
	_, err := Open("", "libnope1.so", "libnope2.so")
	require.ErrorIs(t, err, ErrNotFound)
	var nf *NotFoundError
	require.True(t, errors.As(err, &nf))
	require.Len(t, nf.Reasons, 2)
	require.ErrorContains(t, err, "libnope2.so")
}

func TestEnvOverride(t *testing.T) {
	t.Setenv("DL_TEST_LIB", "libnope3.so")
	_, err := Open("DL_TEST_LIB", "libc.so.6")
	require.ErrorIs(t, err, ErrNotFound, "the override replaces the candidates")
	require.ErrorContains(t, err, "libnope3.so")
}

// TestNotFoundReasonsConcurrent opens missing libraries from many goroutines
// at once: each failure's reason must be its own dlerror message, which
// names the library it tried.
func TestNotFoundReasonsConcurrent(t *testing.T) {
	const workers, rounds = 16, 50
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for r := range rounds {
				name := fmt.Sprintf("libdistbuf-missing-%d-%d.so", w, r)
				_, err := Open("", name)
				var nf *NotFoundError
				if !errors.As(err, &nf) || len(nf.Reasons) != 1 || !strings.Contains(nf.Reasons[0], name) {
					errs <- fmt.Errorf("open %s: reasons %q (err %v)", name, nf.Reasons, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		require.NoError(t, <-errs)
	}
}

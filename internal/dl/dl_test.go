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

func TestLazy(t *testing.T) {
	calls := 0
	fail := errors.New("not yet")
	load := func() (int, error) {
		calls++
		if calls == 1 {
			return 0, fail
		}
		return 7, nil
	}
	var kept Lazy[int]
	require.False(t, kept.Done())
	_, err := kept.Get(load)
	require.ErrorIs(t, err, fail)
	_, err = kept.Get(load)
	require.ErrorIs(t, err, fail, "a failure is kept")
	require.Equal(t, 1, calls)
	require.True(t, kept.Done())

	calls = 0
	retried := Lazy[int]{Retry: true}
	_, err = retried.Get(load)
	require.ErrorIs(t, err, fail)
	v, err := retried.Get(load)
	require.NoError(t, err, "tried again")
	require.Equal(t, 7, v)
	v, err = retried.Get(load)
	require.NoError(t, err)
	require.Equal(t, 7, v)
	require.Equal(t, 2, calls, "a success is kept")
}

func TestLoadAndCallError(t *testing.T) {
	unavailable := errors.New("lib: unavailable")
	var strlen unsafe.Pointer
	_, err := Load(unavailable, "", []string{"libnope9.so"}, []Symbol{{Name: "strlen", Ptr: &strlen}})
	require.ErrorIs(t, err, unavailable)
	require.ErrorIs(t, err, ErrNotFound)
	_, err = Load(unavailable, "", []string{"libc.so.6"}, []Symbol{{Name: "no_such_fn_xyz", Ptr: &strlen}})
	require.ErrorIs(t, err, unavailable)
	require.ErrorIs(t, err, ErrMissingSymbol)
	lib, err := Load(unavailable, "", []string{"libc.so.6"}, []Symbol{{Name: "strlen", Ptr: &strlen}})
	require.NoError(t, err)
	require.NotNil(t, strlen)
	require.Equal(t, "libc.so.6", lib.Name)

	failed := errors.New("lib: call failed")
	ce := &CallError{Lib: "lib", Call: "libDo", Code: 3, Msg: "bad", Log: "line 1", Kind: failed}
	require.ErrorIs(t, ce, failed)
	require.Equal(t, "lib: libDo: status 3: bad: line 1", ce.Error())
}

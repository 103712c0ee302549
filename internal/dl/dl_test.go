//go:build cgo

package dl

import (
	"errors"
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

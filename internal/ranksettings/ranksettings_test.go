package ranksettings

import (
	"errors"
	"fmt"
	"math"
	"os"
	"testing"
	"time"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
	"github.com/stretchr/testify/require"
)

// TestMain brings MPI up and down around the tests (a one-rank world
// without the mpi tag).
func TestMain(m *testing.M) {
	if err := cluster.Init(); err != nil {
		fmt.Fprintln(os.Stderr, "Init:", err)
		os.Exit(1)
	}
	code := m.Run()
	if err := cluster.Finalize(); err != nil {
		fmt.Fprintln(os.Stderr, "Finalize:", err)
		code = 1
	}
	os.Exit(code)
}

func TestSettings(t *testing.T) {
	require.Equal(t, Setting{"-iters", 3, "3", true}, Number("-iters", 3))
	a, b := Text("-mode", "packed"), Text("-mode", "perblock")
	require.NotEqual(t, a.Value, b.Value)
	require.Equal(t, `"packed"`, a.Shown)
	require.False(t, a.Numeric)
}

// settings are what the comparison tests' ranks resolved.
var settings = []Setting{Number("-iters", 3), Text("-mode", "packed"), Number("-blocks", 2000)}

// rowOf is the row a rank that resolved s sends.
func rowOf(s []Setting, failed int64) []int64 {
	row := []int64{failed, int64(namesHash(s))}
	for _, x := range s {
		row = append(row, x.Value)
	}
	return row
}

func TestCompare(t *testing.T) {
	same := rowOf(settings, 0)
	require.NoError(t, compare([][]int64{same, same, same}, 1, settings))

	other := []Setting{Number("-iters", 5), Text("-mode", "perblock"), Number("-blocks", 2000)}
	err := compare([][]int64{same, same, rowOf(other, 0)}, 0, settings)
	require.ErrorIs(t, err, distbuf.ErrBadConfig)
	require.ErrorContains(t, err, "the ranks disagree on -iters: rank 0 has -iters 3, rank 2 has -iters 5 (this rank: 3)")
	require.ErrorContains(t, err, "the ranks disagree on -mode: rank 0 and rank 2 were started with different -mode")
	require.NotContains(t, err.Error(), "-blocks")

	// A rank that could not resolve its settings is named by the others;
	// its values are not compared.
	err = compare([][]int64{same, rowOf(other, 1), same}, 2, settings)
	require.ErrorIs(t, err, distbuf.ErrBadConfig)
	require.ErrorContains(t, err, "rank 1 could not resolve their settings")
	require.NotContains(t, err.Error(), "disagree")
	// ... and says nothing more itself: its own error says why.
	require.NoError(t, compare([][]int64{same, rowOf(other, 1), same}, 1, settings))

	// A list of other names (another build) is reported as such.
	renamed := []Setting{Number("-iterations", 3), Text("-mode", "packed"), Number("-blocks", 2000)}
	err = compare([][]int64{same, rowOf(renamed, 0)}, 0, settings)
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	require.ErrorContains(t, err, "rank 1 compares other settings than this rank")
}

// TestCompareHostileFailureSlot: a rank's failure slot speaks for that
// rank alone. A value other than 0 or 1 is that rank's malformed row: it
// cannot make the others blame rank 0, or name a rank that does not exist.
func TestCompareHostileFailureSlot(t *testing.T) {
	same := rowOf(settings, 0)
	for _, slot := range []int64{-9223372036854775807, math.MinInt64, -1, 2, math.MaxInt64} {
		for self := range 3 {
			hostile := rowOf(settings, slot)
			err := compare([][]int64{same, same, hostile}, self, settings)
			require.ErrorIs(t, err, distbuf.ErrInvalid, "slot %d", slot)
			require.ErrorContains(t, err, fmt.Sprintf("rank 2 sent %d in its failure slot (want 0 or 1)", slot))
			require.NotContains(t, err.Error(), "rank 0 could not")
			require.NotContains(t, err.Error(), "could not resolve")
		}
	}
	// Rows of another length are refused whole.
	err := compare([][]int64{same, same[:3]}, 0, settings)
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	require.ErrorContains(t, err, "rank 1 sent 3 values")
}

// TestAgreeOwnFailure: a rank that could not resolve its settings gets
// its own error back after taking part (on one rank, with no one else to
// name).
func TestAgreeOwnFailure(t *testing.T) {
	world, err := cluster.World()
	require.NoError(t, err)
	if world.Size() != 1 {
		t.Skip("one rank only: the multi-rank cases are in agree_mpi_test.go")
	}
	require.NoError(t, AgreeWith(world, settings, Options{Timeout: 10 * time.Second}))
	require.NoError(t, Agree(world, settings))
	bad := errors.New("-mode \"pakced\": want packed or perblock")
	err = AgreeWith(world, settings, Options{Timeout: 10 * time.Second, Failed: bad})
	require.ErrorIs(t, err, bad)
}

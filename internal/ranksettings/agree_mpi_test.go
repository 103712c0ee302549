//go:build mpi

package ranksettings

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
	"github.com/stretchr/testify/require"
)

const generous = 60 * time.Second

func multiRank(t *testing.T) *cluster.Comm {
	t.Helper()
	world, err := cluster.World()
	require.NoError(t, err)
	if world.Size() < 2 {
		t.Skip("needs several ranks")
	}
	return world
}

// TestAgreeRanks: ranks that resolved the same settings agree; a rank
// with another value makes every rank fail alike, naming it.
func TestAgreeRanks(t *testing.T) {
	world := multiRank(t)
	last := world.Size() - 1
	require.NoError(t, AgreeWith(world, settings, Options{Timeout: generous}))
	mine := settings
	if world.Rank() == last {
		mine = []Setting{Number("-iters", 3), Text("-mode", "perblock"), Number("-blocks", 2000)}
	}
	err := AgreeWith(world, mine, Options{Timeout: generous})
	require.ErrorIs(t, err, distbuf.ErrBadConfig)
	require.ErrorContains(t, err, fmt.Sprintf("the ranks disagree on -mode: rank 0 and rank %d were started with different -mode", last))
}

// TestAgreeFailedRank: a rank that could not resolve its settings takes
// part; every other rank names it, and it returns its own error.
func TestAgreeFailedRank(t *testing.T) {
	world := multiRank(t)
	last := world.Size() - 1
	var failed error
	if world.Rank() == last {
		failed = errors.New("-blocks -3: want 0 to 1000000")
	}
	err := AgreeWith(world, settings, Options{Timeout: generous, Failed: failed})
	require.Error(t, err)
	if world.Rank() == last {
		require.ErrorIs(t, err, failed)
		return
	}
	require.ErrorIs(t, err, distbuf.ErrBadConfig)
	require.ErrorContains(t, err, fmt.Sprintf("rank %d could not resolve their settings", last))
}

// TestAgreeHostileRow: a rank that sends a failure slot of
// -9223372036854775807 (as a peer in another language might) is reported
// by every rank as that rank's malformed row; no rank blames rank 0 or a
// rank that does not exist.
func TestAgreeHostileRow(t *testing.T) {
	world := multiRank(t)
	last := world.Size() - 1
	var err error
	if world.Rank() == last {
		row := rowOf(settings, -9223372036854775807)
		err = agreeRow(world, row, settings, generous)
	} else {
		err = AgreeWith(world, settings, Options{Timeout: generous})
	}
	require.ErrorIs(t, err, distbuf.ErrInvalid)
	require.ErrorContains(t, err, fmt.Sprintf("rank %d sent -9223372036854775807 in its failure slot (want 0 or 1)", last))
	require.NotContains(t, err.Error(), "could not resolve")
}

// TestAgreeStalledRank: a rank that arrives after the deadline is named
// by every other rank in an error matching cluster.ErrTimeout; one that
// arrives before costs nothing.
func TestAgreeStalledRank(t *testing.T) {
	world := multiRank(t)
	last := world.Size() - 1
	if world.Rank() == last {
		time.Sleep(200 * time.Millisecond)
	}
	require.NoError(t, AgreeWith(world, settings, Options{Timeout: 20 * time.Second}))

	const deadline = 500 * time.Millisecond
	if world.Rank() == last {
		time.Sleep(4 * deadline)
		require.NoError(t, AgreeWith(world, settings, Options{Timeout: generous}), "the late rank, once it arrives")
	} else {
		start := time.Now()
		err := AgreeWith(world, settings, Options{Timeout: deadline})
		require.ErrorIs(t, err, cluster.ErrTimeout)
		var te *cluster.TimeoutError
		require.ErrorAs(t, err, &te)
		require.Equal(t, []int{last}, te.Missing)
		require.Less(t, time.Since(start), deadline+2*time.Second)
	}
	// Every rank in step again; the timeout is resolved for Finalize.
	require.NoError(t, world.BarrierWithin(generous))
}

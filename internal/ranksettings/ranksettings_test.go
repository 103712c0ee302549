package ranksettings

import (
	"testing"

	"github.com/distbuf/distbuf/cluster"
	"github.com/stretchr/testify/require"
)

func TestSettings(t *testing.T) {
	require.Equal(t, Setting{"-iters", 3, "3", true}, Number("-iters", 3))
	a, b := Text("-mode", "packed"), Text("-mode", "perblock")
	require.NotEqual(t, a.Value, b.Value)
	require.Equal(t, `"packed"`, a.Shown)
	require.False(t, a.Numeric)
}

// TestAgreeOneRank: a rank always agrees with itself (the disagreements
// of several ranks are the commands' job tests).
func TestAgreeOneRank(t *testing.T) {
	require.NoError(t, cluster.Init())
	world, err := cluster.World()
	require.NoError(t, err)
	if world.Size() != 1 {
		t.Skip("one rank only")
	}
	require.NoError(t, Agree(world, []Setting{Number("-iters", 3), Text("-mode", "x")}))
}

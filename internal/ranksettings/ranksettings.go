// Package ranksettings checks that every rank of an MPI job was started
// with the same settings: ranks that disagree on a setting that shapes the
// collective work would wait for each other in different collectives, so
// the commands compare their settings once, at start, and every rank fails
// alike, naming the setting and the ranks. It holds no state.
package ranksettings

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io"

	"github.com/distbuf/distbuf/cluster"
)

// Setting is one setting as a number every rank can compare: the value of
// a numeric setting, the hash of a text one.
type Setting struct {
	Name    string
	Value   int64
	Shown   string // as a message shows this rank's value
	Numeric bool   // Value is the setting itself, not a hash of it
}

// Number is the numeric setting name = v.
func Number(name string, v int64) Setting { return Setting{name, v, fmt.Sprint(v), true} }

// Text is the text setting name = v, compared by its hash.
func Text(name, v string) Setting {
	h := fnv.New64a()
	_, _ = io.WriteString(h, v)
	return Setting{name, int64(h.Sum64()), fmt.Sprintf("%q", v), false}
}

// Agree gathers every rank's settings (one MPI_Allgather; every rank must
// pass the same names in the same order) and fails on every rank alike
// when they differ, naming each setting and the first rank that differs
// from rank 0.
func Agree(world *cluster.Comm, mine []Setting) error {
	k := len(mine)
	in := make([]int64, k)
	for i, s := range mine {
		in[i] = s.Value
	}
	all := make([]int64, k*world.Size())
	if err := cluster.Allgather(world, in, all); err != nil {
		return fmt.Errorf("comparing the settings of the ranks: %w", err)
	}
	var errs []error
	for i, s := range mine {
		for r := range world.Size() {
			if v := all[r*k+i]; v != all[i] {
				what := fmt.Sprintf("rank 0 and rank %d were started with different %s", r, s.Name)
				if s.Numeric {
					what = fmt.Sprintf("rank 0 has %s %d, rank %d has %s %d", s.Name, all[i], r, s.Name, v)
				}
				errs = append(errs, fmt.Errorf("the ranks disagree on %s: %s (this rank: %s); start every rank with the same settings", s.Name, what, s.Shown))
				break
			}
		}
	}
	return errors.Join(errs...)
}

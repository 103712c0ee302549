// Package ranksettings checks that every rank of an MPI job resolved the
// same settings: ranks that disagree on a setting that shapes the
// collective work would wait for each other in different collectives, so
// the commands compare their settings once, at start, and every rank fails
// alike, naming the setting and the ranks. It holds no state.
//
// A setting is compared as the rank will use it, after defaults and the
// environment are applied, never as typed: a rank given a flag at its
// default value (-mode packed, -blocks 2000) agrees with ranks that left
// it out, and two ranks whose flags differ in spelling only agree. The
// caller resolves each setting with the same code that applies it.
//
// The comparison is one bounded Allgather (cluster.AllgatherWithin) of a
// row of int64s per rank: a failure slot, a hash of the settings' names,
// and the settings' values. A rank that could not resolve its settings
// still takes part, with its failure slot set, so that the others fail
// alike naming it instead of waiting for it. Each rank's row sits at its
// own place in the gathered rows, so a rank speaks only for itself: its
// failure slot can name no other rank, and a slot that is neither 0 nor 1
// is reported as that rank's malformed row.
package ranksettings

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"strings"
	"time"

	"github.com/distbuf/distbuf"
	"github.com/distbuf/distbuf/cluster"
)

// Setting is one resolved setting as a number every rank can compare: the
// value of a numeric setting, the hash of a text one.
type Setting struct {
	Name    string
	Value   int64
	Shown   string // as a message shows this rank's value
	Numeric bool   // Value is the setting itself, not a hash of it
}

// Number is the numeric setting name = v, v resolved.
func Number(name string, v int64) Setting { return Setting{name, v, fmt.Sprint(v), true} }

// Text is the text setting name = v, v resolved, compared by its hash.
func Text(name, v string) Setting {
	return Setting{name, int64(hash(v)), fmt.Sprintf("%q", v), false}
}

func hash(s string) uint64 {
	h := fnv.New64a()
	_, _ = io.WriteString(h, s)
	return h.Sum64()
}

// Options says how Agree runs.
type Options struct {
	// Timeout bounds the agreement: a rank not heard from within it is
	// named in an error matching cluster.ErrTimeout. Ranks start at
	// different times (launch, runtime and MPI start-up), so it is
	// generous. Zero or negative: no limit.
	Timeout time.Duration
	// Failed is why this rank could not resolve its settings, or nil. The
	// rank still takes part, so that every other rank fails naming it
	// instead of waiting for it; Agree then returns Failed on this rank.
	Failed error
}

// The slots before the settings' values in each rank's row.
const (
	slotFailed = iota // 0, or 1 when the rank could not resolve its settings
	slotNames         // the hash of the settings' names, in order
	slotValues        // the first setting's value
)

// Agree is AgreeWith without a deadline, for a rank that resolved its
// settings.
func Agree(c *cluster.Comm, mine []Setting) error { return AgreeWith(c, mine, Options{}) }

// AgreeWith gathers every rank's resolved settings and fails on every
// rank alike when they differ, naming each setting and the first rank that
// differs from rank 0, or when a rank could not resolve them, naming it.
// Every rank of c calls it with the same names in the same order. The
// errors match distbuf.ErrBadConfig (different or unresolved settings),
// distbuf.ErrInvalid (a rank's malformed row, or rows of different
// lengths: another list of settings) or cluster.ErrTimeout.
func AgreeWith(c *cluster.Comm, mine []Setting, o Options) error {
	row := make([]int64, slotValues+len(mine))
	if o.Failed != nil {
		row[slotFailed] = 1
	}
	row[slotNames] = int64(namesHash(mine))
	for i, s := range mine {
		row[slotValues+i] = s.Value
	}
	err := agreeRow(c, row, mine, o.Timeout)
	if o.Failed != nil {
		return errors.Join(o.Failed, err)
	}
	return err
}

func namesHash(settings []Setting) uint64 {
	names := make([]string, len(settings))
	for i, s := range settings {
		names[i] = s.Name
	}
	return hash(strings.Join(names, "\x00"))
}

// agreeRow gathers row from every rank and compares the rows.
func agreeRow(c *cluster.Comm, row []int64, mine []Setting, timeout time.Duration) error {
	all := make([]int64, len(row)*c.Size())
	if err := cluster.AllgatherWithin(c, row, all, timeout); err != nil {
		return fmt.Errorf("ranksettings: comparing the settings of the ranks: %w", err)
	}
	rows := make([][]int64, c.Size())
	for r := range rows {
		rows[r] = all[r*len(row) : (r+1)*len(row)]
	}
	return compare(rows, c.Rank(), mine)
}

// compare checks every rank's row against this rank's settings. It trusts
// no row: the failure slot must be 0 or 1 and the names' hash this rank's;
// a row that breaks either is reported as its rank's.
func compare(rows [][]int64, self int, mine []Setting) error {
	names := int64(namesHash(mine))
	var errs []error
	var failed []string
	for r, row := range rows {
		if len(row) != slotValues+len(mine) {
			return fmt.Errorf("ranksettings: rank %d sent %d values, this rank %d: %w", r, len(row), slotValues+len(mine), distbuf.ErrInvalid)
		}
		switch row[slotFailed] {
		case 0:
		case 1:
			if r != self {
				failed = append(failed, fmt.Sprint(r))
			}
		default:
			errs = append(errs, fmt.Errorf("ranksettings: rank %d sent %d in its failure slot (want 0 or 1): %w", r, row[slotFailed], distbuf.ErrInvalid))
		}
		if row[slotNames] != names {
			errs = append(errs, fmt.Errorf("ranksettings: rank %d compares other settings than this rank (%s): is it another build of the program?: %w",
				r, listNames(mine), distbuf.ErrInvalid))
		}
	}
	if len(failed) > 0 {
		who := "rank " + failed[0]
		if len(failed) > 1 {
			who = "ranks " + strings.Join(failed, ", ")
		}
		errs = append(errs, fmt.Errorf("ranksettings: %s could not resolve their settings (each one's own error says why): %w", who, distbuf.ErrBadConfig))
	}
	if len(errs) > 0 || rows[self][slotFailed] != 0 {
		// A rank that failed says why itself; its values mean nothing.
		return errors.Join(errs...)
	}
	for i, s := range mine {
		first := rows[0][slotValues+i]
		for r := 1; r < len(rows); r++ {
			v := rows[r][slotValues+i]
			if v == first {
				continue
			}
			what := fmt.Sprintf("rank 0 and rank %d were started with different %s", r, s.Name)
			if s.Numeric {
				what = fmt.Sprintf("rank 0 has %s %d, rank %d has %s %d", s.Name, first, r, s.Name, v)
			}
			errs = append(errs, fmt.Errorf("ranksettings: the ranks disagree on %s: %s (this rank: %s); start every rank with the same settings: %w",
				s.Name, what, s.Shown, distbuf.ErrBadConfig))
			break
		}
	}
	return errors.Join(errs...)
}

func listNames(settings []Setting) string {
	names := make([]string, len(settings))
	for i, s := range settings {
		names[i] = s.Name
	}
	return strings.Join(names, ", ")
}

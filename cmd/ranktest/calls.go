package main

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/internal/cudart"
)

// callTimes accumulates, with -calls, the runtime calls of the solves and
// the time spent inside them, by entry point, leaving the harness's own
// work out (pause to resume) as runtime_calls does. Its methods do nothing
// on a nil receiver, so that the solve calls them unconditionally.
type callTimes struct {
	start, now cudart.Tally // read around each counted stretch, reused
	solves     cudart.Tally
	n          int
}

func (c *callTimes) begin() {
	if c != nil {
		c.start.Read()
	}
}

func (c *callTimes) pause() {
	if c != nil {
		c.now.Read()
		c.solves.AddSince(&c.now, &c.start)
	}
}

func (c *callTimes) resume() { c.begin() }

func (c *callTimes) finish() {
	if c != nil {
		c.pause()
		c.n++
	}
}

// entryCalls is one entry point's share of a solve.
type entryCalls struct {
	Calls float64 `json:"calls"`
	US    float64 `json:"us"`
}

// collect returns, on every rank, each entry point's calls and time per
// solve, as the mean over ranks. It is collective.
func (c *callTimes) collect(world *cluster.Comm, timeout time.Duration) (map[string]entryCalls, error) {
	names := cudart.EntryPoints()
	counts, ns := c.solves.Counts(), c.solves.Durations()
	v := make([]float64, 2*len(names)+1)
	for i, name := range names {
		v[2*i], v[2*i+1] = float64(counts[name]), float64(ns[name])
	}
	v[len(v)-1] = float64(c.n)
	if err := cluster.AllreduceWithin(world, v, v, cluster.Sum, timeout); err != nil {
		return nil, err
	}
	solves := v[len(v)-1] // over all ranks: the mean per rank and solve
	out := map[string]entryCalls{}
	for i, name := range names {
		if v[2*i] > 0 && solves > 0 {
			out[name] = entryCalls{Calls: round3(v[2*i] / solves), US: round3(v[2*i+1] / solves / 1e3)}
		}
	}
	return out, nil
}

// printCalls is the table of -calls: the entry points by time per solve.
func printCalls(out io.Writer, by map[string]entryCalls) {
	names := make([]string, 0, len(by))
	var calls, us float64
	for name, e := range by {
		names = append(names, name)
		calls += e.Calls
		us += e.US
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(cmp.Compare(by[b].US, by[a].US), cmp.Compare(a, b)) })
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "runtime calls per solve (mean over ranks)\tcalls\ttime\tper call\t")
	for _, name := range names {
		e := by[name]
		fmt.Fprintf(tw, "%s\t%.1f\t%s\t%s\t\n", name, e.Calls, human(e.US, "us"), human(e.US/e.Calls, "us"))
	}
	fmt.Fprintf(tw, "all\t%.1f\t%s\t\t\n", calls, human(us, "us"))
	_ = tw.Flush()
}

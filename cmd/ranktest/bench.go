package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
)

// benchContext is what a benchmark receives: the parsed flags, an open
// allocator and a sink for result lines.
type benchContext struct {
	cfg   config
	alloc *devalloc.Allocator
	world *cluster.Comm
	out   io.Writer
}

// benchResult is one JSON line of -bench output. Extra carries
// benchmark-specific figures (ratios against the baseline measured in the
// same run, bandwidths, counts).
type benchResult struct {
	Bench    string         `json:"bench"`
	Mode     string         `json:"mode"`
	N        int            `json:"n"`
	Bytes    int64          `json:"bytes"`
	MedianUS float64        `json:"median_us"`
	Backend  string         `json:"backend"`
	Extra    map[string]any `json:"extra,omitempty"`
}

// emit writes r as one JSON line.
func (c *benchContext) emit(r benchResult) error {
	if r.Backend == "" && c.alloc != nil {
		r.Backend = kindName(c.alloc)
	}
	line, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(c.out, string(line))
	return err
}

// benchFunc runs one benchmark in every mode it has (or only c.cfg.mode when set).
type benchFunc func(c *benchContext) error

// benches is filled by the bench_*.go files of this command.
var benches = map[string]benchFunc{}

func benchNames() string {
	names := make([]string, 0, len(benches))
	for n := range benches {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// median of xs; it sorts xs.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	m := len(xs) / 2
	if len(xs)%2 == 1 {
		return xs[m]
	}
	return (xs[m-1] + xs[m]) / 2
}

func runBench(cfg config, world *cluster.Comm, out io.Writer) error {
	var names []string
	if cfg.bench == "all" {
		for n := range benches {
			names = append(names, n)
		}
		sort.Strings(names)
	} else {
		if _, ok := benches[cfg.bench]; !ok {
			return fmt.Errorf("-bench %q: unknown benchmark (have: %s, all)", cfg.bench, benchNames())
		}
		names = []string{cfg.bench}
	}
	a, err := openAllocator(cfg)
	if err != nil {
		return err
	}
	c := &benchContext{cfg: cfg, alloc: a, world: world, out: out}
	for _, n := range names {
		if err := benches[n](c); err != nil {
			_ = a.Close()
			return fmt.Errorf("bench %s: %w", n, err)
		}
	}
	return a.Close()
}

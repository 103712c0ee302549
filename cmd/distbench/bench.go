package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/allockind"
)

// benchContext is what a benchmark receives: the parsed flags, the rank's
// open allocator, the world and a sink for result lines.
type benchContext struct {
	cfg   config
	alloc *devalloc.Allocator
	world *cluster.Comm
	out   io.Writer
}

// benchResult is one JSON line of output. Extra carries
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
		r.Backend = allockind.Name(c.alloc)
	}
	line, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(c.out, string(line))
	return err
}

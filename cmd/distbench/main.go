package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/ranksettings"
	"github.com/distbuf/distbuf/msg"
)

type config struct {
	bench      string // the benchmark: exchange
	backend    string // "": DISTBUF_BACKEND, else auto
	mode       string // the benchmark's modes; "" runs its default set
	iters      int    // the least number of repetitions of each mode
	blocks     int    // blocks per rank (0: the benchmark's default)
	blockBytes int64  // bytes per block (0: the benchmark's default)
}

// Bounds on the sizes the flags give, far above any run this command is
// for and far below what would exhaust memory before the first exchange.
const (
	maxIters      = 10_000_000
	maxBlocks     = 1_000_000
	maxBlockBytes = 1 << 40
)

// benches are the benchmarks by name, each with its resolution of the
// flags into what it runs.
var benches = map[string]func(cfg config) (benchPlan, error){
	"exchange": resolveExchange,
}

// benchPlan is a benchmark resolved from the flags: the settings every
// rank must agree on, and the run. A resolution that failed still gives
// the settings' names (with zero values), so the rank can take part in the
// agreement.
type benchPlan interface {
	settings() []ranksettings.Setting
	run(c *benchContext) error
}

func main() {
	cfg, err := parseArgs(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "distbench:", err)
		os.Exit(2)
	}
	if rank, err := mainErr(cfg); err != nil {
		// At once, naming the rank, and then the end of the whole job: the
		// other ranks may be waiting for this one in a collective.
		if rank >= 0 {
			fmt.Fprintf(os.Stderr, "distbench: rank %d: %v\n", rank, err)
		} else {
			fmt.Fprintln(os.Stderr, "distbench:", err)
		}
		cluster.Abort(1)
	}
	if err := cluster.Finalize(); err != nil {
		fmt.Fprintln(os.Stderr, "distbench:", err)
		os.Exit(1)
	}
}

const usage = `usage: distbench BENCHMARK [flags]

Runs a multi-rank benchmark under mpirun (build with -tags mpi) and prints
one JSON object per result line on rank 0. Benchmarks:

  exchange   package msg between 2 ranks against one MPI message per block
             and a raw MPI exchange of the same bytes; -mode device
             exchanges device buffers (CUDA backend)

Flags:
`

// parseArgs reads the benchmark's name and then its flags.
func parseArgs(args []string, out io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("distbench", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(out, usage)
		fs.PrintDefaults()
	}
	fs.StringVar(&cfg.backend, "backend", "", "memory backend: auto, cuda or host (default: $"+"DISTBUF_BACKEND"+", else auto)")
	fs.StringVar(&cfg.mode, "mode", "", "exchange: packed, packed-cold, persistent, packed-mpi, perblock, raw (several, separated by commas, take turns), or device; default: every host mode, and device on the CUDA backend")
	fs.IntVar(&cfg.iters, "iters", 20, fmt.Sprintf("the least number of repetitions of each mode (at most %d)", maxIters))
	fs.IntVar(&cfg.blocks, "blocks", 0, fmt.Sprintf("blocks per rank (0: the benchmark's default; at most %d)", maxBlocks))
	fs.Int64Var(&cfg.blockBytes, "block-bytes", 0, "bytes per block (0: the benchmark's default)")
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
			fs.Usage()
			return cfg, flag.ErrHelp
		}
		fs.Usage()
		return cfg, errors.New("name a benchmark first: distbench exchange [flags]")
	}
	cfg.bench = args[0]
	if _, ok := benches[cfg.bench]; !ok {
		return cfg, fmt.Errorf("unknown benchmark %q (have: exchange)", cfg.bench)
	}
	if err := fs.Parse(args[1:]); err != nil {
		return cfg, err
	}
	switch {
	case fs.NArg() > 0:
		return cfg, fmt.Errorf("unexpected argument %q: distbench takes a benchmark's name, then flags", fs.Arg(0))
	case cfg.iters < 0 || cfg.iters > maxIters:
		return cfg, fmt.Errorf("-iters %d: want 0 to %d repetitions", cfg.iters, maxIters)
	case cfg.blocks < 0 || cfg.blocks > maxBlocks:
		return cfg, fmt.Errorf("-blocks %d: want 0 to %d blocks per rank", cfg.blocks, maxBlocks)
	case cfg.blockBytes < 0 || cfg.blockBytes > maxBlockBytes:
		return cfg, fmt.Errorf("-block-bytes %d: want 0 to %d bytes", cfg.blockBytes, int64(maxBlockBytes))
	}
	return cfg, nil
}

// mainErr brings up MPI, checks that every rank resolved the same
// settings, places the rank on a GPU by its local rank, and runs the
// benchmark. It returns the rank (-1 before MPI is up) and leaves MPI
// running: main ends it, by Finalize on success and by aborting the job on
// error.
func mainErr(cfg config) (rank int, err error) {
	if err := cluster.Init(); err != nil {
		return -1, err
	}
	world, err := cluster.World()
	if err != nil {
		return -1, err
	}
	rank = world.Rank()
	plan, settings, timeout, resolveErr := resolveSettings(cfg)
	if err := ranksettings.AgreeWith(world, settings, ranksettings.Options{Timeout: timeout, Failed: resolveErr}); err != nil {
		return rank, err
	}
	device := 0
	if n, _ := devalloc.DeviceCount(); n > 0 {
		if device, err = world.Device(n); err != nil {
			return rank, err
		}
	}
	// An empty backend lets devalloc read DISTBUF_BACKEND, as resolveSettings did.
	a, err := devalloc.Open(devalloc.Options{Backend: devalloc.Backend(cfg.backend), Device: device, Warn: func(string) {}})
	if err != nil {
		if cfg.backend != "" {
			err = fmt.Errorf("-backend %q: %w", cfg.backend, err)
		}
		return rank, err
	}
	c := &benchContext{cfg: cfg, alloc: a, world: world, out: os.Stdout}
	if err := plan.run(c); err != nil {
		return rank, errors.Join(fmt.Errorf("%s: %w", cfg.bench, err), a.Close())
	}
	return rank, a.Close()
}

// resolveSettings resolves what this rank will run, as every rank must
// agree: the benchmark, the backend asked for (-backend, else
// DISTBUF_BACKEND, else auto) and the benchmark's own settings after its
// defaults; and the agreement's timeout, msg's (DISTBUF_MSG_TIMEOUT, else
// msg.DefaultTimeout): ranks start at different times, and a rank that
// never reaches the agreement ends the job within it instead of hanging
// it. On error the settings keep their names, so that the rank can still
// take part in the agreement and the others name it.
func resolveSettings(cfg config) (benchPlan, []ranksettings.Setting, time.Duration, error) {
	var errs []error
	backend, err := resolveBackend(cfg.backend)
	errs = append(errs, err)
	plan, err := benches[cfg.bench](cfg)
	errs = append(errs, err)
	timeout := msg.DefaultTimeout
	if v, ok := os.LookupEnv(msg.EnvTimeout); ok {
		t, err := msg.ParseTimeout(v)
		if err != nil {
			errs = append(errs, err) // it names the variable and its value
		} else {
			timeout = t
		}
	}
	settings := append([]ranksettings.Setting{
		ranksettings.Text("benchmark", cfg.bench),
		ranksettings.Text("-backend", string(backend)),
	}, plan.settings()...)
	return plan, settings, timeout, errors.Join(errs...)
}

// resolveBackend is the backend devalloc.Open will use: the flag, else
// DISTBUF_BACKEND, else auto, in lower case.
func resolveBackend(flagValue string) (devalloc.Backend, error) {
	v, from := flagValue, "-backend"
	if v == "" {
		v, from = os.Getenv("DISTBUF_BACKEND"), "DISTBUF_BACKEND"
	}
	b := devalloc.Backend(strings.ToLower(strings.TrimSpace(v)))
	switch b {
	case "":
		return devalloc.BackendAuto, nil
	case devalloc.BackendAuto, devalloc.BackendCUDA, devalloc.BackendHost:
		return b, nil
	}
	return "", fmt.Errorf("%s %q: want auto, cuda or host", from, v)
}

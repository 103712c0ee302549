package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
	"github.com/distbuf/distbuf/internal/bytesize"
	"github.com/distbuf/distbuf/internal/ranksettings"
	"github.com/distbuf/distbuf/msg"
)

type config struct {
	// backend and policy are "" when their flag was not given: the
	// environment (DISTBUF_BACKEND, DISTBUF_ALLOC_CONF) then decides.
	backend    string
	policy     string
	iters      int
	seed       uint64
	json       bool
	mode       string // packed or perblock; "" is packed
	blocks     int    // blocks per rank (0: the workload's default)
	bonds      int    // bonds of the workload's sweep (0: defaultBonds)
	fresh      bool   // plan every solve afresh
	device     int    // CUDA device, set from the rank's placement
	cpuProfile string // per-rank CPU profile path prefix; "" for none
	calls      bool   // time the runtime calls of the solves by entry point
	// timeout bounds every collective of the run (cluster's *Within
	// forms): DISTBUF_MSG_TIMEOUT, the exchanges' own bound, else msg's
	// default; 0 waits without limit.
	timeout  time.Duration
	workload string // synthetic, sectors or maxm; "" is synthetic
	m        int    // bond dimension of the sectors and maxm workloads
	bigBlock int64  // sectors: a sector of D with D*D float64s at least this many bytes is big; a block between two big ones is its own allocation
	growConfig
}

// Bounds on the sizes the flags give, far above any run this harness is
// for and far below what would exhaust memory before the first solve.
const (
	maxIters  = 10_000_000
	maxBlocks = 1_000_000
	maxM      = 1 << 20
)

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ranktest:", err)
		os.Exit(2)
	}
	if rank, err := mainErr(cfg); err != nil {
		// At once, naming the rank, and then the end of the whole job: the
		// other ranks may be waiting for this one in a collective, and
		// Finalize would wait for them.
		if rank >= 0 {
			fmt.Fprintf(os.Stderr, "ranktest: rank %d: %v\n", rank, err)
		} else {
			fmt.Fprintln(os.Stderr, "ranktest:", err)
		}
		cluster.Abort(1)
	}
	// A rank that stopped for good would hold MPI_Finalize for ever.
	timeout, _ := collectiveTimeout()
	if err := cluster.FinalizeWithin(timeout); err != nil {
		fmt.Fprintln(os.Stderr, "ranktest:", err)
		os.Exit(1)
	}
}

// parseFlags reads the command line. A flag overrides the environment only
// when it is given: without -backend, DISTBUF_BACKEND decides, and without
// -policy, the policy of DISTBUF_ALLOC_CONF does.
func parseFlags(args []string, usage io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("ranktest", flag.ContinueOnError)
	fs.SetOutput(usage)
	fs.StringVar(&cfg.backend, "backend", "auto", "memory backend: auto, cuda or host (when not given: $DISTBUF_BACKEND, else auto)")
	fs.StringVar(&cfg.policy, "policy", "auto", "pool retention policy: auto, retain or free (when not given: the policy in $DISTBUF_ALLOC_CONF, else auto)")
	fs.IntVar(&cfg.iters, "iters", 20, fmt.Sprintf("solves per rank (at most %d)", maxIters))
	fs.Uint64Var(&cfg.seed, "seed", 1, "workload seed")
	fs.BoolVar(&cfg.json, "json", false, "print one JSON summary object as the last line")
	fs.StringVar(&cfg.mode, "mode", "", "packed or perblock (default packed)")
	fs.IntVar(&cfg.blocks, "blocks", 0, fmt.Sprintf("blocks per rank (0: the workload's default; at most %d)", maxBlocks))
	fs.IntVar(&cfg.bonds, "bonds", defaultBonds, fmt.Sprintf("bonds of the solve's sweep: solve i is at bond i mod N, each bond with its own block structure, planned at its first solve (at most %d)", maxBonds))
	fs.BoolVar(&cfg.fresh, "fresh", false, "plan every solve afresh (layout, GEMM plans, exchange pattern), as for a block structure that never repeats")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write each rank's CPU profile to FILE.rankN")
	fs.StringVar(&cfg.workload, "workload", "synthetic", "synthetic (random block sizes, one GEMM per block, the blocks sent to random ranks), sectors (a U(1) spin-1/2 chain's two-site H·psi at bond dimension -m) or maxm (shared/anchors' maxm.cu working set at bond dimension -m, through distbuf's pool and packing: allocated, touched, freed)")
	fs.IntVar(&cfg.m, "m", defaultM, fmt.Sprintf("bond dimension of the sectors and maxm workloads, the first of a growing run (1 to %d)", maxM))
	bigBlock := fs.String("big-block", "1MiB", "sectors: a block between two sectors of D with D*D*8 bytes at least this size is allocated on its own; the others share their operand's tail buffer (0: every block in the tail)")
	fs.BoolVar(&cfg.calls, "calls", false, "time every CUDA runtime call of the solves and report calls and time per solve by entry point (two clock reads a call: tens of nanoseconds each, up to half a microsecond on virtual machines with a slow clock)")
	registerGrowFlags(fs, &cfg.growConfig)
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	size, err := bytesize.Parse(*bigBlock)
	if err != nil {
		return cfg, fmt.Errorf("-big-block %q: %w", *bigBlock, err)
	}
	cfg.bigBlock = size
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if !given["backend"] {
		cfg.backend = ""
	}
	if !given["policy"] {
		cfg.policy = ""
	}
	switch {
	case fs.NArg() > 0:
		return cfg, fmt.Errorf("unexpected argument %q: ranktest takes flags only (ranktest -h lists them)", fs.Arg(0))
	case cfg.iters > maxIters:
		return cfg, fmt.Errorf("-iters %d: at most %d solves", cfg.iters, maxIters)
	case cfg.blocks < 0 || cfg.blocks > maxBlocks:
		return cfg, fmt.Errorf("-blocks %d: want 0 to %d blocks per rank", cfg.blocks, maxBlocks)
	case cfg.bonds < 1 || cfg.bonds > maxBonds:
		return cfg, fmt.Errorf("-bonds %d: want 1 to %d bonds", cfg.bonds, maxBonds)
	case cfg.workload != "synthetic" && cfg.workload != "sectors" && cfg.workload != "maxm":
		return cfg, fmt.Errorf("-workload %q: want synthetic, sectors or maxm", cfg.workload)
	case cfg.m < 1 || cfg.m > maxM:
		return cfg, fmt.Errorf("-m %d: want 1 to %d", cfg.m, maxM)
	}
	return cfg, checkGrowFlags(cfg.growConfig, cfg.workload)
}

// mainErr brings up MPI (a one-rank world when built without the mpi tag),
// checks that every rank got the same settings, places the rank on a GPU
// by its local rank, and runs the workload. It returns
// the rank (-1 before MPI is up). It leaves MPI running: main ends it,
// by Finalize on success and by aborting the job on error.
func mainErr(cfg config) (rank int, err error) {
	if err := cluster.Init(); err != nil {
		return -1, err
	}
	world, err := cluster.World()
	if err != nil {
		return -1, err
	}
	rank = world.Rank()
	settings, failed := agreedSettings(&cfg)
	if err := ranksettings.AgreeWith(world, settings, ranksettings.Options{Timeout: cfg.timeout, Failed: failed}); err != nil {
		return rank, err
	}
	if cfg.cpuProfile != "" {
		stop, err := startCPUProfile(fmt.Sprintf("%s.rank%d", cfg.cpuProfile, rank))
		if err != nil {
			return rank, err
		}
		defer func() { err = errors.Join(err, stop()) }()
	}
	if n, _ := devalloc.DeviceCount(); n > 0 {
		if cfg.device, err = world.Device(n); err != nil {
			return rank, err
		}
	}
	return rank, run(cfg, world, os.Stdout, os.Stderr)
}

// agreedSettings are the settings that shape the collective work, as the
// run will use them (withDefaults, the environment applied): ranks that
// disagree on them would wait for each other in different collectives. It
// sets cfg.timeout, the bound of every collective (collectiveTimeout). A
// setting this rank cannot resolve is its error, which the agreement
// reports on every rank.
func agreedSettings(cfg *config) ([]ranksettings.Setting, error) {
	var errs []error
	var err error
	if cfg.timeout, err = collectiveTimeout(); err != nil {
		errs = append(errs, err)
	}
	r := cfg.withDefaults()
	backend, policy := r.backend, r.policy
	if backend == "" {
		backend = strings.ToLower(strings.TrimSpace(os.Getenv("DISTBUF_BACKEND")))
	}
	if backend == "" {
		backend = string(devalloc.BackendAuto)
	}
	if policy != "" {
		p, err := parsePolicy(policy)
		if err != nil {
			errs = append(errs, fmt.Errorf("-policy %q: %w", policy, err))
		}
		policy = p.String()
	} else {
		conf, err := devalloc.EnvConfig()
		errs = append(errs, err)
		policy = conf.Policy.String()
	}
	number, text := ranksettings.Number, ranksettings.Text
	return []ranksettings.Setting{
		number("-iters", int64(r.iters)),
		text("-mode", r.mode),
		number("-blocks", int64(r.blocks)),
		number("-seed", int64(r.seed)),
		number("-bonds", int64(r.bonds)),
		number("-fresh", map[bool]int64{false: 0, true: 1}[cfg.fresh]),
		number("-calls", map[bool]int64{false: 0, true: 1}[cfg.calls]),
		text("-policy", policy),
		text("-backend", backend),
		text("-workload", r.workload),
		number("-m", int64(cfg.m)),
		number("-big-block", cfg.bigBlock),
		text("-grow", strconv.FormatFloat(cfg.grow, 'g', -1, 64)),
		number("-grow-until", int64(cfg.growUntil)),
		number("-step-solves", int64(cfg.stepSolves)),
		number("-probe", map[bool]int64{false: 0, true: 1}[cfg.probe]),
		number("-ballast-free", cfg.ballastFree),
	}, errors.Join(errs...)
}

// collectiveTimeout is the bound of the run's collectives:
// DISTBUF_MSG_TIMEOUT, the exchanges' own, else msg's default; 0 for none
// (off).
func collectiveTimeout() (time.Duration, error) {
	v, ok := os.LookupEnv(msg.EnvTimeout)
	if !ok || strings.TrimSpace(v) == "" {
		return msg.DefaultTimeout, nil
	}
	t, err := msg.ParseTimeout(v)
	if err != nil {
		return msg.DefaultTimeout, fmt.Errorf("%s: %w", msg.EnvTimeout, err)
	}
	return max(t, 0), nil
}

// withDefaults fills in what the flags leave to the workload: the mode, the
// workload, the bonds and the synthetic workload's blocks, as run applies
// them.
func (cfg config) withDefaults() config {
	if cfg.mode == "" {
		cfg.mode = "packed"
	}
	if cfg.workload == "" {
		cfg.workload = "synthetic"
	}
	if cfg.bonds == 0 {
		cfg.bonds = defaultBonds
	}
	if cfg.blocks == 0 {
		cfg.blocks = defaultShape.blocks
	}
	return cfg
}

// startCPUProfile profiles this process into path until the returned
// function is called.
func startCPUProfile(path string) (func() error, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("-cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("-cpuprofile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

// parsePolicy reads a -policy value as DISTBUF_ALLOC_CONF's policy key
// does: auto, retain, or free (aggressive-free).
func parsePolicy(s string) (devalloc.Policy, error) {
	if strings.ContainsAny(s, ",:") {
		return 0, fmt.Errorf("want auto, retain or free")
	}
	c, err := devalloc.ParseConfig("policy:" + s)
	return c.Policy, err
}

// openAllocator opens the rank's allocator: the backend of -backend, else
// of DISTBUF_BACKEND, else auto; the configuration of DISTBUF_ALLOC_CONF,
// whose policy -policy overrides when given.
func openAllocator(cfg config) (*devalloc.Allocator, error) {
	// "": devalloc reads DISTBUF_BACKEND; Open refuses a name it does not know.
	backend := devalloc.Backend(strings.ToLower(strings.TrimSpace(cfg.backend)))
	conf, err := devalloc.EnvConfig()
	if err != nil {
		return nil, err
	}
	if cfg.policy != "" {
		policy, err := parsePolicy(cfg.policy)
		if err != nil {
			return nil, fmt.Errorf("-policy %q: %w", cfg.policy, err)
		}
		conf.Policy = policy
	}
	// The fallback reason is printed once, by rank 0 (run's banner); the
	// table counts ranks on another backend than rank 0's.
	quiet := func(string) {}
	return devalloc.Open(devalloc.Options{Backend: backend, Device: cfg.device, Config: &conf, Warn: quiet})
}

package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/distbuf/distbuf/cluster"
	"github.com/distbuf/distbuf/devalloc"
)

type config struct {
	backend    string
	policy     string
	iters      int
	seed       uint64
	json       bool
	bench      string // benchmark name, "all", or "" for the solve workload
	mode       string // benchmark mode; "" runs every mode
	blocks     int    // blocks per rank (workload and benchmarks)
	bonds      int    // bonds of the workload's sweep (0: defaultBonds)
	fresh      bool   // plan every solve afresh
	blockBytes int64  // bytes per block for benchmarks that use one size
	device     int    // CUDA device, set from the rank's placement
	cpuProfile string // per-rank CPU profile path prefix; "" for none
}

func main() {
	var cfg config
	flag.StringVar(&cfg.backend, "backend", "auto", "memory backend: auto, cuda or host")
	flag.StringVar(&cfg.policy, "policy", "retain", "pool retention policy: retain or free")
	flag.IntVar(&cfg.iters, "iters", 20, "solves per rank")
	flag.Uint64Var(&cfg.seed, "seed", 1, "workload seed")
	flag.BoolVar(&cfg.json, "json", false, "print one JSON summary object as the last line")
	flag.StringVar(&cfg.bench, "bench", "", "run a benchmark instead of the workload: a name or all (one JSON line per result)")
	flag.StringVar(&cfg.mode, "mode", "", "packed or perblock for the solve (default packed); a benchmark's mode with -bench (default: all; -bench exchange takes several, separated by commas)")
	flag.IntVar(&cfg.blocks, "blocks", 0, "blocks per rank (0: the workload's or benchmark's default)")
	flag.IntVar(&cfg.bonds, "bonds", defaultBonds, "bonds of the solve's sweep: solve i is at bond i mod N, each bond with its own block structure, planned at its first solve")
	flag.BoolVar(&cfg.fresh, "fresh", false, "plan every solve afresh (layout, GEMM plans, exchange pattern), as for a block structure that never repeats")
	flag.Int64Var(&cfg.blockBytes, "block-bytes", 0, "bytes per block, for benchmarks with one block size (0: default)")
	flag.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write each rank's CPU profile to FILE.rankN")
	flag.Parse()
	if err := mainErr(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "ranktest:", err)
		os.Exit(1)
	}
}

// mainErr brings up MPI (a one-rank world when built without the mpi tag),
// places the rank on a GPU by its local rank, and runs the workload or the
// benchmark.
func mainErr(cfg config) (err error) {
	if cfg.blocks < 0 || cfg.blockBytes < 0 {
		return fmt.Errorf("-blocks and -block-bytes must not be negative")
	}
	if err := cluster.Init(); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, cluster.Finalize()) }()
	world, err := cluster.World()
	if err != nil {
		return err
	}
	if cfg.cpuProfile != "" {
		stop, err := startCPUProfile(fmt.Sprintf("%s.rank%d", cfg.cpuProfile, world.Rank()))
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, stop()) }()
	}
	if n, _ := devalloc.DeviceCount(); n > 0 {
		if cfg.device, err = world.Device(n); err != nil {
			return err
		}
	}
	if cfg.bench != "" {
		return runBench(cfg, world, os.Stdout)
	}
	return run(cfg, world, os.Stdout, os.Stderr)
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

func openAllocator(cfg config) (*devalloc.Allocator, error) {
	backend, err := devalloc.ParseBackend(cfg.backend)
	if err != nil {
		return nil, err
	}
	policy, err := devalloc.ParsePolicy(cfg.policy)
	if err != nil {
		return nil, fmt.Errorf("-policy %q: %w", cfg.policy, err)
	}
	conf := devalloc.Config{}
	if env := os.Getenv(devalloc.EnvConf); env != "" {
		if conf, err = devalloc.ParseConfig(env); err != nil {
			return nil, err
		}
	}
	conf.Policy = policy
	// The fallback reason is printed once, by rank 0 (run's banner); the
	// table counts ranks on another backend than rank 0's.
	quiet := func(string) {}
	return devalloc.Open(devalloc.Options{Backend: backend, Device: cfg.device, Config: &conf, Warn: quiet})
}

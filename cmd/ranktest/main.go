package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sort"
	"time"

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
	blockBytes int64  // bytes per block for benchmarks that use one size
	device     int    // CUDA device, set from the rank's placement
}

func main() {
	var cfg config
	flag.StringVar(&cfg.backend, "backend", "auto", "memory backend: auto, cuda or host")
	flag.StringVar(&cfg.policy, "policy", "retain", "pool retention policy: retain or free")
	flag.IntVar(&cfg.iters, "iters", 20, "solve iterations")
	flag.Uint64Var(&cfg.seed, "seed", 1, "workload seed")
	flag.BoolVar(&cfg.json, "json", false, "print one JSON summary object as the last line")
	flag.StringVar(&cfg.bench, "bench", "", "run a benchmark instead of the workload: a name or all (one JSON line per result)")
	flag.StringVar(&cfg.mode, "mode", "", "benchmark mode (default: every mode of the benchmark)")
	flag.IntVar(&cfg.blocks, "blocks", 0, "blocks per rank (0: the workload's or benchmark's default)")
	flag.Int64Var(&cfg.blockBytes, "block-bytes", 0, "bytes per block, for benchmarks with one block size (0: default)")
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
	if n, _ := devalloc.DeviceCount(); n > 0 {
		if cfg.device, err = world.Device(n); err != nil {
			return err
		}
	}
	if cfg.bench != "" {
		return runBench(cfg, world, os.Stdout)
	}
	return run(cfg, os.Stdout)
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
	return devalloc.Open(devalloc.Options{Backend: backend, Device: cfg.device, Config: &conf})
}

// summary is the -json line.
type summary struct {
	OK                    bool    `json:"ok"`
	Backend               string  `json:"backend"`
	Policy                string  `json:"policy"`
	Iters                 int     `json:"iters"`
	AllocCalls            int64   `json:"alloc_calls"`
	BackendCalls          int64   `json:"backend_calls"`
	MedianCycleUS         float64 `json:"median_cycle_us"`
	PoolReservedPeakBytes int64   `json:"pool_reserved_peak_bytes"`
	RequestedPeakBytes    int64   `json:"requested_peak_bytes"`
}

// run performs an allocation cycle shaped like a two-site solve: a few large
// buffers and many tiny blocks, each allocated, touched and freed.
func run(cfg config, out io.Writer) (err error) {
	if cfg.iters <= 0 {
		return fmt.Errorf("-iters must be positive, got %d", cfg.iters)
	}
	a, err := openAllocator(cfg)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, a.Close()) }()
	s := a.DefaultStream()
	rng := rand.New(rand.NewPCG(cfg.seed, 0))
	cycles := make([]float64, 0, cfg.iters)
	for range cfg.iters {
		start := time.Now()
		var bufs []*devalloc.Buffer
		for range 4 {
			bufs = append(bufs, nil)
			n := int64(1+rng.IntN(4)) << 20
			if bufs[len(bufs)-1], err = a.Alloc(n, s); err != nil {
				return err
			}
		}
		for range 500 {
			n := int64(64 << rng.IntN(8))
			b, err := a.Alloc(n, s)
			if err != nil {
				return err
			}
			bufs = append(bufs, b)
		}
		for _, b := range bufs {
			if err := s.Memset(b, 0, b.Size(), 0); err != nil {
				return err
			}
			if err := b.Free(); err != nil {
				return err
			}
		}
		if err := s.Synchronize(); err != nil {
			return err
		}
		if err := a.EndPhase(); err != nil {
			return err
		}
		cycles = append(cycles, float64(time.Since(start).Microseconds()))
	}
	st := a.Stats()
	sort.Float64s(cycles)
	sum := summary{
		OK: true, Backend: a.Kind().String(), Policy: a.Policy().String(), Iters: cfg.iters,
		AllocCalls: st.AllocCalls, BackendCalls: st.BackendCalls, MedianCycleUS: cycles[len(cycles)/2],
		PoolReservedPeakBytes: st.ReservedPeak, RequestedPeakBytes: st.RequestedPeak,
	}
	fmt.Fprintf(out, "backend      %s (%s)\n", a.Kind(), a.Describe())
	if r := a.FallbackReason(); r != "" {
		fmt.Fprintf(out, "fallback     %s\n", r)
	}
	fmt.Fprintf(out, "policy       %s\n", a.Policy())
	fmt.Fprintf(out, "iterations   %d, median cycle %.0f us\n", cfg.iters, sum.MedianCycleUS)
	fmt.Fprintf(out, "allocs       %d (backend calls %d, frees %d)\n", st.AllocCalls, st.BackendCalls, st.Frees)
	fmt.Fprintf(out, "requested    peak %s, total %s\n", devalloc.FormatBytes(st.RequestedPeak), devalloc.FormatBytes(st.RequestedTotal))
	fmt.Fprintf(out, "reserved     now %s, peak %s\n", devalloc.FormatBytes(st.ReservedCurrent), devalloc.FormatBytes(st.ReservedPeak))
	if cfg.json {
		line, _ := json.Marshal(sum)
		fmt.Fprintln(out, string(line))
	}
	return nil
}

package devalloc

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/distbuf/distbuf/internal/bytesize"
)

// The environment variables Open reads when Options leaves the matching
// field empty (doc.go lists them all).
const (
	envBackend = "DISTBUF_BACKEND"    // auto | cuda | host
	envConf    = "DISTBUF_ALLOC_CONF" // e.g. "policy:retain,prime:2GiB,limit:80%"
	// envHostMemory sizes the host backend's device memory (hostMemory).
	envHostMemory = "DISTBUF_HOST_MEMORY"
)

// Backend names a memory backend: the one Options asks for, and the one
// Info reports in use (BackendCUDA or BackendHost; Info.Pool says which of
// the CUDA allocators it is).
type Backend string

const (
	BackendAuto Backend = "auto" // CUDA when a usable GPU is present, else host (with a reported reason)
	BackendCUDA Backend = "cuda" // CUDA or an error: never falls back to host
	BackendHost Backend = "host" // host memory; no GPU needed
)

// parseBackend accepts "auto", "cuda" and "host", in any case.
func parseBackend(s, source string) (Backend, error) {
	switch b := Backend(strings.ToLower(strings.TrimSpace(s))); b {
	case BackendAuto, BackendCUDA, BackendHost:
		return b, nil
	}
	return "", &configError{source: source, key: "backend", value: s, reason: "want auto, cuda or host"}
}

// Policy is the pool retention policy. It can be changed while running with
// Allocator.SetPolicy.
type Policy int

const (
	// Auto retains freed memory as Retain does until the device's memory is
	// tight, and then gives back what the pool keeps unused, as
	// AggressiveFree would: the retained speed for a run at a fixed size and
	// the reach of AggressiveFree for one that grows until the device is
	// full, with no choice to make. The device is tight when less of its
	// memory is free than the larger of Config.Headroom and the pool's own
	// unused reservation (doc.go, "Policy, budget and out-of-memory", says
	// when it looks). It is the default.
	Auto Policy = iota
	// Retain keeps freed memory in the pool (release threshold = max), so the
	// next allocation is a cheap reuse with no driver round trip. Fastest for
	// converged runs at a fixed problem size.
	Retain
	// AggressiveFree hands unused pool memory back at synchronisation points and
	// phase boundaries, leaving the most headroom for the largest runs.
	AggressiveFree
)

func (p Policy) String() string {
	switch p {
	case Auto:
		return "auto"
	case Retain:
		return "retain"
	case AggressiveFree:
		return "free"
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// retains reports whether the pool keeps freed memory between phases: the
// release threshold is the maximum and freed blocks may be kept for reuse.
func (p Policy) retains() bool { return p == Auto || p == Retain }

// parsePolicy accepts "auto", "retain", and "free" or "aggressive-free".
func parsePolicy(s string) (Policy, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "auto":
		return Auto, nil
	case "retain":
		return Retain, nil
	case "free", "aggressive-free", "aggressivefree":
		return AggressiveFree, nil
	}
	return 0, fmt.Errorf("want auto, retain or free")
}

// limitString writes the budget of c as the limit key takes it.
func (c Config) limitString() string {
	switch {
	case c.Limit > 0:
		return bytesize.Exact(c.Limit)
	case c.LimitFraction > 0:
		return formatPercent(c.LimitFraction)
	}
	return "none"
}

// formatPercent writes a fraction as a percentage that parsePercent reads
// back exactly: the shortest decimal that is the fraction, with its decimal
// point moved two places, not the fraction times 100 (which rounds, so that
// 1/3 would not come back).
func formatPercent(f float64) string {
	mant, exp, _ := strings.Cut(strconv.FormatFloat(f, 'e', -1, 64), "e")
	e, _ := strconv.Atoi(exp)
	e += 2 // a percentage
	digits := strings.Replace(mant, ".", "", 1)
	if e < -6 || e > 20 {
		return mant + "e" + strconv.Itoa(e) + "%"
	}
	// digits is d.ddd times 10^e: put the point after the first e+1 digits.
	point := e + 1
	switch {
	case point <= 0:
		digits = "0." + strings.Repeat("0", -point) + digits
	case point >= len(digits):
		digits += strings.Repeat("0", point-len(digits))
	default:
		digits = digits[:point] + "." + digits[point:]
	}
	return digits + "%"
}

// parsePercent reads a percentage as the fraction it writes, moving the
// decimal point two places in the text rather than dividing by 100, so that
// formatPercent's output comes back exactly.
func parsePercent(pct string) (float64, error) {
	mant, exp, hasExp := strings.Cut(strings.ToLower(strings.TrimSpace(pct)), "e")
	e := 0
	if hasExp {
		var err error
		if e, err = strconv.Atoi(exp); err != nil {
			return 0, fmt.Errorf("not a percentage (want e.g. 80%%)")
		}
	}
	f, err := strconv.ParseFloat(mant+"e"+strconv.Itoa(e-2), 64)
	if err != nil || math.IsNaN(f) || !(f > 0 && f <= 1) {
		return 0, fmt.Errorf("percentage must be in (0, 100]")
	}
	if f < minLimitFraction {
		return 0, fmt.Errorf("percentage too small: under one allocation (%d B) of any memory up to 1 PiB", allocAlign)
	}
	return f, nil
}

// minLimitFraction is the smallest fraction that can be a budget: one
// allocation unit of 1 PiB, the largest allocation distbuf accepts.
const minLimitFraction = float64(allocAlign) / (1 << 50)

// resolveLimit turns the budget into bytes given the total memory; 0 means
// none (or a fraction of unknown memory). Open refuses a fraction that
// resolves to less than one allocation.
func (c Config) resolveLimit(total int64) int64 {
	if c.Limit > 0 {
		return c.Limit
	}
	if c.LimitFraction > 0 && total > 0 {
		return int64(c.LimitFraction * float64(total))
	}
	return 0
}

// Config is the allocator configuration: what DISTBUF_ALLOC_CONF can set.
// The zero Config is the default: auto, a sixteenth of the device primed
// (CUDA pool), no budget, release
// threshold 0 under AggressiveFree, a sixteenth of the device as auto's
// headroom, pool when supported, 256 MiB cache.
type Config struct {
	Policy Policy
	// Prime is reserved in the pool once at Open, so that the first
	// solves find their memory there instead of growing the pool piece by
	// piece. 0 means the default: DefaultPrimeFraction of the device on the
	// CUDA pool under a retaining policy (Auto, Retain), none elsewhere (the
	// host backend's pool maps pages as they are touched; the cudaMalloc
	// fallback would cache one block of that size; AggressiveFree gives it
	// back at the first phase end). -1 (prime:none, prime:0) primes
	// nothing; unless PrimeFraction is set, a positive size is reserved as it is.
	Prime int64
	// PrimeFraction, in (0, 1], primes that fraction of the device's total
	// memory when Prime is 0.
	PrimeFraction float64
	// Limit is the hard per-rank budget in bytes, independent of the
	// retention policy: it caps the bytes of live buffers. 0 means none,
	// unless LimitFraction is set.
	Limit int64
	// LimitFraction, in (0, 1], sets the budget to that fraction of the
	// device's (or host's) total memory when Limit is 0.
	LimitFraction float64
	// FreeThreshold is the release threshold used under AggressiveFree.
	FreeThreshold int64
	// Headroom is the device memory Auto keeps free for everything else on
	// the device (other ranks sharing it, other libraries): once less than
	// this (or than the pool's own unused reservation) is free, Auto gives
	// back what the pool does not use. 0 means the default, unless
	// HeadroomFraction is set: DefaultHeadroomFraction of the device's
	// memory.
	Headroom int64
	// HeadroomFraction, in (0, 1], sets Headroom to that fraction of the
	// device's (or host's) total memory when Headroom is 0.
	HeadroomFraction float64
	// NoPool forces the CUDA backend's cudaMalloc fallback (pool:off).
	NoPool bool
	// Cache bounds the bytes devalloc keeps for reuse without the driver:
	// the cudaMalloc fallback's cache, and on the pool under Retain the
	// blocks kept for the next allocation of their size on the stream they
	// were freed on (on any stream, once their free has run, for those
	// freed on the reclamation stream). -1 keeps none, 0 means the default
	// (256 MiB).
	Cache int64
}

const defaultCache = 256 << 20

// DefaultPrimeFraction is the share of the device's memory a retaining
// pool reserves at Open when Config sets no prime: on an H100 with a 5.4 GB
// working set it took the first solve from 19.7 ms to 0.9 ms, and the
// growing run reached the same m (docs/PERFORMANCE.md, "Growing m").
const DefaultPrimeFraction = 1.0 / 16

// DefaultHeadroomFraction is the share of the device's memory Auto keeps
// free when Config sets no headroom: enough for another rank's growth step
// or a library's workspace beside the pool, small enough that a run at a
// fixed size keeps its retained memory until the device is all but full.
const DefaultHeadroomFraction = 1.0 / 16

// resolvePrime is the bytes to reserve at Open on a device of total bytes,
// for a pool of the given kind under policy p.
func (c Config) resolvePrime(total int64, pool bool, p Policy) int64 {
	switch {
	case c.Prime > 0:
		return c.Prime
	case c.Prime < 0 || total <= 0:
		return 0
	case c.PrimeFraction > 0:
		return int64(c.PrimeFraction * float64(total))
	case pool && p.retains():
		return alignUp(int64(DefaultPrimeFraction*float64(total)), allocAlign)
	}
	return 0
}

// resolveHeadroom is the headroom in bytes on a device of total bytes (0
// when neither is known).
func (c Config) resolveHeadroom(total int64) int64 {
	switch {
	case c.Headroom > 0:
		return c.Headroom
	case total <= 0:
		return 0
	case c.HeadroomFraction > 0:
		return int64(c.HeadroomFraction * float64(total))
	}
	return int64(DefaultHeadroomFraction * float64(total))
}

// String renders the configuration in the DISTBUF_ALLOC_CONF syntax;
// ParseConfig(c.String()) == c.
func (c Config) String() string {
	parts := []string{"policy:" + c.Policy.String()}
	switch {
	case c.Prime > 0:
		parts = append(parts, "prime:"+bytesize.Exact(c.Prime))
	case c.Prime < 0:
		parts = append(parts, "prime:none")
	case c.PrimeFraction > 0:
		parts = append(parts, "prime:"+formatPercent(c.PrimeFraction))
	}
	if c.Limit != 0 || c.LimitFraction != 0 {
		parts = append(parts, "limit:"+c.limitString())
	}
	if c.FreeThreshold > 0 {
		parts = append(parts, "threshold:"+bytesize.Exact(c.FreeThreshold))
	}
	switch {
	case c.Headroom > 0:
		parts = append(parts, "headroom:"+bytesize.Exact(c.Headroom))
	case c.HeadroomFraction > 0:
		parts = append(parts, "headroom:"+formatPercent(c.HeadroomFraction))
	}
	if c.NoPool {
		parts = append(parts, "pool:off")
	}
	if c.Cache != 0 {
		if c.Cache < 0 {
			parts = append(parts, "cache:off")
		} else {
			parts = append(parts, "cache:"+bytesize.Exact(c.Cache))
		}
	}
	return strings.Join(parts, ",")
}

// ParseConfig parses "key:value" pairs separated by commas, starting from the
// zero Config. Keys: policy (auto|retain|free), prime (size, N% or none), limit (size,
// N% or none), threshold (size), headroom (size or N%), pool (auto|off),
// cache (size or off). Sizes take
// B, KB, MB, GB, TB (powers of 1000) and KiB, MiB, GiB, TiB (powers of 1024)
// and must come to a whole number of bytes ("0.5" is an error, not 0). A
// limit of "none" or "0" means no budget; any other limit must be at least
// one byte, and a percentage at least 2.3e-11% (one 256-byte allocation of
// 1 PiB); Open also refuses a percentage that comes to less than 256 bytes
// of the memory it finds. An unknown, repeated or malformed key is an error
// naming the key, matching distbuf.ErrBadConfig. ParseConfig(c.String()) == c
// for every Config it returns.
func ParseConfig(s string) (Config, error) { return parseConfig(s, "config") }

// EnvConfig is the configuration DISTBUF_ALLOC_CONF gives, as Open reads it
// when Options.Config is nil (the zero Config when it is unset): for
// programs that adjust it before Open (a flag that overrides one key), with
// errors that name the variable.
func EnvConfig() (Config, error) { return parseConfig(os.Getenv(envConf), envConf) }

func parseConfig(s, source string) (Config, error) {
	var c Config
	seen := map[string]bool{}
	for _, field := range strings.Split(s, ",") {
		field = strings.TrimSpace(field)
		if field == "" {
			continue
		}
		key, val, ok := strings.Cut(field, ":")
		key, val = strings.ToLower(strings.TrimSpace(key)), strings.TrimSpace(val)
		bad := func(reason string) error {
			return &configError{source: source, key: key, value: val, reason: reason}
		}
		if !ok {
			return c, &configError{source: source, key: key, value: "", reason: "want key:value"}
		}
		if seen[key] {
			return c, bad("key given twice")
		}
		seen[key] = true
		var err error
		switch key {
		case "policy":
			if c.Policy, err = parsePolicy(val); err != nil {
				return c, bad(err.Error())
			}
		case "prime":
			if c.Prime, c.PrimeFraction, err = parsePrime(val); err != nil {
				return c, bad(err.Error())
			}
		case "limit":
			if c.Limit, c.LimitFraction, err = parseLimit(val); err != nil {
				return c, bad(err.Error())
			}
		case "threshold":
			if c.FreeThreshold, err = bytesize.Parse(val); err != nil {
				return c, bad(err.Error())
			}
		case "headroom":
			if c.Headroom, c.HeadroomFraction, err = parseHeadroom(val); err != nil {
				return c, bad(err.Error())
			}
		case "pool":
			switch strings.ToLower(val) {
			case "auto", "on":
				c.NoPool = false
			case "off":
				c.NoPool = true
			default:
				return c, bad("want auto or off")
			}
		case "cache":
			if strings.EqualFold(val, "off") {
				c.Cache = -1
			} else if c.Cache, err = bytesize.Parse(val); err != nil {
				return c, bad(err.Error())
			}
		default:
			return c, bad("unknown key (want policy, prime, limit, threshold, headroom, pool or cache)")
		}
	}
	return c, nil
}

func parseLimit(val string) (bytes int64, fraction float64, err error) {
	if strings.EqualFold(val, "none") || val == "0" {
		return 0, 0, nil
	}
	if pct, ok := strings.CutSuffix(val, "%"); ok {
		f, err := parsePercent(pct)
		if err != nil {
			return 0, 0, err
		}
		return 0, f, nil
	}
	n, err := bytesize.Parse(val)
	if err != nil {
		return 0, 0, err
	}
	if n == 0 {
		return 0, 0, fmt.Errorf("a limit of 0 bytes: write none (or 0) for no budget")
	}
	return n, 0, nil
}

// parsePrime reads a size, a percentage of the device's memory, or none (0
// too), which is -1.
func parsePrime(val string) (bytes int64, fraction float64, err error) {
	if strings.EqualFold(val, "none") || val == "0" {
		return -1, 0, nil
	}
	if pct, ok := strings.CutSuffix(val, "%"); ok {
		f, err := parsePercent(pct)
		return 0, f, err
	}
	n, err := bytesize.Parse(val)
	if err == nil && n == 0 {
		return -1, 0, nil
	}
	return n, 0, err
}

// parseHeadroom reads a size or a percentage of the device's memory. 0
// means the default.
func parseHeadroom(val string) (bytes int64, fraction float64, err error) {
	if pct, ok := strings.CutSuffix(val, "%"); ok {
		f, err := parsePercent(pct)
		return 0, f, err
	}
	n, err := bytesize.Parse(val)
	return n, 0, err
}

// resolveBackend applies Options, then the environment, then auto.
func resolveBackend(b Backend) (Backend, error) {
	if b != "" {
		parsed, err := parseBackend(string(b), "Options")
		if err != nil {
			return "", &configError{source: "Options", key: "Backend", value: string(b), reason: "want auto, cuda or host"}
		}
		return parsed, nil
	}
	if env, ok := os.LookupEnv(envBackend); ok && strings.TrimSpace(env) != "" {
		return parseBackend(env, envBackend)
	}
	return BackendAuto, nil
}

// resolveConfig applies Options.Config, then the environment, then defaults.
// It also names where the configuration came from, for later errors.
func resolveConfig(c *Config) (Config, string, error) {
	if c != nil {
		if err := c.validate("Options"); err != nil {
			return Config{}, "", err
		}
		return *c, "Options", nil
	}
	if env, ok := os.LookupEnv(envConf); ok {
		c, err := parseConfig(env, envConf)
		return c, envConf, err
	}
	return Config{}, "defaults", nil
}

func (c Config) validate(source string) error {
	bad := func(key, val, reason string) error {
		return &configError{source: source, key: key, value: val, reason: reason}
	}
	switch {
	case c.Policy != Auto && c.Policy != Retain && c.Policy != AggressiveFree:
		return bad("Policy", c.Policy.String(), "want Auto, Retain or AggressiveFree")
	case c.Prime < -1:
		return bad("Prime", strconv.FormatInt(c.Prime, 10), "want -1 (none), 0 (the default) or a size")
	case c.PrimeFraction < 0 || c.PrimeFraction > 1 || math.IsNaN(c.PrimeFraction):
		return bad("PrimeFraction", strconv.FormatFloat(c.PrimeFraction, 'g', -1, 64), "must be in (0, 1]")
	case c.Limit < 0:
		return bad("Limit", strconv.FormatInt(c.Limit, 10), "must not be negative")
	case c.LimitFraction < 0 || c.LimitFraction > 1 || math.IsNaN(c.LimitFraction):
		return bad("LimitFraction", strconv.FormatFloat(c.LimitFraction, 'g', -1, 64), "must be in (0, 1]")
	case c.LimitFraction > 0 && c.LimitFraction < minLimitFraction:
		return bad("LimitFraction", strconv.FormatFloat(c.LimitFraction, 'g', -1, 64), fmt.Sprintf("too small: under one allocation (%d B) of any memory up to 1 PiB", allocAlign))
	case c.FreeThreshold < 0:
		return bad("FreeThreshold", strconv.FormatInt(c.FreeThreshold, 10), "must not be negative")
	case c.Headroom < 0:
		return bad("Headroom", strconv.FormatInt(c.Headroom, 10), "must not be negative")
	case c.HeadroomFraction < 0 || c.HeadroomFraction > 1 || math.IsNaN(c.HeadroomFraction):
		return bad("HeadroomFraction", strconv.FormatFloat(c.HeadroomFraction, 'g', -1, 64), "must be in (0, 1]")
	case c.Cache < -1:
		return bad("Cache", strconv.FormatInt(c.Cache, 10), "want -1 (off), 0 (default) or a size")
	}
	return nil
}

package devalloc

import (
	"fmt"
	"math"
	"math/big"
	"os"
	"strconv"
	"strings"
)

// Environment variables read by Open when Options leaves the matching field empty.
const (
	EnvBackend = "DISTBUF_BACKEND"    // auto | cuda | host
	EnvConf    = "DISTBUF_ALLOC_CONF" // e.g. "policy:retain,prime:2GiB,limit:80%"
)

// Backend selects the memory backend.
type Backend string

const (
	BackendAuto Backend = "auto" // CUDA when a usable GPU is present, else host (with a reported reason)
	BackendCUDA Backend = "cuda" // CUDA or an error: never falls back to host
	BackendHost Backend = "host" // host memory; no GPU needed
)

// ParseBackend accepts "auto", "cuda" and "host".
func ParseBackend(s string) (Backend, error) {
	switch b := Backend(strings.ToLower(strings.TrimSpace(s))); b {
	case BackendAuto, BackendCUDA, BackendHost:
		return b, nil
	}
	return "", &ConfigError{Source: EnvBackend, Key: "backend", Value: s, Reason: "want auto, cuda or host"}
}

// Policy is the pool retention policy. It can be changed while running with
// Allocator.SetPolicy.
type Policy int

const (
	// Retain keeps freed memory in the pool (release threshold = max), so the
	// next allocation is a cheap reuse with no driver round trip. Fastest for
	// converged runs at a fixed problem size.
	Retain Policy = iota
	// AggressiveFree hands unused pool memory back at synchronisation points and
	// phase boundaries, leaving the most headroom for the largest runs.
	AggressiveFree
)

func (p Policy) String() string {
	switch p {
	case Retain:
		return "retain"
	case AggressiveFree:
		return "free"
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// ParsePolicy accepts "retain", and "free" or "aggressive-free".
func ParsePolicy(s string) (Policy, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "retain":
		return Retain, nil
	case "free", "aggressive-free", "aggressivefree":
		return AggressiveFree, nil
	}
	return 0, fmt.Errorf("want retain or free")
}

// PoolMode says whether the CUDA backend may use a stream-ordered memory pool.
type PoolMode int

const (
	PoolAuto PoolMode = iota // use the pool when the device supports it
	PoolOff                  // force the cudaMalloc fallback
)

func (m PoolMode) String() string {
	if m == PoolOff {
		return "off"
	}
	return "auto"
}

// Limit is the hard per-rank budget: bytes, or a fraction of the device's (or
// host's) total memory. The zero Limit means no budget.
type Limit struct {
	Bytes    int64
	Fraction float64 // in (0, 1]; used when Bytes is 0
}

// IsZero reports whether no budget is set.
func (l Limit) IsZero() bool { return l.Bytes == 0 && l.Fraction == 0 }

func (l Limit) String() string {
	switch {
	case l.Bytes > 0:
		return formatSizeExact(l.Bytes)
	case l.Fraction > 0:
		return formatPercent(l.Fraction)
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

// resolve turns the limit into bytes given the total memory; 0 means none
// (or a fraction of unknown memory). Open refuses a fraction that resolves
// to less than one allocation.
func (l Limit) resolve(total int64) int64 {
	if l.Bytes > 0 {
		return l.Bytes
	}
	if l.Fraction > 0 && total > 0 {
		return int64(l.Fraction * float64(total))
	}
	return 0
}

// Config is the allocator configuration. The zero Config is the default:
// retain, no priming, no budget, release threshold 0 under AggressiveFree,
// pool when supported, 256 MiB fallback cache.
type Config struct {
	Policy Policy
	// Prime is reserved in the pool once at Open (opt-in).
	Prime int64
	// Limit is the hard per-rank budget, independent of the retention policy.
	Limit Limit
	// FreeThreshold is the release threshold used under AggressiveFree.
	FreeThreshold int64
	// Pool forces the cudaMalloc fallback when PoolOff.
	Pool PoolMode
	// Cache bounds the bytes devalloc keeps for reuse without the driver:
	// the cudaMalloc fallback's cache, and on the pool under Retain the
	// blocks kept for the next allocation of their size on the stream they
	// were freed on (on any stream, once their free has run, for those
	// freed on the reclamation stream). -1 keeps none, 0 means the default
	// (256 MiB).
	Cache int64
}

const defaultCache = 256 << 20

// String renders the configuration in the DISTBUF_ALLOC_CONF syntax;
// ParseConfig(c.String()) == c.
func (c Config) String() string {
	parts := []string{"policy:" + c.Policy.String()}
	if c.Prime > 0 {
		parts = append(parts, "prime:"+formatSizeExact(c.Prime))
	}
	if !c.Limit.IsZero() {
		parts = append(parts, "limit:"+c.Limit.String())
	}
	if c.FreeThreshold > 0 {
		parts = append(parts, "threshold:"+formatSizeExact(c.FreeThreshold))
	}
	if c.Pool != PoolAuto {
		parts = append(parts, "pool:"+c.Pool.String())
	}
	if c.Cache != 0 {
		if c.Cache < 0 {
			parts = append(parts, "cache:off")
		} else {
			parts = append(parts, "cache:"+formatSizeExact(c.Cache))
		}
	}
	return strings.Join(parts, ",")
}

// ParseConfig parses "key:value" pairs separated by commas, starting from the
// zero Config. Keys: policy (retain|free), prime (size), limit (size, N% or
// none), threshold (size), pool (auto|off), cache (size or off). Sizes take
// B, KB, MB, GB, TB (powers of 1000) and KiB, MiB, GiB, TiB (powers of 1024)
// and must come to a whole number of bytes ("0.5" is an error, not 0). A
// limit of "none" or "0" means no budget; any other limit must be at least
// one byte, and a percentage at least 2.3e-11% (one 256-byte allocation of
// 1 PiB); Open also refuses a percentage that comes to less than 256 bytes
// of the memory it finds. An unknown, repeated or malformed key is an error
// naming the key. ParseConfig(c.String()) == c for every Config it returns.
func ParseConfig(s string) (Config, error) { return parseConfig(s, "config") }

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
			return &ConfigError{Source: source, Key: key, Value: val, Reason: reason}
		}
		if !ok {
			return c, &ConfigError{Source: source, Key: key, Value: "", Reason: "want key:value"}
		}
		if seen[key] {
			return c, bad("key given twice")
		}
		seen[key] = true
		var err error
		switch key {
		case "policy":
			if c.Policy, err = ParsePolicy(val); err != nil {
				return c, bad(err.Error())
			}
		case "prime":
			if c.Prime, err = ParseBytes(val); err != nil {
				return c, bad(err.Error())
			}
		case "limit":
			if c.Limit, err = parseLimit(val); err != nil {
				return c, bad(err.Error())
			}
		case "threshold":
			if c.FreeThreshold, err = ParseBytes(val); err != nil {
				return c, bad(err.Error())
			}
		case "pool":
			switch strings.ToLower(val) {
			case "auto", "on":
				c.Pool = PoolAuto
			case "off":
				c.Pool = PoolOff
			default:
				return c, bad("want auto or off")
			}
		case "cache":
			if strings.EqualFold(val, "off") {
				c.Cache = -1
			} else if c.Cache, err = ParseBytes(val); err != nil {
				return c, bad(err.Error())
			}
		default:
			return c, bad("unknown key (want policy, prime, limit, threshold, pool or cache)")
		}
	}
	return c, nil
}

func parseLimit(val string) (Limit, error) {
	if strings.EqualFold(val, "none") || val == "0" {
		return Limit{}, nil
	}
	if pct, ok := strings.CutSuffix(val, "%"); ok {
		f, err := parsePercent(pct)
		if err != nil {
			return Limit{}, err
		}
		return Limit{Fraction: f}, nil
	}
	n, err := ParseBytes(val)
	if err != nil {
		return Limit{}, err
	}
	if n == 0 {
		return Limit{}, fmt.Errorf("a limit of 0 bytes: write none (or 0) for no budget")
	}
	return Limit{Bytes: n}, nil
}

var byteUnits = []struct {
	suffix string
	scale  int64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1_000}, {"mb", 1_000_000}, {"gb", 1_000_000_000}, {"tb", 1_000_000_000_000},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40},
	{"b", 1},
}

// ParseBytes parses a non-negative size such as "4096", "64KiB", "1.5GB" or "2G"
// (bare K, M, G, T are powers of 1024). The value must be a whole number of
// bytes: "0.5" and "1.1KiB" are errors, not rounded.
func ParseBytes(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	scale := int64(1)
	for _, u := range byteUnits {
		if rest, ok := strings.CutSuffix(t, u.suffix); ok {
			t, scale = strings.TrimSpace(rest), u.scale
			break
		}
	}
	notASize := fmt.Errorf("not a size (want e.g. 4096, 64KiB, 2GiB)")
	// A decimal number with an exponent of a sensible size (an exact
	// rational of 10^1000000000 would take gigabytes to hold).
	if t == "" || strings.ContainsAny(t, "/_") {
		return 0, notASize
	}
	if _, exp, ok := strings.Cut(t, "e"); ok {
		if e, err := strconv.Atoi(exp); err != nil || e < -40 || e > 40 {
			return 0, notASize
		}
	}
	r, ok := new(big.Rat).SetString(t)
	if !ok || strings.HasPrefix(t, "0x") || strings.HasPrefix(t, "0b") || strings.HasPrefix(t, "0o") {
		return 0, notASize
	}
	r.Mul(r, new(big.Rat).SetInt64(scale))
	switch {
	case r.Sign() < 0:
		return 0, fmt.Errorf("size must not be negative")
	case !r.IsInt():
		return 0, fmt.Errorf("not a whole number of bytes")
	case r.Num().Cmp(big.NewInt(math.MaxInt64/2)) > 0:
		return 0, fmt.Errorf("size out of range")
	}
	return r.Num().Int64(), nil
}

// FormatBytes renders n for people, with a binary unit: "512 B", "64 KiB",
// "1.5 GiB" (at most two decimals).
func FormatBytes(n int64) string {
	units := [...]string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	f, i := float64(n), 0
	for math.Abs(f) >= 1024 && i < len(units)-1 {
		f /= 1024
		i++
	}
	s := strconv.FormatFloat(f, 'f', 2, 64)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s + " " + units[i]
}

// formatSizeExact renders n so that ParseBytes gives n back: the largest
// binary unit that divides it exactly.
func formatSizeExact(n int64) string {
	for _, u := range []struct {
		suffix string
		scale  int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.scale == 0 {
			return strconv.FormatInt(n/u.scale, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

// resolveBackend applies Options, then the environment, then auto.
func resolveBackend(b Backend) (Backend, error) {
	if b != "" {
		if _, err := ParseBackend(string(b)); err != nil {
			return "", &ConfigError{Source: "Options", Key: "Backend", Value: string(b), Reason: "want auto, cuda or host"}
		}
		return b, nil
	}
	if env, ok := os.LookupEnv(EnvBackend); ok && strings.TrimSpace(env) != "" {
		return ParseBackend(env)
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
	if env, ok := os.LookupEnv(EnvConf); ok {
		c, err := parseConfig(env, EnvConf)
		return c, EnvConf, err
	}
	return Config{}, "defaults", nil
}

func (c Config) validate(source string) error {
	bad := func(key, val, reason string) error {
		return &ConfigError{Source: source, Key: key, Value: val, Reason: reason}
	}
	switch {
	case c.Policy != Retain && c.Policy != AggressiveFree:
		return bad("Policy", c.Policy.String(), "want Retain or AggressiveFree")
	case c.Prime < 0:
		return bad("Prime", strconv.FormatInt(c.Prime, 10), "must not be negative")
	case c.Limit.Bytes < 0:
		return bad("Limit", strconv.FormatInt(c.Limit.Bytes, 10), "must not be negative")
	case c.Limit.Fraction < 0 || c.Limit.Fraction > 1 || math.IsNaN(c.Limit.Fraction):
		return bad("Limit", c.Limit.String(), "fraction must be in (0, 1]")
	case c.Limit.Fraction > 0 && c.Limit.Fraction < minLimitFraction:
		return bad("Limit", c.Limit.String(), fmt.Sprintf("fraction too small: under one allocation (%d B) of any memory up to 1 PiB", allocAlign))
	case c.FreeThreshold < 0:
		return bad("FreeThreshold", strconv.FormatInt(c.FreeThreshold, 10), "must not be negative")
	case c.Pool != PoolAuto && c.Pool != PoolOff:
		return bad("Pool", c.Pool.String(), "want PoolAuto or PoolOff")
	case c.Cache < -1:
		return bad("Cache", strconv.FormatInt(c.Cache, 10), "want -1 (off), 0 (default) or a size")
	}
	return nil
}

package bytesize

import (
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

var units = []struct {
	suffix string
	scale  int64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1_000}, {"mb", 1_000_000}, {"gb", 1_000_000_000}, {"tb", 1_000_000_000_000},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40},
	{"b", 1},
}

// Parse reads a non-negative size such as "4096", "64KiB", "1.5GB" or "2G":
// B, KB, MB, GB, TB are powers of 1000; KiB, MiB, GiB, TiB and the bare K,
// M, G, T powers of 1024. The value must be a whole number of bytes: "0.5"
// and "1.1KiB" are errors, not rounded.
func Parse(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	scale := int64(1)
	for _, u := range units {
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

// Format writes n for people, with a binary unit: "512 B", "64 KiB",
// "1.5 GiB" (at most two decimals).
func Format(n int64) string {
	names := [...]string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	f, i := float64(n), 0
	for math.Abs(f) >= 1024 && i < len(names)-1 {
		f /= 1024
		i++
	}
	s := strconv.FormatFloat(f, 'f', 2, 64)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s + " " + names[i]
}

// Exact writes n so that Parse gives n back: in the largest binary unit
// that divides it exactly, else in bytes.
func Exact(n int64) string {
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

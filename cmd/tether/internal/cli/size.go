package cli

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/tetherfleet/tether/protocol"
)

// sizeUnits are the suffixes parseSize accepts, with their multipliers: the
// binary ones (K, KiB…, as coreutils' K) and the decimal ones (KB, kB…).
var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"kB", 1e3}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"K", 1 << 10}, {"k", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40},
	{"B", 1},
}

// parseSize parses a byte count: a whole number, optionally followed by a
// unit (B; K, KiB, M, MiB, G, GiB, T, TiB are powers of 1024; KB, MB, GB,
// TB are powers of 1000), as in "64MiB", "512K" or "1000000".
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range sizeUnits {
		if num, ok := strings.CutSuffix(t, u.suffix); ok {
			t, mult = strings.TrimSpace(num), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if errors.Is(err, strconv.ErrRange) && n > 0 {
		return 0, fmt.Errorf("%q is too large (at most %d bytes)", s, int64(math.MaxInt64))
	}
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q: want a whole number of bytes with an optional unit, like 64MiB, 512K or 1GB", s)
	}
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return n * mult, nil
}

// formatSize prints n bytes in the largest binary unit that divides it.
func formatSize(n int64) string {
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.mult && n%u.mult == 0 {
			return fmt.Sprintf("%d %s", n/u.mult, u.suffix)
		}
	}
	if n == 1 {
		return "1 byte"
	}
	return fmt.Sprintf("%d bytes", n)
}

// outputLimitFlag is --output-limit: a size (parseSize) of at least one
// byte, or "unlimited" (protocol.OutputUnlimited). Zero, its unset value,
// means the agent's default.
type outputLimitFlag struct{ n *int64 }

func (f outputLimitFlag) Set(s string) error {
	if strings.EqualFold(strings.TrimSpace(s), "unlimited") {
		*f.n = protocol.OutputUnlimited
		return nil
	}
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("%q: the limit must be at least 1 byte (say unlimited for no limit; leave the flag out for the agent's default)", s)
	}
	*f.n = n
	return nil
}

func (f outputLimitFlag) String() string {
	switch {
	case f.n == nil || *f.n == 0:
		return ""
	case *f.n == protocol.OutputUnlimited:
		return "unlimited"
	}
	// What Set reads back: "64MiB", or a plain count ("1000", not
	// formatSize's "1000 bytes").
	s := formatSize(*f.n)
	if strings.HasSuffix(s, "byte") || strings.HasSuffix(s, "bytes") {
		return strconv.FormatInt(*f.n, 10)
	}
	return strings.ReplaceAll(s, " ", "")
}

func (f outputLimitFlag) Type() string { return "size" }

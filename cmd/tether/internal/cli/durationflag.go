package cli

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Every duration flag of every tether command is a durationFlag, so that a
// duration reads the same everywhere (issue 13): a Go duration ("90s",
// "5m", "1h30m", "250ms") or a bare decimal number of seconds ("30", "1.5"),
// as the API's timeout field takes it. `run-lease --ttl 30` and
// `exec --timeout 30` both mean 30 seconds.
//
// Set refuses what is no finite duration (NaN, Inf, "soon") and what does
// not fit its range, and pflag names the flag in the error ("invalid
// argument "NaN" for "--ttl" flag: ..."). A negative value parses: each
// command's Validate says whether it means something there ("negative:
// none") or is an error, together with the command line's other problems.

// maxDurationSeconds is the longest duration a time.Duration holds, in
// seconds (about 292 years).
const maxDurationSeconds = float64(math.MaxInt64) / float64(time.Second)

// parseDuration reads s as a Go duration or a bare number of seconds.
// max > 0 bounds its absolute value; min > 0 is the least value accepted
// (then negative values are refused too). Errors say what was wrong with s,
// and the range in human terms ("over the limit of 24h (the range is 1s to
// 24h)"), without naming the flag (pflag adds that).
func parseDuration(s string, min, max time.Duration) (time.Duration, error) {
	s = strings.TrimSpace(s)
	over := func(what string) error {
		return fmt.Errorf("%s is over the limit of %s%s", what, humanDuration(limitOf(max)), rangeNote(min, max))
	}
	var d time.Duration
	what := s // s as the messages name it
	if n, err := strconv.ParseFloat(s, 64); err == nil {
		what = s + " seconds"
		switch {
		case math.IsNaN(n) || math.IsInf(n, 0):
			return 0, fmt.Errorf("%s is not a number of seconds: want a duration like 30s or 5m, or a number of seconds", s)
		case math.Abs(n) >= maxDurationSeconds || math.Abs(n) > limitOf(max).Seconds():
			return 0, over(what)
		}
		d = time.Duration(n * float64(time.Second))
		if d == 0 && n != 0 {
			// "1e-12" would otherwise become 0, which most flags read as
			// "none" or "the default": the opposite of a tiny value.
			return 0, fmt.Errorf("%s seconds is shorter than 1ns", s)
		}
	} else if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
		return 0, over(s + " seconds")
	} else {
		d, err = time.ParseDuration(s)
		if err != nil {
			if strings.Contains(err.Error(), "invalid duration") && looksNumeric(s) {
				// time.ParseDuration says "invalid duration" for an
				// overflow too ("1000000000h").
				return 0, over(s)
			}
			return 0, fmt.Errorf("%q is not a duration: want a duration like 30s, 5m or 1h30m, or a number of seconds", s)
		}
	}
	if max > 0 && (d > max || d < -max) {
		return 0, over(what)
	}
	if min > 0 && d < min {
		return 0, fmt.Errorf("%s is under the minimum of %s%s", what, humanDuration(min), rangeNote(min, max))
	}
	return d, nil
}

// rangeNote is " (the range is MIN to MAX)" for a flag with a lower bound,
// else "" (the limit alone says it all).
func rangeNote(min, max time.Duration) string {
	if min <= 0 {
		return ""
	}
	return " (the range is " + durationRange(min, max) + ")"
}

// durationRange is the range [min, max] in words: "1s to 24h", "at most
// 1m" (min <= 0), "at least 10s" (max <= 0).
func durationRange(min, max time.Duration) string {
	switch {
	case min > 0 && max > 0:
		return humanDuration(min) + " to " + humanDuration(max)
	case min > 0:
		return "at least " + humanDuration(min)
	default:
		return "at most " + humanDuration(limitOf(max))
	}
}

// humanDuration is d as a person writes it, in a form every duration flag
// takes back: "24h" and "1h30m" rather than Go's "24h0m0s" and
// "1h30m0s"; whole days from 48h on are named too ("8760h (365 days)"),
// and from ten years on only the years ("about 292 years" rather than
// "2562047h47m16.854775807s").
func humanDuration(d time.Duration) string {
	const day, year = 24 * time.Hour, 365 * 24 * time.Hour
	abs := d
	if abs < 0 {
		abs = -abs // MinInt64 stays negative: caught below
	}
	if abs < 0 || abs >= 10*year {
		sign := ""
		if d < 0 {
			sign = "-"
		}
		return fmt.Sprintf("%sabout %.0f years", sign, math.Abs(float64(d))/float64(year))
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") || strings.HasSuffix(s, "h0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	if abs >= 2*day && abs%day == 0 {
		s += fmt.Sprintf(" (%d days)", abs/day)
	}
	return s
}

// looksNumeric reports whether s is made of digits, units and a sign only,
// i.e. a syntactically plausible Go duration.
func looksNumeric(s string) bool {
	s = strings.TrimLeft(s, "+-")
	if s == "" || s[0] < '0' || s[0] > '9' {
		return false
	}
	return strings.Trim(s, "0123456789.nsuµmh") == ""
}

// limitOf is the largest absolute value a flag with bound max accepts.
func limitOf(max time.Duration) time.Duration {
	if max > 0 {
		return max
	}
	return time.Duration(math.MaxInt64)
}

// durationFlag is a pflag.Value for a time.Duration (see the comment at the
// top of this file). max > 0 bounds its absolute value; 0 means the whole
// range of time.Duration. min > 0 is the least value it takes (negative
// and zero values are refused then); 0 means no lower bound.
type durationFlag struct {
	d        *time.Duration
	min, max time.Duration
}

var _ pflag.Value = durationFlag{}

func (f durationFlag) Set(s string) error {
	d, err := parseDuration(s, f.min, f.max)
	if err != nil {
		return err
	}
	*f.d = d
	return nil
}

// String is "" for zero, so that help shows no "(default 0s)" (as
// pflag's own duration flag shows none).
func (f durationFlag) String() string {
	if f.d == nil || *f.d == 0 {
		return ""
	}
	return f.d.String()
}

func (f durationFlag) Type() string { return "duration" }

// durationVar defines a duration flag on fs, like fs.DurationVar, parsed as
// every tether duration is (durationFlag).
func durationVar(fs *pflag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	fs.Var(durationFlag{d: p}, name, usage)
}

// boundedDurationVar is durationVar for a flag whose values must lie in
// [min, max] (durationFlag's min and max): a value outside is an error at
// parse time that states the range.
func boundedDurationVar(fs *pflag.FlagSet, p *time.Duration, name string, value, min, max time.Duration, usage string) {
	*p = value
	fs.Var(durationFlag{d: p, min: min, max: max}, name, usage)
}

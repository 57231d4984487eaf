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
// max > 0 bounds its absolute value; errors say what was wrong with s
// without naming the flag (pflag adds that).
func parseDuration(s string, max time.Duration) (time.Duration, error) {
	s = strings.TrimSpace(s)
	var d time.Duration
	if n, err := strconv.ParseFloat(s, 64); err == nil {
		switch {
		case math.IsNaN(n) || math.IsInf(n, 0):
			return 0, fmt.Errorf("%s is not a number of seconds: want a duration like 30s or 5m, or a number of seconds", s)
		case math.Abs(n) >= maxDurationSeconds || math.Abs(n) > limitOf(max).Seconds():
			return 0, fmt.Errorf("%s seconds is over the limit of %v", s, limitOf(max))
		}
		d = time.Duration(n * float64(time.Second))
		if d == 0 && n != 0 {
			// "1e-12" would otherwise become 0, which most flags read as
			// "none" or "the default": the opposite of a tiny value.
			return 0, fmt.Errorf("%s seconds is shorter than 1ns", s)
		}
	} else if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
		return 0, fmt.Errorf("%s seconds is over the limit of %v", s, limitOf(max))
	} else {
		d, err = time.ParseDuration(s)
		if err != nil {
			if strings.Contains(err.Error(), "invalid duration") && looksNumeric(s) {
				// time.ParseDuration says "invalid duration" for an
				// overflow too ("1000000000h").
				return 0, fmt.Errorf("%s is over the limit of %v", s, limitOf(max))
			}
			return 0, fmt.Errorf("%q is not a duration: want a duration like 30s, 5m or 1h30m, or a number of seconds", s)
		}
	}
	if max > 0 && (d > max || d < -max) {
		return 0, fmt.Errorf("%s is over the limit of %v", s, max)
	}
	return d, nil
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

// limitOf is the range a flag with bound max accepts, for messages.
func limitOf(max time.Duration) time.Duration {
	if max > 0 {
		return max
	}
	return time.Duration(math.MaxInt64)
}

// durationFlag is a pflag.Value for a time.Duration (see the comment at the
// top of this file). max > 0 bounds it; 0 means the whole range of
// time.Duration.
type durationFlag struct {
	d   *time.Duration
	max time.Duration
}

var _ pflag.Value = durationFlag{}

func (f durationFlag) Set(s string) error {
	d, err := parseDuration(s, f.max)
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

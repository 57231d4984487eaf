package cli

import (
	"context"
	"math"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// TestDurationFlagsParseAlike: every duration flag of every command takes
// a bare number as seconds and a Go duration, and refuses NaN, Inf and
// what overflows with an error that says what is wrong (issue 13: `run-lease
// --ttl 30` was refused while `exec --timeout 30` meant 30 s).
func TestDurationFlagsParseAlike(t *testing.T) {
	root := newRootCmd(&env{})
	n := 0
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Value.Type() != "duration" {
				return
			}
			n++
			name := c.CommandPath() + " --" + f.Name
			for in, want := range map[string]time.Duration{"30": 30 * time.Second, "1.5": 1500 * time.Millisecond, "2m": 2 * time.Minute, "1h30m": 90 * time.Minute} {
				err := f.Value.Set(in)
				if df, ok := f.Value.(durationFlag); ok && df.max > 0 && want > df.max {
					// Out of this flag's range: refused, saying so.
					if err == nil || !strings.Contains(err.Error(), "over the limit of "+humanDuration(df.max)) {
						t.Errorf("%s %s: error %v, want one stating the limit %s", name, in, err, humanDuration(df.max))
					}
					continue
				}
				if err != nil {
					t.Errorf("%s %s: %v", name, in, err)
					continue
				}
				if got := f.Value.String(); got != want.String() {
					t.Errorf("%s %s = %s, want %v", name, in, got, want)
				}
			}
			for in, why := range map[string]string{"NaN": "not a number", "Inf": "not a number", "1e10": "over the limit", "-1e300": "over the limit", "1000000000h": "over the limit", "soon": "not a duration", "1e-12": "shorter than 1ns", "-1e-12": "shorter than 1ns"} {
				err := f.Value.Set(in)
				if err == nil || !strings.Contains(err.Error(), why) {
					t.Errorf("%s %s: error %v, want one saying %q", name, in, err, why)
				}
				if err != nil && strings.Contains(err.Error(), "negative") {
					t.Errorf("%s %s: %v", name, in, err)
				}
			}
		})
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	if n < 15 {
		t.Fatalf("found %d duration flags; the walk missed the command tree", n)
	}
}

// TestDurationFlagErrorNamesFlag: a bad value is a usage error naming the
// flag, in a command other than exec too.
func TestDurationFlagErrorNamesFlag(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"run-lease", "--ttl", "NaN", "--", "true"}, `"--ttl" flag: NaN is not a number of seconds`},
		{[]string{"exec", "--node", "n", "--timeout", "1e10", "--", "true"}, `"--timeout" flag: 1e10 seconds is over the limit`},
		{[]string{"job", "wait", "--poll", "Inf", "j1"}, `"--poll" flag: Inf is not a number`},
	} {
		r := runCLI(ctx, nil, "", tt.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tt.args, r.code, r.stderr, tt.want)
		}
	}
	// A bare number is seconds in run-lease too: --ttl 30 passes the
	// flag parser and Validate (it then fails for want of a coordinator,
	// not of a unit).
	r := runCLI(ctx, map[string]string{"TETHER_NATS_URL": "nats://127.0.0.1:1"}, "", "run-lease", "--ttl", "30", "--", "true")
	if strings.Contains(r.stderr, "missing unit") || r.code == exitUsage {
		t.Errorf("run-lease --ttl 30: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestHumanDuration: durations in messages read as a person writes them,
// never as Go's "24h0m0s" or "2562047h47m16.854775807s".
func TestHumanDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		24 * time.Hour:                   "24h",
		90 * time.Minute:                 "1h30m",
		2 * time.Minute:                  "2m",
		90 * time.Second:                 "1m30s",
		time.Second:                      "1s",
		500 * time.Millisecond:           "500ms",
		0:                                "0s",
		-5 * time.Second:                 "-5s",
		time.Hour + 500*time.Millisecond: "1h0m0.5s",
		365 * 24 * time.Hour:             "8760h (365 days)",
		time.Duration(math.MaxInt64):     "about 292 years",
		time.Duration(math.MinInt64):     "-about 292 years",
		time.Duration(1 << 62):           "about 146 years",
		maxTimeout:                       "about 146 years",
	} {
		if got := humanDuration(d); got != want {
			t.Errorf("humanDuration(%d) = %q, want %q", int64(d), got, want)
		}
	}
}

// TestDurationRangeErrorsHuman: a duration flag out of range states its
// range in human terms, and the range each command really enforces:
// run-lease's --ttl is 1s to 24h (what the ledger accepts), not the 292
// years of a time.Duration; no error prints Go's raw duration forms.
func TestDurationRangeErrorsHuman(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"run-lease", "--ttl", "1e10", "--", "true"}, `"--ttl" flag: 1e10 seconds is over the limit of 24h (the range is 1s to 24h)`},
		{[]string{"run-lease", "--ttl", "48h", "--", "true"}, `"--ttl" flag: 48h is over the limit of 24h (the range is 1s to 24h)`},
		{[]string{"run-lease", "--ttl", "0.5", "--", "true"}, `"--ttl" flag: 0.5 seconds is under the minimum of 1s (the range is 1s to 24h)`},
		{[]string{"run-lease", "--ttl", "-1m", "--", "true"}, `"--ttl" flag: -1m is under the minimum of 1s`},
		{[]string{"exec", "--node", "n", "--timeout", "1e10", "--", "true"}, `1e10 seconds is over the limit of about 146 years`},
		{[]string{"job", "wait", "--poll", "2m", "j1"}, `"--poll" flag: 2m is over the limit of 1m`},
		{[]string{"token", "create", "--ttl", "9000h"}, `"--ttl" flag: 9000h is over the limit of 8760h (365 days)`},
		{[]string{"audit", "--since", "1e300"}, `over the limit of about 292 years`},
		{[]string{"nats", "user", "create", "--ttl", "-90m", "u"}, `--ttl -1h30m is negative`},
	} {
		r := runCLI(ctx, nil, "", tt.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tt.args, r.code, r.stderr, tt.want)
		}
		if goDuration.MatchString(r.stderr) {
			t.Errorf("%v: stderr %q prints a raw Go duration", tt.args, r.stderr)
		}
	}
}

// goDuration matches Go's long duration forms: "24h0m0s", "1h30m0s",
// "2562047h47m16.854775807s".
var goDuration = regexp.MustCompile(`\d+h\d+m[\d.]+s|\d+h0m\b`)

package cli

import (
	"context"
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
				if err := f.Value.Set(in); err != nil {
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

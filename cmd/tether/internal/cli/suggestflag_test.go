package cli

import (
	"strings"
	"testing"
)

// TestUnknownFlagSuggestions: a mistyped flag gets "did you mean" from
// the command's own flags (cobra suggests subcommands only); one nothing
// is near gets none; the error stays a usage error (exit 2).
func TestUnknownFlagSuggestions(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"exec", "--node", "n", "--tiemout", "5", "--", "true"}, "unknown flag: --tiemout; did you mean --timeout?"},
		{[]string{"exec", "--nod", "n", "--", "true"}, "unknown flag: --nod; did you mean --node?"},
		{[]string{"run-lease", "--tll", "5", "--", "true"}, "unknown flag: --tll; did you mean --ttl?"},
		{[]string{"nodes", "--nats-ur=x"}, "unknown flag: --nats-ur; did you mean --nats-url?"},
		{[]string{"nodes", "--frob"}, "unknown flag: --frob\n"},
	} {
		r := runCLI(testCtx(t), nil, "", tt.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tt.args, r.code, r.stderr, tt.want)
		}
	}
}

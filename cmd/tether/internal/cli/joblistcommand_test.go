package cli

import (
	"regexp"
	"testing"

	"github.com/tetherfleet/tether/fleettest"
)

// TestJobListCommandMarksMoreLines: job list's COMMAND of a batch or a
// script of several lines is its first line marked as "…", with the count
// of lines, as the column marks a line it cut (it showed the first line
// alone, as if it were the whole job; fresh-user pass cliux19).
func TestJobListCommandMarksMoreLines(t *testing.T) {
	f := startFleet(t, fleettest.Options{Agents: 1, Jobs: true})
	url := f.NATS.ClientURL()
	ctx := testCtx(t)
	for _, tc := range []struct {
		name, stdin string
		args        []string
		want        string
	}{
		{"batch", "", []string{"-c", "echo a", "-c", "echo b"}, "echo a … (2 lines)"},
		{"fail-fast batch", "", []string{"--fail-fast", "-c", "true", "-c", "true", "-c", "true"}, "true … (3 lines)"}, // attached: a fail-fast batch is not detached
		{"script", "echo 1\necho 2\necho 3\n", []string{"--script", "-"}, "echo 1 … (3 lines)"},
		{"one line", "", []string{"--", "echo", "one"}, "echo one"},
	} {
		args := []string{"exec", "--nats-url", url, "--node", "node-0", "--detach"}
		if tc.args[0] == "--fail-fast" {
			args = args[:len(args)-1]
		}
		r := runCLI(ctx, nil, tc.stdin, append(args, tc.args...)...)
		if r.code != 0 {
			t.Fatalf("%s: exec: exit %d, stdout %q, stderr %q", tc.name, r.code, r.stdout, r.stderr)
		}
		r = runCLI(ctx, nil, "", "job", "list", "--nats-url", url, "--limit", "1") // the newest: this one
		m := regexp.MustCompile(`(?m)^\S+ .*Z  (.*)$`).FindStringSubmatch(r.stdout)
		if r.code != 0 || m == nil || m[1] != tc.want {
			t.Errorf("%s: job list: exit %d, COMMAND %q, want %q; stdout %q", tc.name, r.code, m, tc.want, r.stdout)
		}
	}
}

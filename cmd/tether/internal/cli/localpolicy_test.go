package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/agent/localpolicy"
	"github.com/tetherfleet/tether/fleettest"
)

// TestLocalPolicyRefusalsShown: what the node's local policy refuses,
// whatever the coordinator asked, reaches the user of tether exec, cp and
// shell as one clear line naming the node, the policy file and the rule.
func TestLocalPolicyRefusalsShown(t *testing.T) {
	roots := t.TempDir()
	const file = "/etc/tether/agent-policy.yaml"
	doc := fmt.Sprintf("version: 1\nusers:\n  - uid: %d\ncopy_roots: [%s]\nexec: false\nshell: false\n", os.Geteuid(), roots)
	p, err := localpolicy.Parse(file, []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	f := fleettest.Start(t, fleettest.Options{Agent: func(_ int, c *agent.Config) { c.LocalPolicy = p }})
	url := f.NATS.ClientURL()
	local := filepath.Join(t.TempDir(), "f")
	os.WriteFile(local, []byte("x"), 0o644)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"exec", []string{"exec", "--nats-url", url, "--node", "node-0", "--", "true"}, exitTether,
			[]string{"node-0", "refused by the local policy " + file, `"exec: true"`, "(forbidden)"}},
		{"cp outside the roots", []string{"cp", "--nats-url", url, local, "node-0:/var/tmp/x"}, exitFailure,
			[]string{"node-0", "refused by the local policy " + file, `"copy_roots: /var/tmp/x"`}},
		{"cp inside the roots", []string{"cp", "--nats-url", url, local, "node-0:" + roots + "/x"}, 0, nil},
		// Without a terminal, tether shell runs its command on an exec
		// stream: refused as an exec (the pty refusal is the agent's
		// TestLocalPolicyRefuses).
		{"shell without a terminal", []string{"shell", "node-0", "--nats-url", url, "--", "true"}, exitTether,
			[]string{"node-0", "refused by the local policy " + file, `"exec: true"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCLI(testCtx(t), nil, "", tc.args...)
			t.Logf("exit %d\nstdout %q\nstderr %q", r.code, r.stdout, r.stderr)
			if r.code != tc.code {
				t.Errorf("exit %d, want %d", r.code, tc.code)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q", w)
				}
			}
		})
	}
}

package cli

import (
	"strings"
	"testing"

	"github.com/tetherfleet/tether/fleettest"
)

// tether job logs of a fan-out (--all, --selector) that matched one node
// prefixes its lines "NODE | " as tether exec --all printed them; --node
// asks that node alone, unprefixed. Fresh-user pass: the one-node fan-out's
// lines came unprefixed.
func TestJobLogsOfOneNodeFanOutPrefixed(t *testing.T) {
	f := startFleet(t, fleettest.Options{Agents: 1, Jobs: true})
	url := f.NATS.ClientURL()
	ctx := testCtx(t)
	r := runCLI(ctx, nil, "", "exec", "--nats-url", url, "--all", "--detach", "--", "sh", "-c", "echo hello; echo oops >&2")
	id := strings.TrimSpace(r.stdout)
	if r.code != 0 || id == "" {
		t.Fatalf("exec --all --detach: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(ctx, nil, "", "job", "wait", "--nats-url", url, id); r.code != 0 {
		t.Fatalf("job wait: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := runCLI(ctx, nil, "", "job", "logs", "--nats-url", url, id); r.code != 0 || r.stdout != "node-0 | hello\n" || r.stderr != "node-0 | oops\n" {
		t.Errorf("job logs: exit %d, stdout %q, stderr %q; want node-0's lines prefixed", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(ctx, nil, "", "job", "logs", "--nats-url", url, "--node", "node-0", id); r.code != 0 || r.stdout != "hello\n" || r.stderr != "oops\n" {
		t.Errorf("job logs --node node-0: exit %d, stdout %q, stderr %q; want unprefixed", r.code, r.stdout, r.stderr)
	}
}

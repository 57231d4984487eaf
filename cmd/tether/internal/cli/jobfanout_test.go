package cli

import (
	"strings"
	"testing"

	"github.com/tetherfleet/tether/fleettest"
)

// tether job logs ID and tether job cancel ID of a detached job on
// several nodes work by the job id alone: logs prints every node's
// output, each line prefixed "NODE | " as exec prints a fan-out's, cancel
// cancels every node's run (a node: line each); --node narrows to one
// (fresh-user pass: both were a usage error, "ran on 2 nodes; give
// --node").
func TestJobLogsAndCancelOfFanOutWithoutNode(t *testing.T) {
	f := startFleet(t, fleettest.Options{Agents: 2, Jobs: true})
	url := f.NATS.ClientURL()
	ctx := testCtx(t)
	detach := func(script string) string {
		t.Helper()
		r := runCLI(ctx, nil, "", "exec", "--nats-url", url, "--all", "--detach", "--", "sh", "-c", script)
		id := strings.TrimSpace(r.stdout)
		if r.code != 0 || id == "" || strings.Contains(id, "\n") {
			t.Fatalf("exec --all --detach: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		return id
	}
	id := detach("echo hello; echo oops >&2; exit 3")
	if r := runCLI(ctx, nil, "", "job", "wait", "--nats-url", url, id); r.code != exitFailure {
		t.Fatalf("job wait: exit %d, stderr %q; want %d (a node failed)", r.code, r.stderr, exitFailure)
	}
	for _, follow := range []bool{false, true} {
		args := []string{"job", "logs", "--nats-url", url}
		if follow {
			args = append(args, "--follow", "--poll", "50ms")
		}
		r := runCLI(ctx, nil, "", append(args, id)...)
		want := 0
		if follow {
			want = exitFailure // as exec --all ends: a node failed
		}
		if r.code != want {
			t.Fatalf("job logs (follow %v): exit %d, stderr %q; want %d", follow, r.code, r.stderr, want)
		}
		for _, n := range []string{"node-0", "node-1"} {
			if !strings.Contains(r.stdout, n+" | hello\n") || !strings.Contains(r.stderr, n+" | oops\n") {
				t.Errorf("job logs (follow %v): stdout %q, stderr %q; want %s's lines prefixed", follow, r.stdout, r.stderr, n)
			}
		}
	}
	if r := runCLI(ctx, nil, "", "job", "logs", "--nats-url", url, "--node", "node-1", id); r.code != 0 || r.stdout != "hello\n" || r.stderr != "oops\n" {
		t.Errorf("job logs --node node-1: exit %d, stdout %q, stderr %q; want node-1's output alone, unprefixed", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(ctx, nil, "", "job", "logs", "--follow", "--nats-url", url, "--node", "node-1", id); r.code != 3 {
		t.Errorf("job logs --follow --node node-1: exit %d, stderr %q; want the node's own 3", r.code, r.stderr)
	}

	id = detach("sleep 60")
	r := runCLI(ctx, nil, "", "job", "cancel", "--nats-url", url, id)
	if r.code != 0 {
		t.Fatalf("job cancel of a fan-out: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"job:       " + id + "\n", "node:      node-0 cancel", "node:      node-1 cancel"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("job cancel lacks %q:\n%s", want, r.stdout)
		}
	}
	if r := runCLI(ctx, nil, "", "job", "wait", "--nats-url", url, id); r.code != exitFailure {
		t.Errorf("job wait of the cancelled fan-out: exit %d, stderr %q; want %d", r.code, r.stderr, exitFailure)
	}
	r = runCLI(ctx, nil, "", "job", "cancel", "--nats-url", url, "--node", "node-0", id)
	if r.code != 0 || !strings.Contains(r.stdout, "node:      node-0 exit 130 (cancelled: signal TERM, exit code 143)") || strings.Contains(r.stdout, "node:      node-1") || !strings.Contains(r.stderr, "had already ended (cancelled)") {
		t.Errorf("job cancel --node node-0 of the ended job: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/fleettest"
)

// tether job cancel ID cancels an attached job too (the tether exec that
// runs it ends as cancelled), by id alone and with --node: the README
// promises "kill its process group" for any job. Fresh-user pass (F12):
// it asked the node for a detached job and failed, 404 "no detached job",
// exit 255, and the job ran on.
func TestJobCancelOfAttachedJob(t *testing.T) {
	f := startFleet(t, fleettest.Options{Agents: 1, Jobs: true})
	url := f.NATS.ClientURL()
	ctx := testCtx(t)
	for _, withNode := range []bool{false, true} {
		done := make(chan result, 1)
		go func() {
			done <- runCLI(ctx, nil, "", "exec", "--nats-url", url, "--node", "node-0", "--", "sleep", "60")
		}()
		var id string
		for id == "" {
			r := runCLI(ctx, nil, "", "job", "list", "--nats-url", url, "--state", "running")
			if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); r.code == 0 && len(lines) > 1 {
				id = strings.Fields(lines[1])[0]
				break
			}
			select {
			case r := <-done:
				t.Fatalf("exec ended before it was cancelled: exit %d, stderr %q", r.code, r.stderr)
			case <-ctx.Done():
				t.Fatal("the attached job never showed as running")
			case <-time.After(20 * time.Millisecond):
			}
		}
		args := []string{"job", "cancel", "--nats-url", url}
		if withNode {
			args = append(args, "--node", "node-0")
		}
		r := runCLI(ctx, nil, "", append(args, id)...)
		if r.code != 0 || !strings.Contains(r.stdout, id) || !strings.Contains(r.stdout, "cancel") {
			t.Fatalf("job cancel (--node %v) of an attached job: exit %d, stdout %q, stderr %q", withNode, r.code, r.stdout, r.stderr)
		}
		if r := <-done; r.code != exitInterrupted {
			t.Errorf("the cancelled attached exec (--node %v): exit %d, stderr %q; want %d", withNode, r.code, r.stderr, exitInterrupted)
		}
	}
}

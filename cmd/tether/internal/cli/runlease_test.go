package cli

import (
	"errors"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// run-lease holds a lease for exactly the command's life: the command sees
// its run id, its exit code comes back, and the lease is closed after it.
func TestRunLeaseOnFleet(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Gateways: &fleettest.GatewayOptions{}})
	url := f.NATS.ClientURL()
	ctx := testCtx(t)

	r := runCLI(ctx, nil, "", "run-lease", "--nats-url", url, "--run", "rl-1", "--", "sh", "-c", `echo "$NEMO_GYM_RUN_ID $TETHER_RUN"; exit 7`)
	if r.code != 7 || r.stdout != "rl-1 rl-1\n" {
		t.Errorf("run-lease exit 7: code %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if _, err := f.Client.RenewLease(ctx, "rl-1"); !errors.Is(err, &protocol.APIError{Code: protocol.ErrCodeLeaseClosed}) {
		t.Errorf("renew after the command exited: %v, want lease_closed", err)
	}
	r = runCLI(ctx, nil, "", "run-lease", "--nats-url", url, "--run", "rl-1", "--", "true")
	if r.code != 1 || !strings.Contains(r.stderr, "run rl-1 was closed earlier") || !strings.Contains(r.stderr, "new --run id") {
		t.Errorf("reusing a closed run: code %d, stderr %q", r.code, r.stderr)
	}
	r = runCLI(ctx, map[string]string{"NEMO_GYM_RUN_ID": "rl-env"}, "", "run-lease", "--nats-url", url, "--", "/nonexistent/cmd")
	if r.code != 127 || !strings.Contains(r.stderr, "/nonexistent/cmd") {
		t.Errorf("missing command: code %d, stderr %q", r.code, r.stderr)
	}
	if li, err := f.Client.CloseLease(ctx, "rl-env"); err != nil || !li.Closed {
		t.Errorf("the run id from NEMO_GYM_RUN_ID: lease %+v, %v; want it opened and then closed", li, err)
	}
	r = runCLI(ctx, nil, "", "run-lease", "--nats-url", url, "--keep", "--run", "rl-keep", "--", "true")
	if r.code != 0 {
		t.Errorf("--keep: code %d, stderr %q", r.code, r.stderr)
	}
	if li, err := f.Client.RenewLease(ctx, "rl-keep"); err != nil || li.Closed {
		t.Errorf("--keep leaves the lease open to expire: %+v, %v", li, err)
	}
}

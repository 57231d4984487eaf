package cli

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// run-lease holds a lease for exactly the command's life: the command sees
// its run id, its exit code comes back, and the lease is closed after it.
func TestRunLeaseOnFleet(t *testing.T) {
	f := startFleet(t, fleettest.Options{Gateways: &fleettest.GatewayOptions{}})
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
	if r.code != 255 || !strings.Contains(r.stderr, "run rl-1 was closed earlier") || !strings.Contains(r.stderr, "new --run id") {
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

func TestClipHolder(t *testing.T) {
	long := strings.Repeat("é", 200) // 400 bytes
	got := clipHolder(long)
	if len(got) > protocol.MaxHolderLen || !utf8.ValidString(got) || len(got) < protocol.MaxHolderLen-1 {
		t.Errorf("clipHolder(200×é) = %d bytes, valid %v", len(got), utf8.ValidString(got))
	}
	if got := clipHolder("a\xffb"); got != "a?b" {
		t.Errorf("clipHolder(invalid UTF-8) = %q", got)
	}
}

// While the command shuts down after SIGTERM, run-lease keeps its lease
// alive: the sandboxes are the command's until it has exited.
func TestRunLeaseRenewsDuringShutdown(t *testing.T) {
	f := startFleet(t, fleettest.Options{Gateways: &fleettest.GatewayOptions{}})
	ctx, cancel := context.WithCancelCause(testCtx(t))
	var stdout, stderr syncBuffer
	e := &env{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, getenv: testGetenv(nil), now: time.Now}
	done := make(chan int, 1)
	const ttl = time.Second
	go func() {
		done <- run(ctx, []string{"run-lease", "--nats-url", f.NATS.ClientURL(), "--run", "rl-slow", "--ttl", ttl.String(), "--keep", "--",
			"sh", "-c", `trap 'sleep 4; exit 0' TERM; echo ready; while :; do sleep 0.05; done`}, e)
	}()
	for !strings.Contains(stdout.String(), "ready") {
		time.Sleep(10 * time.Millisecond)
	}
	term := time.Now()
	cancel(SignalCause(syscall.SIGTERM))
	if code := <-done; code != 0 {
		t.Fatalf("run-lease exit %d, stderr %q", code, stderr.String())
	}
	// Renewed more than a TTL after the SIGTERM: without renewals during
	// the shutdown (at least 4 s) the lease would have expired. (Whether it
	// is still live when the test looks depends on how long a loaded
	// machine took since the last renewal, every TTL/3.)
	ls, ok := f.Sandboxes.Ledger().LeaseOf("rl-slow")
	if !ok || ls.Closed || !ls.RenewedAt.After(term.Add(ttl)) {
		t.Errorf("lease after a 4 s shutdown with a %v TTL, SIGTERM at %v: %+v (found %v), want it renewed after %v", ttl, term, ls, ok, term.Add(ttl))
	}
}

package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/natsauth/natsauthtest"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// TestRevokedCallerJobCancelled: an attached job whose caller a reloaded
// policy no longer grants exec on its node is cancelled by RecheckCallers
// (not left to run to its end): the client gets the node's result with
// error_code revoked within a few seconds, the process is killed, and
// the job's audit event has reason revoked. Before, the job ran on.
func TestRevokedCallerJobCancelled(t *testing.T) {
	self := runAsSelf(t)
	pol := `version: 1
identities:
  nats:alice:
    rules:
      - nodes: "*"
        operations: [exec]
        run_as: ` + self + `
`
	logs := &lockedBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	store, path := writePolicy(t, pol)
	f := fleettest.Start(t, fleettest.Options{Logger: log, Coordinator: func(c *coordinator.Config) {
		c.Policy = store
		withAudit(t, c, log)
	}})
	done, pid := startSleepJob(t, fleetAs(t, f, "alice"), "revoked-1")

	replacePolicy(t, path, "version: 1\nidentities:\n  nats:bob:\n    rules:\n      - nodes: \"*\"\n        operations: [exec]\n        run_as: "+self+"\n")
	if _, err := store.Reload(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	f.Coordinator.RecheckCallers()

	wantRevokedJob(t, done, pid, start, "no longer grants")
	checkFor(t, defaultTestTimeout, func() error {
		for _, l := range auditLines(t, logs) {
			if l["operation"] == "exec" && l["job_id"] == "revoked-1" {
				if l["reason"] != protocol.AuditReasonRevoked || l["result"] != protocol.AuditFailed || l["error_code"] != protocol.ResultCodeRevoked {
					return fmt.Errorf("exec event %v, want reason revoked", l)
				}
				return nil
			}
		}
		return errors.New("no exec event for revoked-1")
	})
}

// startSleepJob runs an attached job id of `sleep 60` on node-0 as nc's
// user and returns the channel of its replies and the process's pid, once
// it started.
func startSleepJob(t *testing.T, nc *nats.Conn, id string) (<-chan execReply, int) {
	t.Helper()
	pidFile := filepath.Join(t.TempDir(), "pid")
	body := mustJSON(t, protocol.ExecRequest{ID: id, Target: protocol.Target{Node: "node-0"},
		Argv: []string{"sh", "-c", `echo $$ > "$1"; exec sleep 60`, "sh", pidFile}})
	done := make(chan execReply, 1)
	go func() {
		r, err := execRaw(nc, body)
		if err != nil {
			r.err = &protocol.APIError{Code: "test_transport", Message: err.Error()}
		}
		done <- r
	}()
	var pid int
	checkFor(t, defaultTestTimeout, func() error {
		b, err := os.ReadFile(pidFile)
		if err != nil || !strings.HasSuffix(string(b), "\n") {
			return fmt.Errorf("no pid yet: %v", err)
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err
	})
	return done, pid
}

// wantRevokedJob waits for the job of done to end revoked (its node's
// error_code revoked, cancelled, "access revoked" and why), and its
// process pid to be gone.
func wantRevokedJob(t *testing.T, done <-chan execReply, pid int, start time.Time, why string) {
	t.Helper()
	var r execReply
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the revoked caller's job still running 10 s after the recheck")
	}
	t.Logf("job ended %v after the recheck", time.Since(start))
	if r.err != nil || r.result == nil || len(r.result.Results) != 1 {
		t.Fatalf("job's end: %+v %+v", r.err, r.result)
	}
	res := r.result.Results[0]
	if res.ErrorCode != protocol.ResultCodeRevoked || !res.Cancelled || !strings.Contains(res.Error, "access revoked") ||
		!strings.Contains(res.Error, why) {
		t.Errorf("node result %+v, want error_code %s, cancelled, access revoked: %s", res, protocol.ResultCodeRevoked, why)
	}
	checkFor(t, defaultTestTimeout, func() error {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("process %d still there (kill 0: %v)", pid, err)
		}
		return nil
	})
}

// TestRevokedCredentialsJobCancelled: an attached job whose caller's NATS
// user was revoked (tether nats user revoke: natsauth.Layout.Revoke) is
// cancelled by RecheckCallers, though the policy still grants it. Before,
// it ran on.
func TestRevokedCredentialsJobCancelled(t *testing.T) {
	self := runAsSelf(t)
	store, _ := writePolicy(t, "version: 1\nidentities:\n  nats:carol:\n    rules:\n      - nodes: \"*\"\n        operations: [exec]\n        run_as: "+self+"\n")
	f := fleettest.Start(t, fleettest.Options{Logger: testLogger(t), Coordinator: func(c *coordinator.Config) {
		c.Policy = store
	}})
	creds := natsauthtest.ClientCreds(t, f.Layout, "carol")
	nc := natsauthtest.Connect(t, f.NATS.ClientURL(), creds)
	done, pid := startSleepJob(t, nc, "revoked-creds")
	if err := f.Layout.Revoke(creds.PublicKey()); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	f.Coordinator.RecheckCallers()
	wantRevokedJob(t, done, pid, start, "NATS credentials")
}

// dialEcho is a fake agent's stream handler: a dial stream answers
// dial-ok, then echoes.
func dialEcho(a *fakeAgent, st *yamux.Stream, h protocol.Header) {
	defer st.Close()
	if h.Kind != protocol.KindDial {
		return
	}
	if err := protocol.WriteFrame(st, protocol.FrameDialOK, nil); err != nil {
		return
	}
	io.Copy(st, st)
}

// TestRevokedCallerStreamClosed: an open forward stream (tether forward)
// whose caller a reloaded policy no longer grants forwarding to its
// target is closed by RecheckCallers, the client reading "access
// revoked", and audited as revoked; the same stream of a caller still
// granted keeps relaying. Before, only ssh streams were rechecked.
func TestRevokedCallerStreamClosed(t *testing.T) {
	logs := &lockedBuffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))
	pol := `version: 1
identities:
  nats:alice:
    rules:
      - nodes: "*"
        operations: [forward]
        targets: [openshell]
  nats:bob:
    rules:
      - nodes: "*"
        operations: [forward]
        targets: [openshell]
`
	store, path := writePolicy(t, pol)
	h := newHarness(t, func(c *coordinator.Config) {
		c.Policy = store
		c.Logger = log
		withAudit(t, c, log)
	})
	h.dialAgent(t, agentOpts{id: "n-a", stream: dialEcho})
	e, alice := streamAs(t, h.as("alice"), "n-a", protocol.KindDial, protocol.DialParams{Target: "openshell"})
	if e != nil {
		t.Fatal(e)
	}
	readDialOK(t, alice)
	e, bob := streamAs(t, h.as("bob"), "n-a", protocol.KindDial, protocol.DialParams{Target: "openshell"})
	if e != nil {
		t.Fatal(e)
	}
	readDialOK(t, bob)

	revokeAliceForward(t, h, store, path, alice, "stream")
	if _, err := bob.Write([]byte("still here")); err != nil {
		t.Fatal(err)
	}
	bob.CloseWrite()
	if got, err := io.ReadAll(bob); err != nil || string(got) != "still here" {
		t.Errorf("bob's stream after the reload: %q, %v", got, err)
	}
	checkFor(t, defaultTestTimeout, func() error {
		for _, l := range auditLines(t, logs) {
			if l["operation"] == "forward" && l["identity"] == "nats:alice" {
				if l["reason"] != protocol.AuditReasonRevoked || l["result"] != protocol.AuditFailed {
					return fmt.Errorf("alice's forward event %v, want reason revoked", l)
				}
				return nil
			}
		}
		return errors.New("no forward event for alice")
	})
}

// TestRevokedCallerDirectStreamClosed: the same on the direct data path:
// alice's forward stream on the coordinator's listener is closed by
// RecheckCallers once the policy no longer grants it, and she reads
// "access revoked".
func TestRevokedCallerDirectStreamClosed(t *testing.T) {
	store, path := writePolicy(t, `version: 1
identities:
  nats:alice:
    rules:
      - nodes: "*"
        operations: [forward]
        targets: [openshell]
`)
	h := newHarness(t, withDirect(func(c *coordinator.Config) { c.Policy = store }))
	h.dialAgent(t, agentOpts{id: "n-a", stream: dialEcho})
	c := client.New(h.as("alice"))
	c.Direct = client.DirectOnly
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	s, err := c.Dial(ctx, "n-a", "openshell")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo: %q, %v", buf, err)
	}
	revokeAliceForward(t, h, store, path, s, "direct stream")
}

// revokeAliceForward reloads a policy that leaves forward to bob alone,
// rechecks the callers, and wants alice's open stream (what names it)
// ended with access revoked, naming the operation.
func revokeAliceForward(t *testing.T, h *harness, store *policy.Store, path string, alice io.Reader, what string) {
	t.Helper()
	replacePolicy(t, path, "version: 1\nidentities:\n  nats:bob:\n    rules:\n      - nodes: \"*\"\n        operations: [forward]\n        targets: [openshell]\n")
	if _, err := store.Reload(); err != nil {
		t.Fatal(err)
	}
	h.c.RecheckCallers()
	read := make(chan error, 1)
	go func() { _, err := io.ReadAll(alice); read <- err }()
	select {
	case err := <-read:
		if err == nil || !strings.Contains(err.Error(), "access revoked") || !strings.Contains(err.Error(), "forward") {
			t.Errorf("alice's %s ended with %v, want access revoked", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("alice's %s still open 10 s after the recheck", what)
	}
}

// TestRevokedJobGraceBounded: a revoked job whose node does not report
// its exit after the cancel ends within revokeGrace (2 s), not the
// coordinator's CancelGrace (10 s here), still as revoked.
func TestRevokedJobGraceBounded(t *testing.T) {
	store, path := writePolicy(t, "version: 1\nidentities:\n  nats:alice:\n    rules:\n      - nodes: \"*\"\n        operations: [exec]\n        run_as: deploy\n")
	h := newHarness(t, func(c *coordinator.Config) {
		c.Policy = store
		c.CancelGrace = 10 * time.Second
	})
	started := make(chan struct{}, 1)
	h.dialAgent(t, agentOpts{id: "n-a", handler: func(a *fakeAgent, st *yamux.Stream, p protocol.ExecParams) {
		started <- struct{}{}
		io.Copy(io.Discard, st) // deaf to the cancel: never reports
	}})
	body := mustJSON(t, protocol.ExecRequest{ID: "deaf-1", Target: protocol.Target{Node: "n-a"}, Argv: []string{"sleep", "60"}})
	done := make(chan execReply, 1)
	go func() {
		r, err := execRaw(h.as("alice"), body)
		if err != nil {
			r.err = &protocol.APIError{Code: "test_transport", Message: err.Error()}
		}
		done <- r
	}()
	select {
	case <-started:
	case <-time.After(defaultTestTimeout):
		t.Fatal("the job did not start")
	}
	replacePolicy(t, path, "version: 1\nidentities:\n  nats:bob:\n    rules:\n      - nodes: \"*\"\n        operations: [exec]\n        run_as: deploy\n")
	if _, err := store.Reload(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	h.c.RecheckCallers()
	select {
	case r := <-done:
		d := time.Since(start)
		if d > 3*time.Second {
			t.Errorf("the job ended %v after the recheck, want within about 2 s", d)
		}
		if r.result == nil || len(r.result.Results) != 1 || r.result.Results[0].ErrorCode != protocol.ResultCodeRevoked {
			t.Errorf("job's end: %+v %+v, want error_code revoked", r.err, r.result)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the revoked job still running 10 s after the recheck")
	}
}

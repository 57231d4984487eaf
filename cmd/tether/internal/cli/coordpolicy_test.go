package cli

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/facade/peeruid"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// testAdminPolicy grants every client user (nats-account:CLIENTS) and
// loopback facade caller everything, running as the test's own user (the
// one every agent may run as): tests of other parts.
func testAdminPolicy(t testing.TB) string {
	t.Helper()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	rules := `    rules:
      - nodes: "*"
        operations: [exec, shell, cp.read, cp.write]
        paths: [/]
        run_as: ` + u.Username + `
      - nodes: "*"
        operations: [forward]
        targets: [openshell, opensandbox, execd]
      - nodes: "*"
        operations: [nodes.list]
      - nodes: "*"
        operations: [job.status, job.logs, job.cancel, sandboxes.register]
        scope: any
      - operations: [sandboxes.list, sandboxes.lease, sandboxes.reap]
        scope: any
      - operations: [admin]
`
	return "version: 1\nidentities:\n  nats-account:CLIENTS:\n" + rules + "  " + peeruid.Identity(uint32(os.Geteuid())).String() + ":\n" + rules
}

func writeTestPolicy(t testing.TB, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCoordinatorRequiresPolicy: without --policy the coordinator does not
// start (usage error, exit 2, saying why); a bad policy stops the start
// with every problem at FILE:LINE:COLUMN.
func TestCoordinatorRequiresPolicy(t *testing.T) {
	r := runCLI(testCtx(t), nil, "", "coordinator", "--data-dir", t.TempDir())
	if r.code != exitUsage || !strings.Contains(r.stderr, "--policy FILE is required") || !strings.Contains(r.stderr, "default deny") {
		t.Fatalf("exit %d, stderr %q; want 2 and why --policy is required", r.code, r.stderr)
	}
	o := testCoordinatorOptions(t, t.TempDir())
	o.Policy = writeTestPolicy(t, "version: 1\nidentities:\n  nats:x:\n    rules:\n      - operations: [exec]\n")
	_, err := startCoordinator(o, "tok", slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	if err == nil || !strings.Contains(err.Error(), o.Policy+":5:") {
		t.Fatalf("start with a bad policy: %v; want its FILE:LINE", err)
	}
	o.Policy = ""
	if _, err := startCoordinator(o, "tok", slog.New(slog.DiscardHandler), prometheus.NewRegistry()); !errors.Is(err, errNoPolicy) {
		t.Fatalf("start without a policy: %v", err)
	}
}

// TestPolicyRefusalExitCode: a refused request prints the refusal once,
// on one line, naming the identity, the operation, the node and the rule
// missing, and exits 255 (Tether refused, as ssh exits 255 for a refused
// login), for exec, cp and job.
func TestPolicyRefusalExitCode(t *testing.T) {
	path := writeTestPolicy(t, `version: 1
identities:
  nats:fleettest:
    rules:
      - nodes: "index=1"
        operations: [exec, cp.write]
        paths: [/tmp]
        run_as: root
`)
	store, err := policy.NewStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The commands connect as the fleet's client user, nats:fleettest.
	f := startFleet(t, fleettest.Options{Agents: 2, Coordinator: func(c *coordinator.Config) {
		c.Policy = store
	}})
	url := f.NATS.ClientURL()
	src := filepath.Join(t.TempDir(), "f")
	os.WriteFile(src, []byte("x"), 0o600)
	for _, tt := range []struct {
		args  []string
		parts []string
	}{
		{[]string{"exec", "--nats-url", url, "--node", "node-0", "--", "true"}, []string{"nats:fleettest may not exec on node-0", `"index=1"`}},
		{[]string{"cp", "--nats-url", url, src, "node-0:/tmp/f"}, []string{`nats:fleettest may not cp.write "/tmp/f" on node-0`}},
		{[]string{"job", "status", "--nats-url", url, "--node", "node-0", "job-1"}, []string{"nats:fleettest may not job.status its own job on node-0"}},
	} {
		r := runCLI(testCtx(t), nil, "", tt.args...)
		lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
		if r.code != exitTether || len(lines) != 1 {
			t.Errorf("tether %s: exit %d, stderr %q; want 255 and one line", strings.Join(tt.args, " "), r.code, r.stderr)
			continue
		}
		for _, p := range tt.parts {
			if !strings.Contains(lines[0], p) || strings.Count(r.stderr, p) != 1 {
				t.Errorf("tether %s: stderr %q does not name %q once", tt.args[0], r.stderr, p)
			}
		}
	}
}

// TestCoordinatorSIGHUPReloadsPolicy: SIGHUP reloads the policy file: a
// decision changes at once, and a stream that is running and that the
// new policy no longer grants is closed ("access revoked"), while the
// agent's session stays up; a broken file keeps the policy in force and
// logs every problem at FILE:LINE:COLUMN.
func TestCoordinatorSIGHUPReloadsPolicy(t *testing.T) {
	// The test's agent runs as the test's user, who may not run as
	// anyone else unless root: the rule runs as that user.
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	allow := `version: 1
identities:
  nats:tester:
    rules:
      - nodes: "*"
        operations: [exec, nodes.list]
        run_as: ` + u.Username + `
`
	const deny = `version: 1
identities:
  nats:tester:
    rules:
      - nodes: "*"
        operations: [nodes.list]
`
	o := testCoordinatorOptions(t, t.TempDir())
	o.Policy = writeTestPolicy(t, allow)
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(io.MultiWriter(&logs, t.Output()), nil))
	o.AllowSharedToken = true // the agent below joins with the shared token
	// A real agent, as tether dev runs one, and a stream that runs
	// across the reload: cat echoes what it is sent.
	f := startReloadFleet(t, o, nil, log, "node-hup")
	cl := f.cl
	f.echo(t, "before\n")
	exec := func() error {
		_, err := cl.Exec(testCtx(t), &protocol.ExecRequest{Target: protocol.Target{Node: "node-hup"}, Argv: []string{"true"}}, nil)
		return err
	}
	if err := exec(); err != nil {
		t.Fatalf("exec under the first policy: %v", err)
	}

	replaceFile(t, o.Policy, deny)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() error {
		var ae *protocol.APIError
		if err := exec(); !errors.As(err, &ae) || ae.Code != protocol.ErrCodeForbidden {
			return errors.New("exec not refused yet")
		}
		return nil
	})
	// The stream the new policy no longer grants is closed at the
	// reload (Coordinator.RecheckCallers), not left to run on.
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := f.fr.Next(); err != nil {
				ended <- err
				return
			}
		}
	}()
	select {
	case err := <-ended:
		if !strings.Contains(err.Error(), "access revoked") {
			t.Errorf("the running stream ended with %v, want access revoked", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the running stream still open 10 s after the reload took its grant")
	}
	f.sameSession(t)

	// A broken file: the deny policy stays, the log names the line.
	replaceFile(t, o.Policy, "version: 1\nidentities:\n  nats:tester:\n    rulez: []\n")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() error {
		if !strings.Contains(logs.String(), "policy reload failed") {
			return errors.New("no reload failure logged yet")
		}
		return nil
	})
	if !strings.Contains(logs.String(), o.Policy+":4:5") {
		t.Errorf("the reload failure does not name %s:4:5:\n%s", o.Policy, logs.String())
	}
	var ae *protocol.APIError
	if err := exec(); !errors.As(err, &ae) || ae.Code != protocol.ErrCodeForbidden {
		t.Fatalf("exec after a broken reload: %v, want still refused", err)
	}
	f.sameSession(t)
}

func replaceFile(t *testing.T, path, data string) {
	t.Helper()
	if err := writeFileAtomic(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, f func() error) {
	t.Helper()
	deadline := time.Now().Add(defaultTestTimeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDevPolicy: the dev policy grants the dev NATS user every operation
// on every node as the invoking user; an existing file is the user's and
// is kept.
func TestDevPolicy(t *testing.T) {
	data, err := devPolicy("nats:alice", "alice")
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse("dev", data)
	if err != nil {
		t.Fatal(err)
	}
	if w := p.Warnings(); len(w) != 0 {
		t.Errorf("warnings: %v", w)
	}
	alice := policy.Identity{Kind: policy.KindNATS, Name: "alice"}
	node := policy.Node{ID: "any-node", Labels: map[string]string{"x": "y"}}
	for _, op := range policy.Operations() {
		obj := policy.Object{Path: "/etc/hosts", Target: "openshell", Owner: "nats:someone-else"}
		n := node
		if !op.OnNode() {
			n = policy.Node{}
		}
		g, err := p.Decide(alice, op, n, obj)
		if err != nil {
			t.Errorf("%s: %v", op, err)
			continue
		}
		if (op == policy.OpExec || op == policy.OpShell) && g.RunAs != "alice" {
			t.Errorf("%s runs as %q, want alice", op, g.RunAs)
		}
	}
	if _, err := p.Decide(policy.Identity{Kind: policy.KindNATS, Name: "bob"}, policy.OpExec, node, policy.Object{}); err == nil {
		t.Error("the dev policy grants another user")
	}
	if _, err := devPolicy("nats:alice", "1000"); err == nil {
		t.Error("devPolicy accepted a uid as run_as")
	}

	dir := t.TempDir()
	path, err := writeDevPolicy(dir, "nats:alice", "alice")
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("dev policy %s: %v %v, want mode 0600", path, fi.Mode(), err)
	}
	os.WriteFile(path, []byte("# mine\n"), 0o600)
	if _, err := writeDevPolicy(dir, "nats:alice", "alice"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, []byte("# mine\n")) {
		t.Errorf("writeDevPolicy replaced the user's file: %q", b)
	}
}

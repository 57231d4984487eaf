//go:build e2e

package e2e

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/tetherfleet/tether/mirror"
	"github.com/tetherfleet/tether/protocol"
)

// TestLocalPolicyAndRunAs runs the built tether agent with a local policy
// file: what it forbids is refused whatever the coordinator relays, a
// SIGHUP after an edit changes the decision without dropping the tunnel,
// and a copy as another account (through the binary's own copy helper)
// has only that account's rights.
func TestLocalPolicyAndRunAs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a user")
	}
	name := "tte" + strings.ToLower(rand.Text()[:8])
	base, err := os.MkdirTemp("", "tether-e2e-home-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(base, 0o755)
	t.Cleanup(func() { os.RemoveAll(base) })
	home := filepath.Join(base, name)
	if out, err := exec.Command("useradd", "-m", "-d", home, "-s", "/bin/sh", name).CombinedOutput(); err != nil {
		t.Skipf("useradd: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("userdel", name).Run() })
	pw, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	rootOnly := filepath.Join(base, "rootonly")
	os.Mkdir(rootOnly, 0o755)

	policy := filepath.Join(t.TempDir(), "agent-policy.yaml")
	write := func(doc string) {
		t.Helper()
		if err := os.WriteFile(policy+".tmp", []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(policy+".tmp", policy); err != nil {
			t.Fatal(err)
		}
	}
	write(fmt.Sprintf("version: 1\nusers:\n  - name: root\n  - name: %s\ncopy_roots: [%s]\nexec: false\n", name, base))

	// The coordinator's policy runs copies into base as the new account
	// (the stream's user is the grant's, whatever the client wrote).
	f := startFleetPolicy(t, e2ePolicyWith(t, fmt.Sprintf(`      - nodes: "*"
        operations: [cp.write]
        paths: [%s]
        run_as: %s`, base, name)))
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	agent := f.startAgentBin(t, *tetherBin, "lp", "lp=1", f.tokenFile, "--local-policy", policy, "--metrics-addr", metricsAddr)
	f.waitNodes(t, "lp")

	_, stderr, code := runCLI(t, f.natsURL, "", "exec", "--node", "lp", "--", "true")
	if code != 255 || !strings.Contains(stderr, "refused by the local policy "+policy) || !strings.Contains(stderr, `"exec: true"`) {
		t.Errorf("exec refused: exit %d, stderr %q", code, stderr)
	}

	// Edit, SIGHUP: allowed now, on the same tunnel session.
	write(fmt.Sprintf("version: 1\nusers:\n  - name: root\n  - name: %s\ncopy_roots: [%s]\nexec: true\n", name, base))
	agent.cmd.Process.Signal(syscall.SIGHUP)
	checkFor(t, defaultTestTimeout, func() error {
		stdout, stderr, code := runCLI(t, f.natsURL, "", "exec", "--node", "lp", "--", "echo", "ok")
		if code != 0 || stdout != "ok\n" {
			return fmt.Errorf("exec after SIGHUP: exit %d, stdout %q, stderr %q", code, stdout, stderr)
		}
		return nil
	})
	if n := metric(t, metricsAddr, "tether_agent_tunnel_reconnects_total"); n != 0 {
		t.Errorf("the agent redialled %v times: the reload dropped its session", n)
	}

	// A copy as the user, through the binary's copy helper.
	src := t.TempDir()
	os.Chmod(src, 0o755)
	os.WriteFile(filepath.Join(src, "f"), []byte("hello"), 0o644)
	push := func(dst string) error {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
		defer cancel()
		st, err := f.cl.OpenStream(ctx, "lp", protocol.KindCopy, &protocol.CopyParams{Direction: protocol.CopyPush, Path: dst, User: name})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		_, err = mirror.Send(ctx, src, st, mirror.Options{})
		return err
	}
	if err := push(filepath.Join(home, "dst")); err != nil {
		t.Fatalf("push into the home as %s: %v", name, err)
	}
	fi, err := os.Stat(filepath.Join(home, "dst", "f"))
	if err != nil {
		t.Fatal(err)
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; strconv.Itoa(int(uid)) != pw.Uid {
		t.Errorf("pushed file owned by uid %d, want %s", uid, pw.Uid)
	}
	if err := push(filepath.Join(rootOnly, "dst")); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("push into a root-owned directory as %s: %v, want permission denied", name, err)
	}
	if ents, _ := os.ReadDir(rootOnly); len(ents) != 0 {
		t.Errorf("the root-owned directory got %v", ents)
	}
	// A bad edit keeps the policy in force.
	write("version: 1\nexec: true\nbogus: 1\n")
	agent.cmd.Process.Signal(syscall.SIGHUP)
	checkFor(t, defaultTestTimeout, func() error {
		b, _ := os.ReadFile(agent.log)
		if !strings.Contains(string(b), "local policy not reloaded") {
			return fmt.Errorf("the agent has not logged the refused reload")
		}
		return nil
	})
	if stdout, stderr, code := runCLI(t, f.natsURL, "", "exec", "--node", "lp", "--", "echo", "ok"); code != 0 || stdout != "ok\n" {
		t.Errorf("exec after a bad edit: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

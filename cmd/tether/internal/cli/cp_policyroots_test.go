package cli

import (
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/policy"
)

// TestCpPolicyPathIsANodeBoundary: a user granted cp.read and cp.write on
// ROOT/pub only (the agent's copy root is ROOT) can upload symlinks into
// pub, but cannot read or write through them outside pub: the policy's
// path is a boundary the agent enforces, not only a lexical check of the
// path the client names. Copies inside pub, through a symlink that stays
// in pub too, still work.
func TestCpPolicyPathIsANodeBoundary(t *testing.T) {
	// The fleet's agent copy root is its data dir; the fleet is started
	// first to learn it, the policy (reloadable) written after.
	dir := t.TempDir()
	path := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(path, []byte("version: 1\nidentities: {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	store, err := policy.NewStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := startFleet(t, fleettest.Options{Agents: 1, Coordinator: func(c *coordinator.Config) { c.Policy = store }})
	url := f.NATS.ClientURL()
	root := f.DataDir("node-0")
	pub := filepath.Join(root, "pub")
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(`version: 1
identities:
  nats:fleettest:
    rules:
      - nodes: "*"
        operations: [cp.read, cp.write]
        paths: [`+pub+`]
        run_as: `+me.Username+`
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Reload(); err != nil {
		t.Fatal(err)
	}
	// Outside pub, on the node: a secret and a victim directory.
	for _, d := range []string{filepath.Join(root, "outside"), filepath.Join(root, "victim"), filepath.Join(pub, "sub")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "outside", "secret"), []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pub, "sub", "ok"), []byte("ok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The user uploads symlinks into pub: the policy allows that write.
	local := t.TempDir()
	links := filepath.Join(local, "links")
	os.MkdirAll(links, 0o755)
	for name, target := range map[string]string{
		"abs":    filepath.Join(root, "outside"),
		"rel":    "../outside",
		"victim": filepath.Join(root, "victim"),
		"inside": filepath.Join(pub, "sub"),
	} {
		if err := os.Symlink(target, filepath.Join(links, name)); err != nil {
			t.Fatal(err)
		}
	}
	cp := func(args ...string) result {
		return runCLI(testCtx(t), nil, "", append([]string{"cp", "--nats-url", url}, args...)...)
	}
	if r := cp(links+"/", "node-0:"+pub+"/"); r.code != 0 {
		t.Fatalf("push the links into pub: exit %d, stderr %q", r.code, r.stderr)
	}
	if l, err := os.Readlink(filepath.Join(pub, "abs")); err != nil || l != filepath.Join(root, "outside") {
		t.Fatalf("pub/abs on the node: %q, %v; want the symlink the user pushed", l, err)
	}
	// Reads through them stop at pub.
	for _, name := range []string{"abs", "rel"} {
		dst := filepath.Join(local, "got-"+name)
		r := cp("node-0:"+pub+"/"+name+"/secret", dst)
		if r.code == 0 {
			t.Errorf("read %s/%s/secret through a symlink out of the policy's path: exit 0, want a refusal", pub, name)
		}
		if b, err := os.ReadFile(dst); err == nil {
			t.Errorf("read through pub/%s: got %q from outside the policy's path", name, b)
		}
		if !strings.Contains(r.stderr, pub) {
			t.Errorf("read through pub/%s: stderr %q does not name the policy's path %s", name, r.stderr, pub)
		}
	}
	// Writes through them too.
	file := filepath.Join(local, "planted")
	os.WriteFile(file, []byte("planted\n"), 0o644)
	if r := cp(file, "node-0:"+pub+"/victim/"); r.code == 0 || !strings.Contains(r.stderr, pub) {
		t.Errorf("write through pub/victim: exit %d, stderr %q; want a refusal naming %s", r.code, r.stderr, pub)
	}
	if _, err := os.Lstat(filepath.Join(root, "victim", "planted")); err == nil {
		t.Errorf("write through pub/victim planted a file outside the policy's path")
	}
	// Inside pub everything still works, through a symlink that stays in it.
	if r := cp("node-0:"+pub+"/inside/ok", filepath.Join(local, "ok")); r.code != 0 {
		t.Errorf("read pub/inside/ok: exit %d, stderr %q", r.code, r.stderr)
	} else if b, _ := os.ReadFile(filepath.Join(local, "ok")); string(b) != "ok\n" {
		t.Errorf("read pub/inside/ok: %q", b)
	}
	if r := cp(file, "node-0:"+pub+"/inside/"); r.code != 0 {
		t.Errorf("write pub/inside/: exit %d, stderr %q", r.code, r.stderr)
	} else if _, err := os.Stat(filepath.Join(pub, "sub", "planted")); err != nil {
		t.Errorf("write pub/inside/: %v", err)
	}
	// The lexical check still refuses a path outside pub outright.
	if r := cp("node-0:"+root+"/outside/secret", filepath.Join(local, "direct")); r.code != exitTether || !strings.Contains(r.stderr, "may not cp.read") {
		t.Errorf("read outside pub: exit %d, stderr %q; want the policy's refusal", r.code, r.stderr)
	}
}

package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/tunnel"
)

// TestDevAgentNeverCopiesCoordinatorState: under tether dev, the dev
// agent's copies (its copy roots reach the data dir) refuse the dev
// coordinator's own state, which would hand the copier the fleet: the
// NATS operator keys, the CA, the policy, the SSH jump host's keys, the
// dev user's credentials; a pull of the whole data dir skips them. Other
// files beside them still copy.
func TestDevAgentNeverCopiesCoordinatorState(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a full dev stack")
	}
	dir := t.TempDir()
	devVars := map[string]string{"XDG_CONFIG_HOME": t.TempDir()}
	dev := runDevT(t, dir, testGetenv(devVars))
	url := dev.URL
	node := devNodeID()
	local := t.TempDir()
	ents, err := os.ReadDir(filepath.Join(dir, "nats-auth"))
	if err != nil || len(ents) == 0 {
		t.Fatalf("the dev data dir holds no NATS keys: %v", err)
	}
	secrets := []string{
		filepath.Join(dir, "nats-auth", ents[0].Name()),
		filepath.Join(dir, "nats-auth"),
		filepath.Join(dir, "pki", tunnel.CAFile),
		filepath.Join(dir, devPolicyFile),
		filepath.Join(dir, "dev.creds"),
		filepath.Join(devVars["XDG_CONFIG_HOME"], "tether", "dev.creds"),
	}
	if _, err := os.Stat(filepath.Join(dir, "ssh")); err == nil {
		secrets = append(secrets, filepath.Join(dir, "ssh"))
	}
	for i, p := range secrets {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("dev state %s: %v", p, err)
			continue
		}
		dst := filepath.Join(local, "got", strings.Repeat("x", i+1))
		r := runCLI(testCtx(t), devVars, "", "cp", "--nats-url", url, node+":"+p, dst)
		if r.code == 0 || !strings.Contains(r.stderr, "the agent's own state") {
			t.Errorf("cp %s:%s: exit %d, stderr %q; want a refusal: the agent's own state", node, p, r.code, r.stderr)
		}
		if _, err := os.Lstat(dst); err == nil {
			t.Errorf("cp %s:%s copied the dev coordinator's state", node, p)
		}
	}
	// A write onto the policy is refused too, and leaves it as it was.
	before, _ := os.ReadFile(filepath.Join(dir, devPolicyFile))
	evil := filepath.Join(local, "evil.yaml")
	os.WriteFile(evil, []byte("version: 1\n"), 0o600)
	if r := runCLI(testCtx(t), devVars, "", "cp", "--nats-url", url, evil, node+":"+filepath.Join(dir, devPolicyFile)); r.code == 0 {
		t.Errorf("cp onto the dev policy: exit 0, stderr %q", r.stderr)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, devPolicyFile)); string(after) != string(before) {
		t.Error("cp onto the dev policy replaced it")
	}
	// A file of the user's beside them still copies.
	mine := filepath.Join(dir, "mine.txt")
	os.WriteFile(mine, []byte("mine\n"), 0o600)
	if r := runCLI(testCtx(t), devVars, "", "cp", "--nats-url", url, node+":"+mine, filepath.Join(local, "mine.txt")); r.code != 0 {
		t.Errorf("cp of a user's file in the data dir: exit %d, stderr %q", r.code, r.stderr)
	}
	// Hard links, under a copy root, to the fleet CA's key and to the
	// files of the node's identity are refused alone and skipped in a
	// tree.
	work := filepath.Join(local, "work")
	os.MkdirAll(work, 0o755)
	os.WriteFile(filepath.Join(work, "mine"), []byte("mine\n"), 0o600)
	links := map[string]string{"ca_hl": filepath.Join(dir, "pki", "ca.key")}
	ids, _ := os.ReadDir(filepath.Join(dir, "agent", "identity"))
	for _, e := range ids {
		if e.Type().IsRegular() {
			links["id_"+e.Name()] = filepath.Join(dir, "agent", "identity", e.Name())
		}
	}
	if len(links) < 2 {
		t.Fatalf("the dev agent's identity directory holds no file: %v", ids)
	}
	for name, target := range links {
		if err := os.Link(target, filepath.Join(work, name)); err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(local, "got", name)
		r := runCLI(testCtx(t), devVars, "", "cp", "--nats-url", url, node+":"+filepath.Join(work, name), dst)
		if r.code == 0 || !strings.Contains(r.stderr, "the agent's own state") || !strings.Contains(r.stderr, target) {
			t.Errorf("cp of a hard link to %s: exit %d, stderr %q; want a refusal naming it", target, r.code, r.stderr)
		}
		if _, err := os.Lstat(dst); err == nil {
			t.Errorf("cp of a hard link to %s copied it", target)
		}
	}
	tree := filepath.Join(local, "gotwork")
	r := runCLI(testCtx(t), devVars, "", "cp", "--nats-url", url, node+":"+work, tree)
	if got, err := os.ReadDir(tree); err != nil || len(got) != 1 || got[0].Name() != "mine" {
		t.Errorf("cp of a tree holding hard links to the agent's state: exit %d, stderr %q, copied %v (%v); want only mine", r.code, r.stderr, got, err)
	}
}

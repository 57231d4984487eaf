package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPolicyCheckExample: the shipped example passes `tether policy check`
// with no warning.
func TestPolicyCheckExample(t *testing.T) {
	// A copy of mode 0600: policy check refuses a group-writable file, and
	// a checkout made under umask 002 has one.
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "..", "deploy", "policy.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "policy.example.yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	r := runCLI(testCtx(t), nil, "", "policy", "check", path)
	if r.code != exitOK || r.stderr != "" {
		t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
	if want := path + ": ok: 7 identities, 3 roles, 13 rules\n"; r.stdout != want {
		t.Errorf("stdout %q, want %q", r.stdout, want)
	}
}

func TestPolicyCheckErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("version: 1\nroles:\n  r:\n    - nodes: \"*\"\n      operations: [exec]\n      run_as: 1000\nidentities:\n  nats:al: {roles: [x]}\n  ssh:bar: {}\n"), 0o600)
	r := runCLI(testCtx(t), nil, "", "policy", "check", bad)
	if r.code != exitFailure || r.stdout != "" {
		t.Fatalf("exit %d (want %d), stdout %q", r.code, exitFailure, r.stdout)
	}
	want := "tether: " + bad + ":6:15: roles.r[0].run_as: want a string, got the integer 1000\n" +
		"tether: " + bad + `:8:21: identities["nats:al"].roles[0]: role "x" is not defined (roles: r)` + "\n" +
		"tether: " + bad + `:9:3: identities: identity "ssh:bar": unknown kind "ssh": want one of nats, nats-account, cert, token, ssh-key, ssh-principal` + "\n"
	if r.stderr != want {
		t.Errorf("stderr\n%s\nwant\n%s", r.stderr, want)
	}

	warn := filepath.Join(dir, "warn.yaml")
	os.WriteFile(warn, []byte("version: 1\nroles:\n  spare:\n    - operations: [admin]\nidentities:\n  cert:ops: {rules: [{operations: [admin]}]}\n"), 0o600)
	r = runCLI(testCtx(t), nil, "", "policy", "check", warn)
	if r.code != exitOK || r.stdout != warn+": ok: 1 identity, 1 role, 2 rules\n" ||
		r.stderr != "tether: warning: "+warn+":3:3: role spare is not used by any identity\n" {
		t.Errorf("warnings: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}

	r = runCLI(testCtx(t), nil, "", "policy", "check", filepath.Join(dir, "missing.yaml"))
	if r.code != exitFailure || !strings.Contains(r.stderr, "missing.yaml: no such file or directory") {
		t.Errorf("missing file: exit %d, stderr %q", r.code, r.stderr)
	}
	// The coordinator's file checks: a group-writable file is refused.
	loose := filepath.Join(dir, "loose.yaml")
	os.WriteFile(loose, []byte("version: 1\nidentities: {}\n"), 0o600)
	os.Chmod(loose, 0o660)
	r = runCLI(testCtx(t), nil, "", "policy", "check", loose)
	if r.code != exitFailure || !strings.Contains(r.stderr, loose+" (owner uid ") || !strings.Contains(r.stderr, "writable by its group (mode 0660)") {
		t.Errorf("group-writable file: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, args := range [][]string{{"policy"}, {"policy", "check"}, {"policy", "check", "a", "b"}} {
		if r := runCLI(testCtx(t), nil, "", args...); r.code != exitUsage {
			t.Errorf("%q: exit %d, want %d; stderr %q", args, r.code, exitUsage, r.stderr)
		}
	}
}

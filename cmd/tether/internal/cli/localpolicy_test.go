package cli

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/agent/localpolicy"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/internal/sdnotify"
	"github.com/tetherfleet/tether/internal/sdnotify/sdnotifytest"
)

// TestLocalPolicyRefusalsShown: what the node's local policy refuses,
// whatever the coordinator asked, reaches the user of tether exec, cp and
// shell as one clear line naming the node, the policy file and the rule.
func TestLocalPolicyRefusalsShown(t *testing.T) {
	roots := t.TempDir()
	const file = "/etc/tether/agent-policy.yaml"
	doc := fmt.Sprintf("version: 1\nusers:\n  - uid: %d\ncopy_roots: [%s]\nexec: false\nshell: false\n", os.Geteuid(), roots)
	p, err := localpolicy.Parse(file, []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	f := startFleet(t, fleettest.Options{Agent: func(_ int, c *agent.Config) { c.LocalPolicy = p }})
	url := f.NATS.ClientURL()
	local := filepath.Join(t.TempDir(), "f")
	os.WriteFile(local, []byte("x"), 0o644)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"exec", []string{"exec", "--nats-url", url, "--node", "node-0", "--", "true"}, exitTether,
			[]string{"node-0", "refused by the local policy " + file, `"exec: true"`, "(forbidden)"}},
		{"cp outside the roots", []string{"cp", "--nats-url", url, local, "node-0:/var/tmp/x"}, exitFailure,
			[]string{"node-0", "refused by the local policy " + file, `"copy_roots: /var/tmp/x"`}},
		{"cp inside the roots", []string{"cp", "--nats-url", url, local, "node-0:" + roots + "/x"}, 0, nil},
		// Without a terminal, tether shell runs its command on an exec
		// stream: refused as an exec (the pty refusal is the agent's
		// TestLocalPolicyRefuses).
		{"shell without a terminal", []string{"shell", "node-0", "--nats-url", url, "--", "true"}, exitTether,
			[]string{"node-0", "refused by the local policy " + file, `"exec: true"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCLI(testCtx(t), nil, "", tc.args...)
			t.Logf("exit %d\nstdout %q\nstderr %q", r.code, r.stdout, r.stderr)
			if r.code != tc.code {
				t.Errorf("exit %d, want %d", r.code, tc.code)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q", w)
				}
			}
		})
	}
}

// TestAgentRefusesBadLocalPolicy: tether agent does not start with a local
// policy that is malformed (file:line:col named) or writable by others.
func TestAgentRefusesBadLocalPolicy(t *testing.T) {
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	os.WriteFile(token, []byte("t0ken"), 0o600)
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("version: 1\nexec: true\nexce: true\n"), 0o600)
	open := filepath.Join(dir, "open.yaml")
	os.WriteFile(open, []byte("version: 1\n"), 0o600)
	os.Chmod(open, 0o666)
	for _, tc := range []struct{ file, want string }{
		{bad, bad + `:3:1: unknown key "exce"`},
		{open, open + ": mode 0666 is writable by its group or others"},
		{filepath.Join(dir, "missing.yaml"), "no such file or directory"},
	} {
		r := runCLI(testCtx(t), nil, "", "agent", "--coordinator", "127.0.0.1:1", "--token-file", token,
			"--data-dir", filepath.Join(dir, "data"), "--local-policy", tc.file)
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("agent --local-policy %s: exit %d, stderr %q, want it to contain %q", tc.file, r.code, r.stderr, tc.want)
		}
	}
}

// TestLocalPolicyReloadOnSIGHUP: a SIGHUP loads the edited file; a broken
// edit keeps the policy in force.
func TestLocalPolicyReloadOnSIGHUP(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	write := func(doc string) {
		t.Helper()
		if err := os.WriteFile(path+".tmp", []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		os.Rename(path+".tmp", path)
	}
	write("version: 1\nexec: false\n")
	p, lpPath, err := loadLocalPolicy(path)
	if err != nil || p == nil || lpPath != path {
		t.Fatalf("load: %v %v %q", p, err, lpPath)
	}
	cfg := agent.DefaultConfig()
	cfg.Coordinators, cfg.Token, cfg.Dial = []string{"127.0.0.1:1"}, "t", nil
	cfg.TLS = &tls.Config{}
	cfg.LocalPolicy = p
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	// systemd hears of each reload (RELOADING=1, then READY=1 with the
	// outcome) once the agent said READY=1.
	sock := sdnotifytest.Listen(t)
	notify := sdnotify.New(sock.Path, 0)
	notify.Ready("connected")
	stop := watchLocalPolicy(testCtx(t), a, path, path, notify, slog.New(slog.NewTextHandler(&logs, nil)))
	defer stop()
	hup := func() { syscall.Kill(os.Getpid(), syscall.SIGHUP) }
	write("version: 1\nexec: true\n")
	hup()
	checkFor(t, defaultTestTimeout, func() error {
		if a.LocalPolicy().AllowExec() != nil {
			return errorString("exec still refused after SIGHUP")
		}
		return nil
	})
	sock.Wait(t, defaultTestTimeout, "RELOADING=1", func(m sdnotifytest.Message) bool { return m.Has("RELOADING=1") })
	sock.Wait(t, defaultTestTimeout, "READY=1 after the reload", func(m sdnotifytest.Message) bool {
		v, _ := m.Value("STATUS")
		return m.Has("READY=1") && v == "local policy reloaded from "+path
	})
	reloaded := a.LocalPolicy()
	write("version: 1\nexec: true\nshell: true\nbogus: 1\n")
	hup()
	checkFor(t, defaultTestTimeout, func() error {
		if !strings.Contains(logs.String(), "local policy not reloaded") || !strings.Contains(logs.String(), "bogus") {
			return errorString("no log of the refused reload: " + logs.String())
		}
		return nil
	})
	if a.LocalPolicy() != reloaded {
		t.Error("a broken file replaced the policy in force")
	}
	sock.Wait(t, defaultTestTimeout, "READY=1 after the refused reload", func(m sdnotifytest.Message) bool {
		v, _ := m.Value("STATUS")
		return m.Has("READY=1") && strings.HasPrefix(v, "local policy not reloaded (the one in force stays): ") && strings.Contains(v, "bogus")
	})
}

func TestDevCopyRoots(t *testing.T) {
	if got := devCopyRoots(1000, "/d"); len(got) != 1 || got[0] != "/" {
		t.Errorf("as a user: %v, want [/]: the kernel checks the user's rights", got)
	}
	wd, _ := os.Getwd()
	got := devCopyRoots(0, "/d")
	if got[0] != "/d" || got[len(got)-1] != os.TempDir() || (wd != "/" && got[1] != wd) {
		t.Errorf("as root: %v, want the data dir, the working directory and the temp dir", got)
	}
	for _, r := range got {
		if r == "/" {
			t.Errorf("as root the default includes /: %v", got)
		}
	}
	// --copy-root reaches the dev agent's config.
	o := defaultDevOptions()
	o.CopyRoots = []string{"/srv"}
	cfg, err := devAgentConfig(&o, coordinatorInfo{CAFile: ""}, slog.New(slog.DiscardHandler), func(string) string { return "" }, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.CopyRoots) != 1 || cfg.CopyRoots[0] != "/srv" {
		t.Errorf("dev agent copy roots %v, want [/srv]", cfg.CopyRoots)
	}
	if r := runCLI(testCtx(t), nil, "", "dev", "--copy-root", "rel"); r.code != exitUsage || !strings.Contains(r.stderr, `--copy-root "rel": must be an absolute path`) {
		t.Errorf("dev --copy-root rel: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestShellOnTerminalRefusedByLocalPolicy: tether shell on a terminal (a
// pty stream) that the node's local policy forbids prints the refusal and
// exits 255, with the terminal restored.
func TestShellOnTerminalRefusedByLocalPolicy(t *testing.T) {
	p, err := localpolicy.Parse("/etc/tether/agent-policy.yaml", []byte(fmt.Sprintf("version: 1\nusers:\n  - uid: %d\nexec: true\n", os.Geteuid())))
	if err != nil {
		t.Fatal(err)
	}
	f := startFleet(t, fleettest.Options{Agent: func(_ int, c *agent.Config) { c.LocalPolicy = p }})
	tm := newTerminal(t, 24, 80)
	r := startShell(testCtx(t), t, tm, nil, f.NATS.ClientURL(), "true")
	if code := r.wait(t); code != exitTether {
		t.Errorf("exit %d, want %d", code, exitTether)
	}
	tm.waitScreen(t, `tether: node node-0: refused by the local policy /etc/tether/agent-policy.yaml: shell \(pty\) is not allowed \(no "shell: true" rule\) \(forbidden\)`)
}

// TestLocalPolicyCheckedWithOtherOptions: a bad local policy is reported
// with the agent's other option errors (here: no join token), not only once
// they are fixed; tether policy check --local checks one on its own, and
// tether policy check of one says what it is instead of calling every key
// unknown (fresh-user pass F-P3).
func TestLocalPolicyCheckedWithOtherOptions(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("version: 1\nexec: yes\n"), 0o600)
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, []byte("version: 1\nusers:\n  - name: root\ncopy_roots: [/srv]\nexec: true\n"), 0o600)
	ctx := testCtx(t)
	r := runCLI(ctx, nil, "", "agent", "--coordinator", "127.0.0.1:1", "--data-dir", filepath.Join(dir, "data"), "--local-policy", bad)
	if r.code != exitUsage || !strings.Contains(r.stderr, bad+`:2:7: exec: must be true or false`) || !strings.Contains(r.stderr, "a join token is required") {
		t.Errorf("agent without a token, bad local policy: exit %d, stderr %q; want both problems", r.code, r.stderr)
	}
	if r := runCLI(ctx, nil, "", "policy", "check", "--local", good); r.code != 0 || r.stdout != good+": ok: a local policy, 1 user entry, 1 copy root\n" {
		t.Errorf("policy check --local good: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(ctx, nil, "", "policy", "check", "--local", bad); r.code != 1 || !strings.Contains(r.stderr, bad+`:2:7: exec:`) {
		t.Errorf("policy check --local bad: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := runCLI(ctx, nil, "", "policy", "check", good); r.code != 1 || !strings.Contains(r.stderr, "is a node's local policy, not the coordinator's; check it with tether policy check --local") {
		t.Errorf("policy check of a local policy: exit %d, stderr %q", r.code, r.stderr)
	}
}

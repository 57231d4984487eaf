package agent

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tetherfleet/tether/agent/localpolicy"
	"github.com/tetherfleet/tether/mirror"
	"github.com/tetherfleet/tether/protocol"
)

// testUser is a local account made for a test: a user with its own home
// and one supplementary group.
type testUser struct {
	name, group string
	uid, gid    int // gid: the supplementary group's
	home        string
	base        string // a 0755 directory holding home, outside t.TempDir (0700)
}

// newTestUser creates a user (useradd) with a home under a world-searchable
// directory and a supplementary group, removed at cleanup. It skips the
// test unless it runs as root.
func newTestUser(t *testing.T) *testUser { return newTestUserTB(t) }

// newTestUserTB is newTestUser for tests and benchmarks.
func newTestUserTB(t testing.TB) *testUser {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create users")
	}
	for _, tool := range []string{"useradd", "groupadd", "userdel", "groupdel"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s", tool)
		}
	}
	suffix := strings.ToLower(rand.Text()[:8])
	u := &testUser{name: "tt" + suffix, group: "ttg" + suffix}
	base, err := os.MkdirTemp("", "tether-home-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(base, 0o755)
	u.base = base
	u.home = filepath.Join(base, u.name)
	t.Cleanup(func() { os.RemoveAll(base) })
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	run("groupadd", u.group)
	t.Cleanup(func() { exec.Command("groupdel", u.group).Run() })
	run("useradd", "-m", "-d", u.home, "-s", "/bin/sh", "-G", u.group, u.name)
	t.Cleanup(func() { exec.Command("userdel", u.name).Run() })
	pw, err := user.Lookup(u.name)
	if err != nil {
		t.Fatal(err)
	}
	u.uid, _ = strconv.Atoi(pw.Uid)
	gr, err := user.LookupGroup(u.group)
	if err != nil {
		t.Fatal(err)
	}
	u.gid, _ = strconv.Atoi(gr.Gid)
	return u
}

// withPolicy is a harness mutator that loads the local policy doc.
func withPolicy(t *testing.T, doc string) func(*Config) {
	t.Helper()
	p, err := localpolicy.Parse("/etc/tether/test-policy.yaml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return func(c *Config) { c.LocalPolicy = p }
}

func TestExecRunsAsMappedUser(t *testing.T) {
	u := newTestUser(t)
	h := newHarness(t, withPolicy(t, fmt.Sprintf("version: 1\nusers:\n  - name: %s\nexec: true\n", u.name)))
	e := h.open(t, protocol.KindExec, protocol.ExecParams{
		Script: `id -u; id -G; echo "$HOME|$USER|$LOGNAME|$SHELL"; pwd; echo "${TETHER_TOKEN-unset}"`,
		User:   u.name,
	})
	e.finish(t)
	if e.exit == nil || e.exit.ExitCode != 0 {
		t.Fatalf("exit %+v, error %v, stderr %q", e.exit, e.errInfo, e.stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(e.stdout.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("output %q", e.stdout.String())
	}
	if lines[0] != strconv.Itoa(u.uid) {
		t.Errorf("id -u = %s, want %d", lines[0], u.uid)
	}
	if !strings.Contains(" "+lines[1]+" ", " "+strconv.Itoa(u.gid)+" ") || strings.Contains(" "+lines[1]+" ", " 0 ") {
		t.Errorf("id -G = %s, want the supplementary group %d and not root's", lines[1], u.gid)
	}
	if want := u.home + "|" + u.name + "|" + u.name + "|/bin/sh"; lines[2] != want {
		t.Errorf("HOME|USER|LOGNAME|SHELL = %s, want %s", lines[2], want)
	}
	if lines[3] != u.home {
		t.Errorf("default cwd %s, want the home %s", lines[3], u.home)
	}

	// By uid too, and argv mode, and a relative cwd from the home.
	os.Mkdir(filepath.Join(u.home, "w"), 0o755)
	e = h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"sh", "-c", "id -un; pwd"}, User: strconv.Itoa(u.uid), Cwd: "w"})
	e.finish(t)
	if e.exit == nil || e.stdout.String() != u.name+"\n"+filepath.Join(u.home, "w")+"\n" {
		t.Errorf("by uid: exit %+v error %v output %q", e.exit, e.errInfo, e.stdout.String())
	}

	// A fail-fast batch: every command as the user.
	e = h.open(t, protocol.KindExec, protocol.ExecParams{FailFast: true, Commands: []string{"id -u", "id -u"}, User: u.name})
	e.finish(t)
	if want := strings.Repeat(strconv.Itoa(u.uid)+"\n", 2); e.stdout.String() != want {
		t.Errorf("fail-fast output %q, want %q (error %v)", e.stdout.String(), want, e.errInfo)
	}
}

func TestUnknownUserAndNoLocalPolicy(t *testing.T) {
	h := newHarness(t, nil)
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"true"}, User: "no-such-user-xyz"})
	e.finish(t)
	if e.errInfo == nil || e.errInfo.Code != codeUnknownUser || !strings.Contains(e.errInfo.Message, `node-a: user "no-such-user-xyz": no such user on this node`) {
		t.Errorf("unknown user: %+v", e.errInfo)
	}
	// Without a local policy: the agent's own account only.
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	e = h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"id", "-u"}, User: me.Username})
	e.finish(t)
	if e.exit == nil || strings.TrimSpace(e.stdout.String()) != me.Uid {
		t.Errorf("as the agent's own user: %+v %v %q", e.exit, e.errInfo, e.stdout.String())
	}
	if os.Geteuid() == 0 {
		e = h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"id", "-u"}, User: "nobody"})
		e.finish(t)
		if e.errInfo == nil || e.errInfo.Code != codeForbidden || !strings.Contains(e.errInfo.Message, "no local policy") ||
			!strings.Contains(e.errInfo.Message, "write a local policy that lists") {
			t.Errorf("as nobody without a local policy: exit %+v error %+v", e.exit, e.errInfo)
		}
	}
}

// TestRunAsHint: Config.RunAsHint replaces the advice of a refusal to run
// as another user without a local policy (tether dev's).
func TestRunAsHint(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: as another user every user is 'another', and the test needs one that exists besides the agent's")
	}
	h := newHarness(t, func(c *Config) { c.RunAsHint = "do the dev thing" })
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"true"}, User: "nobody"})
	e.finish(t)
	if e.errInfo == nil || e.errInfo.Code != codeForbidden || !strings.Contains(e.errInfo.Message, "(do the dev thing)") ||
		strings.Contains(e.errInfo.Message, "--local-policy") {
		t.Errorf("as nobody with a hint: %+v", e.errInfo)
	}
}

// TestLocalPolicyRefuses plays a coordinator that asks for everything the
// node's local policy forbids: each is refused with a forbidden error
// naming the file and the missing rule, and nothing runs.
func TestLocalPolicyRefuses(t *testing.T) {
	u := newTestUser(t)
	marker := filepath.Join(t.TempDir(), "ran")
	h := newHarness(t, func(c *Config) {
		withPolicy(t, fmt.Sprintf("version: 1\nusers:\n  - name: %s\n    copy_roots: [%s]\nexec: true\nforward: true\ntargets: [allowed]\n", u.name, u.home))(c)
		c.Targets = map[string]string{"allowed": "127.0.0.1:1", "other": "127.0.0.1:2"}
	})
	const file = "/etc/tether/test-policy.yaml"
	check := func(t *testing.T, info *protocol.ErrorInfo, rule string) {
		t.Helper()
		if info == nil || info.Code != codeForbidden || !strings.Contains(info.Message, file) || !strings.Contains(info.Message, strconv.Quote(rule)) {
			t.Errorf("error %+v, want forbidden naming %s and rule %q", info, file, rule)
		}
	}
	t.Run("user not allowed", func(t *testing.T) {
		e := h.open(t, protocol.KindExec, protocol.ExecParams{Script: "touch " + marker, User: "root"})
		e.finish(t)
		check(t, e.errInfo, "users: - name: root")
		// Empty User is the agent's own account (root), not listed either.
		e = h.open(t, protocol.KindExec, protocol.ExecParams{Script: "touch " + marker})
		e.finish(t)
		check(t, e.errInfo, "users: - name: root")
		e = h.open(t, protocol.KindExec, protocol.ExecParams{Script: "touch " + marker, User: "root", Detach: true, JobID: "j1"})
		e.finish(t)
		check(t, e.errInfo, "users: - name: root")
	})
	t.Run("shell off", func(t *testing.T) {
		e := h.open(t, protocol.KindPTY, protocol.PTYParams{Argv: []string{"touch", marker}, User: u.name})
		e.finish(t)
		check(t, e.errInfo, "shell: true")
	})
	t.Run("target not allowed", func(t *testing.T) {
		e := h.open(t, protocol.KindDial, protocol.DialParams{Target: "other"})
		e.finish(t)
		check(t, e.errInfo, "targets: other")
	})
	t.Run("copy root not allowed", func(t *testing.T) {
		src := t.TempDir()
		writeTree(t, src, map[string]string{"f": "x"})
		for _, tc := range []struct {
			p    protocol.CopyParams
			rule string
		}{
			{protocol.CopyParams{Direction: protocol.CopyPush, Path: filepath.Join(u.base, "x"), User: u.name}, "copy_roots: " + filepath.Join(u.base, "x")},
			{protocol.CopyParams{Direction: protocol.CopyPush, Path: filepath.Join(u.home, "x"), User: "root"}, "users: - name: root"},
			{protocol.CopyParams{Direction: protocol.CopyPull, Path: "/etc/passwd", User: u.name}, "copy_roots: /etc/passwd"},
		} {
			s := h.open(t, protocol.KindCopy, tc.p)
			var err error
			if tc.p.Direction == protocol.CopyPull {
				_, err = mirror.Receive(copyCtx(t), filepath.Join(t.TempDir(), "l"), s.st, mirror.Options{})
			} else {
				_, err = mirror.Send(copyCtx(t), src, s.st, mirror.Options{})
			}
			var pe *mirror.PeerError
			if !errors.As(err, &pe) {
				t.Fatalf("copy %+v: %v, want a refusal", tc.p, err)
			}
			check(t, &pe.Info, tc.rule)
		}
		if _, err := os.Stat(filepath.Join(u.base, "x")); err == nil {
			t.Error("the refused push wrote its file")
		}
	})
	if _, err := os.Stat(marker); err == nil {
		t.Error("a refused operation ran")
	}
	t.Run("exec off", func(t *testing.T) {
		h := newHarness(t, withPolicy(t, fmt.Sprintf("version: 1\nusers:\n  - name: %s\n", u.name)))
		e := h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"true"}, User: u.name})
		e.finish(t)
		check(t, e.errInfo, "exec: true")
		e = h.open(t, protocol.KindDial, protocol.DialParams{Target: "x"})
		e.finish(t)
		check(t, e.errInfo, "forward: true")
	})
	// SetLocalPolicy (SIGHUP) changes the next decision.
	t.Run("reload", func(t *testing.T) {
		p, err := localpolicy.Parse(file, []byte(fmt.Sprintf("version: 1\nusers:\n  - name: %s\nexec: true\nshell: true\n", u.name)))
		if err != nil {
			t.Fatal(err)
		}
		h.a.SetLocalPolicy(p)
		// The terminal is the user's too.
		e := h.open(t, protocol.KindPTY, protocol.PTYParams{Argv: []string{"sh", "-c", `id -u; stat -c %u "$(tty)"; echo "$HOME"`}, User: u.name})
		e.finish(t)
		want := fmt.Sprintf("%d\r\n%d\r\n%s\r\n", u.uid, u.uid, u.home)
		if e.exit == nil || e.stdout.String() != want {
			t.Errorf("pty after reload: exit %+v error %v output %q, want %q", e.exit, e.errInfo, e.stdout.String(), want)
		}
	})
}

func TestCopyAsUserHasOnlyItsRights(t *testing.T) {
	u := newTestUser(t)
	// A root-owned directory the user may read but not write, inside the
	// copy roots: only the kernel, checking the user's rights, refuses.
	rootDir := filepath.Join(u.base, "rootonly")
	os.Mkdir(rootDir, 0o755)
	secret := filepath.Join(u.base, "secret")
	os.WriteFile(secret, []byte("root only"), 0o600)
	h := newHarness(t, withPolicy(t, fmt.Sprintf("version: 1\nusers:\n  - name: %s\ncopy_roots: [%s]\n", u.name, u.base)))
	src := t.TempDir()
	writeTree(t, src, map[string]string{"a": "alpha", "sub/b": "beta"})
	os.Chmod(src, 0o755)

	// Push into a root-owned directory: permission denied, nothing written.
	s := h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: filepath.Join(rootDir, "dst"), User: u.name})
	_, err := mirror.Send(copyCtx(t), src, s.st, mirror.Options{})
	if err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("push into a root-owned directory as %s: %v, want permission denied", u.name, err)
	}
	if ents, _ := os.ReadDir(rootDir); len(ents) != 0 {
		t.Errorf("the root-owned directory got %v", ents)
	}
	// Pull of a root-only file: refused.
	s = h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPull, Path: secret, User: u.name, Strict: true})
	local := filepath.Join(t.TempDir(), "got")
	if _, err := mirror.Receive(copyCtx(t), local, s.st, mirror.Options{}); err == nil {
		t.Errorf("pull of a root-only file as %s succeeded", u.name)
	}
	if b, err := os.ReadFile(local); err == nil {
		t.Errorf("pulled %q", b)
	}

	// Into its home: works, and the files are the user's.
	dst := filepath.Join(u.home, "dst")
	s = h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: dst, User: u.name})
	res, err := mirror.Send(copyCtx(t), src, s.st, mirror.Options{})
	if err != nil || res.FilesWritten != 2 {
		t.Fatalf("push into the home: %+v, %v", res, err)
	}
	for _, p := range []string{dst, filepath.Join(dst, "a"), filepath.Join(dst, "sub", "b")} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if uid := statUID(fi); uid != u.uid {
			t.Errorf("%s is owned by uid %d, want %d", p, uid, u.uid)
		}
	}
	// And back.
	s = h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPull, Path: dst, User: u.name})
	back := filepath.Join(t.TempDir(), "back")
	if _, err := mirror.Receive(copyCtx(t), back, s.st, mirror.Options{}); err != nil {
		t.Fatal(err)
	}
	if got := readTree(t, back); !equalMaps(got, map[string]string{"a": "alpha", "sub/b": "beta"}) {
		t.Errorf("pulled %v", got)
	}
}

func TestDetachedJobAsUser(t *testing.T) {
	u := newTestUser(t)
	h := newHarness(t, withPolicy(t, fmt.Sprintf("version: 1\nusers:\n  - name: %s\nexec: true\n", u.name)))
	t.Cleanup(h.a.jobs.wg.Wait)
	e := h.open(t, protocol.KindExec, protocol.ExecParams{
		Script: "id -u; pwd; echo ready; exec sleep 60", User: u.name, Detach: true, JobID: "asuser",
	})
	e.finish(t)
	if e.exit == nil || !e.exit.Detached {
		t.Fatalf("start: %+v %v", e.exit, e.errInfo)
	}
	var out string
	waitFor(t, testWait, "the job's output", func() bool {
		e := h.jobOp(t, protocol.JobParams{Op: protocol.JobOpOutput, ID: "asuser", Stream: "stdout"})
		out = e.stdout.String()
		return strings.Contains(out, "ready")
	})
	if want := fmt.Sprintf("%d\n%s\nready\n", u.uid, u.home); out != want {
		t.Errorf("job output %q, want %q", out, want)
	}
	if st := h.jobStatus(t, "asuser"); st.State != protocol.JobRunning {
		t.Errorf("status %+v, want running", st)
	}
	e = h.jobOp(t, protocol.JobParams{Op: protocol.JobOpCancel, ID: "asuser"})
	var st protocol.JobStatus
	if e.errInfo != nil || json.Unmarshal(e.job, &st) != nil {
		t.Fatalf("cancel: %v %q", e.errInfo, e.job)
	}
	if st.State != protocol.JobExited || !st.Cancelled {
		t.Errorf("cancelled job = %+v", st)
	}
}

func statUID(fi os.FileInfo) int { return int(fi.Sys().(*syscall.Stat_t).Uid) }

// userProcs lists the live processes of uid (zombies excluded).
func userProcs(uid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		s := string(b)
		if strings.Contains(s, "\nState:\tZ") {
			continue
		}
		if i := strings.Index(s, "\nUid:\t"); i >= 0 {
			f := strings.Fields(s[i+6:])
			if len(f) > 0 && f[0] == strconv.Itoa(uid) {
				out = append(out, pid)
			}
		}
	}
	return out
}

// TestCopyAsUserAbortLeavesDestination: a push as another account (in the
// helper process) that the client cancels, abandons or whose session is
// lost leaves the destination as it was, no stage behind, and no helper.
func TestCopyAsUserAbortLeavesDestination(t *testing.T) {
	u := newTestUser(t)
	h := newHarness(t, withPolicy(t, fmt.Sprintf("version: 1\nusers:\n  - name: %s\n    copy_roots: [%s]\n", u.name, u.home)))
	dst := filepath.Join(u.home, "dst")
	s := h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: dst, User: u.name})
	if _, err := mirror.Send(copyCtx(t), t.TempDir(), s.st, mirror.Options{}); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dst, "old"), []byte("o"), 0o644)
	os.Chown(filepath.Join(dst, "old"), u.uid, u.uid)

	for i, how := range []string{"cancel", "close", "session lost"} {
		s := h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: dst, Delete: true, User: u.name})
		for {
			f, err := s.fr.Next()
			if err != nil {
				t.Fatal(err)
			}
			if f.Type == protocol.FrameManifestEnd {
				break
			}
		}
		protocol.WriteJSONFrame(s.st, protocol.FrameEntry, protocol.CopyEntry{Path: ".", Type: "dir", Mode: 0o755})
		protocol.WriteJSONFrame(s.st, protocol.FrameEntry, protocol.CopyEntry{Path: "new", Type: "file", Size: 10, Mode: 0o644})
		protocol.WriteFrame(s.st, protocol.FrameFileData, []byte("12345"))
		switch how {
		case "cancel":
			protocol.WriteFrame(s.st, protocol.FrameCancel, nil)
		case "close":
			s.st.Close()
		case "session lost":
			waitFor(t, testWait, "the helper", func() bool { return len(userProcs(u.uid)) > 0 })
			h.client.Close()
		}
		if how != "session lost" {
			waitFor(t, testWait, "failed copy", func() bool {
				return testutil.ToFloat64(h.a.m.copies.WithLabelValues("push", "error")) == float64(i+1)
			})
		}
		waitFor(t, testWait, "no helper left", func() bool { return len(userProcs(u.uid)) == 0 })
		if got := readTree(t, dst); !equalMaps(got, map[string]string{"old": "o"}) {
			t.Errorf("%s: destination changed: %v", how, got)
		}
		waitFor(t, testWait, "no stage left", func() bool {
			ents, _ := os.ReadDir(u.home)
			for _, e := range ents {
				if strings.HasPrefix(e.Name(), ".tether-stage-") {
					return false
				}
			}
			return true
		})
	}
}

// BenchmarkCopyPushAsUser compares a 64 MiB push in process (the agent's
// own account) with the same push through the helper process (another
// account): the relay's cost, as a ratio in one run.
func BenchmarkCopyPushAsUser(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	u := newTestUserTB(b)
	src := b.TempDir()
	os.Chmod(src, 0o755)
	data := make([]byte, 64<<20)
	rand.Read(data)
	os.WriteFile(filepath.Join(src, "f"), data, 0o644)
	me, _ := user.Current()
	doc := fmt.Sprintf("version: 1\nusers:\n  - name: %s\n  - name: %s\ncopy_roots: [%s]\n", u.name, me.Username, u.home)
	p, err := localpolicy.Parse("bench.yaml", []byte(doc))
	if err != nil {
		b.Fatal(err)
	}
	for _, as := range []string{"self", "user"} {
		b.Run(as, func(b *testing.B) {
			h := newHarness(b, func(c *Config) { c.LocalPolicy = p })
			name := u.name
			if as == "self" {
				name = ""
			}
			b.SetBytes(int64(len(data)))
			for i := range b.N {
				dst := filepath.Join(u.home, fmt.Sprintf("%s-%d", as, i))
				s := h.open(b, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: dst, User: name})
				if _, err := mirror.Send(b.Context(), src, s.st, mirror.Options{}); err != nil {
					b.Fatal(err)
				}
				os.RemoveAll(dst)
			}
		})
	}
}

// TestCopyAsUserNeverTouchesAgentState: the agent's own state stays out of
// a copy as another account even where that account's rights would reach
// it (a data dir the account may write): the helper identifies the
// protected files by the descriptors the agent hands it.
func TestCopyAsUserNeverTouchesAgentState(t *testing.T) {
	u := newTestUser(t)
	data := filepath.Join(u.base, "data")
	os.MkdirAll(filepath.Join(data, "jobs"), 0o777)
	os.Chmod(data, 0o777)
	os.Chmod(filepath.Join(data, "jobs"), 0o777)
	secret := filepath.Join(u.base, "token")
	os.WriteFile(secret, []byte("s3cret"), 0o666)
	h := newHarness(t, func(c *Config) {
		withPolicy(t, fmt.Sprintf("version: 1\nusers:\n  - name: %s\ncopy_roots: [%s]\n", u.name, u.base))(c)
		c.DataDir = data
		c.SecretFiles = []string{secret}
	})
	src := t.TempDir()
	os.Chmod(src, 0o755)
	writeTree(t, src, map[string]string{"pwned": "x"})
	// execs/ too: a record planted there names a group the next agent kills.
	for _, dst := range []string{filepath.Join(data, "jobs", "x"), filepath.Join(data, "jobs"), secret,
		filepath.Join(data, "execs"), filepath.Join(data, "execs", "slots-1-1-x")} {
		s := h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPush, Path: dst, User: u.name})
		_, err := mirror.Send(copyCtx(t), src, s.st, mirror.Options{})
		if err == nil || !strings.Contains(err.Error(), "the agent's own state") {
			t.Errorf("push onto %s as %s: %v, want a refusal naming the agent's own state", dst, u.name, err)
		}
	}
	s := h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPull, Path: secret, User: u.name})
	if _, err := mirror.Receive(copyCtx(t), filepath.Join(t.TempDir(), "got"), s.st, mirror.Options{}); err == nil {
		t.Errorf("pull of the agent's secret file as %s succeeded", u.name)
	}
	if ents, _ := os.ReadDir(filepath.Join(data, "jobs")); len(ents) != 0 {
		t.Errorf("the jobs directory got %v", ents)
	}
	if ents, _ := os.ReadDir(filepath.Join(data, "execs")); len(ents) != 0 {
		t.Errorf("the execs directory got %v", ents)
	}
	if b, _ := os.ReadFile(secret); string(b) != "s3cret" {
		t.Errorf("the secret file was changed: %q", b)
	}
}

// TestCopyAsUserRefusesHardLinksToAgentState: in a copy as another account
// (the helper, given the protected directories as descriptors), a hard link
// under the account's copy root to a file inside the jobs directory that
// the account may read is the agent's own state: a pull of it is refused
// naming the file by its real path, a pull of its directory skips it.
func TestCopyAsUserRefusesHardLinksToAgentState(t *testing.T) {
	u := newTestUser(t)
	data := filepath.Join(u.base, "data")
	jobOut := filepath.Join(data, "jobs", "j1", "out")
	os.MkdirAll(filepath.Dir(jobOut), 0o755)
	for _, d := range []string{data, filepath.Join(data, "jobs"), filepath.Dir(jobOut)} {
		os.Chmod(d, 0o755)
	}
	if err := os.WriteFile(jobOut, []byte("job output"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(c *Config) {
		withPolicy(t, fmt.Sprintf("version: 1\nusers:\n  - name: %s\ncopy_roots: [%s]\n", u.name, u.base))(c)
		c.DataDir = data
	})
	work := filepath.Join(u.base, "work")
	os.MkdirAll(work, 0o755)
	os.WriteFile(filepath.Join(work, "a"), []byte("a"), 0o644)
	if err := os.Link(jobOut, filepath.Join(work, "hl")); err != nil {
		t.Fatal(err)
	}
	s := h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPull, Path: filepath.Join(work, "hl"), User: u.name})
	_, err := mirror.Receive(copyCtx(t), filepath.Join(t.TempDir(), "got"), s.st, mirror.Options{})
	if err == nil || !strings.Contains(err.Error(), "the agent's own state") || !strings.Contains(err.Error(), jobOut) {
		t.Errorf("pull of the hard link as %s: %v, want a refusal naming %s", u.name, err, jobOut)
	}
	out := filepath.Join(t.TempDir(), "w")
	s = h.open(t, protocol.KindCopy, protocol.CopyParams{Direction: protocol.CopyPull, Path: work, User: u.name})
	res, err := mirror.Receive(copyCtx(t), out, s.st, mirror.Options{})
	if err != nil {
		t.Fatalf("pull of the tree as %s: %v", u.name, err)
	}
	if res.Skipped != 1 || len(res.SkippedEntries) != 1 || res.SkippedEntries[0].Path != "hl" {
		t.Errorf("pull of the tree skipped %+v, want hl", res.SkippedEntries)
	}
	if got := readTree(t, out); !equalMaps(got, map[string]string{"a": "a"}) {
		t.Errorf("pull of the tree copied %v, want only a", got)
	}
}

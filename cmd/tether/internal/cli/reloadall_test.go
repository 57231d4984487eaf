package cli

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"github.com/tetherfleet/tether/internal/sdnotify"
	"github.com/tetherfleet/tether/internal/sdnotify/sdnotifytest"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// newTestSigner is a fresh ed25519 SSH key.
func newTestSigner(t *testing.T) ssh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// authorizedLine is k's authorized_keys line.
func authorizedLine(k ssh.Signer) string { return string(ssh.MarshalAuthorizedKey(k.PublicKey())) }

// gateReload is a coordinator with a config file and the SSH jump host
// (serving), for the reload tests: the authorized keys file trusts alice,
// the user CA file a CA.
type gateReload struct {
	cs                         *coordinatorServer
	logs                       *syncBuffer
	base, cfgPath              string
	policyFile, akFile, caFile string
	alice, bob, ca             ssh.Signer
}

func startGateReload(t *testing.T, withConfig bool) *gateReload {
	t.Helper()
	kdir := t.TempDir()
	g := &gateReload{logs: &syncBuffer{}, alice: newTestSigner(t), bob: newTestSigner(t), ca: newTestSigner(t),
		policyFile: writeTestPolicy(t, testAdminPolicy(t)),
		akFile:     filepath.Join(kdir, "authorized_keys"), caFile: filepath.Join(kdir, "user_ca.pub")}
	replaceFile(t, g.akFile, authorizedLine(g.alice))
	replaceFile(t, g.caFile, "cert-authority "+authorizedLine(g.ca))
	log := slog.New(slog.NewTextHandler(io.MultiWriter(g.logs, t.Output()), nil))
	o := defaultCoordinatorOptions()
	if withConfig {
		g.base = fmt.Sprintf("role: coordinator\npolicy: %s\nlisten: 127.0.0.1:0\nhttp-addr: 127.0.0.1:0\nnats-listen: 127.0.0.1:0\nopenshell-listen: \"\"\nopensandbox-listen: \"\"\nallow-shared-token: true\ndata-dir: %s\nssh-addr: 127.0.0.1:0\nssh-authorized-keys: %s\nssh-user-ca: [%s]\n",
			g.policyFile, t.TempDir(), g.akFile, g.caFile)
		g.cfgPath = writeConfig(t, g.base)
		e := testEnv(nil)
		cmd := coordinatorCommand(e, &o)
		if err := cmd.ParseFlags([]string{"--config", g.cfgPath}); err != nil {
			t.Fatal(err)
		}
		src, err := loadDaemonConfig(cmd, e, coordinatorConfigRole, &o.Log)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { g.cs.config = src }()
	} else {
		o = testCoordinatorOptions(t, t.TempDir())
		o.Policy = g.policyFile
		o.SSHAddr, o.SSHAuthorizedKeys, o.SSHUserCAs = "127.0.0.1:0", g.akFile, []string{g.caFile}
	}
	cs, err := startCoordinator(o, "tok", log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cs.close)
	if cs.gate == nil {
		t.Fatal("no SSH jump host")
	}
	go cs.gate.Serve(cs.sshLn)
	g.cs = cs
	return g
}

// trusted reports whether the jump host takes k's key now.
func (g *gateReload) trusted(t *testing.T, k ssh.Signer) bool {
	t.Helper()
	c, err := ssh.Dial("tcp", g.cs.sshLn.Addr().String(), &ssh.ClientConfig{
		User: "x", Auth: []ssh.AuthMethod{ssh.PublicKeys(k)},
		HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: defaultTestTimeout,
	})
	if err != nil {
		if !strings.Contains(err.Error(), "unable to authenticate") {
			t.Fatalf("ssh dial: %v", err)
		}
		return false
	}
	c.Close()
	return true
}

// TestReloadKeyFilesAllOrNothing: the SSH key files are checked with the
// config file and the policy before any of them applies. A bad key file
// (or one that is gone) keeps the config file's limits, the policy and
// the keys as they are, and the status names every problem of every file
// at once, with its line. (Before, the config file and the policy were
// applied and the key files refused: a reload half applied.)
func TestReloadKeyFilesAllOrNothing(t *testing.T) {
	g := startGateReload(t, true)
	cs := g.cs
	before := cs.policy.Policy()
	limits := cs.coord.Limits()
	unchanged := func(status string) {
		t.Helper()
		if cs.policy.Policy() != before {
			t.Errorf("the policy was reloaded; status %q", status)
		}
		if l := cs.coord.Limits(); l != limits {
			t.Errorf("limits %+v, want the ones in force %+v; status %q", l, limits, status)
		}
		if !g.trusted(t, g.alice) || g.trusted(t, g.bob) {
			t.Errorf("the authorized keys in force changed; status %q", status)
		}
		if !strings.HasPrefix(status, "reload failed (nothing changed") {
			t.Errorf("status %q, want it to say nothing changed", status)
		}
	}

	// Good config and policy changes; a bad line in the authorized keys.
	replaceFile(t, g.cfgPath, g.base+"max-handshakes-per-source: 3\n")
	replaceFile(t, g.policyFile, testAdminPolicy(t)+"\n# changed\n")
	replaceFile(t, g.akFile, authorizedLine(g.bob)+"not a key\n")
	status := cs.reload()
	unchanged(status)
	if !strings.Contains(status, g.akFile+":2: not an authorized key line") {
		t.Errorf("status %q does not name %s:2", status, g.akFile)
	}

	// Every file bad: every problem at once, each with its file.
	replaceFile(t, g.cfgPath, g.base+"max-handshakes-per-source: -3\n")
	replaceFile(t, g.policyFile, "version: 1\nbogus: true\n")
	replaceFile(t, g.caFile, "\n\nssh-ed25519 nope\n")
	status = cs.reload()
	unchanged(status)
	for _, w := range []string{g.cfgPath + ":13: key max-handshakes-per-source: -3 is negative", g.policyFile + ":2:", g.akFile + ":2:", g.caFile + ":3:"} {
		if !strings.Contains(status, w) {
			t.Errorf("status %q\nwant %q", status, w)
		}
	}

	// The key files gone (deleted, renamed): nothing changes either.
	replaceFile(t, g.cfgPath, g.base+"max-handshakes-per-source: 3\n")
	replaceFile(t, g.policyFile, testAdminPolicy(t)+"\n# changed again\n")
	if err := os.Remove(g.akFile); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(g.caFile, g.caFile+".old"); err != nil {
		t.Fatal(err)
	}
	status = cs.reload()
	unchanged(status)
	for _, w := range []string{"authorized keys file " + g.akFile + " does not exist", "user CA file " + g.caFile + " does not exist"} {
		if !strings.Contains(status, w) {
			t.Errorf("status %q\nwant %q", status, w)
		}
	}

	// The key files back, the policy file gone: nothing changes.
	replaceFile(t, g.akFile, authorizedLine(g.bob))
	replaceFile(t, g.caFile, "cert-authority "+authorizedLine(g.ca))
	if err := os.Rename(g.policyFile, g.policyFile+".old"); err != nil {
		t.Fatal(err)
	}
	status = cs.reload()
	unchanged(status)
	if w := "policy file " + g.policyFile + " does not exist (deleted or renamed?)"; !strings.Contains(status, w) {
		t.Errorf("status %q\nwant %q", status, w)
	}
	// The config file gone: nothing changes either.
	if err := os.Rename(g.policyFile+".old", g.policyFile); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(g.cfgPath, g.cfgPath+".old"); err != nil {
		t.Fatal(err)
	}
	status = cs.reload()
	unchanged(status)
	if w := "config file " + g.cfgPath + " does not exist (deleted or renamed?)"; !strings.Contains(status, w) {
		t.Errorf("status %q\nwant %q", status, w)
	}
	if err := os.Rename(g.cfgPath+".old", g.cfgPath); err != nil {
		t.Fatal(err)
	}

	// All good: all of it applies.
	status = cs.reload()
	if cs.policy.Policy() == before || cs.coord.Limits().MaxHandshakesPerSource != 3 || !g.trusted(t, g.bob) || g.trusted(t, g.alice) {
		t.Errorf("a good reload did not apply everything; status %q", status)
	}
	for _, w := range []string{"config reloaded: applied max-handshakes-per-source", "policy reloaded from " + g.policyFile, "SSH keys reloaded (1 authorized keys, 1 user CAs)"} {
		if !strings.Contains(status, w) {
			t.Errorf("status %q\nwant %q", status, w)
		}
	}
}

// TestReloadBadKeysKeepPolicy: without a config file too, a bad key file
// keeps the policy as it is (it was reloaded anyway before), and a bad
// policy the keys.
func TestReloadBadKeysKeepPolicy(t *testing.T) {
	g := startGateReload(t, false)
	cs := g.cs
	before := cs.policy.Policy()
	replaceFile(t, g.policyFile, testAdminPolicy(t)+"\n# changed\n")
	replaceFile(t, g.akFile, "ssh-rsa AAAA\n")
	if status := cs.reload(); cs.policy.Policy() != before || !strings.Contains(status, g.akFile+":1:") {
		t.Errorf("a bad key file: policy reloaded %v, status %q", cs.policy.Policy() != before, status)
	}
	replaceFile(t, g.policyFile, "version: 1\nbogus: true\n")
	replaceFile(t, g.akFile, authorizedLine(g.bob))
	if status := cs.reload(); g.trusted(t, g.bob) || !g.trusted(t, g.alice) || !strings.Contains(status, g.policyFile+":2:") {
		t.Errorf("a bad policy: keys reloaded %v, status %q", g.trusted(t, g.bob), status)
	}
}

// opens counts the times a file named name in the directory watched by
// the inotify descriptor fd was opened, reading the events queued.
func opens(t *testing.T, fd int, name string) int {
	t.Helper()
	n := 0
	buf := make([]byte, 64<<10)
	for {
		r, err := unix.Read(fd, buf)
		if err == unix.EAGAIN {
			return n
		}
		if err != nil {
			t.Fatal(err)
		}
		for b := buf[:r]; len(b) >= unix.SizeofInotifyEvent; {
			mask := binary.NativeEndian.Uint32(b[4:8])
			l := int(binary.NativeEndian.Uint32(b[12:16]))
			got := string(bytes.TrimRight(b[unix.SizeofInotifyEvent:unix.SizeofInotifyEvent+l], "\x00"))
			if mask&unix.IN_OPEN != 0 && got == name {
				n++
			}
			b = b[unix.SizeofInotifyEvent+l:]
		}
	}
}

// TestReloadReadsPolicyOnce: a reload reads the policy file once: what
// was checked is what applies. (Before, with a config file, it was read
// once to check it and again to load it, so an edit in between applied a
// policy nobody checked with the rest, or refused it after the config
// file's changes applied.)
func TestReloadReadsPolicyOnce(t *testing.T) {
	for _, withConfig := range []bool{true, false} {
		t.Run(fmt.Sprintf("config=%v", withConfig), func(t *testing.T) {
			g := startGateReload(t, withConfig)
			fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
			if err != nil {
				t.Skipf("inotify: %v", err)
			}
			defer unix.Close(fd)
			// IN_CLOSE_NOWRITE too: the kernel merges an event with the
			// one before it when they are the same, two opens in a row.
			if _, err := unix.InotifyAddWatch(fd, filepath.Dir(g.policyFile), unix.IN_OPEN|unix.IN_CLOSE_NOWRITE); err != nil {
				t.Skipf("inotify: %v", err)
			}
			replaceFile(t, g.policyFile, testAdminPolicy(t)+"\n# changed\n")
			opens(t, fd, filepath.Base(g.policyFile)) // the write's own
			status := g.cs.reload()
			if n := opens(t, fd, filepath.Base(g.policyFile)); n != 1 {
				t.Errorf("the policy file was opened %d times by one reload, want once; status %q", n, status)
			}
		})
	}
}

// TestReloadMissingPolicy: a SIGHUP while the policy file is gone
// (deleted or renamed) is refused in those terms, naming the path; the
// policy in force stays, the coordinator keeps serving (the agent's
// session, a stream, a new exec), systemd's status says so; once the file
// is back, the next SIGHUP loads it.
func TestReloadMissingPolicy(t *testing.T) {
	sock := sdnotifytest.Listen(t)
	o := testCoordinatorOptions(t, t.TempDir())
	o.AllowSharedToken = true
	o.notify = sdnotify.New(sock.Path, 0)
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(io.MultiWriter(&logs, t.Output()), nil))
	f := startReloadFleet(t, o, nil, log, "node-gone")
	before := f.cs.policy.Policy()
	// hup sends SIGHUP and waits for the READY=1 after it, returning
	// its status.
	hup := func() string {
		t.Helper()
		n := len(sock.Messages())
		syscall.Kill(os.Getpid(), syscall.SIGHUP)
		var status string
		waitFor(t, func() error {
			for _, m := range sock.Messages()[n:] {
				if v, _ := m.Value("STATUS"); m.Has("READY=1") {
					status = v
					return nil
				}
			}
			return errorString("no READY=1 after the SIGHUP yet")
		})
		return status
	}
	want := "policy file " + o.Policy + " does not exist (deleted or renamed?)"
	for i, gone := range []func() error{
		func() error { return os.Rename(o.Policy, o.Policy+".old") },
		func() error { return os.Remove(o.Policy) },
	} {
		if err := gone(); err != nil {
			t.Fatal(err)
		}
		if st := hup(); !strings.HasPrefix(st, "reload failed (nothing changed") || !strings.Contains(st, want) {
			t.Errorf("status after a reload without the policy file: %q\nwant it to say nothing changed and %q", st, want)
		}
		if n := strings.Count(logs.String(), want); n != i+1 {
			t.Errorf("%d log lines say %q, want %d:\n%s", n, want, i+1, logs.String())
		}
		if f.cs.policy.Policy() != before {
			t.Fatal("the policy in force changed")
		}
		res, err := f.cl.Exec(testCtx(t), &protocol.ExecRequest{Target: protocol.Target{Node: "node-gone"}, Argv: []string{"true"}}, nil)
		if err != nil || len(res.Results) != 1 || res.Results[0].ExitCode != 0 {
			t.Fatalf("exec after the refused reload: %v %+v", err, res)
		}
		f.echo(t, "still\n")
		f.sameSession(t)
		// Back: the next SIGHUP loads it.
		replaceFile(t, o.Policy, testAdminPolicy(t))
		if st := hup(); !strings.HasPrefix(st, "policy reloaded from "+o.Policy) {
			t.Errorf("status once the file is back: %q", st)
		}
		before = f.cs.policy.Policy()
	}
	f.st.CloseWrite()
}

// newbie is an identity that testAdminPolicy does not know.
var newbie = policy.Identity{Kind: policy.KindToken, Name: "newbie"}

// TestReloadPolicyPathChange: a SIGHUP after the config file's policy:
// key names another file reads that file, checks it with the rest and
// puts it in force, all or nothing: a broken or missing new file changes
// nothing (the policy in force and its path stay) and the status names
// the new file. (Before, the change was only logged as waiting for a
// restart: the old file was reloaded and the new one never read, so a
// broken one was taken and the next restart failed.)
func TestReloadPolicyPathChange(t *testing.T) {
	g := startGateReload(t, true)
	cs := g.cs
	oldPath := g.policyFile
	newPath := filepath.Join(t.TempDir(), "new-policy.yaml")
	naming := func(path string) string {
		return strings.Replace(g.base, "policy: "+oldPath+"\n", "policy: "+path+"\n", 1)
	}
	before := cs.policy.Policy()
	refused := func(status, want string) {
		t.Helper()
		if !strings.HasPrefix(status, "reload failed (nothing changed") || !strings.Contains(status, want) {
			t.Errorf("status %q\nwant it to say nothing changed and %q", status, want)
		}
		if cs.policy.Policy() != before || cs.policy.Path() != oldPath {
			t.Errorf("the policy in force changed (now from %s); status %q", cs.policy.Path(), status)
		}
		if cs.policy.Holds(newbie, policy.OpAdmin) == nil {
			t.Errorf("%s holds admin after a refused reload", newbie)
		}
		if l := cs.coord.Limits().MaxHandshakesPerSource; l == 3 {
			t.Errorf("the config file's limits applied after a refused reload; status %q", status)
		}
	}
	if cs.policy.Holds(newbie, policy.OpAdmin) == nil {
		t.Fatalf("%s holds admin under the first policy", newbie)
	}

	// A broken new file: refused, naming it (and its line).
	replaceFile(t, newPath, "version: 1\nbogus: true\n")
	replaceFile(t, g.cfgPath, naming(newPath)+"max-handshakes-per-source: 3\n")
	refused(cs.reload(), newPath+":2:")

	// A new file that does not exist: refused, naming it.
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	replaceFile(t, g.cfgPath, naming(missing)+"max-handshakes-per-source: 3\n")
	refused(cs.reload(), "policy file "+missing+" does not exist")

	// A good new file: applied with the rest.
	replaceFile(t, newPath, testAdminPolicy(t)+"  "+newbie.String()+":\n    rules:\n      - operations: [admin]\n")
	replaceFile(t, g.cfgPath, naming(newPath)+"max-handshakes-per-source: 3\n")
	status := cs.reload()
	if !strings.Contains(status, "policy reloaded from "+newPath) || strings.Contains(status, "restart") {
		t.Errorf("status %q, want the policy reloaded from %s", status, newPath)
	}
	if err := cs.policy.Holds(newbie, policy.OpAdmin); err != nil {
		t.Errorf("%s refused admin under the new policy: %v; status %q", newbie, err, status)
	}
	if cs.policy.Path() != newPath || cs.coord.Limits().MaxHandshakesPerSource != 3 {
		t.Errorf("after the reload: policy from %s, limits %+v; status %q", cs.policy.Path(), cs.coord.Limits(), status)
	}

	// The next SIGHUP reloads the new file, not the old one.
	replaceFile(t, oldPath, "version: 1\nbogus: true\n")
	replaceFile(t, newPath, testAdminPolicy(t))
	status = cs.reload()
	if !strings.Contains(status, "policy reloaded from "+newPath) || cs.policy.Holds(newbie, policy.OpAdmin) == nil {
		t.Errorf("the reload after: status %q, %s still holds admin: %v", status, newbie, cs.policy.Holds(newbie, policy.OpAdmin) == nil)
	}
}

// TestReloadRefusesNonReloadableKey: a SIGHUP after a change of a config
// key the running coordinator cannot apply (a listener, a directory,
// NATS, TLS files, ...) is refused, naming each such key and its line:
// nothing changes, not the limits, not the policy, and the status says
// to restart. Set back, the next SIGHUP applies the rest. (Before, the
// change was logged as waiting for a restart and the rest applied: the
// file no longer said what was running.)
func TestReloadRefusesNonReloadableKey(t *testing.T) {
	g := startGateReload(t, true)
	cs := g.cs
	before := cs.policy.Policy()
	limits := cs.coord.Limits()
	changed := strings.Replace(g.base, "listen: 127.0.0.1:0\n", "listen: 127.0.0.1:1\n", 1)
	changed = strings.Replace(changed, "nats-listen: 127.0.0.1:0\n", "", 1) // back to its default
	replaceFile(t, g.cfgPath, changed+"max-handshakes-per-source: 3\ntls-host: [x.example]\n")
	replaceFile(t, g.policyFile, testAdminPolicy(t)+"\n# changed\n")
	status := cs.reload()
	if !strings.HasPrefix(status, "reload failed (nothing changed") {
		t.Errorf("status %q, want it to say nothing changed", status)
	}
	for _, w := range []string{
		g.cfgPath + ":3: key listen: cannot change at run time; restart the coordinator",
		g.cfgPath + ":13: key tls-host: cannot change at run time; restart the coordinator",
		g.cfgPath + ": key nats-listen: cannot change at run time; restart the coordinator",
	} {
		if !strings.Contains(status, w) {
			t.Errorf("status %q\nwant %q", status, w)
		}
	}
	if cs.policy.Policy() != before || cs.coord.Limits() != limits {
		t.Errorf("a refused reload changed the policy (%v) or the limits (%+v); status %q", cs.policy.Policy() != before, cs.coord.Limits(), status)
	}

	// Set back: the rest applies.
	replaceFile(t, g.cfgPath, g.base+"max-handshakes-per-source: 3\n")
	status = cs.reload()
	if cs.policy.Policy() == before || cs.coord.Limits().MaxHandshakesPerSource != 3 || strings.Contains(status, "failed") {
		t.Errorf("the reload once set back did not apply; status %q", status)
	}
}

// TestReloadClosesRemovedKeyConnection: the SIGHUP reload closes a live
// jump host connection whose key left the authorized keys file (before,
// it stayed open, and an OpenSSH ControlMaster kept reaching its node).
func TestReloadClosesRemovedKeyConnection(t *testing.T) {
	g := startGateReload(t, false)
	c, err := ssh.Dial("tcp", g.cs.sshLn.Addr().String(), &ssh.ClientConfig{
		User: "x", Auth: []ssh.AuthMethod{ssh.PublicKeys(g.alice)},
		HostKeyCallback: ssh.InsecureIgnoreHostKey(), Timeout: defaultTestTimeout,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	replaceFile(t, g.akFile, authorizedLine(g.bob))
	if status := g.cs.reload(); !strings.Contains(status, "SSH keys reloaded") {
		t.Fatalf("reload: %s", status)
	}
	closed := make(chan struct{})
	go func() { c.Wait(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("alice's connection still open 10 s after the reload removed her key")
	}
	if !strings.Contains(g.logs.String(), "ssh connection closed: its key is no longer trusted") {
		t.Error("the closed connection was not logged")
	}
}

//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/tetherfleet/tether/protocol"
)

// sshFleet is a coordinator with its SSH jump host and two agents, node-a
// (role=a, with the forward targets echo and closed) and node-b (role=b),
// and the SSH identities of the tests, each with the config tether
// ssh-config printed for it.
type sshFleet struct {
	*fleet
	dir      string
	login    string // the test's own user: the login every grant names
	jumpAddr string // the coordinator's --ssh-addr
	echoAddr string // the allow-listed forward target "echo"
	// The identities: alice by key (authorized, every node, forward to
	// echo), bob by certificate (principal bob: role=a nodes only),
	// mallory by a key nobody authorized, expired by a certificate that
	// expired, rogue by a certificate from a CA nobody trusts. proxy
	// reaches the nodes through tether ssh-proxy (ProxyCommand) instead of
	// the jump port, as the NATS client nats:e2e, granted what alice is.
	alice, bob, mallory, expired, rogue, proxy *sshClient

	keys       map[string]sshKey // alice's and mallory's keys, by name
	authorized string            // the jump host's --ssh-authorized-keys
	nodeA      *proc             // node-a's agent
	nodeAArgs  []string          // node-a's extra agent flags, its data dir among them
}

// startSSHFleet starts the fleet, or skips the test when this tether has
// no SSH commands yet.
func startSSHFleet(t *testing.T) *sshFleet {
	t.Helper()
	needTools(t, "ssh", "ssh-keygen")
	if why := haveSSHCommands(t); why != "" {
		t.Skip(why)
	}
	s := &sshFleet{dir: t.TempDir(), login: currentUser(t)}
	keys := filepath.Join(s.dir, "keys")
	os.Mkdir(keys, 0o700)
	alice := newSSHKey(t, keys, "alice")
	ca := newSSHKey(t, keys, "user-ca")
	rogueCA := newSSHKey(t, keys, "rogue-ca")
	bob := newSSHKey(t, keys, "bob")
	signUserCert(t, ca, bob, "bob@e2e", []string{"bob"}, "-5m:+1h")
	mallory := newSSHKey(t, keys, "mallory")
	expired := newSSHKey(t, keys, "expired")
	signUserCert(t, ca, expired, "bob-expired@e2e", []string{"bob"}, "20200101:20200102")
	rogue := newSSHKey(t, keys, "rogue")
	signUserCert(t, rogueCA, rogue, "bob-rogue@e2e", []string{"bob"}, "-5m:+1h")

	authorized := filepath.Join(s.dir, "authorized_keys")
	s.authorized = authorized
	s.keys = map[string]sshKey{"alice": alice, "mallory": mallory}
	pub, _ := os.ReadFile(alice.Pub)
	if err := os.WriteFile(authorized, pub, 0o600); err != nil {
		t.Fatal(err)
	}

	// The NATS client (tether ssh-proxy) and alice may log in everywhere
	// and forward to echo; bob only on role=a. Nobody may forward to
	// closed, which node-a has all the same.
	grants := fmt.Sprintf(`      - nodes: "*"
        operations: [ssh]
        run_as: %[1]s
      - nodes: "*"
        operations: [forward]
        targets: [echo]
`, s.login)
	policy := filepath.Join(s.dir, "policy.yaml")
	pol := sshPolicy(t, grants) + fmt.Sprintf(`  ssh-key:%[1]s:
    rules:
%[2]s  ssh-principal:bob:
    rules:
      - nodes: "role=a"
        operations: [ssh]
        run_as: %[3]s
`, alice.Fingerprint, grants, s.login)
	if err := os.WriteFile(policy, []byte(pol), 0o600); err != nil {
		t.Fatal(err)
	}

	s.jumpAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s.fleet = startFleetArgs(t, policy, "--ssh-addr", s.jumpAddr,
		"--ssh-authorized-keys", authorized, "--ssh-user-ca", ca.Pub)
	s.echoAddr = startEcho(t)
	closed := startEcho(t)
	s.nodeAArgs = []string{"--target", "echo=" + s.echoAddr, "--target", "closed=" + closed, "--data-dir", t.TempDir()}
	s.nodeA = s.startAgentBin(t, *tetherBin, "node-a", "role=a", s.tokenFile, s.nodeAArgs...)
	s.startAgentBin(t, *tetherBin, "node-b", "role=b", s.tokenFile)
	s.waitNodes(t, "node-a", "node-b")

	s.alice = s.client(t, "alice", alice)
	s.bob = s.client(t, "bob", bob)
	s.mallory = s.client(t, "mallory", mallory)
	s.expired = s.client(t, "expired", expired)
	s.rogue = s.client(t, "rogue", rogue)
	s.proxy = s.client(t, "proxy", alice, "--proxy-command")
	return s
}

// sshPolicy is the e2e policy's identities (nats:e2e, the loopback facade
// user) with extra rules first, without the closing of the identities
// map, so that more entries may follow.
func sshPolicy(t *testing.T, extra string) string {
	t.Helper()
	b, err := os.ReadFile(e2ePolicyWith(t, extra))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// client writes the config tether ssh-config prints for key (with the
// extra ssh-config flags) and returns the identity's way in.
func (s *sshFleet) client(t *testing.T, name string, key sshKey, extra ...string) *sshClient {
	t.Helper()
	// --known-hosts keeps the test out of the user's ~/.config.
	args := append([]string{"ssh-config", "--identity", key.Priv,
		"--known-hosts", filepath.Join(s.dir, "known_hosts."+name)}, extra...)
	out, errOut, code := runCLI(t, s.natsURL, "", args...)
	if code != 0 {
		t.Fatalf("tether %s: exit %d, stderr %q", strings.Join(args, " "), code, errOut)
	}
	cfg := filepath.Join(s.dir, "ssh_config."+name)
	if err := os.WriteFile(cfg, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	return &sshClient{Name: name, Config: cfg, Env: natsEnv(s.natsURL)}
}

// ancestry is a script printing the command names of the shell's
// ancestors, one a line, up to pid 1.
const ancestry = `p=$$
while [ "$p" -gt 1 ]; do
  cat /proc/$p/comm
  p=$(sed 's/.*) //' /proc/$p/stat | cut -d' ' -f2)
done
`

func TestSSHEndToEnd(t *testing.T) {
	s := startSSHFleet(t)
	top := t // processes restarted in a subtest belong to the whole test
	// No sshd takes part: the nodes' sessions descend from the agents
	// (the bash -s subtest checks). One running here is only noted.
	if pids := processesNamed("sshd"); len(pids) > 0 {
		t.Logf("note: sshd processes %v are running on this machine; these tests do not use them", pids)
	}
	a, b := hostAlias("node-a"), hostAlias("node-b")

	t.Run("config names both nodes", func(t *testing.T) {
		for _, c := range []*sshClient{s.alice, s.proxy} {
			for _, h := range []string{a, b} {
				r := c.ssh(t, defaultTestTimeout, nil, "-G", h)
				if r.Code != 0 {
					t.Fatalf("ssh -G %s with the %s config: %v", h, c.Name, r)
				}
				g := sshOptions(r.Stdout)
				if g["hostkeyalias"] != h || g["user"] != s.login || g["proxyjump"] == "" && g["proxycommand"] == "" {
					t.Errorf("%s config for %s: hostkeyalias %q, user %q, proxyjump %q, proxycommand %q; want the alias, %s, and a way in",
						c.Name, h, g["hostkeyalias"], g["user"], g["proxyjump"], g["proxycommand"], s.login)
				}
				known, err := os.ReadFile(strings.Fields(g["userknownhostsfile"] + " ")[0])
				if err != nil || !bytes.Contains(known, []byte("@cert-authority ")) {
					t.Errorf("%s config for %s: known_hosts %q: %v, want an @cert-authority line in\n%s", c.Name, h, g["userknownhostsfile"], err, known)
				}
			}
		}
	})

	t.Run("bash -s: only the last status counts", func(t *testing.T) {
		for _, tt := range []struct {
			script, stdout string
			code           int
		}{
			{"false\necho middle-failed\n", "middle-failed\n", 0},
			{"echo first\nfalse\n", "first\n", 1},
			{"X=5\ntest $X = 6 || echo or-works\nexit 7\n", "or-works\n", 7},
			{"printf 'no newline'", "no newline", 0},
		} {
			r := s.alice.ssh(t, defaultTestTimeout, strings.NewReader(tt.script), a, "bash -s")
			if r.Code != tt.code || r.Stdout != tt.stdout {
				t.Errorf("script %q: want exit %d stdout %q; got %v", tt.script, tt.code, tt.stdout, r)
			}
		}
		// No sshd serves it: the shell's ancestors are the agent's.
		r := s.alice.ssh(t, defaultTestTimeout, strings.NewReader(ancestry), a, "bash -s")
		names := strings.Fields(r.Stdout)
		if r.Code != 0 || !containsStr(names, "tether") || containsStr(names, "sshd") {
			t.Errorf("the remote shell's ancestors %v: want the tether agent and no sshd; %v", names, r)
		}
		// stdin EOF reaches the command, binary data intact.
		blob := bytes.Repeat([]byte{0, 1, 2, 0xff, '\n'}, 50000)
		r = s.alice.ssh(t, defaultTestTimeout, bytes.NewReader(blob), a, "cat")
		if r.Code != 0 || r.Stdout != string(blob) {
			t.Errorf("ssh %s cat of %d bytes: exit %d, %d bytes back, equal %v", a, len(blob), r.Code, len(r.Stdout), r.Stdout == string(blob))
		}
	})

	t.Run("OpenSSH behaviours beyond bash -s", func(t *testing.T) {
		// stdout and stderr stay apart; the exit status comes back.
		r := s.alice.ssh(t, defaultTestTimeout, nil, a, "echo out; echo err >&2; exit 3")
		if r.Code != 3 || r.Stdout != "out\n" || !strings.Contains(r.Stderr, "err\n") { // ~/.bashrc may write to stderr too
			t.Errorf("stdout, stderr and exit status: %v", r)
		}
		// env requests: LC_* is allowed, other names are dropped.
		r = s.alice.ssh(t, defaultTestTimeout, nil, "-o", "SetEnv=LC_E2E=lc E2E_NOT_ALLOWED=no", a, `echo "[$LC_E2E][$E2E_NOT_ALLOWED]"`)
		if r.Code != 0 || r.Stdout != "[lc][]\n" {
			t.Errorf("SetEnv LC_E2E (allowed) and E2E_NOT_ALLOWED (not): %v", r)
		}
		// All the output arrives before the exit status ends the channel.
		r = s.alice.ssh(t, defaultTestTimeout, nil, a, "head -c 5000000 /dev/zero; head -c 300000 /dev/zero >&2; exit 3")
		if zeros := strings.Count(r.Stderr, "\x00"); r.Code != 3 || len(r.Stdout) != 5000000 || zeros != 300000 {
			t.Errorf("5 MB of stdout, 300 kB of stderr, then exit 3: got exit %d, %d bytes and %d NULs", r.Code, len(r.Stdout), zeros)
		}
		// OpenSSH's keepalives (ServerAliveInterval, a global request
		// wanting a reply) are answered: the session outlives them.
		r = s.alice.ssh(t, defaultTestTimeout, nil, "-o", "ServerAliveInterval=1", "-o", "ServerAliveCountMax=1", a, "sleep 4; echo alive")
		if r.Code != 0 || r.Stdout != "alive\n" {
			t.Errorf("a 4 s command with ServerAliveInterval=1 ServerAliveCountMax=1: %v", r)
		}
		// A remote forward (tcpip-forward) is refused, not hung on.
		r = s.alice.ssh(t, defaultTestTimeout, nil, "-o", "ExitOnForwardFailure=yes", "-R", "127.0.0.1:0:127.0.0.1:1", a, "echo must-not-run")
		if r.Code != 255 || r.Stdout != "" || !strings.Contains(r.Stderr, "forwarding failed") {
			t.Errorf("ssh -R with ExitOnForwardFailure: want refused; %v", r)
		}
		// A command killed by a signal is not a success.
		r = s.alice.ssh(t, defaultTestTimeout, nil, a, "kill -KILL $$")
		if r.Code == 0 {
			t.Errorf("a remote command killed by SIGKILL: %v, want a failure", r)
		}
		// Parallel sessions on one connection (NeMo Gym's master serves
		// every command; tools run them side by side).
		sock := filepath.Join(s.dir, "par-%C")
		if m := s.alice.ssh(t, defaultTestTimeout, nil, "-o", "ControlMaster=yes", "-o", "ControlPersist=yes", "-o", "ControlPath="+sock, "-N", a); m.Code != 0 {
			t.Fatalf("master: %v", m)
		}
		defer s.alice.ssh(t, defaultTestTimeout, nil, "-o", "ControlPath="+sock, "-O", "exit", a)
		results := make(chan toolRun, 10)
		for i := range 10 {
			go func() {
				results <- s.alice.ssh(t, defaultTestTimeout, strings.NewReader(fmt.Sprintf("head -c 100000 /dev/zero | wc -c; echo par-%d", i)),
					"-o", "ControlMaster=no", "-o", "ControlPath="+sock, "-o", "ProxyCommand=false", a, "bash -s")
			}()
		}
		for range 10 {
			if r := <-results; r.Code != 0 || !regexp.MustCompile(`^100000\npar-\d\n$`).MatchString(r.Stdout) {
				t.Errorf("one of 10 parallel sessions on one master: %v", r)
			}
		}
		// scp, with the SFTP protocol (OpenSSH 9's default) and the
		// legacy one (-O: an exec of scp -t on the node).
		src := filepath.Join(s.dir, "scp-src")
		blob := make([]byte, 300000)
		for i := range blob {
			blob[i] = byte(i * 7)
		}
		os.WriteFile(src, blob, 0o640)
		for _, legacy := range []bool{false, true} {
			dst := filepath.Join(s.dir, fmt.Sprintf("scp-dst-legacy-%v", legacy))
			args := []string{"-F", s.alice.Config, "-p"}
			if legacy {
				args = append(args, "-O")
			}
			r := runTool(t, defaultTestTimeout, nil, s.alice.Env, "", "scp", append(args, src, a+":"+dst)...)
			got, err := os.ReadFile(dst)
			if r.Code != 0 || err != nil || !bytes.Equal(got, blob) {
				t.Errorf("scp (legacy protocol %v) to %s: %v; copy %d bytes, %v", legacy, a, r, len(got), err)
			}
		}
		// A login the policy does not grant, and a node nobody runs.
		r = s.alice.ssh(t, defaultTestTimeout, nil, "nobody@"+a, "echo must-not-run")
		if r.Code != 255 || r.Stdout != "" {
			t.Errorf("login nobody on %s (not granted): want refused; %v", a, r)
		}
		t.Logf("login nobody: ssh says %q", r.Stderr)
		r = s.alice.ssh(t, defaultTestTimeout, nil, hostAlias("node-z"), "echo must-not-run")
		if r.Code != 255 || !strings.Contains(r.Stderr, "node-z") {
			t.Errorf("a node nobody runs: want refused naming node-z; %v", r)
		}
	})

	t.Run("the session's environment is sshd's", func(t *testing.T) {
		// What sshd gives a command, and programs rely on: the login's
		// HOME, USER, LOGNAME and SHELL, the home directory as the
		// working directory (NeMo Gym's relative mkdir -p and rsync
		// targets land there), and SSH_CONNECTION / SSH_CLIENT, by which
		// Debian's bash decides to read ~/.bashrc for a command (the PATH
		// of pyenv, conda or module setups) and scripts tell a remote
		// session.
		u, err := user.Current()
		if err != nil {
			t.Fatal(err)
		}
		home := u.HomeDir // the passwd entry's, as sshd sets it
		r := s.alice.ssh(t, defaultTestTimeout, nil, a, `printf '%s|%s|%s|%s|%s|%s|%s\n' "$HOME" "$USER" "$LOGNAME" "$(pwd)" "$SSH_CONNECTION" "$SSH_CLIENT" "$SHELL"`)
		f := strings.Split(strings.TrimSuffix(r.Stdout, "\n"), "|")
		if r.Code != 0 || len(f) != 7 {
			t.Fatalf("environment probe: %v", r)
		}
		if f[0] != home || f[1] != s.login || f[2] != s.login || f[3] != home {
			t.Errorf("HOME %q USER %q LOGNAME %q cwd %q; want %s, %s, %s and %s", f[0], f[1], f[2], f[3], home, s.login, s.login, home)
		}
		if len(strings.Fields(f[4])) != 4 || len(strings.Fields(f[5])) != 3 {
			t.Errorf("SSH_CONNECTION %q, SSH_CLIENT %q: want sshd's four and three fields (client address and port, server address and port)", f[4], f[5])
		}
		if f[6] == "" {
			t.Errorf("SHELL is empty")
		}
	})

	t.Run("20 commands through one ControlMaster", func(t *testing.T) {
		sock := filepath.Join(s.dir, "cm-%C")
		m := s.alice.ssh(t, defaultTestTimeout, nil, "-o", "ControlMaster=yes", "-o", "ControlPersist=yes",
			"-o", "ControlPath="+sock, "-N", a)
		if m.Code != 0 {
			t.Fatalf("master: %v", m)
		}
		t.Cleanup(func() { s.alice.ssh(t, defaultTestTimeout, nil, "-o", "ControlPath="+sock, "-O", "exit", a) })
		check := s.alice.ssh(t, defaultTestTimeout, nil, "-o", "ControlPath="+sock, "-O", "check", a)
		pid := regexp.MustCompile(`pid=(\d+)`).FindStringSubmatch(check.Stderr)
		if check.Code != 0 || pid == nil {
			t.Fatalf("ssh -O check after the master started: %v", check)
		}
		// A ProxyCommand that fails proves each command used the master:
		// a client that fell back to its own connection would fail.
		for i := range 20 {
			r := s.alice.ssh(t, defaultTestTimeout, strings.NewReader(fmt.Sprintf("echo cmd-%d\n", i)),
				"-o", "ControlMaster=no", "-o", "ControlPath="+sock, "-o", "ProxyCommand=false", a, "bash -s")
			if r.Code != 0 || r.Stdout != fmt.Sprintf("cmd-%d\n", i) {
				t.Fatalf("command %d through the master: %v", i, r)
			}
		}
		again := s.alice.ssh(t, defaultTestTimeout, nil, "-o", "ControlPath="+sock, "-O", "check", a)
		if again.Code != 0 || !strings.Contains(again.Stderr, pid[0]) {
			t.Errorf("after 20 commands the master is %v, want still %s", again, pid[0])
		}
	})

	t.Run("rsync -az --delete both ways", func(t *testing.T) {
		needTools(t, "rsync")
		src := makeSSHTree(t, filepath.Join(s.dir, "rsync-src"))
		remote := filepath.Join(s.dir, "rsync-remote") // node-a runs on this machine
		want := treeState(t, src)
		rsync := func(from, to string) {
			t.Helper()
			r := runTool(t, defaultTestTimeout, nil, s.alice.Env, "", "rsync", "-az", "--delete", "-e", s.alice.sshCommand(), from, to)
			if r.Code != 0 {
				t.Fatalf("rsync %s → %s: %v", from, to, r)
			}
		}
		if r := s.alice.ssh(t, defaultTestTimeout, nil, a, "mkdir", "-p", remote); r.Code != 0 {
			t.Fatalf("mkdir -p: %v", r)
		}
		rsync(src+"/", a+":"+remote)
		if err := diffTrees(want, treeState(t, remote), true); err != nil {
			t.Fatalf("rsync to %s: %v", a, err)
		}
		os.WriteFile(filepath.Join(remote, "extra"), []byte("delete me"), 0o644)
		os.Remove(filepath.Join(src, "empty"))
		want = treeState(t, src)
		rsync(src+"/", a+":"+remote)
		if err := diffTrees(want, treeState(t, remote), true); err != nil {
			t.Fatalf("rsync --delete to %s: %v", a, err)
		}

		back := filepath.Join(s.dir, "rsync-back")
		os.MkdirAll(filepath.Join(back, "stale dir"), 0o755)
		os.WriteFile(filepath.Join(back, "stale dir", "old"), []byte("delete me too"), 0o644)
		rsync(a+":"+remote+"/", back)
		if err := diffTrees(want, treeState(t, back), true); err != nil {
			t.Fatalf("rsync from %s: %v", a, err)
		}
	})

	t.Run("sftp -b put and get", func(t *testing.T) {
		src := makeSSHTree(t, filepath.Join(s.dir, "sftp-src"))
		remote := filepath.Join(s.dir, "sftp-remote")
		got := filepath.Join(s.dir, "sftp-got")
		os.Mkdir(got, 0o755)
		batch := filepath.Join(s.dir, "sftp-batch")
		os.WriteFile(batch, []byte(strings.Join([]string{
			"mkdir " + remote,
			"put -p " + src + "/blob.bin " + remote + "/blob.bin",
			"put -p \"" + src + "/name with space.txt\" \"" + remote + "/name with space.txt\"",
			"put -p " + src + "/bin/run.sh " + remote + "/run.sh",
			"ls -l " + remote,
			"get -p " + remote + "/blob.bin " + got + "/blob.bin",
			"get -p \"" + remote + "/name with space.txt\" \"" + got + "/name with space.txt\"",
			"get -p " + remote + "/run.sh " + got + "/run.sh",
			"",
		}, "\n")), 0o600)
		r := runTool(t, defaultTestTimeout, nil, s.alice.Env, "", "sftp", "-F", s.alice.Config, "-b", batch, a)
		if r.Code != 0 {
			t.Fatalf("sftp -b: %v", r)
		}
		if !strings.Contains(r.Stdout, "name with space.txt") {
			t.Errorf("sftp ls printed no uploaded name: %q", r.Stdout)
		}
		want := treeState(t, src)
		for _, p := range []struct{ src, dst string }{{"blob.bin", "blob.bin"}, {"name with space.txt", "name with space.txt"}, {"bin/run.sh", "run.sh"}} {
			for _, dir := range []string{remote, got} {
				st := treeState(t, dir)[p.dst]
				if st != want[p.src] {
					t.Errorf("sftp %s in %s: %+v, want %+v", p.dst, dir, st, want[p.src])
				}
			}
		}
	})

	t.Run("ssh -tt gets the terminal size asked for", func(t *testing.T) {
		ctxCmd := exec.Command("ssh", "-F", s.alice.Config, "-tt", a, "stty size; tty")
		ctxCmd.Env = append(os.Environ(), s.alice.Env...)
		ptmx, err := pty.StartWithSize(ctxCmd, &pty.Winsize{Rows: 37, Cols: 101})
		if err != nil {
			t.Fatalf("start ssh -tt in a pty: %v", err)
		}
		defer ptmx.Close()
		timer := time.AfterFunc(defaultTestTimeout, func() { ctxCmd.Process.Kill() })
		defer timer.Stop()
		var out bytes.Buffer
		io.Copy(&out, ptmx) // until the child closes its side (EIO)
		err = ctxCmd.Wait()
		if err != nil || !strings.Contains(out.String(), "37 101") || !strings.Contains(out.String(), "/dev/pts/") {
			t.Errorf("ssh -tt %s 'stty size; tty' in a 37x101 terminal: %v, output %q; want 37 101 and a pts", a, err, out.String())
		}
	})

	t.Run("ssh -L to an allowed target, and a refused one", func(t *testing.T) {
		fwd := func(spec string) (local string, stop func() string) {
			t.Helper()
			port := freePort(t)
			cmd := exec.Command("ssh", "-F", s.alice.Config, "-N", "-o", "ExitOnForwardFailure=yes",
				"-L", fmt.Sprintf("127.0.0.1:%d:%s", port, spec), a)
			cmd.Env = append(os.Environ(), s.alice.Env...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() { cmd.Wait(); close(done) }()
			local = fmt.Sprintf("127.0.0.1:%d", port)
			checkFor(t, defaultTestTimeout, func() error {
				select {
				case <-done:
					return fmt.Errorf("ssh -L %s exited: %s", spec, stderr.String())
				default:
				}
				c, err := net.Dial("tcp", local)
				if err == nil {
					c.Close()
				}
				return err
			})
			return local, func() string { cmd.Process.Kill(); <-done; return stderr.String() }
		}
		local, stop := fwd("echo:7")
		got, err := echoOnce(local, "through the tunnel", defaultTestTimeout)
		if err != nil || got != "through the tunnel" {
			t.Errorf("ssh -L to target echo: got %q, %v", got, err)
		}
		stop()
		local, stop = fwd(s.echoAddr) // the target's own address works too
		if got, err := echoOnce(local, "by address", defaultTestTimeout); err != nil || got != "by address" {
			t.Errorf("ssh -L to echo's address %s: got %q, %v", s.echoAddr, got, err)
		}
		stop()
		for _, spec := range []string{"closed:7", "127.0.0.1:1"} {
			local, stop = fwd(spec)
			got, err := echoOnce(local, "must not pass", defaultTestTimeout)
			msg := stop()
			if err == nil || got != "" {
				t.Errorf("ssh -L to %s (not allowed): echoed %q, %v", spec, got, err)
			}
			if !strings.Contains(msg, "open failed") {
				t.Errorf("ssh -L to %s: ssh printed no channel refusal: %q", spec, msg)
			}
		}
	})

	t.Run("policy: bob may not log in on node-b", func(t *testing.T) {
		if r := s.bob.ssh(t, defaultTestTimeout, nil, a, "echo bob-here"); r.Code != 0 || r.Stdout != "bob-here\n" {
			t.Fatalf("bob's certificate on %s: %v", a, r)
		}
		r := s.bob.ssh(t, defaultTestTimeout, nil, b, "echo must-not-run")
		if r.Code != 255 || r.Stdout != "" {
			t.Fatalf("bob on %s: want refused (exit 255, no output); %v", b, r)
		}
		t.Logf("bob on %s: ssh says %q", b, r.Stderr)
		if !strings.Contains(r.Stderr, "node-b") || !strings.Contains(r.Stderr, "bob") {
			t.Errorf("bob's refusal on %s does not say who and where (want node-b and bob in it): %q", b, r.Stderr)
		}
	})

	t.Run("wrong key, expired and unknown-CA certificates are refused", func(t *testing.T) {
		// Each is refused for its own reason, counted by the jump host
		// (the expired and rogue clients offer their certificate first,
		// then the plain key, which nobody authorized either).
		for _, c := range []struct {
			client *sshClient
			reason string
		}{{s.mallory, "unknown_key"}, {s.expired, "expired"}, {s.rogue, "unknown_ca"}} {
			name := fmt.Sprintf(`tether_ssh_auth_failures_total{reason=%q}`, c.reason)
			before, _ := metricValue(t, s.httpAddr, name)
			r := c.client.ssh(t, defaultTestTimeout, nil, a, "echo must-not-run")
			if r.Code != 255 || r.Stdout != "" || !strings.Contains(r.Stderr, "Permission denied") {
				t.Errorf("%s: want exit 255 and Permission denied; %v", c.client.Name, r)
			}
			if after, ok := metricValue(t, s.httpAddr, name); !ok || after <= before {
				t.Errorf("%s: %s went from %v to %v (exposed: %v), want it counted", c.client.Name, name, before, after, ok)
			}
		}
		if v, ok := metricValue(t, s.httpAddr, `tether_panics_total{component="coordinator"}`); ok && v != 0 {
			t.Errorf("the coordinator contained %v panics", v)
		}
		// None of them hurt the jump host.
		if r := s.alice.ssh(t, defaultTestTimeout, nil, a, "true"); r.Code != 0 {
			t.Fatalf("alice after the refusals: %v", r)
		}
	})

	t.Run("StrictHostKeyChecking=yes with the published host keys", func(t *testing.T) {
		for _, h := range []string{a, b} {
			r := s.alice.ssh(t, defaultTestTimeout, nil, "-o", "StrictHostKeyChecking=yes", h, "echo checked")
			if r.Code != 0 || r.Stdout != "checked\n" {
				t.Errorf("%s with StrictHostKeyChecking=yes: %v", h, r)
			}
		}
		// The check checks: without the published keys it fails.
		empty := filepath.Join(s.dir, "empty_known_hosts")
		os.WriteFile(empty, nil, 0o600)
		r := s.alice.ssh(t, defaultTestTimeout, nil, "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile="+empty, a, "true")
		if r.Code != 255 || !strings.Contains(r.Stderr, "Host key verification failed") {
			t.Errorf("%s with an empty known_hosts: want Host key verification failed; %v", a, r)
		}
	})

	t.Run("every SSH session is audited", func(t *testing.T) {
		// The bash -s subtest ran "... exit 7" as alice; the policy
		// subtest refused bob on node-b; sftp ran a subsystem.
		alice := "ssh-key:" + s.keys["alice"].Fingerprint
		checkFor(t, defaultTestTimeout, func() error {
			evs, err := s.auditEvents(t, "--operation", "ssh")
			if err != nil {
				return err
			}
			var exit7, sftp, bobRefused, jumpOK bool
			for _, ev := range evs {
				node := strings.Join(ev.Nodes, ",")
				switch {
				case ev.Identity == alice && ev.Method == "exec" && node == "node-a" && ev.ExitCode != nil && *ev.ExitCode == 7 &&
					ev.RunAs == s.login && ev.Command != nil && ev.BytesIn > 0 && ev.Session != "":
					exit7 = true
				case ev.Identity == alice && ev.Method == "subsystem" && ev.Target == "sftp" && ev.BytesIn >= 2<<20 && ev.BytesOut >= 2<<20:
					sftp = true
				case ev.Identity == "ssh-principal:bob" && node == "node-b" && ev.Result == "refused":
					bobRefused = true
				case ev.Identity == alice && ev.Method == "connect" && node == "node-a" && ev.Result == "ok" && ev.BytesIn > 0 && ev.BytesOut > 0:
					jumpOK = true
				}
			}
			if !exit7 || !sftp || !bobRefused || !jumpOK {
				return fmt.Errorf("of %d ssh audit events: alice's exec with exit 7 on node-a %v, alice's sftp of 2 MiB both ways %v, bob refused on node-b %v, a jump host connect of alice's %v",
					len(evs), exit7, sftp, bobRefused, jumpOK)
			}
			return nil
		})
	})

	t.Run("NeMo Gym's SSHConnection in Python", func(t *testing.T) {
		runNeMoGymPython(t, s.alice, "node-a")
	})

	t.Run("NeMo Gym's SSHConnection in Python through ssh-proxy", func(t *testing.T) {
		runNeMoGymPython(t, s.proxy, "node-b")
	})

	t.Run("through tether ssh-proxy as a ProxyCommand", func(t *testing.T) {
		cfg, _ := os.ReadFile(s.proxy.Config)
		if !bytes.Contains(cfg, []byte("ssh-proxy")) {
			t.Errorf("ssh-config --proxy-command printed no ssh-proxy ProxyCommand:\n%s", cfg)
		}
		for _, h := range []string{a, b} {
			r := s.proxy.ssh(t, defaultTestTimeout, strings.NewReader("false\necho via-proxy\n"),
				"-o", "StrictHostKeyChecking=yes", h, "bash -s")
			if r.Code != 0 || r.Stdout != "via-proxy\n" {
				t.Errorf("%s through ssh-proxy: %v", h, r)
			}
		}
	})

	t.Run("a restarted agent keeps its host key (accept-new sees no change)", func(t *testing.T) {
		learned := filepath.Join(s.dir, "learned_known_hosts")
		first := s.alice.ssh(t, defaultTestTimeout, nil, "-o", "UserKnownHostsFile="+learned, "-o", "StrictHostKeyChecking=accept-new", a, "true")
		if st, err := os.Stat(learned); first.Code != 0 || err != nil || st.Size() == 0 {
			t.Fatalf("accept-new on %s: %v; known_hosts written: %v", a, first, err)
		}
		if err := s.nodeA.stop(t); err != nil {
			t.Fatalf("node-a's agent exit after SIGTERM: %v", err)
		}
		s.waitNodes(t, "node-b")
		// Started under the whole test, not this subtest, so that it
		// outlives the subtest for the ones after it.
		s.nodeA = s.startAgentBin(top, *tetherBin, "node-a", "role=a", s.tokenFile, s.nodeAArgs...)
		s.waitNodes(t, "node-a", "node-b")
		r := s.alice.ssh(t, defaultTestTimeout, nil, "-o", "UserKnownHostsFile="+learned, "-o", "StrictHostKeyChecking=yes", a, "echo same-key")
		if r.Code != 0 || r.Stdout != "same-key\n" {
			t.Errorf("%s after its agent restarted, checked against the key accept-new learned: %v", a, r)
		}
	})

	t.Run("a restarted coordinator keeps its jump host key and host CA", func(t *testing.T) {
		// The configs and known_hosts written before the restart still
		// check both hops (StrictHostKeyChecking yes, from the config).
		if err := s.coord.stop(t); err != nil {
			t.Fatalf("coordinator exit after SIGTERM: %v", err)
		}
		s.coord = start(top, "coordinator-restarted", s.coordArgs...) // outlives the subtest
		s.waitReady(t)
		s.waitNodes(t, "node-a", "node-b")
		for _, h := range []string{a, b} {
			r := s.alice.ssh(t, defaultTestTimeout, nil, h, "echo after-restart")
			if r.Code != 0 || r.Stdout != "after-restart\n" {
				t.Errorf("%s after the coordinator restarted, with the config written before: %v", h, r)
			}
		}
	})

	t.Run("SIGHUP reloads the authorized keys", func(t *testing.T) {
		authorize := func(names ...string) {
			t.Helper()
			var b []byte
			for _, n := range names {
				pub, _ := os.ReadFile(s.keys[n].Pub)
				b = append(b, pub...)
			}
			if err := os.WriteFile(s.authorized+".tmp", b, 0o600); err != nil {
				t.Fatal(err)
			}
			os.Rename(s.authorized+".tmp", s.authorized)
			s.coord.cmd.Process.Signal(syscall.SIGHUP)
		}
		defer func() {
			authorize("alice")
			checkFor(t, defaultTestTimeout, func() error {
				if r := s.alice.ssh(t, defaultTestTimeout, nil, a, "true"); r.Code != 0 {
					return fmt.Errorf("alice after her key came back: %v", r)
				}
				return nil
			})
		}()
		// mallory's key, once authorized, gets past the jump host's
		// authentication to the policy, which names no such key.
		authorize("alice", "mallory")
		checkFor(t, defaultTestTimeout, func() error {
			r := s.mallory.ssh(t, defaultTestTimeout, nil, a, "echo must-not-run")
			if r.Code != 255 || r.Stdout != "" || strings.Contains(r.Stderr, "Permission denied") || !strings.Contains(r.Stderr, s.keys["mallory"].Fingerprint) {
				return fmt.Errorf("mallory after her key was authorized: want the policy's refusal naming her key; %v", r)
			}
			return nil
		})
		// alice's ControlMaster, opened while her key is trusted, serves
		// commands...
		sock := filepath.Join(s.dir, "revoke-%C")
		if m := s.alice.ssh(t, defaultTestTimeout, nil, "-o", "ControlMaster=yes", "-o", "ControlPersist=yes", "-o", "ControlPath="+sock, "-N", a); m.Code != 0 {
			t.Fatalf("master: %v", m)
		}
		defer s.alice.ssh(t, defaultTestTimeout, nil, "-o", "ControlPath="+sock, "-O", "exit", a)
		viaMaster := func() toolRun {
			return s.alice.ssh(t, defaultTestTimeout, nil, "-o", "ControlMaster=no", "-o", "ControlPath="+sock, "-o", "ProxyCommand=false", a, "echo via-master")
		}
		if r := viaMaster(); r.Code != 0 || r.Stdout != "via-master\n" {
			t.Fatalf("through the master before the reload: %v", r)
		}
		// ...and her key, removed, is refused, the master's connection
		// closed by the reload included.
		authorize("mallory")
		checkFor(t, defaultTestTimeout, func() error {
			r := s.alice.ssh(t, defaultTestTimeout, nil, a, "echo must-not-run")
			if r.Code != 255 || r.Stdout != "" || !strings.Contains(r.Stderr, "Permission denied") {
				return fmt.Errorf("alice after her key was removed: want Permission denied; %v", r)
			}
			return nil
		})
		checkFor(t, defaultTestTimeout, func() error {
			if r := viaMaster(); r.Code == 0 || r.Stdout != "" {
				return fmt.Errorf("through the master after alice's key was removed: want a failure; %v", r)
			}
			return nil
		})
	})

}

// TestSSHNeMoGymPython lives in TestSSHEndToEnd (one fleet): see
// runNeMoGymPython.

// runNeMoGymPython runs python/test_ngssh.py, NeMo Gym's SSHConnection
// semantics, against node through c's config, and fails unless every
// Python test ran and passed.
func runNeMoGymPython(t *testing.T, c *sshClient, node string) {
	t.Helper()
	needTools(t, "python3", "rsync")
	scratch := t.TempDir()
	env := append(append([]string{}, c.Env...), "TETHER_SSH_CONFIG="+c.Config, "TETHER_SSH_HOST="+hostAlias(node),
		"TETHER_SSH_SCRATCH="+scratch, "PYTHONDONTWRITEBYTECODE=1")
	r := runTool(t, 5*defaultTestTimeout, nil, env, "python", "python3", "-m", "unittest", "-v", "test_ngssh")
	t.Logf("python3 -m unittest -v test_ngssh:\n%s", r.Stderr)
	ran := regexp.MustCompile(`(?m)^Ran (\d+) tests? in`).FindStringSubmatch(r.Stderr)
	switch {
	case r.Code != 0:
		t.Errorf("the Python NeMo Gym client failed against %s (exit %d): see the unittest output above", node, r.Code)
	case ran == nil || ran[1] == "0":
		t.Errorf("the Python NeMo Gym tests ran nothing: %q", r.Stderr)
	case strings.Contains(r.Stderr, "skipped"):
		t.Errorf("the Python NeMo Gym tests skipped some: the environment did not reach them: %q", r.Stderr)
	}
}

// auditEvents reads the audit log through tether audit --json with the
// filter flags.
func (s *sshFleet) auditEvents(t *testing.T, filter ...string) ([]protocol.AuditEvent, error) {
	t.Helper()
	out, errOut, code := runCLI(t, s.natsURL, "", append([]string{"audit", "--json", "--limit", "10000"}, filter...)...)
	if code != 0 {
		return nil, fmt.Errorf("tether audit: exit %d: %s", code, errOut)
	}
	var evs []protocol.AuditEvent
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var ev protocol.AuditEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			return nil, fmt.Errorf("tether audit --json line %q: %v", line, err)
		}
		evs = append(evs, ev)
	}
	return evs, nil
}

// metricValue is metric without failing: the value and whether it is
// exposed.
func metricValue(t *testing.T, httpAddr, name string) (float64, bool) {
	t.Helper()
	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}

// sshOptions parses ssh -G output: option name (lowercase) → value.
func sshOptions(g string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(g, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), " ")
		if _, dup := out[k]; k != "" && !dup {
			out[k] = v
		}
	}
	return out
}

// processesNamed lists the pids whose command name (/proc/PID/comm) is name.
func processesNamed(name string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm")); err == nil && strings.TrimSpace(string(b)) == name {
			pids = append(pids, pid)
		}
	}
	return pids
}

func containsStr(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

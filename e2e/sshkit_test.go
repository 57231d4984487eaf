//go:build e2e

package e2e

// The OpenSSH kit of the SSH tests and benchmarks: keys, a user CA and
// certificates made with ssh-keygen, a throwaway sshd on loopback (for the
// benchmark baseline only: the tests run no sshd), a tree generator and
// checker for rsync and sftp, a TCP echo server for ssh -L, and runners for
// the real ssh, rsync and sftp binaries.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// needTools skips the test unless every named program is on PATH, saying
// which is missing and which Debian package brings it. Under CI (CI=true),
// where .ci/run installs them, a missing tool fails the test instead.
func needTools(t testing.TB, names ...string) {
	t.Helper()
	pkg := map[string]string{"ssh": "openssh-client", "ssh-keygen": "openssh-client", "sftp": "openssh-client",
		"rsync": "rsync", "python3": "python3", "sshd": "openssh-server"}
	for _, n := range names {
		if _, err := exec.LookPath(n); err == nil {
			continue
		}
		if n == "sshd" {
			if _, err := os.Stat(sshdPath); err == nil {
				continue
			}
		}
		msg := fmt.Sprintf("%s not installed (Debian package %s)", n, pkg[n])
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s, and CI should have installed it (.ci/run)", msg)
		}
		t.Skip(msg)
	}
}

// sshdPath is where Debian's openssh-server puts sshd (not on a user's PATH).
const sshdPath = "/usr/sbin/sshd"

// sshKey is an ed25519 key pair written by ssh-keygen.
type sshKey struct {
	Priv, Pub   string // the private key file and its .pub
	Fingerprint string // "SHA256:…" as ssh-keygen -lf prints it
}

// newSSHKey makes an unencrypted ed25519 key dir/name (and dir/name.pub).
func newSSHKey(t testing.TB, dir, name string) sshKey {
	t.Helper()
	k := sshKey{Priv: filepath.Join(dir, name), Pub: filepath.Join(dir, name+".pub")}
	mustRun(t, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", k.Priv)
	out := mustRun(t, "ssh-keygen", "-l", "-E", "sha256", "-f", k.Pub)
	f := strings.Fields(out)
	if len(f) < 2 || !strings.HasPrefix(f[1], "SHA256:") {
		t.Fatalf("ssh-keygen -lf %s printed %q: no SHA256 fingerprint", k.Pub, out)
	}
	k.Fingerprint = f[1]
	return k
}

// signUserCert certifies k's public key with the CA key ca as a user
// certificate for principals, valid for validity (ssh-keygen -V syntax:
// "-5m:+1h", or "20200101:20200102" for one long expired), and returns the
// certificate file, k.Priv + "-cert.pub", where ssh finds it beside the key.
func signUserCert(t testing.TB, ca, k sshKey, id string, principals []string, validity string) string {
	t.Helper()
	mustRun(t, "ssh-keygen", "-q", "-s", ca.Priv, "-I", id, "-n", strings.Join(principals, ","), "-V", validity, k.Pub)
	cert := strings.TrimSuffix(k.Pub, ".pub") + "-cert.pub"
	if _, err := os.Stat(cert); err != nil {
		t.Fatalf("ssh-keygen -s wrote no certificate: %v", err)
	}
	return cert
}

// mustRun runs a program that must succeed within a minute and returns its
// stdout; a failure fails t with the command line and its stderr.
func mustRun(t testing.TB, name string, args ...string) string {
	t.Helper()
	r := runTool(t, defaultTestTimeout, nil, nil, "", name, args...)
	if r.Code != 0 {
		t.Fatalf("%s: exit %d\nstdout: %s\nstderr: %s", r.Line, r.Code, r.Stdout, r.Stderr)
	}
	return r.Stdout
}

// toolRun is the outcome of one run of an external program.
type toolRun struct {
	Line           string // the command line, for messages
	Stdout, Stderr string
	Code           int // the exit code; -1 when it was killed at its deadline
}

func (r toolRun) String() string {
	return fmt.Sprintf("%s: exit %d\n  stdout: %q\n  stderr: %q", r.Line, r.Code, clipText(r.Stdout), clipText(r.Stderr))
}

func clipText(s string) string {
	if len(s) > 2000 {
		return s[:2000] + "…"
	}
	return s
}

// runTool runs name with args, stdin and the extra environment, in dir
// ("" for the test's), killed after d. A program that cannot start fails t.
func runTool(t testing.TB, d time.Duration, stdin io.Reader, env []string, dir, name string, args ...string) toolRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = dir
	cmd.Stdin = stdin
	// ssh -L and ControlPersist leave children holding the pipes; do not
	// wait for them past the process itself.
	cmd.WaitDelay = 5 * time.Second
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	r := toolRun{Line: shellLine(name, args), Stdout: o.String(), Stderr: e.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case ctx.Err() != nil:
		r.Code = -1
		r.Stderr += fmt.Sprintf("\n[killed after %v]", d)
	case errors.As(err, &ee):
		r.Code = ee.ExitCode()
	case errors.Is(err, exec.ErrWaitDelay):
	default:
		t.Fatalf("run %s: %v", r.Line, err)
	}
	return r
}

// shellLine quotes a command line for messages and for sh -c.
func shellLine(name string, args []string) string {
	parts := []string{shellQuote(name)}
	for _, a := range args {
		parts = append(parts, shellQuote(a))
	}
	return strings.Join(parts, " ")
}

func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,@%+", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// currentUser is the user the tests run as: the login every policy here
// grants (an agent without a local policy runs jobs as its own user only).
func currentUser(t testing.TB) string {
	t.Helper()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	return u.Username
}

// --- trees --------------------------------------------------------------

// fileState is what the tree checks compare of one path.
type fileState struct {
	Mode   fs.FileMode // type and permission bits
	Size   int64       // regular files only
	SHA256 string      // regular files only, hex
}

// makeSSHTree writes the tree the rsync and sftp tests move: a name with a
// space, a 2 MiB random file, a mode-755 script, a nested directory and an
// empty file. It returns root.
func makeSSHTree(t testing.TB, root string) string {
	t.Helper()
	blob := make([]byte, 2<<20)
	rand.Read(blob)
	files := []struct {
		name string
		data []byte
		mode fs.FileMode
	}{
		{"name with space.txt", []byte("spaces survive\n"), 0o644},
		{"blob.bin", blob, 0o600},
		{"bin/run.sh", []byte("#!/bin/sh\necho ran\n"), 0o755},
		{"deep/er dir/leaf", []byte("leaf\n"), 0o640},
		{"empty", nil, 0o644},
	}
	for _, f := range files {
		p := filepath.Join(root, f.name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, f.data, f.mode); err != nil {
			t.Fatal(err)
		}
		// WriteFile's mode is masked by the umask; the test wants it exact.
		if err := os.Chmod(p, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// makeManyFiles writes n small files (a few hundred bytes to a few KiB,
// random) under root in directories of 100, for the rsync benchmark.
func makeManyFiles(t testing.TB, root string, n int) {
	t.Helper()
	buf := make([]byte, 4096)
	for i := 0; i < n; i++ {
		dir := filepath.Join(root, fmt.Sprintf("d%03d", i/100))
		if i%100 == 0 {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		rand.Read(buf)
		size := 200 + int(buf[0])*15 // 200 .. 4025 bytes
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d", i)), buf[:size], 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// treeState maps every path under root (relative, slash-separated, root
// itself excluded) to its state.
func treeState(t testing.TB, root string) map[string]fileState {
	t.Helper()
	out := map[string]fileState{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		st := fileState{Mode: fi.Mode() & (fs.ModeType | fs.ModePerm)}
		if fi.Mode().IsRegular() {
			st.Size = fi.Size()
			st.SHA256 = fileSHA256(t, p)
		}
		out[filepath.ToSlash(rel)] = st
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	return out
}

func fileSHA256(t testing.TB, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// diffTrees names every path whose state differs between want and got
// (missing, extra, another mode, size or content); nil when they agree.
// Directories are compared by mode only when dirModes is set (rsync -a
// keeps them; sftp put of single files makes its own).
func diffTrees(want, got map[string]fileState, dirModes bool) error {
	var errs []string
	for p, w := range want {
		g, ok := got[p]
		switch {
		case !ok:
			errs = append(errs, fmt.Sprintf("%s: missing", p))
		case w.Mode.IsDir() && g.Mode.IsDir() && !dirModes:
		case w.Mode != g.Mode:
			errs = append(errs, fmt.Sprintf("%s: mode %v, want %v", p, g.Mode, w.Mode))
		case w.SHA256 != g.SHA256 || w.Size != g.Size:
			errs = append(errs, fmt.Sprintf("%s: %d bytes sha256 %.12s…, want %d bytes %.12s…", p, g.Size, g.SHA256, w.Size, w.SHA256))
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			errs = append(errs, fmt.Sprintf("%s: extra (not in the source)", p))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	sort.Strings(errs)
	return errors.New(strings.Join(errs, "; "))
}

// --- a TCP echo server -----------------------------------------------------

// startEcho serves TCP echo on a free loopback port until the test ends and
// returns its address.
func startEcho(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// echoOnce dials addr, writes a line and returns what came back before
// the first newline, EOF or d.
func echoOnce(addr, line string, d time.Duration) (string, error) {
	c, err := net.DialTimeout("tcp", addr, d)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(d))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSuffix(got, "\n"), err
}

// --- a throwaway sshd (benchmark baseline only) ------------------------------

// sshdServer is an OpenSSH sshd on loopback run as the current user, with
// its own host key and authorized_keys, and a client config to reach it as
// Host "sshd-bench".
type sshdServer struct {
	PID    int // the listening sshd, which reaps every connection's processes
	Port   int
	Config string // the client config file (ssh -F) for Host sshd-bench
	Host   string // "sshd-bench"
}

// sshdShell says which shells the sshd's sessions start.
type sshdShell int

const (
	// nestedShell: sessions get SHLVL=1, so Debian's bash does not read
	// ~/.bashrc for `ssh host CMD`. For baselines against a tether path
	// that runs no shell at all (tether exec, tether forward): a heavy rc
	// file (pyenv init takes 0.17-0.25 s on a dev box) would otherwise be
	// timed as ssh's cost and flatter tether.
	nestedShell sshdShell = iota
	// topLevelShell: sessions start as a stock sshd's do (no SHLVL), so
	// bash reads ~/.bashrc for a command, exactly as the agent's SSH
	// server does (agent/sshd drops SHLVL and sets SSH_CLIENT). For
	// like-for-like baselines of Tether's SSH path: with nestedShell the
	// sshd side skipped the rc file and Tether's did not, which made the
	// ControlMaster scenario read 35x (stop 22's note).
	topLevelShell
)

// startSSHD runs /usr/sbin/sshd -D -e -f CONFIG -p PORT as the current user
// with a generated host key, trusting client (whose private key the client
// config names), until the test ends; shell says whether its sessions'
// bash reads ~/.bashrc. No system daemon is touched.
func startSSHD(t testing.TB, client sshKey, shell sshdShell) *sshdServer {
	t.Helper()
	needTools(t, "sshd", "ssh", "ssh-keygen")
	dir := t.TempDir()
	host := newSSHKey(t, dir, "host_ed25519")
	auth := filepath.Join(dir, "authorized_keys")
	pub, err := os.ReadFile(client.Pub)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(auth, pub, 0o600); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		// sshd started as root wants its privilege separation directory.
		os.MkdirAll("/run/sshd", 0o755)
	}
	sftpServer := "internal-sftp"
	port := freePort(t)
	cfg := filepath.Join(dir, "sshd_config")
	conf := strings.Join([]string{
		"ListenAddress 127.0.0.1",
		"HostKey " + host.Priv,
		"AuthorizedKeysFile " + auth,
		"PidFile " + filepath.Join(dir, "sshd.pid"),
		"StrictModes no",
		"UsePAM no",
		"PasswordAuthentication no",
		"KbdInteractiveAuthentication no",
		"PubkeyAuthentication yes",
		"PermitRootLogin prohibit-password",
		"AllowTcpForwarding yes",
		"MaxSessions 100",
		"MaxStartups 100:30:200",
		"Subsystem sftp " + sftpServer,
		"LogLevel ERROR",
	}, "\n") + "\n"
	if shell == nestedShell {
		// Debian's bash reads ~/.bashrc for `ssh host CMD` (sshd runs
		// `$SHELL -c CMD` with SSH_CLIENT set) unless SHLVL says it is
		// nested.
		conf += "SetEnv SHLVL=1\n"
	}
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(sshdPath, "-D", "-e", "-f", cfg, "-p", fmt.Sprint(port))
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start sshd: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("--- sshd log ---\n%s", log.String())
		}
	})
	known := filepath.Join(dir, "known_hosts")
	hostPub, _ := os.ReadFile(host.Pub)
	os.WriteFile(known, []byte(fmt.Sprintf("[127.0.0.1]:%d %s", port, hostPub)), 0o600)
	s := &sshdServer{PID: cmd.Process.Pid, Port: port, Config: filepath.Join(dir, "ssh_config"), Host: "sshd-bench"}
	client_ := strings.Join([]string{
		"Host sshd-bench",
		"  HostName 127.0.0.1",
		fmt.Sprintf("  Port %d", port),
		"  User " + currentUser(t),
		"  IdentityFile " + client.Priv,
		"  IdentitiesOnly yes",
		"  UserKnownHostsFile " + known,
		"  HostKeyAlias " + fmt.Sprintf("[127.0.0.1]:%d", port),
		"  StrictHostKeyChecking yes",
		"  BatchMode yes",
		"",
	}, "\n")
	if err := os.WriteFile(s.Config, []byte(client_), 0o600); err != nil {
		t.Fatal(err)
	}
	checkForTB(t, defaultTestTimeout, func() error {
		select {
		case <-done:
			return fmt.Errorf("sshd exited: %s", log.String())
		default:
		}
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			return err
		}
		c.Close()
		return nil
	})
	return s
}

// checkForTB is checkFor for a testing.TB (benchmarks too).
func checkForTB(t testing.TB, d time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met after %v: %v", d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// --- the Tether side ----------------------------------------------------------

// haveSSHCommands reports why the tether binary cannot run the SSH tests
// yet ("" when it can): it needs tether ssh-config and tether ssh-proxy, and
// the coordinator's --ssh-addr.
func haveSSHCommands(t testing.TB) string {
	t.Helper()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"ssh-config", "--help"}, "ssh-config"},
		{[]string{"ssh-proxy", "--help"}, "ssh-proxy"},
		{[]string{"coordinator", "--help"}, "--ssh-addr"},
	} {
		r := runTool(t, defaultTestTimeout, nil, nil, "", *tetherBin, c.args...)
		if r.Code != 0 || !strings.Contains(r.Stdout+r.Stderr, c.want) {
			return fmt.Sprintf("this tether has no %q (tether %s: exit %d): issue 10's SSH commands have not landed", c.want, strings.Join(c.args, " "), r.Code)
		}
	}
	return ""
}

// sshClient is one SSH identity's way into the fleet: the config file that
// tether ssh-config printed for it, and the environment its ssh needs
// (ssh-proxy as a ProxyCommand reads the NATS URL and credentials from it).
type sshClient struct {
	Name   string
	Config string
	Env    []string
}

// ssh runs the real ssh with -F c.Config, the options, then args (host and
// command), with stdin (nil: none), killed after d.
func (c *sshClient) ssh(t testing.TB, d time.Duration, stdin io.Reader, args ...string) toolRun {
	t.Helper()
	return runTool(t, d, stdin, c.Env, "", "ssh", append([]string{"-F", c.Config}, args...)...)
}

// sshArgs is the ssh command line for -e of rsync and for sftp -S: ssh
// with the config file.
func (c *sshClient) sshCommand() string { return "ssh -F " + shellQuote(c.Config) }

// hostAlias is a node's SSH host name.
func hostAlias(node string) string { return node + ".tether" }

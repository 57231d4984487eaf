package agent

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/creack/pty"
	"golang.org/x/crypto/ssh"

	"github.com/tetherfleet/tether/protocol"
)

// Tests with the real OpenSSH client. Its ProxyCommand is this test binary
// re-executed with sshProxyEnv set (TestMain runs runSSHProxy): it joins
// its standard input and output to a loopback listener of the test
// (sshBridge), which opens one ssh stream to the agent per connection and
// relays it, as the coordinator's jump host and tether ssh-proxy do.

// sshProxyEnv makes the test binary an ssh ProxyCommand to the address
// it holds.
const sshProxyEnv = "TETHER_TEST_SSH_PROXY"

// runSSHProxy is the ProxyCommand's main: stdin → addr, addr → stdout.
func runSSHProxy(addr string) int {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ssh proxy:", err)
		return 1
	}
	go func() {
		io.Copy(c, os.Stdin)
		c.(*net.TCPConn).CloseWrite()
	}()
	io.Copy(os.Stdout, c)
	return 0
}

// sshBridge is the test's jump host: each TCP connection to ln becomes an
// ssh stream with params from params().
type sshBridge struct {
	f      *sshFixture
	ln     net.Listener
	params func() *protocol.SSHParams
	conns  atomic.Int64 // ssh streams opened
	wg     sync.WaitGroup
}

func newSSHBridge(t testing.TB, f *sshFixture, params func() *protocol.SSHParams) *sshBridge {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &sshBridge{f: f, ln: ln, params: params}
	var mu sync.Mutex
	var open []net.Conn
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				defer c.Close()
				st, info, err := f.openStream(b.params())
				if err != nil || info != nil {
					t.Errorf("bridge: ssh stream: %v %v", err, info)
					return
				}
				b.conns.Add(1)
				defer st.Close()
				done := make(chan struct{})
				go func() {
					defer close(done)
					io.Copy(st, c)
					st.Close() // a half-close: the agent still writes
				}()
				io.Copy(c, st)
				c.(*net.TCPConn).CloseWrite()
				<-done
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		b.wg.Wait()
	})
	return b
}

// openSSH runs OpenSSH's clients against a bridge.
type openSSH struct {
	t          testing.TB
	b          *sshBridge
	dir        string
	keyFile    string
	knownHosts string
	logLevel   string
	user       string
	// port, when set, makes the clients connect to 127.0.0.1:port
	// directly (a local sshd, for the benchmark) instead of through the
	// bridge.
	port string
}

const sshHost = "node-a" + protocol.SSHHostSuffix

func needBinary(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s is not installed (apt-get install -y openssh-client rsync; CI has them): %v", name, err)
	}
	return p
}

func writeKeyFile(t testing.TB, path string, priv ed25519.PrivateKey) {
	t.Helper()
	blk, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(blk), 0o600); err != nil {
		t.Fatal(err)
	}
}

// newOpenSSH is an OpenSSH client setup for f: its key file, a known_hosts
// file naming the agent's host key for sshHost, and a bridge whose params
// vouch for the key (mutate adjusts them).
func newOpenSSH(t testing.TB, f *sshFixture, mutate func(*protocol.SSHParams)) *openSSH {
	t.Helper()
	needBinary(t, "ssh")
	// Short: ControlPath must fit a unix socket's 108 bytes.
	dir, err := os.MkdirTemp("", "tssh")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	o := &openSSH{t: t, dir: dir, keyFile: filepath.Join(dir, "id"), knownHosts: filepath.Join(dir, "kh"), logLevel: "ERROR", user: f.user}
	writeKeyFile(t, o.keyFile, f.priv)
	line := sshHost + " " + string(ssh.MarshalAuthorizedKey(f.hostKey.PublicKey()))
	if err := os.WriteFile(o.knownHosts, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	o.b = newSSHBridge(t, f, func() *protocol.SSHParams { return f.params(mutate) })
	return o
}

// opts are the options every client gets.
func (o *openSSH) opts() []string {
	exe, err := os.Executable()
	if err != nil {
		o.t.Fatal(err)
	}
	hop := []string{"-o", "ProxyCommand=" + exe}
	if o.port != "" {
		hop = []string{"-o", "Port=" + o.port}
	}
	return append(hop, "-F", "/dev/null",
		"-o", "UserKnownHostsFile="+o.knownHosts, "-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes", "-o", "IdentityFile="+o.keyFile,
		"-o", "BatchMode=yes", "-o", "LogLevel="+o.logLevel, "-o", "User="+o.user,
	)
}

func (o *openSSH) env() []string {
	return append(os.Environ(), sshProxyEnv+"="+o.b.ln.Addr().String())
}

// command is name (ssh, sftp, ...) with the options, then args.
func (o *openSSH) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, append(o.opts(), args...)...)
	cmd.Env = o.env()
	return cmd
}

// run runs ssh with args and stdin, returning stdout, stderr and the exit
// code.
func (o *openSSH) run(stdin string, args ...string) (string, string, int) {
	o.t.Helper()
	cmd := o.command("ssh", args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		o.t.Fatalf("ssh %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

func TestOpenSSHBashScriptExitStatusAndSignal(t *testing.T) {
	f := newSSHFixture(t, nil)
	o := newOpenSSH(t, f, nil)
	// NeMo Gym's run(): the commands on stdin of bash -s; only the last
	// status counts.
	out, errs, code := o.run("cd /\nfalse\necho \"one $PWD\"\n", sshHost, "bash -s")
	if code != 0 || out != "one /\n" {
		t.Fatalf("bash -s: exit %d out %q stderr %q", code, out, errs)
	}
	out, errs, code = o.run("echo two\nexit 3\n", sshHost, "bash -s")
	if code != 3 || out != "two\n" {
		t.Fatalf("bash -s with exit 3: exit %d out %q stderr %q", code, out, errs)
	}
	_, _, code = o.run("", sshHost, "kill -KILL $$")
	if code != 255 {
		t.Errorf("kill -KILL $$: ssh exit %d, want 255 (exit-signal)", code)
	}
	f.event(t, "of the killed command", func(e *protocol.SSHChannelEvent) bool { return e.ExitSignal == "KILL" })
}

func TestOpenSSHTTYStty(t *testing.T) {
	f := newSSHFixture(t, nil)
	o := newOpenSSH(t, f, nil)
	cmd := o.command("ssh", "-tt", sshHost, "stty size")
	// ssh takes the size from its own terminal.
	m, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 27, Cols: 91})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	out, _ := io.ReadAll(m) // until EIO: ssh exited
	if err := cmd.Wait(); err != nil {
		t.Errorf("ssh -tt: %v (output %q)", err, out)
	}
	if !bytes.Contains(out, []byte("27 91")) {
		t.Errorf("ssh -tt stty size: %q, want 27 91", out)
	}
}

func TestOpenSSHSFTPPutGet(t *testing.T) {
	needBinary(t, "sftp")
	f := newSSHFixture(t, nil)
	o := newOpenSSH(t, f, nil)
	local := t.TempDir()
	remote := t.TempDir()
	data := make([]byte, 2<<20+5)
	rand.Read(data)
	if err := os.WriteFile(filepath.Join(local, "up.bin"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	batch := filepath.Join(o.dir, "batch")
	os.WriteFile(batch, []byte(fmt.Sprintf("put %s/up.bin %s/r.bin\nget %s/r.bin %s/down.bin\npwd\n", local, remote, remote, local)), 0o600)
	cmd := o.command("sftp", "-b", batch, sshHost)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sftp -b: %v\n%s", err, out)
	}
	for _, p := range []string{filepath.Join(remote, "r.bin"), filepath.Join(local, "down.bin")} {
		if got, err := os.ReadFile(p); err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s differs from the uploaded file: %v", p, err)
		}
	}
	acct, _ := lookupAccount(f.user)
	if !strings.Contains(string(out), "Remote working directory: "+f.h.a.baseDir(acct)) {
		t.Errorf("sftp pwd: %s, want the login's home", out)
	}
}

func TestOpenSSHRsyncBothWays(t *testing.T) {
	needBinary(t, "rsync")
	f := newSSHFixture(t, nil)
	o := newOpenSSH(t, f, nil)
	src, dst, back := t.TempDir(), t.TempDir(), t.TempDir()
	big := make([]byte, 2<<20)
	rand.Read(big)
	files := map[string][]byte{"a name with a space.txt": []byte("hello\n"), "big.bin": big, "sub/run.sh": []byte("#!/bin/sh\necho hi\n")}
	for name, b := range files {
		os.MkdirAll(filepath.Dir(filepath.Join(src, name)), 0o755)
		if err := os.WriteFile(filepath.Join(src, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(src, "sub/run.sh"), 0o755)
	os.WriteFile(filepath.Join(dst, "stale"), []byte("x"), 0o644)
	e := "ssh " + strings.Join(o.opts(), " ")
	rsync := func(from, to string) {
		t.Helper()
		cmd := exec.Command("rsync", "-az", "--delete", "-e", e, from, to)
		cmd.Env = o.env()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("rsync %s %s: %v\n%s", from, to, err, out)
		}
	}
	rsync(src+"/", sshHost+":"+dst+"/")
	rsync(sshHost+":"+dst+"/", back+"/")
	for _, dir := range []string{dst, back} {
		if _, err := os.Stat(filepath.Join(dir, "stale")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: --delete left the stale file (%v)", dir, err)
		}
		for name, want := range files {
			got, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("%s/%s differs: %v", dir, name, err)
			}
		}
		if fi, err := os.Stat(filepath.Join(dir, "sub/run.sh")); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s/sub/run.sh: mode %v %v, want 0755", dir, fi.Mode(), err)
		}
	}
}

// startMaster starts a ControlMaster (ssh -N) on path and waits until it
// answers; the returned func stops it.
func (o *openSSH) startMaster(path string) func() {
	return o.startMasterTo(path, sshHost)
}

// startMasterTo is startMaster for host.
func (o *openSSH) startMasterTo(path, host string) func() {
	o.t.Helper()
	master := o.command("ssh", "-o", "ControlMaster=yes", "-o", "ControlPath="+path, "-o", "ControlPersist=no", "-N", host)
	var errb bytes.Buffer
	master.Stderr = &errb
	if err := master.Start(); err != nil {
		o.t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- master.Wait() }()
	waitFor(o.t, testWait, "the control master", func() bool {
		select {
		case err := <-waited:
			o.t.Fatalf("control master exited: %v: %s", err, errb.String())
		default:
		}
		check := o.command("ssh", "-o", "ControlPath="+path, "-O", "check", host)
		return check.Run() == nil
	})
	return func() {
		o.command("ssh", "-o", "ControlPath="+path, "-O", "exit", host).Run()
		master.Process.Signal(syscall.SIGTERM)
		<-waited
	}
}

func TestOpenSSHControlMaster20Commands(t *testing.T) {
	f := newSSHFixture(t, nil)
	o := newOpenSSH(t, f, nil)
	cp := filepath.Join(o.dir, "cm")
	stop := o.startMaster(cp)
	defer stop()
	for i := range 20 {
		out, errs, code := o.run(fmt.Sprintf("echo %d\n", i), "-o", "ControlMaster=no", "-o", "ControlPath="+cp, sshHost, "bash -s")
		if code != 0 || out != fmt.Sprintf("%d\n", i) {
			t.Fatalf("command %d through the master: exit %d out %q stderr %q", i, code, out, errs)
		}
	}
	if n := o.b.conns.Load(); n != 1 {
		t.Errorf("%d SSH connections, want the master's one", n)
	}
}

func TestOpenSSHRefusals(t *testing.T) {
	f := newSSHFixture(t, nil)
	o := newOpenSSH(t, f, nil)
	o.logLevel = "INFO" // shows the server's banner
	// A key the coordinator did not vouch for.
	_, other := newKey(t)
	good := o.keyFile
	o.keyFile = filepath.Join(o.dir, "other")
	writeKeyFile(t, o.keyFile, other)
	_, errs, code := o.run("", sshHost, "true")
	if code != 255 || !strings.Contains(errs, "Permission denied") {
		t.Errorf("wrong key: exit %d stderr %q, want 255 and permission denied", code, errs)
	}
	// A login not in Logins.
	o.keyFile = good
	o.user = "daemon"
	_, errs, code = o.run("", sshHost, "true")
	if code != 255 || !strings.Contains(errs, `login "daemon" is not one of the logins`) {
		t.Errorf("login daemon: exit %d stderr %q, want 255 and the reason", code, errs)
	}
}

func TestOpenSSHDirectTCPIP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	f := newSSHFixture(t, func(c *Config) { c.Targets = map[string]string{"web": ln.Addr().String(), "db": "127.0.0.1:1"} })
	o := newOpenSSH(t, f, func(p *protocol.SSHParams) { p.Targets = []string{"web"} })
	// ssh -W is a direct-tcpip channel, as ssh -L's connections are.
	out, errs, code := o.run("ping\n", "-W", ln.Addr().String(), sshHost)
	if code != 0 || out != "ping\n" {
		t.Errorf("ssh -W to the allowed target: exit %d out %q stderr %q", code, out, errs)
	}
	o.logLevel = "INFO" // shows the channel open failure's reason
	out, errs, code = o.run("ping\n", "-W", "db:1", sshHost)
	if code == 0 || !strings.Contains(errs, "administratively prohibited") || !strings.Contains(errs, "not a target you may forward to") {
		t.Errorf("ssh -W to a refused target: exit %d out %q stderr %q", code, out, errs)
	}
}

func TestOpenSSHHostCertificateStrictChecking(t *testing.T) {
	f := newSSHFixture(t, nil)
	ca, _ := newKey(t)
	cert := &ssh.Certificate{Key: f.hostKey.PublicKey(), CertType: ssh.HostCert, KeyId: "node-a",
		ValidPrincipals: []string{"node-a", sshHost}, ValidBefore: ssh.CertTimeInfinity}
	if err := cert.SignCert(rand.Reader, ca); err != nil {
		t.Fatal(err)
	}
	o := newOpenSSH(t, f, func(p *protocol.SSHParams) { p.HostCertificate = cert.Marshal() })
	// Only the CA is known: the plain host key would not pass.
	line := "@cert-authority " + sshHost + " " + string(ssh.MarshalAuthorizedKey(ca.PublicKey()))
	if err := os.WriteFile(o.knownHosts, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errs, code := o.run("", sshHost, "echo certified")
	if code != 0 || out != "certified\n" {
		t.Fatalf("with the host certificate: exit %d out %q stderr %q", code, out, errs)
	}
	// Without the certificate the same known_hosts refuses the host.
	o2 := newOpenSSH(t, f, nil)
	os.WriteFile(o2.knownHosts, []byte(line), 0o600)
	if _, errs, code := o2.run("", sshHost, "true"); code != 255 {
		t.Errorf("without the certificate: exit %d stderr %q, want a host key failure", code, errs)
	}
}

// TestOpenSSHStartFailureSaysWhy: a command the agent cannot start (here a
// command line over the kernel's 128 KiB per argument, which ssh joins
// from two shorter ones) names the node and the reason on OpenSSH's
// stderr. The agent wrote it, then refused the exec request, and OpenSSH
// exited on the refusal ("exec request failed on channel 0") before it
// printed the stderr that came first.
func TestOpenSSHStartFailureSaysWhy(t *testing.T) {
	f := newSSHFixture(t, nil)
	o := newOpenSSH(t, f, nil)
	half := strings.Repeat("x", 100<<10)
	out, errs, code := o.run("", sshHost, "echo", half, half)
	if code != 255 || out != "" || !strings.Contains(errs, "argument list too long") || !strings.Contains(errs, "node ") {
		t.Errorf("a 200 KiB command line: exit %d, stdout %q, stderr %q; want 255 and the node and the reason on stderr", code, protocol.Clip(out), errs)
	}
	f.event(t, "of the command", func(e *protocol.SSHChannelEvent) bool {
		return e.Result == protocol.AuditFailed && strings.Contains(e.Error, "argument list too long")
	})
}

package agent

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"

	"github.com/tetherfleet/tether/agent/localpolicy"
	"github.com/tetherfleet/tether/protocol"
)

// sshFixture is an agent serving ssh streams on a harness, a client key
// the test vouches for, and the channel events the agent reported.
type sshFixture struct {
	h       *harness
	user    string
	key     ssh.Signer
	hostKey ssh.Signer
	priv    ed25519.PrivateKey // key's private half
	mu      sync.Mutex
	events  []*protocol.SSHChannelEvent
	evc     chan *protocol.SSHChannelEvent
}

func newSigner(t testing.TB) ssh.Signer {
	s, _ := newKey(t)
	return s
}

func newKey(t testing.TB) (ssh.Signer, ed25519.PrivateKey) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s, priv
}

func newSSHFixture(t testing.TB, mutate func(*Config)) *sshFixture {
	t.Helper()
	me, err := user.Current()
	if err != nil {
		t.Skipf("no current user: %v", err)
	}
	key, priv := newKey(t)
	f := &sshFixture{user: me.Username, key: key, priv: priv, evc: make(chan *protocol.SSHChannelEvent, 1024)}
	f.h = newHarnessWith(t, mutate, func(a *Agent) {
		a.testHook = func(point string, v any) {
			if point == "ssh-event" {
				ev := *v.(*protocol.SSHChannelEvent)
				f.mu.Lock()
				f.events = append(f.events, &ev)
				f.mu.Unlock()
				select {
				case f.evc <- &ev:
				default:
				}
			}
		}
	})
	if f.hostKey, err = f.h.a.sshHostKey(); err != nil {
		t.Fatal(err)
	}
	return f
}

// params are valid params vouching for f.key as f.user; mutate adjusts them.
func (f *sshFixture) params(mutate func(*protocol.SSHParams)) *protocol.SSHParams {
	b := make([]byte, 16)
	rand.Read(b)
	p := &protocol.SSHParams{
		Session: hex.EncodeToString(b), Identity: "ssh-key:" + ssh.FingerprintSHA256(f.key.PublicKey()),
		Logins: []string{f.user}, Auth: protocol.SSHAuthPublicKey, PublicKey: f.key.PublicKey().Marshal(),
	}
	if mutate != nil {
		mutate(p)
	}
	return p
}

// open opens an ssh stream with p and reads the agent's answer: the
// stream (after FrameDialOK) or the error frame.
func (f *sshFixture) open(t testing.TB, p *protocol.SSHParams) (*yamux.Stream, *protocol.ErrorInfo) {
	t.Helper()
	st, info, err := f.openStream(p)
	if err != nil {
		t.Fatal(err)
	}
	if st != nil {
		t.Cleanup(func() { st.Close() })
	}
	return st, info
}

// openStream is open without a testing.TB, for goroutines.
func (f *sshFixture) openStream(p *protocol.SSHParams) (*yamux.Stream, *protocol.ErrorInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	st, err := f.h.srv.Open(ctx, protocol.KindSSH, p)
	if err != nil {
		return nil, nil, err
	}
	// The answer frame, read byte-exactly: SSH follows it.
	var hdr [5]byte
	st.SetReadDeadline(time.Now().Add(testWait))
	if _, err := io.ReadFull(st, hdr[:]); err != nil {
		st.Close()
		return nil, nil, fmt.Errorf("read the answer to the ssh stream: %w", err)
	}
	payload := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
	if _, err := io.ReadFull(st, payload); err != nil {
		st.Close()
		return nil, nil, err
	}
	st.SetReadDeadline(time.Time{})
	switch protocol.FrameType(hdr[0]) {
	case protocol.FrameDialOK:
		return st, nil, nil
	case protocol.FrameError:
		st.Close()
		info := &protocol.ErrorInfo{}
		if err := protocol.DecodeJSON(payload, info); err != nil {
			return nil, nil, err
		}
		return nil, info, nil
	default:
		st.Close()
		return nil, nil, fmt.Errorf("answer %s frame, want dial-ok or error", protocol.FrameType(hdr[0]))
	}
}

// clientConfig logs in as f.user with f.key, checking the host key.
func (f *sshFixture) clientConfig() *ssh.ClientConfig {
	return &ssh.ClientConfig{
		User: f.user, Auth: []ssh.AuthMethod{ssh.PublicKeys(f.key)},
		HostKeyCallback: ssh.FixedHostKey(f.hostKey.PublicKey()), Timeout: testWait,
	}
}

// dial opens an ssh stream with p and runs an SSH client handshake on it.
func (f *sshFixture) dial(t testing.TB, p *protocol.SSHParams, cc *ssh.ClientConfig) (*ssh.Client, error) {
	t.Helper()
	st, info := f.open(t, p)
	if info != nil {
		t.Fatalf("ssh stream refused: %v", info)
	}
	c, chans, reqs, err := ssh.NewClientConn(st, "node-a.tether:22", cc)
	if err != nil {
		st.Close()
		return nil, err
	}
	client := ssh.NewClient(c, chans, reqs)
	t.Cleanup(func() { client.Close() })
	return client, nil
}

func (f *sshFixture) mustDial(t testing.TB) *ssh.Client {
	t.Helper()
	c, err := f.dial(t, f.params(nil), f.clientConfig())
	if err != nil {
		t.Fatalf("ssh handshake: %v", err)
	}
	return c
}

// event waits for the next channel event matching cond.
func (f *sshFixture) event(t testing.TB, what string, cond func(*protocol.SSHChannelEvent) bool) *protocol.SSHChannelEvent {
	t.Helper()
	deadline := time.After(testWait)
	for {
		select {
		case ev := <-f.evc:
			if cond(ev) {
				return ev
			}
		case <-deadline:
			t.Fatalf("no ssh channel event %s", what)
		}
	}
}

func run(t *testing.T, c *ssh.Client, cmd string, stdin string) (string, error) {
	t.Helper()
	out, _, err := runErr(t, c, cmd, stdin)
	return out, err
}

// runErr is run returning standard error too.
func runErr(t *testing.T, c *ssh.Client, cmd string, stdin string) (string, string, error) {
	t.Helper()
	s, err := c.NewSession()
	if err != nil {
		t.Fatalf("new session: %v", err)
	}
	defer s.Close()
	if stdin != "" {
		s.Stdin = strings.NewReader(stdin)
	}
	// Standard output only: the login's rc files (bash reads ~/.bashrc
	// as under sshd) may say things on standard error.
	var out, errb bytes.Buffer
	s.Stdout = &out
	s.Stderr = &errb
	err = s.Run(cmd)
	if errb.Len() > 0 {
		t.Logf("%s: stderr: %s", cmd, errb.String())
	}
	return out.String(), errb.String(), err
}

func exitStatus(err error) int {
	var ee *ssh.ExitError
	if errors.As(err, &ee) {
		return ee.ExitStatus()
	}
	if err == nil {
		return 0
	}
	return -1
}

func TestSSHExecScriptOnStdinLastStatusCounts(t *testing.T) {
	f := newSSHFixture(t, nil)
	c := f.mustDial(t)
	script := "false\necho one\nexit 4\n"
	out, stderr, err := runErr(t, c, "bash -s", script)
	if exitStatus(err) != 4 || out != "one\n" {
		t.Fatalf("bash -s: out %q err %v, want exit 4 and one", out, err)
	}
	ev := f.event(t, "for the first exec", func(e *protocol.SSHChannelEvent) bool { return e.Channel == 1 })
	sum, size := protocol.CommandDigest("", []string{"bash -s"})
	if ev.Type != protocol.SSHChannelExec || ev.Login != f.user || ev.ExitStatus == nil || *ev.ExitStatus != 4 ||
		ev.Result != protocol.AuditFailed || ev.BytesIn != int64(len(script)) || ev.BytesOut != int64(4+len(stderr)) ||
		ev.Command == nil || ev.Command.Mode != "argv" || ev.Command.SHA256 != sum || ev.Command.Size != size || ev.Command.Program != "bash" {
		t.Errorf("exec event %+v command %+v", ev, ev.Command)
	}
	// Only the last status counts: a failing command before a good one.
	out, err = run(t, c, "bash -s", "false\necho two\n")
	if err != nil || out != "two\n" {
		t.Fatalf("bash -s: out %q err %v, want success", out, err)
	}
	ev = f.event(t, "for the second exec", func(e *protocol.SSHChannelEvent) bool { return e.Channel == 2 })
	if ev.ExitStatus == nil || *ev.ExitStatus != 0 || ev.Result != protocol.AuditOK {
		t.Errorf("second exec event %+v", ev)
	}
}

func TestSSHExecRunsInHomeThroughLoginShell(t *testing.T) {
	f := newSSHFixture(t, nil)
	c := f.mustDial(t)
	out, err := run(t, c, `echo "$PWD|$HOME|$USER|$SHELL|$0"; set -- $SSH_CONNECTION; echo $#; set -- $SSH_CLIENT; echo $#`, "")
	if err != nil {
		t.Fatal(err)
	}
	acct, err := lookupAccount(f.user)
	if err != nil {
		t.Fatal(err)
	}
	home := f.h.a.baseDir(acct)
	if want := home + "|" + acct.home + "|" + f.user + "|" + acct.shellPath() + "|" + acct.shellPath() + "\n4\n3\n"; out != want {
		t.Errorf("environment %q, want %q", out, want)
	}
}

func TestSSHExitSignalAndSignalRequest(t *testing.T) {
	f := newSSHFixture(t, nil)
	c := f.mustDial(t)
	_, err := run(t, c, "kill -TERM $$", "")
	var ee *ssh.ExitError
	if !errors.As(err, &ee) || ee.Signal() != "TERM" {
		t.Fatalf("kill -TERM $$: %v, want exit-signal TERM", err)
	}
	ev := f.event(t, "of the killed exec", func(e *protocol.SSHChannelEvent) bool { return e.Channel == 1 })
	if ev.ExitSignal != "TERM" || ev.ExitStatus != nil || ev.Result != protocol.AuditFailed {
		t.Errorf("event %+v", ev)
	}

	// A signal request reaches the command's process group.
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	out, _ := s.StdoutPipe()
	if err := s.Start("echo ready; exec sleep 1000"); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 6)
	if _, err := io.ReadFull(out, line); err != nil {
		t.Fatal(err)
	}
	if err := s.Signal(ssh.SIGINT); err != nil {
		t.Fatal(err)
	}
	err = s.Wait()
	if !errors.As(err, &ee) || ee.Signal() != "INT" {
		t.Fatalf("after signal INT: %v, want exit-signal INT", err)
	}
}

func TestSSHPTYSizeAndWindowChange(t *testing.T) {
	f := newSSHFixture(t, nil)
	c := f.mustDial(t)
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.RequestPty("xterm-256color", 33, 101, ssh.TerminalModes{}); err != nil {
		t.Fatal(err)
	}
	in, _ := s.StdinPipe()
	out, _ := s.StdoutPipe()
	// The loop prints the size once per line read: a window-change is a
	// channel request, handled beside the data, so the test asks again
	// until the new size shows (an ssh client's resize has the same
	// ordering).
	if err := s.Start(`stty size; echo "T=$TERM"; while read x; do stty size; [ "$x" = q ] && break; done; [ "$SSH_TTY" = "$(tty)" ] && echo TTY-OK`); err != nil {
		t.Fatal(err)
	}
	var got bytes.Buffer
	buf := make([]byte, 4096)
	readUntil := func(want string) {
		for !strings.Contains(got.String(), want) {
			n, err := out.Read(buf)
			got.Write(buf[:n])
			if err != nil {
				t.Fatalf("terminal output %q without %q: %v", got.String(), want, err)
			}
		}
	}
	readUntil("T=xterm-256color")
	if !strings.HasPrefix(got.String(), "33 101\r\n") {
		t.Errorf("stty size on the terminal: %q, want 33 101", got.String())
	}
	if err := s.WindowChange(50, 120); err != nil {
		t.Fatal(err)
	}
	for i := 0; !strings.Contains(got.String(), "50 120"); i++ {
		if i == 200 {
			t.Fatalf("the window change never showed: %q", got.String())
		}
		sizes := func() int { return strings.Count(got.String(), "33 101") + strings.Count(got.String(), "50 120") }
		mark := sizes()
		in.Write([]byte("\n"))
		for sizes() == mark {
			n, err := out.Read(buf)
			got.Write(buf[:n])
			if err != nil {
				t.Fatalf("terminal output %q: %v", got.String(), err)
			}
		}
	}
	in.Write([]byte("q\n"))
	readUntil("TTY-OK")
	if err := s.Wait(); err != nil {
		t.Errorf("wait: %v (output %q)", err, got.String())
	}
	ev := f.event(t, "of the pty exec", func(e *protocol.SSHChannelEvent) bool { return e.Channel == 1 })
	if ev.Command == nil || ev.Command.Program != "pty" || ev.Type != protocol.SSHChannelExec {
		t.Errorf("pty event %+v", ev)
	}
}

func TestSSHEnvAllowList(t *testing.T) {
	f := newSSHFixture(t, func(c *Config) { c.SSHAcceptEnv = []string{"CUSTOM_*"} })
	c := f.mustDial(t)
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Setenv("LANG", "C.UTF-8"); err != nil {
		t.Errorf("LANG refused: %v", err)
	}
	if err := s.Setenv("CUSTOM_X", "y"); err != nil {
		t.Errorf("CUSTOM_X (configured) refused: %v", err)
	}
	if err := s.Setenv("LD_PRELOAD", "/tmp/evil.so"); err == nil {
		t.Error("LD_PRELOAD accepted")
	}
	out, err := s.Output(`echo "$LANG/${LD_PRELOAD-unset}/$CUSTOM_X"`)
	if err != nil || string(out) != "C.UTF-8/unset/y\n" {
		t.Errorf("env: %q %v", out, err)
	}
	ev := f.event(t, "of the exec", func(e *protocol.SSHChannelEvent) bool { return e.Channel == 1 })
	if ev.Command == nil || strings.Join(ev.Command.EnvKeys, ",") != "CUSTOM_X,LANG" {
		t.Errorf("event env keys %+v", ev.Command)
	}
}

func TestSSHBinaryCleanStdinStdout(t *testing.T) {
	f := newSSHFixture(t, nil)
	c := f.mustDial(t)
	data := make([]byte, 3<<20+17)
	rand.Read(data)
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Stdin = bytes.NewReader(data)
	var stderr bytes.Buffer
	s.Stderr = &stderr
	out, err := s.Output("cat")
	if err != nil || !bytes.Equal(out, data) {
		t.Fatalf("cat of %d random bytes: got %d bytes, equal %v, err %v", len(data), len(out), bytes.Equal(out, data), err)
	}
	ev := f.event(t, "of cat", func(e *protocol.SSHChannelEvent) bool { return e.Channel == 1 })
	if ev.BytesIn != int64(len(data)) || ev.BytesOut != int64(len(data)+stderr.Len()) {
		t.Errorf("bytes in %d out %d, want %d and %d (stdout and stderr)", ev.BytesIn, ev.BytesOut, len(data), len(data)+stderr.Len())
	}
}

func TestSSHManyChannelsOneConnection(t *testing.T) {
	f := newSSHFixture(t, nil)
	c := f.mustDial(t)
	for i := range 20 {
		out, err := run(t, c, fmt.Sprintf("echo %d", i), "")
		if err != nil || out != fmt.Sprintf("%d\n", i) {
			t.Fatalf("command %d: %q %v", i, out, err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := c.NewSession()
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			out, err := s.Output(fmt.Sprintf("sleep 0.1; echo c%d", i))
			if err != nil || string(out) != fmt.Sprintf("c%d\n", i) {
				errs <- fmt.Errorf("concurrent %d: %q %v", i, out, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestSSHWrongKeyRefused(t *testing.T) {
	f := newSSHFixture(t, nil)
	cc := f.clientConfig()
	cc.Auth = []ssh.AuthMethod{ssh.PublicKeys(newSigner(t))}
	if _, err := f.dial(t, f.params(nil), cc); err == nil {
		t.Fatal("a key the coordinator did not vouch for logged in")
	}
	ev := f.event(t, "auth", func(e *protocol.SSHChannelEvent) bool { return e.Type == protocol.SSHChannelAuth })
	if ev.Result != protocol.AuditRefused || !strings.Contains(ev.Error, "not the key the coordinator vouched for") || ev.Channel != 0 {
		t.Errorf("auth event %+v", ev)
	}
}

// claimSigner claims the vouched key but signs with another: it cannot
// prove the vouched key.
type claimSigner struct {
	claimed ssh.PublicKey
	real    ssh.Signer
}

func (s claimSigner) PublicKey() ssh.PublicKey { return s.claimed }
func (s claimSigner) Sign(r io.Reader, data []byte) (*ssh.Signature, error) {
	return s.real.Sign(r, data)
}

// The CVE-2024-45337 pattern: the client offers the vouched key (the
// server's query answer is yes) without being able to sign for it, then
// signs with a key it holds. Neither may log in.
func TestSSHOfferedVouchedKeyThenAnotherSignedRefused(t *testing.T) {
	f := newSSHFixture(t, nil)
	other := newSigner(t)
	cc := f.clientConfig()
	cc.Auth = []ssh.AuthMethod{ssh.PublicKeys(claimSigner{claimed: f.key.PublicKey(), real: other}, other)}
	if c, err := f.dial(t, f.params(nil), cc); err == nil {
		out, _ := run(t, c, "id -un", "")
		t.Fatalf("logged in having only offered the vouched key (ran as %q)", out)
	}
	f.event(t, "auth refused", func(e *protocol.SSHChannelEvent) bool {
		return e.Type == protocol.SSHChannelAuth && e.Result == protocol.AuditRefused
	})
}

func TestSSHLoginNotInLoginsRefused(t *testing.T) {
	f := newSSHFixture(t, nil)
	cc := f.clientConfig()
	cc.User = "daemon"
	var banner string
	cc.BannerCallback = func(m string) error { banner = m; return nil }
	if _, err := f.dial(t, f.params(nil), cc); err == nil {
		t.Fatal("a login not in Logins logged in")
	}
	if !strings.Contains(banner, `login "daemon" is not one of the logins`) {
		t.Errorf("banner %q: want the reason", banner)
	}
	ev := f.event(t, "auth", func(e *protocol.SSHChannelEvent) bool { return e.Type == protocol.SSHChannelAuth })
	if ev.Result != protocol.AuditRefused || !strings.Contains(ev.Error, "daemon") {
		t.Errorf("auth event %+v", ev)
	}
}

func TestSSHAuthNone(t *testing.T) {
	f := newSSHFixture(t, nil)
	p := f.params(func(p *protocol.SSHParams) { p.Auth, p.PublicKey = protocol.SSHAuthNone, nil })
	cc := f.clientConfig()
	cc.Auth = nil
	c, err := f.dial(t, p, cc)
	if err != nil {
		t.Fatalf("auth none: %v", err)
	}
	if out, err := run(t, c, "echo in", ""); err != nil || out != "in\n" {
		t.Errorf("%q %v", out, err)
	}
	// A publickey connection does not take "none".
	if _, err := f.dial(t, f.params(nil), cc); err == nil {
		t.Error("auth none accepted on a publickey connection")
	}
}

func TestSSHStreamRefusals(t *testing.T) {
	f := newSSHFixture(t, nil)
	if _, info := f.open(t, f.params(func(p *protocol.SSHParams) { p.Session = "x" })); info == nil || info.Code != protocol.CodeBadRequest {
		t.Errorf("bad session: %v, want bad_request", info)
	}
	// No local policy: only the agent's own account may log in.
	other := "daemon"
	if f.user == "daemon" {
		other = "nobody"
	}
	_, info := f.open(t, f.params(func(p *protocol.SSHParams) { p.Logins = []string{other} }))
	if info == nil || info.Code != protocol.CodeForbidden || !strings.Contains(info.Message, other) {
		t.Errorf("login %s: %v, want forbidden naming it", other, info)
	}
}

func TestSSHHandshakeDeadline(t *testing.T) {
	f := newSSHFixture(t, func(c *Config) { c.HandshakeTimeout = 200 * time.Millisecond })
	st, info := f.open(t, f.params(nil))
	if info != nil {
		t.Fatal(info)
	}
	// A client that never speaks: the agent gives up and closes.
	st.SetReadDeadline(time.Now().Add(testWait))
	if _, err := io.Copy(io.Discard, st); err != nil {
		t.Fatalf("stream did not end with EOF: %v", err)
	}
	f.event(t, "auth", func(e *protocol.SSHChannelEvent) bool { return e.Type == protocol.SSHChannelAuth })
}

func TestSSHDirectTCPIP(t *testing.T) {
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
	addr := ln.Addr().String()
	f := newSSHFixture(t, func(c *Config) { c.Targets = map[string]string{"web": addr, "db": "127.0.0.1:1"} })
	c, err := f.dial(t, f.params(func(p *protocol.SSHParams) { p.Targets = []string{"web", "openshell"} }), f.clientConfig())
	if err != nil {
		t.Fatal(err)
	}
	// Granted, but not a target of this node: that is the reason given,
	// not the policy.
	if conn, err := c.Dial("tcp", "openshell:8080"); err == nil {
		conn.Close()
		t.Error("forward to openshell:8080 allowed on a node without it")
	} else if !strings.Contains(err.Error(), `node node-a has no target \"openshell\" (it serves: db, web)`) { // quoted by ssh's rejection
		t.Errorf("forward to openshell:8080: %v, want the node's lack of it named", err)
	}
	for _, dest := range []string{addr, "web:9"} {
		conn, err := c.Dial("tcp", dest)
		if err != nil {
			t.Fatalf("forward to %s: %v", dest, err)
		}
		conn.Write([]byte("ping"))
		buf := make([]byte, 4)
		if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "ping" {
			t.Errorf("forward to %s: %q %v", dest, buf, err)
		}
		conn.Close()
	}
	for _, dest := range []string{"127.0.0.1:1", "db:1", "example.com:80"} {
		if conn, err := c.Dial("tcp", dest); err == nil {
			conn.Close()
			t.Errorf("forward to %s allowed", dest)
		} else if !strings.Contains(err.Error(), "not a target you may forward to") {
			t.Errorf("forward to %s: %v, want the reason", dest, err)
		}
	}
	ev := f.event(t, "forward", func(e *protocol.SSHChannelEvent) bool {
		return e.Type == protocol.SSHChannelForward && e.Result == protocol.AuditOK
	})
	if ev.Target != "web" || ev.BytesIn != 4 || ev.BytesOut != 4 {
		t.Errorf("forward event %+v", ev)
	}
	f.event(t, "refused forward", func(e *protocol.SSHChannelEvent) bool {
		return e.Type == protocol.SSHChannelForward && e.Result == protocol.AuditRefused
	})
}

func TestSSHSFTPSubsystem(t *testing.T) {
	f := newSSHFixture(t, nil)
	c := f.mustDial(t)
	sc, err := sftp.NewClient(c)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	wd, err := sc.Getwd()
	acct, _ := lookupAccount(f.user)
	if err != nil || wd != f.h.a.baseDir(acct) {
		t.Errorf("sftp working directory %q %v, want the home %s", wd, err, f.h.a.baseDir(acct))
	}
	dir := t.TempDir()
	data := make([]byte, 1<<20+3)
	rand.Read(data)
	w, err := sc.Create(filepath.Join(dir, "up"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if got, err := os.ReadFile(filepath.Join(dir, "up")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("uploaded file differs: %v", err)
	}
	r, err := sc.Open(filepath.Join(dir, "up"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(r)
	r.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("downloaded file differs: %v", err)
	}
	sc.Close()
	ev := f.event(t, "sftp", func(e *protocol.SSHChannelEvent) bool { return e.Type == protocol.SSHChannelSubsystem })
	if ev.Subsystem != "sftp" || ev.BytesIn < int64(len(data)) || ev.BytesOut < int64(len(data)) {
		t.Errorf("sftp event %+v", ev)
	}
}

func TestSSHCloseKillsProcessGroup(t *testing.T) {
	f := newSSHFixture(t, nil)
	c := f.mustDial(t)
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	out, _ := s.StdoutPipe()
	if err := s.Start("sleep 1000 & echo $!; wait"); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 0, 16)
	b := make([]byte, 1)
	for len(line) == 0 || line[len(line)-1] != '\n' {
		if _, err := out.Read(b); err != nil {
			t.Fatal(err)
		}
		line = append(line, b[0])
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(line)))
	if err != nil {
		t.Fatal(err)
	}
	c.Close() // the connection goes: its channels' processes too
	waitFor(t, testWait, "the background sleep to die", func() bool {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return true
		}
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		return bytes.Contains(st, []byte(") Z "))
	})
	ev := f.event(t, "of the killed channel", func(e *protocol.SSHChannelEvent) bool { return e.Channel == 1 })
	if ev.Result != protocol.AuditFailed {
		t.Errorf("event %+v", ev)
	}
}

// Events reach the coordinator on the control stream.
func TestSSHEventOnControlStream(t *testing.T) {
	f := newSSHFixture(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	type accepted struct {
		st  *yamux.Stream
		err error
	}
	acc := make(chan accepted, 1)
	go func() {
		st, err := f.h.srv.AcceptRaw(ctx)
		if err == nil {
			_, err = f.h.srv.ReadHeader(st)
		}
		acc <- accepted{st, err}
	}()
	ctl, err := f.h.client.Open(ctx, protocol.KindControl, protocol.ControlParams{})
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	a := <-acc
	if a.err != nil {
		t.Fatal(a.err)
	}
	defer a.st.Close()
	f.h.a.ctl.Store(ctl)
	defer f.h.a.ctl.Store(nil)
	c := f.mustDial(t)
	if _, err := run(t, c, "exit 3", ""); exitStatus(err) != 3 {
		t.Fatalf("exit 3: %v", err)
	}
	a.st.SetReadDeadline(time.Now().Add(testWait))
	fr, err := protocol.NewFrameReader(a.st).Next()
	if err != nil {
		t.Fatal(err)
	}
	var ev protocol.SSHChannelEvent
	if fr.Type != protocol.FrameSSHChannel {
		t.Fatalf("control frame %s, want ssh-channel", fr.Type)
	}
	if err := protocol.DecodeJSON(fr.Payload, &ev); err != nil {
		t.Fatal(err)
	}
	if ev.ExitStatus == nil || *ev.ExitStatus != 3 || ev.Channel != 1 || ev.Type != protocol.SSHChannelExec || ev.End.Before(ev.Start) {
		t.Errorf("event %+v", ev)
	}
}

// An event fits a control frame whatever the client sets.
func TestSSHEventFitsAControlFrame(t *testing.T) {
	f := newSSHFixture(t, nil)
	c := f.mustDial(t)
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 200 {
		if err := s.Setenv(fmt.Sprintf("LC_%03d_%s", i, strings.Repeat("x", 200)), "v"); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Run(strings.Repeat("true ", 1000)); err != nil {
		t.Fatal(err)
	}
	ev := f.event(t, "of the exec", func(e *protocol.SSHChannelEvent) bool { return e.Channel == 1 })
	b, err := protocol.MarshalJSON(ev)
	if err != nil || len(b) > protocol.MaxControlFrameSize {
		t.Errorf("event of %d bytes (%v), over %d", len(b), err, protocol.MaxControlFrameSize)
	}
	if n := len(ev.Command.EnvKeys); n != 17 || ev.Command.EnvKeys[16] != "(184 more)" {
		t.Errorf("env keys %d, last %q", n, ev.Command.EnvKeys[n-1])
	}
}

// A host certificate of the agent's key is offered; one of another key is
// not (the plain key still is).
func TestSSHHostCertificateOfferedOnlyWhenItCertifiesTheHostKey(t *testing.T) {
	f := newSSHFixture(t, nil)
	ca := newSigner(t)
	certify := func(key ssh.PublicKey) []byte {
		c := &ssh.Certificate{Key: key, CertType: ssh.HostCert, ValidPrincipals: []string{"node-a", sshHost}, ValidBefore: ssh.CertTimeInfinity}
		if err := c.SignCert(rand.Reader, ca); err != nil {
			t.Fatal(err)
		}
		return c.Marshal()
	}
	checker := &ssh.CertChecker{IsHostAuthority: func(auth ssh.PublicKey, _ string) bool {
		return bytes.Equal(auth.Marshal(), ca.PublicKey().Marshal())
	}}
	certOnly := func() *ssh.ClientConfig {
		cc := f.clientConfig()
		cc.HostKeyAlgorithms = []string{ssh.CertAlgoED25519v01}
		cc.HostKeyCallback = checker.CheckHostKey
		return cc
	}
	p := f.params(func(p *protocol.SSHParams) { p.HostCertificate = certify(f.hostKey.PublicKey()) })
	if _, err := f.dial(t, p, certOnly()); err != nil {
		t.Fatalf("host certificate of the host key: %v", err)
	}
	p = f.params(func(p *protocol.SSHParams) { p.HostCertificate = certify(newSigner(t).PublicKey()) })
	if _, err := f.dial(t, p, certOnly()); err == nil {
		t.Error("a certificate of another key was offered")
	}
	if _, err := f.dial(t, p, f.clientConfig()); err != nil {
		t.Errorf("plain host key beside a refused certificate: %v", err)
	}
}

// A process that left the channel's process group (setsid) but holds its
// output does not keep the channel open once the client closed it.
func TestSSHChannelCloseAbandonsOutputHeldOutsideTheGroup(t *testing.T) {
	f := newSSHFixture(t, nil)
	c := f.mustDial(t)
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	out, _ := s.StdoutPipe()
	// The pid comes from the detached process itself, once it is out of
	// the group; the leader waits, so the close kills it.
	if err := s.Start("setsid sh -c 'echo $$; exec sleep 1000' & wait"); err != nil {
		t.Fatal(err)
	}
	var line []byte
	b := make([]byte, 1)
	for len(line) == 0 || line[len(line)-1] != '\n' {
		if _, err := out.Read(b); err != nil {
			t.Fatal(err)
		}
		line = append(line, b[0])
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(line)))
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pid, syscall.SIGKILL)
	s.Close()
	ev := f.event(t, "of the closed channel", func(e *protocol.SSHChannelEvent) bool { return e.Channel == 1 })
	if ev.Result != protocol.AuditFailed || ev.ExitSignal == "" {
		t.Errorf("event %+v: want the killed leader's signal", ev)
	}
	if err := syscall.Kill(pid, 0); err != nil {
		t.Errorf("the detached process %d is gone (%v): the test proved nothing", pid, err)
	}
	// The connection still serves.
	if out, err := run(t, c, "echo still", ""); err != nil || out != "still\n" {
		t.Errorf("after the abandoned channel: %q %v", out, err)
	}
}

// The local policy decides per request: here commands but no shells, and
// no forwarding.
func TestSSHLocalPolicyPerRequest(t *testing.T) {
	me, err := user.Current()
	if err != nil {
		t.Skip(err)
	}
	lp, err := localpolicy.Parse("/etc/tether/local-policy.yaml", []byte(fmt.Sprintf(
		"version: 1\nusers:\n  - name: %s\nexec: true\nshell: false\nforward: false\n", me.Username)))
	if err != nil {
		t.Fatal(err)
	}
	f := newSSHFixture(t, func(c *Config) {
		c.LocalPolicy = lp
		c.Targets = map[string]string{"web": "127.0.0.1:1"}
	})
	c, err := f.dial(t, f.params(func(p *protocol.SSHParams) { p.Targets = []string{"web"} }), f.clientConfig())
	if err != nil {
		t.Fatal(err)
	}
	if out, err := run(t, c, "echo ok", ""); err != nil || out != "ok\n" {
		t.Errorf("exec allowed by the local policy: %q %v", out, err)
	}
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	// The request is refused as a command that fails: exit status 255,
	// the reason on stderr (OpenSSH drops the stderr of a request it was
	// refused).
	var errb bytes.Buffer
	s.Stderr = &errb
	if err := s.Shell(); err != nil {
		t.Fatalf("shell request: %v", err)
	}
	var ee *ssh.ExitError
	if err := s.Wait(); !errors.As(err, &ee) || ee.ExitStatus() != 255 || !strings.Contains(errb.String(), `no "shell: true" rule`) {
		t.Errorf("shell although the local policy says shell: false: %v, stderr %q; want exit status 255 and the reason", err, errb.String())
	}
	s.Close()
	ev := f.event(t, "of the refused shell", func(e *protocol.SSHChannelEvent) bool { return e.Type == protocol.SSHChannelShell })
	if ev.Result != protocol.AuditRefused || !strings.Contains(ev.Error, "local-policy.yaml") {
		t.Errorf("shell event %+v", ev)
	}
	if conn, err := c.Dial("tcp", "web:1"); err == nil {
		conn.Close()
		t.Error("forward allowed although the local policy says forward: false")
	}
}

// An SSH login's environment is a login's, not the agent's.
func TestSSHLoginEnvironmentIsNotTheAgents(t *testing.T) {
	t.Setenv("TETHER_TEST_AGENT_ONLY", "leaked")
	f := newSSHFixture(t, nil)
	c := f.mustDial(t)
	out, err := run(t, c, `echo "${TETHER_TEST_AGENT_ONLY-unset} ${PATH:+path}"`, "")
	if err != nil || out != "unset path\n" {
		t.Errorf("environment: %q %v, want the agent's variable unset and PATH set", out, err)
	}
}

// An SSH command takes one of the node's MaxExecs slots while it runs, as
// an exec stream does, so SSH cannot run more processes than the node
// allows; the slot comes back when the command ends.
func TestSSHCommandsTakeExecSlots(t *testing.T) {
	f := newSSHFixture(t, func(c *Config) { c.MaxExecs = 1 })
	c := f.mustDial(t)
	hold, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	in, _ := hold.StdinPipe()
	if err := hold.Start("cat"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, testWait, "the first command holds the slot", func() bool { return f.h.a.running.Load() == 1 })
	if _, _, err := runErr(t, c, "true", ""); err == nil {
		t.Fatal("a second command started past MaxExecs")
	}
	ev := f.event(t, "of the command past the limit", func(e *protocol.SSHChannelEvent) bool { return e.Result == protocol.AuditFailed })
	if !strings.Contains(ev.Error, "running 1 execs, its limit") {
		t.Fatalf("refused command's event %+v; want the exec limit", ev)
	}
	in.Close()
	if err := hold.Wait(); err != nil {
		t.Fatalf("first command: %v", err)
	}
	waitFor(t, testWait, "the slot is back", func() bool { return f.h.a.running.Load() == 0 })
	if out, err := run(t, c, "echo again", ""); err != nil || out != "again\n" {
		t.Fatalf("after the slot came back: %q %v", out, err)
	}
}

package sshgate

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// TestBulkThroughJump: 2 MiB of random bytes go to the node's cat and back
// through OpenSSH's ProxyJump intact, stdin's end reaching the node (cat
// exits), and the audit counts at least the payload each way.
func TestBulkThroughJump(t *testing.T) {
	e := newEnv(t)
	payload := make([]byte, 2<<20)
	rand.Read(payload)
	in := filepath.Join(t.TempDir(), "in")
	if err := os.WriteFile(in, payload, 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := e.runSSH(sshOpts{key: e.bob, dest: "bob@node-a", cmd: []string{"cat"}, stdin: in})
	if code != 0 {
		t.Fatalf("ssh cat exited %d: %s", code, stderr)
	}
	if sha256.Sum256([]byte(stdout)) != sha256.Sum256(payload) {
		t.Fatalf("got %d bytes back, not the %d sent", len(stdout), len(payload))
	}
	// The channel is audited when the gate's side of it ends, which may be
	// after ssh exits.
	waitFor(t, "the channel audited", func() bool { return len(e.audit.events()) != 0 })
	evs := e.audit.events()
	if len(evs) != 1 || evs[0].BytesIn < int64(len(payload)) || evs[0].BytesOut < int64(len(payload)) {
		t.Errorf("audit %+v: want at least the payload counted each way", evs)
	}
}

// TestHandshakeTimeout: a client that never speaks is cut and counted.
func TestHandshakeTimeout(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.HandshakeTimeout = 200 * time.Millisecond })
	c, err := net.Dial("tcp", e.addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(c); err != nil {
		t.Fatalf("the gate did not close the silent connection: %v", err)
	}
	waitFor(t, "the timeout counted", func() bool { return e.conns(connTimeout) == 1 })
}

// TestMaxConnections: past MaxConnections a connection is closed unread.
func TestMaxConnections(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxConnections = 1 })
	held, err := e.dial(e.bob.signer)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if c, err := e.dial(e.bob.signer); err == nil {
		c.Close()
		t.Fatal("a second connection got in")
	}
	waitFor(t, "the refusal counted", func() bool { return e.conns(connLimit) == 1 })
}

// TestShutdown: Shutdown waits for an authenticated connection's channel,
// and when its context ends it cuts it and returns the context's error;
// Serve returns ErrClosed and later connections are refused.
func TestShutdown(t *testing.T) {
	e := newEnv(t)
	c, err := e.dial(e.bob.signer)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sess := openSession(t, c, "node-a", e.bob.signer)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.gate.Shutdown(ctx) }()
	// Still served while Shutdown waits.
	if out, err := sess.Output("whoami"); err != nil || string(out) != "bob\n" {
		t.Fatalf("during Shutdown: %q, %v", out, err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Shutdown = %v, want context.Canceled", err)
	}
	if _, err := net.Dial("tcp", e.addr.String()); err == nil {
		t.Error("the listener still accepts")
	}
	if err := e.gate.Shutdown(context.Background()); err != nil {
		t.Errorf("second Shutdown: %v", err)
	}
}

// openSession logs in to node through the gate connection c (the inner
// SSH connection over a direct-tcpip channel) and opens a session.
func openSession(t *testing.T, c *ssh.Client, node string, signer ssh.Signer) *ssh.Session {
	t.Helper()
	ch, err := openDirect(c, node, 22)
	if err != nil {
		t.Fatal(err)
	}
	a, b := net.Pipe()
	go func() { copyCounting(ch, b, nopCounter{}); ch.CloseWrite() }()
	go func() { copyCounting(b, ch, nopCounter{}); b.Close() }()
	sc, chans, reqs, err := ssh.NewClientConn(a, node, &ssh.ClientConfig{
		User: "bob", Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: ssh.InsecureIgnoreHostKey(),
	})
	if err != nil {
		t.Fatal(err)
	}
	inner := ssh.NewClient(sc, chans, reqs)
	t.Cleanup(func() { inner.Close() })
	s, err := inner.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

type nopCounter struct{}

func (nopCounter) Add(float64) {}

// TestStuckNode: a node that never closes its stream after the client's
// end of file cannot hold the channel once the client disconnects: the
// channel ends, is audited, and Close returns (the env's cleanup).
func TestStuckNode(t *testing.T) {
	e := newEnv(t)
	e.nodes.nodes["node-s"] = &fakeNode{labels: map[string]string{}, hostKey: newSigner(t), stuck: true}
	c, err := e.dial(e.bob.signer)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := openDirect(c, "node-s", 22)
	if err != nil {
		t.Fatal(err)
	}
	ch.Write([]byte("SSH-2.0-test\r\n"))
	ch.CloseWrite()
	waitFor(t, "the bytes relayed", func() bool { return testutilBytes(e, "in") == 14 })
	if n := len(e.audit.events()); n != 0 {
		t.Fatalf("the channel ended (%d events) while the client holds it", n)
	}
	c.Close()
	waitFor(t, "the channel audited", func() bool { return len(e.audit.events()) == 1 })
	if ev := e.audit.events()[0]; ev.BytesIn != 14 {
		t.Errorf("audit %+v: want 14 bytes in", ev)
	}
}

// TestServeAfterClose: a closed gate serves nothing.
func TestServeAfterClose(t *testing.T) {
	e := newEnv(t)
	e.gate.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.gate.Serve(l); !errors.Is(err, ErrClosed) {
		t.Errorf("Serve after Close = %v, want ErrClosed", err)
	}
	if _, err := net.Dial("tcp", l.Addr().String()); err == nil {
		t.Error("Serve left its listener open")
	}
}

// TestControlMasterThroughJump: NeMo Gym's pattern, a ControlMaster that
// later commands multiplex over, goes through one direct-tcpip channel.
func TestControlMasterThroughJump(t *testing.T) {
	e := newEnv(t)
	sock := filepath.Join(t.TempDir(), "cm")
	master := []string{"-o", "ControlMaster=yes", "-o", "ControlPersist=60", "-o", "ControlPath=" + sock, "-N", "-f"}
	if code, _, stderr := e.runSSH(sshOpts{key: e.bob, dest: "bob@node-a", pre: master}); code != 0 {
		t.Fatalf("master: exit %d: %s", code, stderr)
	}
	defer e.runSSH(sshOpts{key: e.bob, dest: "bob@node-a", pre: []string{"-o", "ControlPath=" + sock, "-O", "exit"}})
	for i := range 5 {
		code, stdout, stderr := e.runSSH(sshOpts{key: e.bob, dest: "bob@node-a", cmd: []string{"whoami"},
			pre: []string{"-o", "ControlMaster=no", "-o", "ControlPath=" + sock}})
		if code != 0 || stdout != "bob\n" {
			t.Fatalf("command %d: exit %d, %q, %s", i, code, stdout, stderr)
		}
	}
	if params, _ := e.nodes.recorded(); len(params) != 1 {
		t.Errorf("%d streams opened, want the master's one", len(params))
	}
}

package sshgate

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// swapPolicy is a Policy whose rules a test replaces, as a reload does
// with the policy.Store.
type swapPolicy struct{ p atomic.Pointer[policy.Policy] }

func (s *swapPolicy) Grants(id policy.Identity, op policy.Operation, n policy.Node) ([]policy.Grant, error) {
	return s.p.Load().Grants(id, op, n)
}

func (s *swapPolicy) Peek(id policy.Identity, op policy.Operation, n policy.Node) ([]policy.Grant, error) {
	return s.p.Load().Peek(id, op, n)
}

// withSwapPolicy makes the env's policy replaceable through sp.
func withSwapPolicy(sp *swapPolicy) envOption {
	return func(c *Config) {
		sp.p.Store(c.Policy.(*policy.Policy))
		c.Policy = sp
	}
}

func (sp *swapPolicy) set(t *testing.T, text string) {
	t.Helper()
	p, err := policy.Parse("policy.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	sp.p.Store(p)
}

// innerClient logs in to node as user over a direct-tcpip channel of the
// gate connection c, as ssh -J does: the inner SSH connection.
func innerClient(t *testing.T, c *ssh.Client, node, user string, signer ssh.Signer) *ssh.Client {
	t.Helper()
	ch, err := openDirect(c, node, 22)
	if err != nil {
		t.Fatal(err)
	}
	a, b := net.Pipe()
	go func() { copyCounting(ch, b, nopCounter{}); ch.CloseWrite() }()
	go func() { copyCounting(b, ch, nopCounter{}); b.Close() }()
	sc, chans, reqs, err := ssh.NewClientConn(a, node, &ssh.ClientConfig{
		User: user, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: ssh.InsecureIgnoreHostKey(),
	})
	if err != nil {
		t.Fatal(err)
	}
	inner := ssh.NewClient(sc, chans, reqs)
	t.Cleanup(func() { inner.Close() })
	return inner
}

// run runs cmd in a new session of inner and returns its output.
func run(inner *ssh.Client, cmd string) (string, error) {
	s, err := inner.NewSession()
	if err != nil {
		return "", err
	}
	defer s.Close()
	out, err := s.Output(cmd)
	return string(out), err
}

// waitClosed fails unless c's connection ends (its Wait returns) within
// 10 s.
func waitClosed(t *testing.T, what string, c interface{ Wait() error }) {
	t.Helper()
	done := make(chan struct{})
	go func() { c.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s still open 10 s after the reload", what)
	}
}

// revokedEvent returns the one audit event of a revoked channel to node.
func revokedEvent(t *testing.T, e *env, node string) protocol.AuditEvent {
	t.Helper()
	var found []protocol.AuditEvent
	waitFor(t, "the revoked channel audited", func() bool {
		found = nil
		for _, ev := range e.audit.events() {
			if slices.Equal(ev.Nodes, []string{node}) && ev.Reason == protocol.AuditReasonRevoked {
				found = append(found, ev)
			}
		}
		return len(found) != 0
	})
	if len(found) != 1 {
		t.Fatalf("%d revoked events for %s: %+v", len(found), node, found)
	}
	return found[0]
}

// TestReloadClosesUntrustedConnections: a ControlMaster-like connection
// (one gate connection, one direct-tcpip channel, an inner SSH connection
// that later sessions multiplex over) whose key leaves the authorized keys
// file, or whose certificate's CA leaves the CA file, is closed by the
// reload: the inner connection, the channel and the gate connection end,
// the channel is audited as revoked and counted.
func TestReloadClosesUntrustedConnections(t *testing.T) {
	for _, tc := range []struct {
		name, file, why string
		empty           bool // the file keeps no key at all
	}{
		{name: "key removed", file: "authorized_keys", why: "no longer an authorized key"},
		{name: "CA removed", file: "user_ca.pub", why: "no longer trusted"},
		// Emptying the file is how an operator revokes every key in it
		// (the fresh-user pass fresh17b: the reload failed, "no
		// authorized key in the file", and the keys stayed in force).
		{name: "file emptied", file: "authorized_keys", why: "no longer an authorized key", empty: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			signer, user, keep := e.bob.signer, "bob", e.alice.signer
			if tc.file == "user_ca.pub" {
				cert := certTemplate(e.carol.signer.PublicKey(), "carol")
				signRaw(t, cert, e.userCA, nil)
				signer, user, keep = certSigner(t, cert, e.carol.signer), "carol", e.otherCA
			}
			c, err := e.dial(signer)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			inner := innerClient(t, c, "node-a", user, signer)
			if out, err := run(inner, "whoami"); err != nil || out != user+"\n" {
				t.Fatalf("before the reload: %q, %v", out, err)
			}
			// The file now trusts another key only.
			line := ssh.MarshalAuthorizedKey(keep.PublicKey())
			if tc.file == "user_ca.pub" {
				line = append([]byte("cert-authority "), line...)
			}
			if tc.empty {
				line = []byte("# revoked\n")
			}
			if err := os.WriteFile(filepath.Join(e.dir, tc.file), line, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := e.gate.Reload(); err != nil {
				t.Fatal(err)
			}
			waitClosed(t, "the inner connection", inner)
			waitClosed(t, "the gate connection", c)
			if out, err := run(inner, "whoami"); err == nil {
				t.Errorf("a session after the reload ran: %q", out)
			}
			ev := revokedEvent(t, e, "node-a")
			if ev.Result != protocol.AuditFailed || !strings.Contains(ev.Error, tc.why) {
				t.Errorf("audit event %+v: want failed, with %q", ev, tc.why)
			}
			waitFor(t, "the channel counted", func() bool { return e.channels(chanRevoked) == 1 })
			if n := e.revokedConns(); n != 1 {
				t.Errorf("%v connections counted revoked, want 1", n)
			}
		})
	}
}

// TestRecheckClosesRevokedChannels: after a policy change and Recheck, a
// channel to a node the identity may no longer ssh to, or whose stream
// was vouched a login no longer granted there, is closed, while the same
// connection's channel to a node still granted keeps serving, and so does
// the connection (a new channel to the node still granted opens).
func TestRecheckClosesRevokedChannels(t *testing.T) {
	for _, tc := range []struct {
		name, rule, why string
	}{
		{name: "grant removed", why: "no longer grants ssh", rule: `
      - nodes: "env=prod"
        operations: [ssh]
        run_as: bob`},
		{name: "login removed", why: "login bob", rule: `
      - nodes: "env=prod"
        operations: [ssh]
        run_as: bob
      - nodes: "env=staging"
        operations: [ssh]
        run_as: deploy`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := &swapPolicy{}
			e := newEnv(t, withSwapPolicy(sp))
			c, err := e.dial(e.bob.signer)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			a := innerClient(t, c, "node-a", "bob", e.bob.signer)
			b := innerClient(t, c, "node-b", "bob", e.bob.signer)
			for _, inner := range []*ssh.Client{a, b} {
				if out, err := run(inner, "whoami"); err != nil || out != "bob\n" {
					t.Fatalf("before the reload: %q, %v", out, err)
				}
			}
			sp.set(t, fmt.Sprintf("version: 1\nidentities:\n  ssh-key:%s:\n    rules:%s\n", e.bob.fingerprint(), tc.rule))
			e.gate.Recheck()
			waitClosed(t, "node-a's inner connection", a)
			ev := revokedEvent(t, e, "node-a")
			if ev.Result != protocol.AuditFailed || !strings.Contains(ev.Error, tc.why) || ev.Identity != "ssh-key:"+e.bob.fingerprint() {
				t.Errorf("audit event %+v: want failed, bob's, with %q", ev, tc.why)
			}
			if out, err := run(b, "whoami"); err != nil || out != "bob\n" {
				t.Errorf("node-b after the reload: %q, %v", out, err)
			}
			b2 := innerClient(t, c, "node-b", "bob", e.bob.signer)
			if out, err := run(b2, "whoami"); err != nil || out != "bob\n" {
				t.Errorf("a new channel to node-b after the reload: %q, %v", out, err)
			}
			if n := e.channels(chanRevoked); n != 1 {
				t.Errorf("%v channels counted revoked, want 1", n)
			}
			if n := e.revokedConns(); n != 0 {
				t.Errorf("%v connections counted revoked, want 0", n)
			}
		})
	}
}

// TestCertificateExpiryClosesConnection: a connection authenticated with a
// certificate is closed once the certificate expires (no clock skew
// here), without a reload.
func TestCertificateExpiryClosesConnection(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.ClockSkew = -1 })
	cert := certTemplate(e.carol.signer.PublicKey(), "carol")
	cert.ValidBefore = uint64(time.Now().Add(5 * time.Second).Unix())
	signRaw(t, cert, e.userCA, nil)
	signer := certSigner(t, cert, e.carol.signer)
	c, err := e.dial(signer)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	inner := innerClient(t, c, "node-a", "carol", signer)
	if out, err := run(inner, "whoami"); err != nil || out != "carol\n" {
		t.Fatalf("before expiry: %q, %v", out, err)
	}
	waitClosed(t, "the inner connection", inner)
	waitClosed(t, "the gate connection", c)
	if ev := revokedEvent(t, e, "node-a"); !strings.Contains(ev.Error, "expired") {
		t.Errorf("audit event %+v: want expired", ev)
	}
}

package sshgate

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/tetherfleet/tether/protocol"
)

func openDirect(c *ssh.Client, host string, port uint32) (ssh.Channel, error) {
	ch, reqs, err := c.OpenChannel("direct-tcpip", ssh.Marshal(directTCPIP{Host: host, Port: port, OriginHost: "127.0.0.1", OriginPort: 4242}))
	if err != nil {
		return nil, err
	}
	go ssh.DiscardRequests(reqs)
	return ch, nil
}

func wantReject(t *testing.T, err error, reason ssh.RejectionReason, msg string) {
	t.Helper()
	var oce *ssh.OpenChannelError
	if !errors.As(err, &oce) {
		t.Fatalf("open: %v, want a rejection", err)
	}
	if oce.Reason != reason || !strings.Contains(oce.Message, msg) {
		t.Errorf("rejected %v %q, want %v with %q", oce.Reason, oce.Message, reason, msg)
	}
}

// TestChannelRefusals: the gate opens direct-tcpip to NODE:22 only; every
// other channel and global request is refused with a message saying why.
func TestChannelRefusals(t *testing.T) {
	e := newEnv(t)
	e.nodes.nodes["node-c"] = &fakeNode{labels: map[string]string{}, hostKey: newSigner(t),
		refuse: &protocol.ErrorInfo{Code: protocol.CodeForbidden, Message: "local policy allows none of [bob]"}}
	e.nodes.nodes["node-d"] = &fakeNode{labels: map[string]string{}, hostKey: newSigner(t),
		refuse: &protocol.ErrorInfo{Code: protocol.CodeUnsupported, Message: "serves no SSH"}}
	alice, err := e.dial(e.alice.signer)
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()
	bob, err := e.dial(e.bob.signer)
	if err != nil {
		t.Fatal(err)
	}
	defer bob.Close()

	t.Run("port 23", func(t *testing.T) {
		_, err := openDirect(alice, "node-a", 23)
		wantReject(t, err, ssh.Prohibited, "port 23 refused")
	})
	t.Run("session", func(t *testing.T) {
		_, err := alice.NewSession()
		if err == nil || !strings.Contains(err.Error(), "ssh -J") {
			t.Errorf("session: %v, want the jump host message", err)
		}
	})
	t.Run("tcpip-forward", func(t *testing.T) {
		_, err := alice.Listen("tcp", "127.0.0.1:0")
		if err == nil {
			t.Error("remote forward accepted")
		}
		ok, _, err := alice.SendRequest("tcpip-forward", true, ssh.Marshal(struct {
			Addr string
			Port uint32
		}{"0.0.0.0", 8080}))
		if ok || err != nil {
			t.Errorf("tcpip-forward: %v %v, want refused", ok, err)
		}
	})
	t.Run("other channel type", func(t *testing.T) {
		_, _, err := alice.OpenChannel("x11", nil)
		wantReject(t, err, ssh.UnknownChannelType, "direct-tcpip to NODE:22 only")
	})
	t.Run("malformed direct-tcpip", func(t *testing.T) {
		_, _, err := alice.OpenChannel("direct-tcpip", []byte{0, 0, 0, 9, 'x'})
		wantReject(t, err, ssh.ConnectionFailed, "malformed")
	})
	t.Run("unknown node, caller who may see it", func(t *testing.T) {
		// bob may ssh on every node: he learns that ghost is unknown.
		_, err := openDirect(bob, "ghost", 22)
		wantReject(t, err, ssh.ConnectionFailed, "unknown node ghost")
	})
	t.Run("unknown node, caller who may not", func(t *testing.T) {
		// alice may ssh on env=staging only: ghost gets the policy's
		// refusal, as an unlabelled node she may not use would.
		_, err := openDirect(alice, "ghost.tether", 22)
		wantReject(t, err, ssh.Prohibited, "no rule grants ssh on a node with ghost's labels")
	})
	t.Run("invalid node name", func(t *testing.T) {
		_, err := openDirect(bob, "../etc", 22)
		wantReject(t, err, ssh.ConnectionFailed, "unknown node")
	})
	t.Run("node's local policy refuses", func(t *testing.T) {
		_, err := openDirect(bob, "node-c", 22)
		wantReject(t, err, ssh.Prohibited, "node node-c: local policy allows none of [bob]")
	})
	t.Run("node unreachable", func(t *testing.T) {
		_, err := openDirect(bob, "node-d", 22)
		wantReject(t, err, ssh.ConnectionFailed, "node node-d")
	})
	waitFor(t, "every channel audited", func() bool { return len(e.audit.events()) == 7 })
	results := map[string]int{}
	for _, ev := range e.audit.events() {
		results[ev.Result]++
	}
	if results[protocol.AuditRefused] != 2 || results[protocol.AuditError] != 5 {
		t.Errorf("audit results %v, want 2 refused (policy, local policy), 5 errors", results)
	}
	if e.channels(chanSession) != 1 || e.channels(chanBadTarget) != 2 || e.channels(chanUnsupported) != 1 {
		t.Errorf("channel counts: session %v, bad_target %v, unsupported %v", e.channels(chanSession), e.channels(chanBadTarget), e.channels(chanUnsupported))
	}
	if params, _ := e.nodes.recorded(); len(params) != 0 {
		t.Errorf("a node was reached: %+v", params)
	}
	// The connection survived every refusal.
	ch, err := openDirect(alice, "node-a", 22)
	if err != nil {
		t.Fatalf("node-a after the refusals: %v", err)
	}
	ch.Close()
}

// TestOpenSSHSessionRefused: ssh to the gate itself tells the user it is a
// jump host.
func TestOpenSSHSessionRefused(t *testing.T) {
	e := newEnv(t)
	code, _, stderr := e.runSSH(sshOpts{key: e.alice, dest: "gate", cmd: []string{"true"}})
	if code == 0 || !strings.Contains(stderr, "ssh -J") {
		t.Errorf("exit %d, stderr %s: want the jump host message", code, stderr)
	}
}

// TestChannelLimit: past MaxChannelsPerConn a channel is refused, and a
// closed one frees its place.
func TestChannelLimit(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxChannelsPerConn = 2 })
	c, err := e.dial(e.bob.signer)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var open []ssh.Channel
	for range 2 {
		ch, err := openDirect(c, "node-a", 22)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, ch)
	}
	_, err = openDirect(c, "node-a", 22)
	wantReject(t, err, ssh.ResourceShortage, "2 channels open")
	open[0].Close()
	waitFor(t, "a channel's place freed", func() bool {
		ch, err := openDirect(c, "node-a", 22)
		if err == nil {
			ch.Close()
		}
		return err == nil
	})
}

// TestPreAuthFloodDoesNotStarve: silent connections from one source fill
// the handshake places; a client from another source still gets in, and
// the flood's newcomers are refused.
func TestPreAuthFloodDoesNotStarve(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxHandshakes, c.MaxHandshakesPerSource = 4, 6 })
	dialFrom := func(src string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
		c, err := d.Dial("tcp", e.addr.String())
		if err != nil {
			t.Skipf("cannot dial from %s: %v", src, err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	for range 8 {
		dialFrom("127.0.0.2")
	}
	waitFor(t, "the flood admitted up to the limit and refused", func() bool {
		return e.gate.adm.InProgress() == 4 && e.conns(connOverload) == 4
	})
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}, Timeout: 10 * time.Second}
	nc, err := d.Dial("tcp", e.addr.String())
	if err != nil {
		t.Fatal(err)
	}
	sc, chans, reqs, err := ssh.NewClientConn(nc, e.addr.String(), &ssh.ClientConfig{
		User: "x", Auth: []ssh.AuthMethod{ssh.PublicKeys(e.bob.signer)},
		HostKeyCallback: ssh.FixedHostKey(e.gate.HostKey()), HostKeyAlgorithms: []string{ssh.KeyAlgoED25519},
	})
	if err != nil {
		t.Fatalf("the other source's client was starved: %v", err)
	}
	client := ssh.NewClient(sc, chans, reqs)
	defer client.Close()
	if ch, err := openDirect(client, "node-a", 22); err != nil {
		t.Errorf("node-a: %v", err)
	} else {
		ch.Close()
	}
	waitFor(t, "one flood handshake cut", func() bool { return e.conns(connEvicted) == 1 })
}

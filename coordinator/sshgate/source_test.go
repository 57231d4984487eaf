package sshgate

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/tetherfleet/tether/protocol"
)

// sourceNodes is Nodes that keeps the SourceOf of each OpenSSH's ctx.
type sourceNodes struct {
	Nodes
	mu      sync.Mutex
	sources []string
}

func (s *sourceNodes) OpenSSH(ctx context.Context, node string, params protocol.SSHParams) (net.Conn, error) {
	s.mu.Lock()
	s.sources = append(s.sources, SourceOf(ctx))
	s.mu.Unlock()
	return s.Nodes.OpenSSH(ctx, node, params)
}

// dialFrom connects to the gate from ip (a loopback IP other than
// 127.0.0.1) with signer, and returns the client (nil when refused), the
// error and the connection's local address: what the gate's listener
// sees as the TCP peer.
func (e *env) dialFrom(ip string, signer ssh.Signer) (*ssh.Client, string, error) {
	e.t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 30 * time.Second}
	conn, err := d.Dial("tcp", e.addr.String())
	if err != nil {
		e.t.Fatal(err)
	}
	local := conn.LocalAddr().String()
	cfg := &ssh.ClientConfig{
		User:              "whoever",
		Auth:              []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback:   ssh.FixedHostKey(e.gate.HostKey()),
		HostKeyAlgorithms: []string{ssh.KeyAlgoED25519},
	}
	c, chans, reqs, err := ssh.NewClientConn(conn, e.addr.String(), cfg)
	if err != nil {
		conn.Close()
		return nil, local, err
	}
	return ssh.NewClient(c, chans, reqs), local, nil
}

// TestAuditSourceIsTheTCPPeer: the jump host's events name where the
// connection came from, the client's IP and port as its listener saw
// them: a failed login's (the connection-level event) and each channel's;
// the stream it opens to a node carries it (SourceOf), for the node's
// channel events.
func TestAuditSourceIsTheTCPPeer(t *testing.T) {
	sn := &sourceNodes{}
	e := newEnv(t, func(c *Config) { sn.Nodes = c.Nodes; c.Nodes = sn })
	_, local, err := e.dialFrom("127.0.0.7", e.mallory.signer)
	if err == nil {
		t.Fatal("mallory's key authenticated")
	}
	if !strings.HasPrefix(local, "127.0.0.7:") {
		t.Fatalf("the client's local address is %q, want 127.0.0.7:PORT", local)
	}
	waitFor(t, "the failed login's event", func() bool { return len(e.audit.events()) == 1 })
	if ev := e.audit.events()[0]; ev.Method != "auth" || ev.Reason != "unauthenticated" || ev.Source != local {
		t.Errorf("failed login: method %q, reason %q, source %q; want auth, unauthenticated from %q", ev.Method, ev.Reason, ev.Source, local)
	}

	alice, local, err := e.dialFrom("127.0.0.8", e.alice.signer)
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()
	_, err = openDirect(alice, "node-a", 23)
	wantReject(t, err, ssh.Prohibited, "port 23 refused")
	waitFor(t, "the channel's event", func() bool { return len(e.audit.events()) == 2 })
	if ev := e.audit.events()[1]; ev.Method != "connect" || ev.Identity == "" || ev.Source != local {
		t.Errorf("channel: method %q, identity %q, source %q; want connect by alice from %q", ev.Method, ev.Identity, ev.Source, local)
	}

	// A channel the gate opens a stream for.
	ch, err := openDirect(alice, "node-a", 22)
	if err != nil {
		t.Fatal(err)
	}
	ch.Close()
	sn.mu.Lock()
	sources := append([]string(nil), sn.sources...)
	sn.mu.Unlock()
	if len(sources) != 1 || sources[0] != local {
		t.Errorf("OpenSSH's ctx named sources %q, want [%s]", sources, local)
	}
}

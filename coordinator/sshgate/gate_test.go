package sshgate

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/tetherfleet/tether/protocol"
)

// TestJumpAuthorizedKey: ssh -J gate node-a true with an authorized key
// reaches the node's SSH server, which was vouched the proven key, the
// policy's logins (sorted, without repeats) and targets, and a host
// certificate for the node's key; the channel is audited once.
func TestJumpAuthorizedKey(t *testing.T) {
	e := newEnv(t)
	code, stdout, stderr := e.runSSH(sshOpts{key: e.alice, dest: "deploy@node-a", cmd: []string{"params"}})
	if code != 0 {
		t.Fatalf("ssh exited %d: %s", code, stderr)
	}
	wantID := "ssh-key:" + e.alice.fingerprint()
	if got, want := strings.TrimSpace(stdout), wantID+" alice,deploy"; got != want {
		t.Errorf("the node saw %q, want %q", got, want)
	}
	params, errs := e.nodes.recorded()
	if len(errs) != 0 || len(params) != 1 {
		t.Fatalf("node: params %+v, errors %v", params, errs)
	}
	p := params[0]
	if p.Identity != wantID || !slices.Equal(p.Logins, []string{"alice", "deploy"}) || !slices.Equal(p.Targets, []string{"db", "web"}) ||
		p.Auth != protocol.SSHAuthPublicKey || !bytes.Equal(p.PublicKey, e.alice.signer.PublicKey().Marshal()) {
		t.Errorf("params = %+v", p)
	}
	k, err := ssh.ParsePublicKey(p.HostCertificate)
	if err != nil {
		t.Fatalf("host certificate: %v", err)
	}
	cert := k.(*ssh.Certificate)
	if cert.CertType != ssh.HostCert || !slices.Equal(cert.ValidPrincipals, []string{"node-a", "node-a.tether"}) ||
		cert.KeyId != "tether-node:node-a" || !bytes.Equal(cert.SignatureKey.Marshal(), e.gate.HostCA().PublicKey().Marshal()) {
		t.Errorf("host certificate = %+v", cert)
	}
	// The channel is audited when the gate's side of it ends, which may be
	// after ssh exits.
	waitFor(t, "the channel audited", func() bool { return len(e.audit.events()) != 0 })
	evs := e.audit.events()
	if len(evs) != 1 {
		t.Fatalf("audit events: %+v", evs)
	}
	ev := evs[0]
	if ev.Result != protocol.AuditOK || ev.Operation != "ssh" || ev.Method != "connect" || ev.Identity != wantID ||
		!slices.Equal(ev.Nodes, []string{"node-a"}) || ev.Session != p.Session || ev.RunAs != "alice, deploy" ||
		ev.BytesIn == 0 || ev.BytesOut == 0 {
		t.Errorf("audit event = %+v", ev)
	}
	if e.conns(connOK) != 1 || e.channels(chanOK) != 1 {
		t.Errorf("connections ok %v, channels ok %v; want 1, 1", e.conns(connOK), e.channels(chanOK))
	}
	if n := testutilBytes(e, "in"); n != float64(ev.BytesIn) {
		t.Errorf("bytes in metric %v, audit %d", n, ev.BytesIn)
	}
}

// TestJumpCertificate: a user certificate from the configured CA
// authenticates as its first principal, and the node is vouched the whole
// certificate.
func TestJumpCertificate(t *testing.T) {
	e := newEnv(t)
	c := certTemplate(e.carol.signer.PublicKey(), "carol", "not valid!", "ops")
	if err := c.SignCert(randReader, e.userCA); err != nil {
		t.Fatal(err)
	}
	certPath := e.carol.writeCert(t, c)
	code, stdout, stderr := e.runSSH(sshOpts{key: e.carol, cert: certPath, dest: "carol@node-b.tether", cmd: []string{"params"}})
	if code != 0 {
		t.Fatalf("ssh exited %d: %s", code, stderr)
	}
	if got := strings.TrimSpace(stdout); got != "ssh-principal:carol carol" {
		t.Errorf("the node saw %q", got)
	}
	params, _ := e.nodes.recorded()
	if len(params) != 1 || !bytes.Equal(params[0].PublicKey, c.Marshal()) {
		t.Errorf("params %+v: want the certificate's blob as the public key", params)
	}
}

// TestStrictHostKeyChecking: with a known_hosts file holding only the
// gate's lines (the CA line for *.tether, the jump host's key), OpenSSH
// checks both hops with StrictHostKeyChecking=yes; with the explicit-names
// variant a bare node id works too. A known_hosts without the CA line
// fails, so the check is real.
func TestStrictHostKeyChecking(t *testing.T) {
	e := newEnv(t)
	kh := e.gate.KnownHosts("gate.test", 0)
	if code, _, stderr := e.runSSH(sshOpts{key: e.alice, knownHosts: kh, dest: "deploy@node-a.tether", cmd: []string{"true"}}); code != 0 {
		t.Fatalf("ssh with the published known_hosts exited %d: %s", code, stderr)
	}
	// The jump hop checked by the CA alone (its certificate names
	// gate.test), the bare node id by the explicit-names line.
	kh2 := e.gate.HostCA().KnownHostsLineFor("gate.test", "node-a") + "\n"
	if code, _, stderr := e.runSSH(sshOpts{key: e.alice, knownHosts: kh2, dest: "deploy@node-a", cmd: []string{"true"}}); code != 0 {
		t.Fatalf("ssh with the CA line for gate.test and node-a exited %d: %s", code, stderr)
	}
	onlyJump := e.gate.JumpKnownHostsLine("gate.test", 0) + "\n"
	if code, _, stderr := e.runSSH(sshOpts{key: e.alice, knownHosts: onlyJump, dest: "deploy@node-a.tether", cmd: []string{"true"}}); code == 0 || !strings.Contains(stderr, "Host key verification failed") {
		t.Fatalf("ssh without the CA line: exit %d, %s", code, stderr)
	}
	if !strings.HasPrefix(e.gate.HostCA().KnownHostsLine(), "@cert-authority *.tether ssh-ed25519 ") ||
		!strings.HasSuffix(e.gate.HostCA().KnownHostsLine(), " tether-host-ca") {
		t.Errorf("KnownHostsLine = %q", e.gate.HostCA().KnownHostsLine())
	}
	if got := e.gate.JumpKnownHostsLine("h", 2222); !strings.HasPrefix(got, "[h]:2222 ssh-ed25519 ") {
		t.Errorf("JumpKnownHostsLine = %q", got)
	}
}

// TestPolicyRefusalVisible: alice's policy excludes node-b (env=prod);
// OpenSSH shows the policy's message, and the refusal is audited.
func TestPolicyRefusalVisible(t *testing.T) {
	e := newEnv(t)
	code, _, stderr := e.runSSH(sshOpts{key: e.alice, dest: "deploy@node-b", cmd: []string{"true"}})
	if code == 0 {
		t.Fatal("ssh to node-b succeeded")
	}
	if !strings.Contains(stderr, "administratively prohibited") || !strings.Contains(stderr, "no rule grants ssh on a node with node-b's labels") {
		t.Errorf("stderr does not show the policy's refusal: %s", stderr)
	}
	// The channel is audited when the gate's side of it ends, which may be
	// after ssh exits.
	waitFor(t, "the channel audited", func() bool { return len(e.audit.events()) != 0 })
	evs := e.audit.events()
	if len(evs) != 1 || evs[0].Result != protocol.AuditRefused || evs[0].Reason != "no_rule" || !strings.Contains(evs[0].Error, "node-b") {
		t.Errorf("audit events = %+v", evs)
	}
	if params, _ := e.nodes.recorded(); len(params) != 0 {
		t.Errorf("the node was reached: %+v", params)
	}
}

package sshgate

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// TestRefusedCredentials: every bad credential is refused in the handshake,
// without a panic (the env's cleanup checks the panics counter), and
// counted under its reason.
func TestRefusedCredentials(t *testing.T) {
	e := newEnv(t)
	carolPub := e.carol.signer.PublicKey()
	signed := func(c *ssh.Certificate, ca ssh.Signer) *ssh.Certificate {
		signRaw(t, c, ca, nil)
		return c
	}
	now := time.Now()
	// A "CA" that is itself a certificate of the trusted CA's key.
	caCert := certTemplate(e.userCA.PublicKey(), "ca")
	if err := caCert.SignCert(randReader, e.userCA); err != nil {
		t.Fatal(err)
	}
	byCert := certTemplate(carolPub, "carol")
	signRaw(t, byCert, e.userCA, caCert)

	cases := []struct {
		name   string
		signer ssh.Signer
		reason string
	}{
		{"wrong key", e.mallory.signer, reasonUnknownKey},
		{"expired", certSigner(t, signed(func() *ssh.Certificate {
			c := certTemplate(carolPub, "carol")
			c.ValidAfter, c.ValidBefore = uint64(now.Add(-3*time.Hour).Unix()), uint64(now.Add(-2*time.Hour).Unix())
			return c
		}(), e.userCA), e.carol.signer), reasonExpired},
		{"not yet valid", certSigner(t, signed(func() *ssh.Certificate {
			c := certTemplate(carolPub, "carol")
			c.ValidAfter, c.ValidBefore = uint64(now.Add(2*time.Hour).Unix()), uint64(now.Add(3*time.Hour).Unix())
			return c
		}(), e.userCA), e.carol.signer), reasonNotYetValid},
		{"unknown CA", certSigner(t, signed(certTemplate(carolPub, "carol"), e.otherCA), e.carol.signer), reasonUnknownCA},
		{"signed by a certificate", certSigner(t, byCert, e.carol.signer), reasonCertByCert},
		{"host certificate", certSigner(t, signed(func() *ssh.Certificate {
			c := certTemplate(carolPub, "carol")
			c.CertType = ssh.HostCert
			return c
		}(), e.userCA), e.carol.signer), reasonNotUserCert},
		{"no principals", certSigner(t, signed(certTemplate(carolPub), e.userCA), e.carol.signer), reasonNoPrincipals},
		{"only unusable principals", certSigner(t, signed(certTemplate(carolPub, "", "a b"), e.userCA), e.carol.signer), reasonNoPrincipals},
		{"force-command", certSigner(t, signed(func() *ssh.Certificate {
			c := certTemplate(carolPub, "carol")
			c.CriticalOptions = map[string]string{"force-command": "/bin/true"}
			return c
		}(), e.userCA), e.carol.signer), reasonCriticalOption},
		{"source-address elsewhere", certSigner(t, signed(func() *ssh.Certificate {
			c := certTemplate(carolPub, "carol")
			c.CriticalOptions = map[string]string{"source-address": "10.0.0.0/8,192.0.2.1"}
			return c
		}(), e.userCA), e.carol.signer), reasonSourceAddress},
		{"bad CA signature", certSigner(t, func() *ssh.Certificate {
			c := signed(certTemplate(carolPub, "carol"), e.userCA)
			c.KeyId = "changed after signing"
			return c
		}(), e.carol.signer), reasonBadSignature},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before, failed, audited := e.authFailures(tc.reason), e.conns(connAuthFailed), len(e.audit.events())
			c, err := e.dial(tc.signer)
			if err == nil {
				c.Close()
				t.Fatal("authenticated")
			}
			if !strings.Contains(err.Error(), "unable to authenticate") {
				t.Errorf("dial error %v: want an authentication failure", err)
			}
			if got := e.authFailures(tc.reason) - before; got != 1 {
				t.Errorf("auth failures %s counted %v times, want 1", tc.reason, got)
			}
			// The connection's end is counted by its own goroutine.
			waitFor(t, "the connection counted auth_failed", func() bool { return e.conns(connAuthFailed) == failed+1 })
			evs := e.audit.events()
			if len(evs) != audited+1 {
				t.Fatalf("%d audit events, want %d", len(evs), audited+1)
			}
			if ev := evs[audited]; ev.Result != "refused" || ev.Reason != "unauthenticated" || ev.Identity != "" ||
				!strings.Contains(ev.Error, "127.0.0.1") {
				t.Errorf("audit events %+v: want one more, refused unauthenticated, naming the client", evs)
			}
		})
	}

	// OpenSSH too, for the ones the issue names: a wrong key, an expired
	// certificate, an unknown CA.
	for _, tc := range []struct {
		name string
		key  *userKey
		cert *ssh.Certificate
	}{
		{"OpenSSH wrong key", e.mallory, nil},
		{"OpenSSH expired", e.carol, cases[1].signer.PublicKey().(*ssh.Certificate)},
		{"OpenSSH unknown CA", e.carol, cases[3].signer.PublicKey().(*ssh.Certificate)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := sshOpts{key: tc.key, dest: "carol@node-a", cmd: []string{"true"}}
			if tc.cert != nil {
				o.cert = tc.key.writeCert(t, tc.cert)
			}
			code, _, stderr := e.runSSH(o)
			if code == 0 || !strings.Contains(stderr, "Permission denied (publickey)") {
				t.Errorf("exit %d, stderr %s: want a publickey refusal", code, stderr)
			}
		})
	}
	if params, _ := e.nodes.recorded(); len(params) != 0 {
		t.Errorf("a node was reached: %+v", params)
	}
}

// TestSourceAddressHonoured: a certificate whose source-address holds the
// client's address authenticates.
func TestSourceAddressHonoured(t *testing.T) {
	e := newEnv(t)
	c := certTemplate(e.carol.signer.PublicKey(), "carol")
	c.CriticalOptions = map[string]string{"source-address": "192.0.2.0/24,127.0.0.1"}
	if err := c.SignCert(randReader, e.userCA); err != nil {
		t.Fatal(err)
	}
	client, err := e.dial(certSigner(t, c, e.carol.signer))
	if err != nil {
		t.Fatal(err)
	}
	client.Close()
}

// failingSigner offers its key but cannot sign: the client sends the key in
// a query only, never proving it.
type failingSigner struct{ ssh.Signer }

func (f failingSigner) Sign(_ io.Reader, _ []byte) (*ssh.Signature, error) {
	return nil, errors.New("this key is only offered")
}

// TestProvedKeyIsTheIdentity is the CVE-2024-45337 pattern: the client
// offers keys it does not prove (the callback approves them), then proves
// another. The identity must be the proved key's.
func TestProvedKeyIsTheIdentity(t *testing.T) {
	e := newEnv(t)
	// offerThen is an AuthCallback that first offers each of offered
	// without a signature, then authenticates with proved.
	offerThen := func(proved ssh.Signer, offered ...ssh.Signer) func(*ssh.ClientAuthContext) (ssh.AuthMethod, error) {
		step := 0
		return func(*ssh.ClientAuthContext) (ssh.AuthMethod, error) {
			defer func() { step++ }()
			switch {
			case step < len(offered):
				return ssh.PublicKeys(failingSigner{offered[step]}), nil
			case step == len(offered):
				return ssh.PublicKeys(proved), nil
			}
			return nil, errors.New("no more methods")
		}
	}
	t.Run("authorized key offered, unauthorized key proved", func(t *testing.T) {
		before := e.authFailures(reasonUnknownKey)
		c, err := e.dialConfig(&ssh.ClientConfig{User: "x", AuthCallback: offerThen(e.mallory.signer, e.alice.signer), Timeout: 30 * time.Second})
		if err == nil {
			c.Close()
			t.Fatal("authenticated with an unauthorized key after offering an authorized one")
		}
		if e.authFailures(reasonUnknownKey) != before+1 {
			t.Errorf("unknown_key not counted")
		}
	})
	t.Run("alice offered, bob proved", func(t *testing.T) {
		// alice's key is offered (the callback approves it) and bob proves
		// his: a server that kept the first key its callback approved
		// would take bob for alice. Then bob, alice, bob: one that kept a
		// key its callback saw last, where the library reuses a cached
		// decision, would too.
		for i, offered := range [][]ssh.Signer{{e.alice.signer}, {e.bob.signer, e.alice.signer}} {
			c, err := e.dialConfig(&ssh.ClientConfig{User: "x", AuthCallback: offerThen(e.bob.signer, offered...), Timeout: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ch, reqs, err := c.OpenChannel("direct-tcpip", ssh.Marshal(directTCPIP{Host: "node-b", Port: 22, OriginHost: "127.0.0.1", OriginPort: 1}))
			if err != nil {
				t.Fatalf("offered %d: bob (ssh anywhere) refused on node-b: %v", i, err)
			}
			go ssh.DiscardRequests(reqs)
			ch.Close()
			params, _ := e.nodes.recorded()
			if len(params) != i+1 || params[i].Identity != "ssh-key:"+e.bob.fingerprint() || string(params[i].PublicKey) != string(e.bob.signer.PublicKey().Marshal()) {
				t.Errorf("offered %d: params %+v: want bob's identity and key", i, params)
			}
		}
		// And alice's policy (no node-b) is not bob's: the reverse order
		// leaves alice refused on node-b.
		c2, err := e.dialConfig(&ssh.ClientConfig{User: "x", AuthCallback: offerThen(e.alice.signer, e.alice.signer, e.bob.signer), Timeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer c2.Close()
		_, _, err = c2.OpenChannel("direct-tcpip", ssh.Marshal(directTCPIP{Host: "node-b", Port: 22, OriginHost: "127.0.0.1", OriginPort: 1}))
		var oce *ssh.OpenChannelError
		if !errors.As(err, &oce) || oce.Reason != ssh.Prohibited || !strings.Contains(oce.Message, e.alice.fingerprint()) {
			t.Errorf("alice after offering bob's key: %v, want alice's refusal", err)
		}
	})
}

// waitFor polls cond until it holds or 30 s pass (a condition the test
// cannot be told about, such as a connection goroutine's last count).
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestOpenSSHOfferedKeyNotProved: OpenSSH offers alice's key from its .pub
// alone (the gate accepts the offer), cannot sign with it, and proves
// bob's: the node is vouched bob's identity and key.
func TestOpenSSHOfferedKeyNotProved(t *testing.T) {
	e := newEnv(t)
	pubOnly := filepath.Join(t.TempDir(), "alice-offered")
	data, err := os.ReadFile(e.alice.path + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pubOnly+".pub", data, 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := e.runSSH(sshOpts{key: e.bob, identities: []string{pubOnly}, dest: "bob@node-b", cmd: []string{"params"}})
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if got, want := strings.TrimSpace(stdout), "ssh-key:"+e.bob.fingerprint()+" bob"; got != want {
		t.Errorf("the node saw %q, want %q", got, want)
	}
}

package sshd

import (
	"crypto/ed25519"
	"crypto/rand"
	"path/filepath"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/tetherfleet/tether/internal/sshkey"
)

func TestCheckHostCert(t *testing.T) {
	path := filepath.Join(t.TempDir(), "k")
	host, err := sshkey.LoadOrCreate(path, "test host key")
	if err != nil {
		t.Fatal(err)
	}
	_, caPriv, _ := ed25519.GenerateKey(rand.Reader)
	ca, _ := ssh.NewSignerFromKey(caPriv)
	_, otherPriv, _ := ed25519.GenerateKey(rand.Reader)
	other, _ := ssh.NewSignerFromKey(otherPriv)
	sign := func(key ssh.PublicKey, typ uint32, before uint64) []byte {
		c := &ssh.Certificate{Key: key, CertType: typ, ValidPrincipals: []string{"node-a", "node-a.tether"}, ValidBefore: before}
		if err := c.SignCert(rand.Reader, ca); err != nil {
			t.Fatal(err)
		}
		return c.Marshal()
	}
	s, err := CheckHostCert(host, sign(host.PublicKey(), ssh.HostCert, ssh.CertTimeInfinity))
	if err != nil {
		t.Fatalf("a host cert of the host key: %v", err)
	}
	if _, ok := s.PublicKey().(*ssh.Certificate); !ok {
		t.Errorf("signer's key is %T, want a certificate", s.PublicKey())
	}
	for name, cert := range map[string][]byte{
		"another key":      sign(other.PublicKey(), ssh.HostCert, ssh.CertTimeInfinity),
		"user certificate": sign(host.PublicKey(), ssh.UserCert, ssh.CertTimeInfinity),
		"expired":          sign(host.PublicKey(), ssh.HostCert, 1),
		"plain key":        host.PublicKey().Marshal(),
		"garbage":          []byte("xx"),
	} {
		if _, err := CheckHostCert(host, cert); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

package sshd

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
)

func TestHostKeyCreatedOnceAndReused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ssh_host_ed25519_key")
	k1, err := LoadOrCreateHostKey(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("host key mode %04o, want 0600", fi.Mode().Perm())
	}
	if k1.PublicKey().Type() != ssh.KeyAlgoED25519 {
		t.Errorf("host key type %s, want ed25519", k1.PublicKey().Type())
	}
	k2, err := LoadOrCreateHostKey(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(k1.PublicKey().Marshal(), k2.PublicKey().Marshal()) {
		t.Error("second load made a new key instead of reusing the file")
	}
	// OpenSSH reads it too (ssh-keygen -y), when installed.
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want the key only (no temporary file left)", len(entries))
	}
}

func TestHostKeyCorruptIsAnErrorNamingTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ssh_host_ed25519_key")
	if err := os.WriteFile(path, []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadOrCreateHostKey(path)
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("corrupt host key: err %v, want an error naming %s", err, path)
	}
	if b, _ := os.ReadFile(path); string(b) != "not a key\n" {
		t.Error("the corrupt file was replaced")
	}
}

func TestHostKeyWorldReadableRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "k")
	if _, err := LoadOrCreateHostKey(path); err != nil {
		t.Fatal(err)
	}
	os.Chmod(path, 0o644)
	if _, err := LoadOrCreateHostKey(path); err == nil || !strings.Contains(err.Error(), "0644") {
		t.Fatalf("mode 0644: err %v, want a refusal naming the mode", err)
	}
}

func TestCheckHostCert(t *testing.T) {
	path := filepath.Join(t.TempDir(), "k")
	host, err := LoadOrCreateHostKey(path)
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

package tunnel_test

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/tunnel"
)

func newNodeCert(t *testing.T, ca *tunnel.NodeCA, node string, notBefore time.Time, ttl time.Duration) (*x509.Certificate, *tunnel.Identity) {
	t.Helper()
	key, err := tunnel.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	der, err := tunnel.NewNodeCSR(key, node)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := tunnel.ParseNodeCSR(der, node)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.Sign(csr, node, notBefore, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return cert, &tunnel.Identity{Cert: cert, Key: key}
}

func TestNodeCertificate(t *testing.T) {
	ca, err := tunnel.LoadNodeCA(filepath.Join(t.TempDir(), "pki"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	cert, _ := newNodeCert(t, ca, "gpu-07", now, time.Hour)
	if id, err := ca.VerifyNode(cert, now); err != nil || id != "gpu-07" {
		t.Fatalf("VerifyNode = %q, %v", id, err)
	}
	if len(cert.URIs) != 1 || cert.URIs[0].String() != "urn:tether:node:gpu-07" || cert.Subject.CommonName != "gpu-07" {
		t.Errorf("names: URIs %v CN %q", cert.URIs, cert.Subject.CommonName)
	}
	if len(cert.ExtKeyUsage) != 1 || cert.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth || cert.IsCA {
		t.Errorf("usage %v, CA %v: want client auth only", cert.ExtKeyUsage, cert.IsCA)
	}
	if _, err := ca.VerifyNode(cert, now.Add(2*time.Hour)); !errors.Is(err, tunnel.ErrCertExpired) {
		t.Errorf("after expiry: %v, want ErrCertExpired", err)
	}
	other, err := tunnel.NewTestCA("other")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.VerifyNode(cert, now); !errors.Is(err, tunnel.ErrCertForeign) {
		t.Errorf("other CA: %v, want ErrCertForeign", err)
	}
}

func TestLoadNodeCAKeepsItsCA(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	a, err := tunnel.LoadNodeCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := tunnel.LoadNodeCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !a.Certificate().Equal(b.Certificate()) {
		t.Error("a second load made another CA")
	}
	if fi, err := os.Stat(filepath.Join(dir, "ca.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("ca.key: %v, want mode 0600", err)
	}
	// The dev PKI of the same directory shares it.
	pki, err := tunnel.EnsureDevPKI(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if pki.CACert != filepath.Join(dir, tunnel.CAFile) {
		t.Errorf("dev PKI CA %s", pki.CACert)
	}
}

func TestParseNodeCSRRefuses(t *testing.T) {
	key, _ := tunnel.NewNodeKey()
	der, _ := tunnel.NewNodeCSR(key, "n1")
	if _, err := tunnel.ParseNodeCSR(der, "n2"); err == nil || !strings.Contains(err.Error(), `names "n1"`) {
		t.Errorf("CSR for another node: %v", err)
	}
	if _, err := tunnel.ParseNodeCSR([]byte("junk"), "n1"); err == nil {
		t.Error("junk CSR accepted")
	}
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	rder, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "n1"}}, rk)
	if _, err := tunnel.ParseNodeCSR(rder, "n1"); err == nil || !strings.Contains(err.Error(), "want ECDSA P-256 or Ed25519") {
		t.Errorf("RSA CSR: %v", err)
	}
	// A signature that does not match: flip a byte of the signature.
	bad := append([]byte(nil), der...)
	bad[len(bad)-3] ^= 0xff
	if _, err := tunnel.ParseNodeCSR(bad, "n1"); err == nil {
		t.Error("CSR with a broken signature accepted")
	}
}

func TestIdentityFileRoundTrip(t *testing.T) {
	ca, err := tunnel.NewTestCA("ca")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "identity")
	if _, err := tunnel.LoadIdentity(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("no identity yet: %v, want ErrNotExist", err)
	}
	cert, id := newNodeCert(t, ca, "n1", time.Now(), 3*time.Hour)
	id.Pinned = ca.Certificate()
	if err := tunnel.SaveIdentity(dir, id); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{tunnel.IdentityFile, tunnel.PinnedCAFile} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v, want 0600", f, err, fi.Mode().Perm())
		}
	}
	got, err := tunnel.LoadIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Cert.Equal(cert) || got.NodeID() != "n1" || got.Pinned == nil || !got.Pinned.Equal(ca.Certificate()) {
		t.Errorf("loaded %+v", got)
	}
	if want := cert.NotBefore.Add(2 * time.Hour); !got.RenewAt().Equal(want) {
		t.Errorf("RenewAt %v, want %v (2/3 of 3h)", got.RenewAt(), want)
	}
	os.WriteFile(filepath.Join(dir, tunnel.IdentityFile), []byte("not pem"), 0o600)
	if _, err := tunnel.LoadIdentity(dir); err == nil || !strings.Contains(err.Error(), tunnel.IdentityFile) {
		t.Errorf("broken identity file: %v, want an error naming it", err)
	}
}

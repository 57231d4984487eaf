package openshell_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"

	facade "github.com/tetherfleet/tether/coordinator/facade/openshell"
	osh "github.com/tetherfleet/tether/protocol/openshell"
)

// testCA issues certificates for tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// issue returns a leaf certificate for cn (a server one with an IP SAN of
// 127.0.0.1 when server is set).
func (ca *testCA) issue(t *testing.T, cn string, server bool) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestAuthBoundary: with CheckToken set, a call needs a valid tether-token
// or a verified client certificate; the token never reaches the gateway
// (TestRelayVerbatim checks the stripping).
func TestAuthBoundary(t *testing.T) {
	ca := newTestCA(t)
	e := newEnv(t, envConfig{cfg: func(c *facade.Config) {
		c.CheckToken = func(tok string) bool { return tok == "good" }
		c.TLS = &tls.Config{
			Certificates: []tls.Certificate{ca.issue(t, "facade", true)},
			ClientCAs:    ca.pool,
			ClientAuth:   tls.VerifyClientCertIfGiven,
			MinVersion:   tls.VersionTLS12,
		}
	}})
	anon := dialFacade(t, e.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.pool})))
	withCert := dialFacade(t, e.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: ca.pool, Certificates: []tls.Certificate{ca.issue(t, "nemo-gym", false)},
	})))
	req := &osh.CreateSandboxRequest{Spec: spec()}
	for _, tc := range []struct {
		name string
		cc   *grpc.ClientConn
		kv   []string
		code codes.Code
	}{
		{"no token", anon, nil, codes.Unauthenticated},
		{"wrong token", anon, []string{facade.MetaToken, "bad"}, codes.Unauthenticated},
		{"empty token", anon, []string{facade.MetaToken, ""}, codes.Unauthenticated},
		{"gateway token is not ours", anon, []string{"authorization", "Bearer good"}, codes.Unauthenticated},
		{"token", anon, []string{facade.MetaToken, "good"}, codes.OK},
		{"client certificate", withCert, nil, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := unary[osh.SandboxResponse](testCtx(t, tc.kv...), tc.cc, osh.MethodCreateSandbox, req)
			msg := ""
			if tc.code == codes.Unauthenticated {
				msg = "tether: missing or invalid tether-token"
			}
			wantCode(t, "create", err, tc.code, msg)
		})
	}
	if n := e.gws["node-a"].Calls(osh.MethodCreateSandbox); n != 2 {
		t.Errorf("the gateway got %d creates, want 2 (the authenticated ones)", n)
	}
	if n := counter(t, e, "tether_openshell_facade_auth_failures_total"); n != 4 {
		t.Errorf("auth failures %v, want 4", n)
	}
}

// counter finds a gathered counter's value by name (no labels).
func counter(t *testing.T, e *env, name string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

package tunnel

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Files of a development PKI inside a data directory.
const (
	CAFile         = "ca.crt"
	caKeyFile      = "ca.key"
	ServerCertFile = "server.crt"
	ServerKeyFile  = "server.key"
)

// DevPKI is a CA and a server certificate generated for a coordinator that was
// given none (dev mode, single-node installs). Paths are absolute.
type DevPKI struct {
	CACert, ServerCert, ServerKey string
}

// EnsureDevPKI loads the CA and server certificate from dir, creating them if
// absent. The server certificate covers hosts (DNS names or IPs) plus
// localhost, 127.0.0.1 and ::1; it is reissued when a host is missing or it
// expires within 30 days. Keys are written 0600.
func EnsureDevPKI(dir string, hosts []string) (DevPKI, error) {
	p := DevPKI{
		CACert:     filepath.Join(dir, CAFile),
		ServerCert: filepath.Join(dir, ServerCertFile),
		ServerKey:  filepath.Join(dir, ServerKeyFile),
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return p, fmt.Errorf("dev PKI: %w", err)
	}
	hosts = append([]string{"localhost", "127.0.0.1", "::1"}, hosts...)
	caCert, caKey, err := loadPair(p.CACert, filepath.Join(dir, caKeyFile))
	if errors.Is(err, os.ErrNotExist) {
		caCert, caKey, err = newCA(p.CACert, filepath.Join(dir, caKeyFile))
	}
	if err != nil {
		return p, fmt.Errorf("dev PKI CA in %s: %w", dir, err)
	}
	srv, _, err := loadPair(p.ServerCert, p.ServerKey)
	if err == nil && covers(srv, hosts) && time.Until(srv.NotAfter) > 30*24*time.Hour && srv.CheckSignatureFrom(caCert) == nil {
		return p, nil
	}
	if err := issue(caCert, caKey, hosts, p.ServerCert, p.ServerKey); err != nil {
		return p, fmt.Errorf("dev PKI server certificate in %s: %w", dir, err)
	}
	return p, nil
}

// LoadServerTLS builds a server tls.Config from PEM files.
func LoadServerTLS(certFile, keyFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load TLS key pair %s, %s: %w", certFile, keyFile, err)
	}
	return TunedTLS(&tls.Config{Certificates: []tls.Certificate{cert}}), nil
}

// LoadClientTLS builds a client tls.Config trusting the CA in caFile; an empty
// caFile trusts the system roots.
func LoadClientTLS(caFile string) (*tls.Config, error) {
	cfg := &tls.Config{}
	if caFile != "" {
		pemBytes, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("read CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pemBytes) {
			return nil, fmt.Errorf("CA file %s holds no PEM certificate", caFile)
		}
		cfg.RootCAs = pool
	}
	return TunedTLS(cfg), nil
}

func covers(c *x509.Certificate, hosts []string) bool {
	for _, h := range hosts {
		if c.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

func loadPair(certFile, keyFile string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	cb, err := os.ReadFile(certFile)
	if err != nil {
		return nil, nil, err
	}
	kb, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, nil, err
	}
	cblk, _ := pem.Decode(cb)
	kblk, _ := pem.Decode(kb)
	if cblk == nil || kblk == nil {
		return nil, nil, fmt.Errorf("%s or %s is not PEM", certFile, keyFile)
	}
	cert, err := x509.ParseCertificate(cblk.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("parse %s: %w", certFile, err)
	}
	key, err := x509.ParseECPrivateKey(kblk.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("parse %s: %w", keyFile, err)
	}
	return cert, key, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	return n
}

func newCA(certFile, keyFile string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "Tether development CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	if err := writePair(certFile, keyFile, der, key); err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

func issue(ca *x509.Certificate, caKey *ecdsa.PrivateKey, hosts []string, certFile, keyFile string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "tether coordinator"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(825 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	return writePair(certFile, keyFile, der, key)
}

func writePair(certFile, keyFile string, der []byte, key *ecdsa.PrivateKey) error {
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := writeAtomic(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return err
	}
	return writeAtomic(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

// writeAtomic writes data to a temporary file beside path and renames it into
// place, so a crash never leaves a half-written key or certificate.
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

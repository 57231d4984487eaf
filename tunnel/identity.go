package tunnel

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Node identity: every agent holds a certificate from the coordinator's
// node CA that names its node id, and authenticates with it by mTLS. The
// id is in a URI SAN, NodeURIPrefix + id (CN carries the id too, for
// people; only the URI SAN counts). Everything here is crypto/x509 and
// crypto/tls: no home-made crypto.

// NodeURIPrefix prefixes the URI SAN naming a node id.
const NodeURIPrefix = "urn:tether:node:"

// Sentinel errors of VerifyNode; callers branch on them with errors.Is.
var (
	ErrCertForeign = errors.New("tunnel: certificate not issued by this coordinator's node CA")
	ErrCertExpired = errors.New("tunnel: certificate expired or not yet valid")
	ErrCertNoNode  = errors.New("tunnel: certificate names no node id")
)

// NodeCA is the coordinator's CA for node certificates: it signs the CSRs
// of enrolling and renewing agents and verifies the client certificates
// they present. Safe for concurrent use.
type NodeCA struct {
	cert *x509.Certificate
	key  crypto.Signer
	pool *x509.CertPool
}

// LoadNodeCA loads the CA in dir (CAFile and its key, as EnsureDevPKI
// writes them), creating it (key 0600) when absent. The dev PKI's CA is
// thus also the node CA; a coordinator given its own --tls-cert still keeps
// its node CA in dir.
func LoadNodeCA(dir string) (*NodeCA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("node CA: %w", err)
	}
	certFile, keyFile := filepath.Join(dir, CAFile), filepath.Join(dir, caKeyFile)
	cert, key, err := loadPair(certFile, keyFile)
	if errors.Is(err, os.ErrNotExist) {
		cert, key, err = newCA(certFile, keyFile)
	}
	if err != nil {
		return nil, fmt.Errorf("node CA in %s: %w", dir, err)
	}
	return NewNodeCA(cert, key), nil
}

// NewNodeCA returns the node CA of cert and its key.
func NewNodeCA(cert *x509.Certificate, key crypto.Signer) *NodeCA {
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &NodeCA{cert: cert, key: key, pool: pool}
}

// NewTestCA returns a fresh in-memory node CA (tests, benchmarks).
func NewTestCA(name string) (*NodeCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return NewNodeCA(cert, key), nil
}

// Certificate returns the CA's certificate.
func (ca *NodeCA) Certificate() *x509.Certificate { return ca.cert }

// Sign issues the node certificate of csr for nodeID, valid from now for
// ttl: client authentication only, URI SAN NodeURIPrefix+nodeID. csr must
// have passed ParseNodeCSR for nodeID; its other requested names and
// extensions are ignored.
func (ca *NodeCA) Sign(csr *x509.CertificateRequest, nodeID string, now time.Time, ttl time.Duration) (*x509.Certificate, error) {
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: nodeID},
		URIs:         []*url.URL{NodeURI(nodeID)},
		// No backdating: the coordinator that verifies is the one that
		// issued (or shares its clock within NTP), and the agent never
		// checks its own certificate's dates.
		NotBefore:   now,
		NotAfter:    now.Add(ttl),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, csr.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("sign certificate of node %s: %w", nodeID, err)
	}
	return x509.ParseCertificate(der)
}

// VerifyNode checks that cert chains to the node CA, is valid at now and
// is for client authentication, and returns the node id it names. Errors
// wrap ErrCertForeign, ErrCertExpired or ErrCertNoNode.
func (ca *NodeCA) VerifyNode(cert *x509.Certificate, now time.Time) (string, error) {
	_, err := cert.Verify(x509.VerifyOptions{
		Roots:       ca.pool,
		CurrentTime: now,
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		var inv x509.CertificateInvalidError
		if errors.As(err, &inv) && inv.Reason == x509.Expired {
			return "", fmt.Errorf("%w: serial %s valid %s to %s: %v", ErrCertExpired, SerialHex(cert),
				cert.NotBefore.UTC().Format(time.RFC3339), cert.NotAfter.UTC().Format(time.RFC3339), err)
		}
		return "", fmt.Errorf("%w: serial %s, issuer %q: %v", ErrCertForeign, SerialHex(cert), cert.Issuer.CommonName, err)
	}
	id, err := NodeIDOf(cert)
	if err != nil {
		return "", err
	}
	return id, nil
}

// NodeURI returns the URI SAN naming nodeID.
func NodeURI(nodeID string) *url.URL {
	u, _ := url.Parse(NodeURIPrefix + nodeID)
	return u
}

// NodeIDOf returns the node id cert's one node URI SAN names; an error
// wrapping ErrCertNoNode when it has none or several.
func NodeIDOf(cert *x509.Certificate) (string, error) {
	var ids []string
	for _, u := range cert.URIs {
		if s := u.String(); strings.HasPrefix(s, NodeURIPrefix) {
			ids = append(ids, strings.TrimPrefix(s, NodeURIPrefix))
		}
	}
	if len(ids) != 1 || ids[0] == "" {
		return "", fmt.Errorf("%w: serial %s has %d %s URIs", ErrCertNoNode, SerialHex(cert), len(ids), NodeURIPrefix)
	}
	return ids[0], nil
}

// SerialHex is cert's serial number in lower-case hex, as revocations and
// logs name it.
func SerialHex(cert *x509.Certificate) string {
	return hex.EncodeToString(cert.SerialNumber.Bytes())
}

// NewNodeKey generates an agent's key pair (ECDSA P-256).
func NewNodeKey() (*ecdsa.PrivateKey, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}

// NewNodeCSR returns the DER of a certificate request for key naming
// nodeID (subject CN).
func NewNodeCSR(key crypto.Signer, nodeID string) ([]byte, error) {
	return x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: nodeID}}, key)
}

// ParseNodeCSR parses der, checks its signature (the requester holds the
// key) and that its subject CN is nodeID and its key ECDSA P-256 or
// Ed25519.
func ParseNodeCSR(der []byte, nodeID string) (*x509.CertificateRequest, error) {
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, fmt.Errorf("parse csr of node %s: %w", nodeID, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("csr of node %s: %w", nodeID, err)
	}
	if csr.Subject.CommonName != nodeID {
		return nil, fmt.Errorf("csr of node %s names %q in its subject", nodeID, csr.Subject.CommonName)
	}
	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return nil, fmt.Errorf("csr of node %s: ECDSA key on %s, want P-256", nodeID, k.Curve.Params().Name)
		}
	case ed25519.PublicKey:
	default:
		return nil, fmt.Errorf("csr of node %s: %T key, want ECDSA P-256 or Ed25519", nodeID, k)
	}
	return csr, nil
}

// RequestClientCert returns a copy of cfg, a tunnel listener's server
// config, that asks agents for their certificate without verifying it
// during the TLS handshake (tls.RequestClientCert): TLS still proves the
// agent holds the certificate's key, and the coordinator verifies the
// chain, the dates, the node id and revocation itself, so that each
// refusal gets its own reason, metric and message instead of a bare TLS
// alert, and agents without a certificate can still enroll.
func RequestClientCert(cfg *tls.Config) *tls.Config {
	c := cfg.Clone()
	c.ClientAuth = tls.RequestClientCert
	return c
}

// Files of an agent's identity in its identity directory.
const (
	// IdentityFile holds the node certificate and its key (PEM
	// CERTIFICATE then PRIVATE KEY, PKCS #8), 0600; one file, so a
	// renewal replaces both at once.
	IdentityFile = "node.pem"
	// PinnedCAFile holds the CA the agent pinned for the coordinator's
	// server certificate at enrollment, 0600.
	PinnedCAFile = "ca.crt"
)

// Identity is an agent's certificate and key, and the CA it pins.
type Identity struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// Pinned is the CA the coordinator's certificate must chain to; nil
	// when none was pinned (the enrollment was not over verified TLS).
	Pinned *x509.Certificate
}

// NodeID is the node id the certificate names ("" if none).
func (id *Identity) NodeID() string {
	n, _ := NodeIDOf(id.Cert)
	return n
}

// RenewAt is when the certificate should be renewed: two thirds into its
// lifetime.
func (id *Identity) RenewAt() time.Time {
	life := id.Cert.NotAfter.Sub(id.Cert.NotBefore)
	return id.Cert.NotBefore.Add(life * 2 / 3)
}

// TLSCertificate is the certificate for tls.Config.
func (id *Identity) TLSCertificate() *tls.Certificate {
	return &tls.Certificate{Certificate: [][]byte{id.Cert.Raw}, PrivateKey: id.Key, Leaf: id.Cert}
}

// SaveIdentity writes id to dir (created 0700): IdentityFile and, if
// id.Pinned is set, PinnedCAFile, each 0600 and replaced atomically.
func SaveIdentity(dir string, id *Identity) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("save identity: %w", err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(id.Key)
	if err != nil {
		return fmt.Errorf("save identity: marshal key: %w", err)
	}
	data := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: id.Cert.Raw})
	data = append(data, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb})...)
	if id.Pinned != nil {
		if err := writeAtomic(filepath.Join(dir, PinnedCAFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: id.Pinned.Raw}), 0o600); err != nil {
			return fmt.Errorf("save identity: %w", err)
		}
	}
	if err := writeAtomic(filepath.Join(dir, IdentityFile), data, 0o600); err != nil {
		return fmt.Errorf("save identity: %w", err)
	}
	return nil
}

// LoadIdentity reads the identity SaveIdentity wrote in dir. An error
// wrapping os.ErrNotExist means there is none yet; other errors name the
// file and what is wrong with it.
func LoadIdentity(dir string) (*Identity, error) {
	path := filepath.Join(dir, IdentityFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load identity: %w", err)
	}
	id := &Identity{}
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		switch blk.Type {
		case "CERTIFICATE":
			if id.Cert, err = x509.ParseCertificate(blk.Bytes); err != nil {
				return nil, fmt.Errorf("load identity %s: certificate: %w", path, err)
			}
		case "PRIVATE KEY":
			k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
			if err != nil {
				return nil, fmt.Errorf("load identity %s: key: %w", path, err)
			}
			s, ok := k.(crypto.Signer)
			if !ok {
				return nil, fmt.Errorf("load identity %s: key of type %T cannot sign", path, k)
			}
			id.Key = s
		}
	}
	if id.Cert == nil || id.Key == nil {
		return nil, fmt.Errorf("load identity %s: want a CERTIFICATE and a PRIVATE KEY block", path)
	}
	if _, err := NodeIDOf(id.Cert); err != nil {
		return nil, fmt.Errorf("load identity %s: %w", path, err)
	}
	caPath := filepath.Join(dir, PinnedCAFile)
	if cb, err := os.ReadFile(caPath); err == nil {
		blk, _ := pem.Decode(cb)
		if blk == nil {
			return nil, fmt.Errorf("load identity: %s is not PEM", caPath)
		}
		if id.Pinned, err = x509.ParseCertificate(blk.Bytes); err != nil {
			return nil, fmt.Errorf("load identity: %s: %w", caPath, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("load identity: %w", err)
	}
	return id, nil
}

// PinnedRoot returns the root of the chain that verified the server of
// cs, the CA an enrolling agent pins; nil when the connection's server was
// not verified (InsecureSkipVerify, or not TLS).
func PinnedRoot(cs tls.ConnectionState) *x509.Certificate {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return nil
	}
	ch := cs.VerifiedChains[0]
	return ch[len(ch)-1]
}

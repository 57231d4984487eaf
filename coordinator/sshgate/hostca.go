package sshgate

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/tetherfleet/tether/internal/sshkey"
	"github.com/tetherfleet/tether/protocol"
)

// Host certificates.
const (
	// DefaultHostCertLifetime is how long a host certificate the HostCA
	// issues is valid, from its issue (ValidAfter is HostCertBackdate
	// earlier, for clients whose clock is behind).
	DefaultHostCertLifetime = 7 * 24 * time.Hour
	// HostCertBackdate is how far before its issue a host certificate is
	// valid.
	HostCertBackdate = 5 * time.Minute
	// HostCAComment ends the known_hosts lines the HostCA writes.
	HostCAComment = "tether-host-ca"
	// NodeKeyIDPrefix starts the KeyId of a node's host certificate,
	// followed by the node id.
	NodeKeyIDPrefix = "tether-node:"
	// maxCertCache bounds the certificates a HostCA keeps for reuse (one
	// per node); past it the cache is emptied.
	maxCertCache = 100_000
)

// HostCA is the SSH host certificate authority of the fleet: it certifies
// each node's host key (Hello.SSHHostKey) for the node's names, so that a
// client trusts every node with one known_hosts line
// (KnownHostsLine), and the jump host's own key. Its key is an ed25519 key
// in a file (LoadHostCA). It is safe for concurrent use.
type HostCA struct {
	signer   ssh.Signer
	lifetime time.Duration
	now      func() time.Time

	mu    sync.Mutex
	cache map[string]hostCert // by node id
}

// hostCert is a certificate issued for a node, reused until its half-life.
type hostCert struct {
	key     string // the certified key's wire form
	wire    []byte // the certificate's wire form
	renewAt time.Time
}

// LoadHostCA loads the host CA's ed25519 private key from path (an
// unencrypted OpenSSH private key file, mode 0600), creating it when the
// file does not exist. lifetime is how long its certificates are valid
// (0: DefaultHostCertLifetime); it must exceed HostCertBackdate. A file that
// exists but is not such a key is an error naming it.
func LoadHostCA(path string, lifetime time.Duration) (*HostCA, error) {
	if lifetime == 0 {
		lifetime = DefaultHostCertLifetime
	}
	if lifetime <= HostCertBackdate {
		return nil, fmt.Errorf("ssh host CA %s: certificate lifetime %v: want over %v", path, lifetime, HostCertBackdate)
	}
	signer, err := sshkey.LoadOrCreate(path, HostCAComment)
	if err != nil {
		return nil, fmt.Errorf("ssh host CA: %w", err)
	}
	return &HostCA{signer: signer, lifetime: lifetime, now: time.Now, cache: map[string]hostCert{}}, nil
}

// PublicKey returns the CA's public key, which clients trust with
// @cert-authority.
func (ca *HostCA) PublicKey() ssh.PublicKey { return ca.signer.PublicKey() }

// KnownHostsLine returns the known_hosts line that makes a client trust
// every node host certificate of this CA for names ending in
// protocol.SSHHostSuffix ("@cert-authority *.tether ssh-ed25519 AAAA…
// tether-host-ca"), without a newline.
func (ca *HostCA) KnownHostsLine() string {
	return ca.KnownHostsLineFor("*" + protocol.SSHHostSuffix)
}

// KnownHostsLineFor returns the @cert-authority known_hosts line for the
// given host patterns, written as known_hosts takes them (comma-joined;
// "*" and "?" wildcards; "[host]:port" for a port other than 22; a
// HostKeyAlias as is): for node ids without the suffix ("node-a") or the
// jump host's names. With no pattern it is KnownHostsLine.
func (ca *HostCA) KnownHostsLineFor(patterns ...string) string {
	if len(patterns) == 0 {
		return ca.KnownHostsLine()
	}
	return "@cert-authority " + strings.Join(patterns, ",") + " " + authorizedKey(ca.PublicKey()) + " " + HostCAComment
}

// Certify returns a host certificate, in wire form, for the node's host key
// hostKey (wire form, a plain key): CertType HostCert, principals nodeID
// and nodeID+protocol.SSHHostSuffix (and both lowercased, for an id with
// capitals: OpenSSH checks the host name it lowercased), KeyId NodeKeyIDPrefix+nodeID, valid
// from HostCertBackdate ago for the CA's lifetime, with a random serial. A
// certificate is reused for the same node and key until half its lifetime
// has passed. A node id that protocol.ValidNodeID refuses, or a host key
// that does not parse, is too large or is itself a certificate, is an
// error.
func (ca *HostCA) Certify(nodeID string, hostKey []byte) ([]byte, error) {
	if err := protocol.ValidNodeID(nodeID); err != nil {
		return nil, fmt.Errorf("ssh host CA: certifying: %w", err)
	}
	if len(hostKey) > protocol.MaxSSHKeySize {
		return nil, fmt.Errorf("ssh host CA: node %s's host key: %d bytes, over %d", nodeID, len(hostKey), protocol.MaxSSHKeySize)
	}
	now := ca.now()
	ca.mu.Lock()
	c, ok := ca.cache[nodeID]
	ca.mu.Unlock()
	if ok && c.key == string(hostKey) && now.Before(c.renewAt) {
		return c.wire, nil
	}
	key, err := ssh.ParsePublicKey(hostKey)
	if err != nil {
		return nil, fmt.Errorf("ssh host CA: node %s's host key: %w", nodeID, err)
	}
	principals := []string{nodeID, nodeID + protocol.SSHHostSuffix}
	if low := strings.ToLower(nodeID); low != nodeID {
		// OpenSSH checks a host certificate's principals against the host
		// name (or HostKeyAlias) it lowercased.
		principals = append(principals, low, low+protocol.SSHHostSuffix)
	}
	cert, err := ca.certify(key, principals, NodeKeyIDPrefix+nodeID, now)
	if err != nil {
		return nil, fmt.Errorf("ssh host CA: node %s: %w", nodeID, err)
	}
	wire := cert.Marshal()
	ca.mu.Lock()
	if len(ca.cache) >= maxCertCache {
		clear(ca.cache)
	}
	ca.cache[nodeID] = hostCert{key: string(hostKey), wire: wire, renewAt: now.Add(ca.lifetime / 2)}
	ca.mu.Unlock()
	return wire, nil
}

// certify signs a host certificate for key (a plain key) naming
// principals, issued at now.
func (ca *HostCA) certify(key ssh.PublicKey, principals []string, keyID string, now time.Time) (*ssh.Certificate, error) {
	if _, isCert := key.(*ssh.Certificate); isCert {
		return nil, errors.New("the host key is a certificate, not a plain key")
	}
	var serial [8]byte
	if _, err := rand.Read(serial[:]); err != nil {
		return nil, fmt.Errorf("drawing a serial: %w", err)
	}
	cert := &ssh.Certificate{
		Key:             key,
		Serial:          binary.BigEndian.Uint64(serial[:]),
		CertType:        ssh.HostCert,
		KeyId:           keyID,
		ValidPrincipals: principals,
		ValidAfter:      uint64(now.Add(-HostCertBackdate).Unix()),
		ValidBefore:     uint64(now.Add(ca.lifetime).Unix()),
	}
	if err := cert.SignCert(rand.Reader, ca.signer); err != nil {
		return nil, fmt.Errorf("signing the host certificate: %w", err)
	}
	return cert, nil
}

// authorizedKey is key in authorized_keys form without the newline
// ("ssh-ed25519 AAAA…").
func authorizedKey(key ssh.PublicKey) string {
	return strings.TrimSuffix(string(ssh.MarshalAuthorizedKey(key)), "\n")
}

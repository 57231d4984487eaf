package sshgate

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/tetherfleet/tether/internal/identity"
	"github.com/tetherfleet/tether/policy"
)

// Authentication (CVE-2024-45337). OpenSSH clients offer keys before they
// prove them: PublicKeyCallback runs for every key offered, proved or not,
// so it only decides whether a key would be accepted and records nothing
// outside the Permissions it returns. The identity is read after the
// handshake from ServerConn.Permissions, which golang.org/x/crypto/ssh
// (since v0.31) sets from the callback's result for the key whose
// signature it verified; VerifiedPublicKeyCallback checks again that those
// Permissions name that key. The SSH user name the client sends is ignored
// (clients send their local user name; the login on the node is chosen in
// the inner connection, among SSHParams.Logins).

// Keys of the Permissions a successful PublicKeyCallback returns.
const (
	// extKey is the key's wire form (a certificate's whole blob).
	extKey = "tether-key@tetherfleet"
	// extIdentity is the identity's String.
	extIdentity = "tether-identity@tetherfleet"
	// sourceAddressOption is the one critical option the gate honours.
	sourceAddressOption = "source-address"
)

// identityData is the ExtraData key of the policy.Identity of a key.
type identityData struct{}

// Reasons of tether_ssh_auth_failures_total: why a key was refused.
const (
	reasonUnknownKey     = "unknown_key"     // a plain key not in the authorized keys
	reasonNotUserCert    = "not_user_cert"   // a host certificate offered as a user's
	reasonUnknownCA      = "unknown_ca"      // a certificate of no configured user CA
	reasonCertByCert     = "cert_by_cert"    // a certificate signed by a certificate
	reasonExpired        = "expired"         // past ValidBefore (plus the clock skew)
	reasonNotYetValid    = "not_yet_valid"   // before ValidAfter (less the clock skew)
	reasonNoPrincipals   = "no_principals"   // a certificate naming no usable principal
	reasonCriticalOption = "critical_option" // a critical option the gate cannot honour
	reasonSourceAddress  = "source_address"  // the source-address option excludes the client
	reasonBadSignature   = "bad_signature"   // the CA's signature does not verify
	reasonBadKey         = "bad_key"         // a key the library could not parse or accept
)

var authReasons = []string{
	reasonUnknownKey, reasonNotUserCert, reasonUnknownCA, reasonCertByCert, reasonExpired,
	reasonNotYetValid, reasonNoPrincipals, reasonCriticalOption, reasonSourceAddress,
	reasonBadSignature, reasonBadKey,
}

// authError is a key refusal: reason is its metric label.
type authError struct {
	reason string
	msg    string
}

func (e *authError) Error() string { return "ssh gate: " + e.msg }

func refuseKey(reason, format string, args ...any) *authError {
	return &authError{reason: reason, msg: fmt.Sprintf(format, args...)}
}

// checkKey decides whether key (offered by the client at remote) would
// authenticate, under keys at now with skew of clock tolerance: the
// Permissions it would authenticate with, or an *authError. It records
// nothing.
func checkKey(keys *keySet, key ssh.PublicKey, remote net.Addr, now time.Time, skew time.Duration) (*ssh.Permissions, error) {
	cert, isCert := key.(*ssh.Certificate)
	var id policy.Identity
	var critical map[string]string
	if !isCert {
		if _, ok := keys.users[string(key.Marshal())]; !ok {
			return nil, refuseKey(reasonUnknownKey, "key %s is not an authorized key", ssh.FingerprintSHA256(key))
		}
		id = policy.Identity{Kind: policy.KindSSHKey, Name: ssh.FingerprintSHA256(key)}
	} else {
		var err error
		if id, err = checkCert(keys, cert, remote, now, skew); err != nil {
			return nil, err
		}
		if len(cert.CriticalOptions) != 0 {
			// The library enforces source-address again from these.
			critical = map[string]string{sourceAddressOption: cert.CriticalOptions[sourceAddressOption]}
		}
	}
	return &ssh.Permissions{
		CriticalOptions: critical,
		Extensions:      map[string]string{extKey: string(key.Marshal()), extIdentity: id.String()},
		ExtraData:       map[any]any{identityData{}: id},
	}, nil
}

// checkCert checks a user certificate: its type, its CA, its validity,
// its critical options, its principals and its signature, in that order
// (the cheap checks first).
func checkCert(keys *keySet, cert *ssh.Certificate, remote net.Addr, now time.Time, skew time.Duration) (policy.Identity, error) {
	fp := ssh.FingerprintSHA256(cert.Key)
	if cert.CertType != ssh.UserCert {
		return policy.Identity{}, refuseKey(reasonNotUserCert, "certificate of key %s is not a user certificate (type %d)", fp, cert.CertType)
	}
	if cert.SignatureKey == nil {
		return policy.Identity{}, refuseKey(reasonBadSignature, "certificate of key %s has no signature key", fp)
	}
	if _, byCert := cert.SignatureKey.(*ssh.Certificate); byCert {
		return policy.Identity{}, refuseKey(reasonCertByCert, "certificate of key %s is signed by a certificate, not a CA key", fp)
	}
	caFP := ssh.FingerprintSHA256(cert.SignatureKey)
	if _, ok := keys.cas[string(cert.SignatureKey.Marshal())]; !ok {
		return policy.Identity{}, refuseKey(reasonUnknownCA, "certificate of key %s is signed by %s, not a configured user CA", fp, caFP)
	}
	if err := checkValidity(cert, now, skew); err != nil {
		return policy.Identity{}, err
	}
	for opt, val := range cert.CriticalOptions {
		if opt != sourceAddressOption {
			return policy.Identity{}, refuseKey(reasonCriticalOption, "certificate %q has critical option %s, which the gate cannot honour", clip(cert.KeyId), clipString(opt, 40))
		}
		if err := checkSourceAddress(val, remote); err != nil {
			return policy.Identity{}, refuseKey(reasonSourceAddress, "certificate %q: %v", clip(cert.KeyId), err)
		}
	}
	var principals []string
	for _, p := range cert.ValidPrincipals {
		if identity.CheckSSHPrincipal(p) == nil && !slices.Contains(principals, p) {
			principals = append(principals, p)
			if len(principals) == policy.MaxPrincipals {
				break
			}
		}
	}
	if len(principals) == 0 {
		return policy.Identity{}, refuseKey(reasonNoPrincipals, "certificate %q names no principal a policy can match (%d principals)", clip(cert.KeyId), len(cert.ValidPrincipals))
	}
	// The signature last: the library's own check, given a clock at which
	// the validity checked above holds.
	checker := ssh.CertChecker{
		SupportedCriticalOptions: []string{sourceAddressOption},
		Clock:                    func() time.Time { return time.Unix(int64(cert.ValidAfter), 0) },
	}
	if err := checker.CheckCert(principals[0], cert); err != nil {
		return policy.Identity{}, refuseKey(reasonBadSignature, "certificate %q of key %s: %v", clip(cert.KeyId), fp, err)
	}
	return policy.Identity{Kind: policy.KindSSHPrincipal, Name: principals[0], Principals: principals}, nil
}

// checkValidity checks that now lies in [ValidAfter-skew, ValidBefore+skew)
// and that the window is not empty.
func checkValidity(cert *ssh.Certificate, now time.Time, skew time.Duration) error {
	if cert.ValidAfter > math.MaxInt64 {
		return refuseKey(reasonNotYetValid, "certificate %q is not valid before the end of time", clip(cert.KeyId))
	}
	after := time.Unix(int64(cert.ValidAfter), 0)
	if now.Add(skew).Before(after) {
		return refuseKey(reasonNotYetValid, "certificate %q is not valid before %s", clip(cert.KeyId), after.UTC().Format(time.RFC3339))
	}
	if cert.ValidBefore == ssh.CertTimeInfinity {
		return nil
	}
	if cert.ValidBefore > math.MaxInt64 || cert.ValidBefore <= cert.ValidAfter {
		return refuseKey(reasonExpired, "certificate %q has an empty validity window", clip(cert.KeyId))
	}
	before := time.Unix(int64(cert.ValidBefore), 0)
	if !now.Add(-skew).Before(before) {
		return refuseKey(reasonExpired, "certificate %q expired at %s", clip(cert.KeyId), before.UTC().Format(time.RFC3339))
	}
	return nil
}

// checkSourceAddress checks the source-address critical option: a
// comma-separated list of addresses and CIDR prefixes, one of which must
// hold remote's IP address (no spaces, as OpenSSH and the SSH library
// read it). A remote that is not an IP address never
// matches (as in OpenSSH).
func checkSourceAddress(list string, remote net.Addr) error {
	var ip netip.Addr
	if ta, ok := remote.(*net.TCPAddr); ok {
		ip, _ = netip.AddrFromSlice(ta.IP)
	} else if remote != nil {
		if ap, err := netip.ParseAddrPort(remote.String()); err == nil {
			ip = ap.Addr()
		}
	}
	ip = ip.Unmap().WithZone("")
	for _, item := range strings.Split(list, ",") {
		var pfx netip.Prefix
		var err error
		if strings.Contains(item, "/") {
			pfx, err = netip.ParsePrefix(item)
		} else {
			var a netip.Addr
			if a, err = netip.ParseAddr(item); err == nil {
				pfx = netip.PrefixFrom(a, a.BitLen())
			}
		}
		if err != nil {
			return fmt.Errorf("source-address %s: %s is not an address or a CIDR prefix", clipString(list, 80), clipString(item, 40))
		}
		if ip.IsValid() && pfx.Contains(ip) {
			return nil
		}
	}
	return fmt.Errorf("source-address %s excludes %s", clipString(list, 80), remote)
}

// verifiedKey is VerifiedPublicKeyCallback: the library calls it with the
// key whose signature it verified and the Permissions checkKey returned
// for that key. It checks that they belong together.
func verifiedKey(_ ssh.ConnMetadata, key ssh.PublicKey, perms *ssh.Permissions, _ string) (*ssh.Permissions, error) {
	if perms == nil || perms.Extensions[extKey] != string(key.Marshal()) {
		return nil, errors.New("ssh gate: the verified key is not the key that was authorized")
	}
	return perms, nil
}

// proven is what the handshake proved: the identity and the key.
type proven struct {
	id  policy.Identity
	key ssh.PublicKey
}

// provenOf reads the identity and key from a ServerConn's Permissions,
// checking that the three records agree.
func provenOf(perms *ssh.Permissions) (proven, error) {
	if perms == nil {
		return proven{}, errors.New("ssh gate: authenticated without permissions")
	}
	id, ok := perms.ExtraData[identityData{}].(policy.Identity)
	if !ok || id.String() != perms.Extensions[extIdentity] {
		return proven{}, errors.New("ssh gate: the permissions' identity records disagree")
	}
	wire := perms.Extensions[extKey]
	key, err := ssh.ParsePublicKey([]byte(wire))
	if err != nil {
		return proven{}, fmt.Errorf("ssh gate: the permissions' key: %w", err)
	}
	if !bytes.Equal(key.Marshal(), []byte(wire)) {
		return proven{}, errors.New("ssh gate: the permissions' key does not round-trip")
	}
	return proven{id: id, key: key}, nil
}

// stillTrusted reports why a key proved earlier would no longer
// authenticate under keys at now (a key removed by a reload, a certificate
// now expired or its CA removed), or nil.
func stillTrusted(keys *keySet, key ssh.PublicKey, now time.Time, skew time.Duration) error {
	cert, isCert := key.(*ssh.Certificate)
	if !isCert {
		if _, ok := keys.users[string(key.Marshal())]; !ok {
			return refuseKey(reasonUnknownKey, "key %s is no longer an authorized key", ssh.FingerprintSHA256(key))
		}
		return nil
	}
	if _, ok := keys.cas[string(cert.SignatureKey.Marshal())]; !ok {
		return refuseKey(reasonUnknownCA, "the CA of certificate %q is no longer trusted", clip(cert.KeyId))
	}
	return checkValidity(cert, now, skew)
}

// clip cuts s to 64 bytes for a message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

package policy

import (
	"fmt"
	"slices"

	"github.com/tetherfleet/tether/internal/identity"
	"github.com/tetherfleet/tether/protocol"
)

// Kind is what proved an identity: the kind part of KIND:VALUE.
type Kind uint8

// Identity kinds. The zero Kind is invalid.
const (
	// KindNATS: a NATS user, named by the name in its user JWT or by its
	// public key.
	KindNATS Kind = iota + 1
	// KindNATSAccount: every user of one NATS account. A policy entry of
	// this kind matches callers by Identity.Account; it is never a caller's
	// own Kind.
	KindNATSAccount
	// KindCert: a facade client certificate, by its subject common name.
	KindCert
	// KindToken: a facade bearer token, by the name it was issued under.
	KindToken
	// KindSSHKey: an SSH public key a client proved to the jump host, by
	// its SHA-256 fingerprint as ssh-keygen -l prints it ("SHA256:" and 43
	// characters of unpadded base64).
	KindSSHKey
	// KindSSHPrincipal: an SSH user certificate from a trusted user CA,
	// by one of its principals. A caller of this kind is named by its
	// first principal and matches the entries of all of them
	// (Identity.Principals).
	KindSSHPrincipal
	numKinds // one past the last kind
)

var kindNames = [numKinds]string{
	KindNATS:         identity.NATS,
	KindNATSAccount:  identity.NATSAccount,
	KindCert:         identity.Cert,
	KindToken:        identity.Token,
	KindSSHKey:       identity.SSHKey,
	KindSSHPrincipal: identity.SSHPrincipal,
}

// Kinds lists every identity kind, in declaration order.
func Kinds() []Kind {
	out := make([]Kind, 0, numKinds-1)
	for k := KindNATS; k < numKinds; k++ {
		out = append(out, k)
	}
	return out
}

// Valid reports whether k is a defined kind.
func (k Kind) Valid() bool { return k >= KindNATS && k < numKinds }

// String returns the kind as written in a policy file ("nats",
// "nats-account", "cert", "token", "ssh-key", "ssh-principal"), or
// "kind(N)" for an invalid one.
func (k Kind) String() string {
	if k.Valid() {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// parseKind maps a kind's name to its Kind.
func parseKind(s string) (Kind, bool) {
	for k := KindNATS; k < numKinds; k++ {
		if kindNames[k] == s {
			return k, true
		}
	}
	return 0, false
}

// Identity is a caller as the transport proved it. The coordinator fills it
// from what the NATS server stamped on a request (natsauth), a verified
// client certificate or a token lookup, never from what a client wrote.
type Identity struct {
	// Kind is KindNATS, KindCert, KindToken, KindSSHKey or
	// KindSSHPrincipal.
	Kind Kind
	// Name is the NATS user JWT's name, the certificate's common name, the
	// token's name, the SSH key's fingerprint or the SSH certificate's
	// first principal. It may be empty for a NATS user known by key only.
	Name string
	// Key is a NATS user's public key (56 characters from 'U'); empty for
	// other kinds.
	Key string
	// Account is a NATS user's account, as the identity layer names it
	// (matched verbatim against nats-account: entries); empty for other
	// kinds.
	Account string
	// Principals are an SSH certificate's valid principals (Name is the
	// first), at most MaxPrincipals; empty for other kinds.
	Principals []string
}

// MaxPrincipals bounds Identity.Principals: a certificate's principals
// past it are not looked up.
const MaxPrincipals = 16

// String is the identity as policies, messages and owners name it:
// KIND:NAME, or KIND:KEY when the name is empty.
func (id Identity) String() string {
	v := id.Name
	if v == "" {
		v = id.Key
	}
	return id.Kind.String() + ":" + v
}

// owns reports whether owner (an Identity.String recorded on a job or run)
// names id, by name or by key, without building id's string.
func (id Identity) owns(owner string) bool {
	k := id.Kind.String()
	if len(owner) <= len(k) || owner[:len(k)] != k || owner[len(k)] != ':' {
		return false
	}
	v := owner[len(k)+1:]
	if v == "" {
		return false
	}
	return v == id.Name || v == id.Key || id.Kind == KindSSHPrincipal && slices.Contains(id.Principals, v)
}

// entryKey is a policy entry's identity, parsed: the kind and the value
// callers are matched on (a name or a key).
type entryKey struct {
	kind  Kind
	value string
}

// parseEntryKey parses and checks KIND:VALUE, the key of an identities
// entry, by identity.Parse's rule.
func parseEntryKey(s string) (entryKey, error) {
	kindText, value, err := identity.Parse(s)
	if err != nil {
		return entryKey{}, err
	}
	kind, ok := parseKind(kindText)
	if !ok { // identity.Kinds and kindNames are kept equal (TestKindNamesInProtocol)
		return entryKey{}, fmt.Errorf("identity %q: unknown kind %q", s, kindText)
	}
	return entryKey{kind: kind, value: value}, nil
}

// maxUser bounds a run_as user name, in bytes (useradd's default).
const maxUser = 32

// checkUser checks a run_as user name: 1-32 bytes of [A-Za-z0-9._-],
// starting with a letter or '_' (so never a number, which could be read as
// a uid, nor an option).
func checkUser(v string) error {
	if v == "" {
		return fmt.Errorf("the user name is empty")
	}
	if len(v) > maxUser {
		return fmt.Errorf("user name %q is %d bytes, over %d", v, len(v), maxUser)
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_'
		if i == 0 && !letter {
			return fmt.Errorf("user name %q must start with a letter or '_'", v)
		}
		if !letter && !(c >= '0' && c <= '9') && c != '.' && c != '-' {
			return fmt.Errorf("user name %q: %s is not allowed (letters, digits, '.', '_' and '-' only)", v, protocol.CharAt(v, i))
		}
	}
	return nil
}

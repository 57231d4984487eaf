package policy

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nkeys"

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
	KindNATS:         "nats",
	KindNATSAccount:  "nats-account",
	KindCert:         "cert",
	KindToken:        "token",
	KindSSHKey:       "ssh-key",
	KindSSHPrincipal: "ssh-principal",
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

// Bounds of identity values, in bytes.
const (
	maxNATSName = 128
	maxName     = 64 // account, token and certificate common names (X.509's ub-common-name)
	nkeyLen     = 56
)

// parseEntryKey parses and checks KIND:VALUE, the key of an identities
// entry.
func parseEntryKey(s string) (entryKey, error) {
	kindText, value, ok := strings.Cut(s, ":")
	if !ok {
		return entryKey{}, fmt.Errorf("identity %q: want KIND:VALUE, KIND one of %s", s, kindList())
	}
	kind, ok := parseKind(kindText)
	if !ok {
		return entryKey{}, fmt.Errorf("identity %q: unknown kind %q: want one of %s", s, kindText, kindList())
	}
	var err error
	switch kind {
	case KindNATS:
		err = checkNKeyOrName(value, 'U', "user", maxNATSName, "._@+-")
	case KindNATSAccount:
		err = checkNKeyOrName(value, 'A', "account", maxName, "._-")
	case KindCert:
		err = checkCommonName(value)
	case KindToken:
		err = checkName(value, maxName, "._-")
	case KindSSHKey:
		err = CheckSSHFingerprint(value)
	case KindSSHPrincipal:
		err = CheckSSHPrincipal(value)
	}
	if err != nil {
		return entryKey{}, fmt.Errorf("identity %q: %w", s, err)
	}
	return entryKey{kind: kind, value: value}, nil
}

// ValidIdentity checks s, a caller's identity as Identity.String writes it
// and job owners and audit events record it: KIND:NAME or KIND:KEY, by
// the rules of a policy file's identities entries (the kinds of Kinds but
// nats-account, which names every user of an account, never one caller).
// The error quotes s and says what is wrong: an unknown kind, a value too
// long, or the first character its kind does not allow.
func ValidIdentity(s string) error {
	k, err := parseEntryKey(s)
	if err != nil {
		return err
	}
	if k.kind == KindNATSAccount {
		return fmt.Errorf("identity %q: %s names every user of an account in a policy, never one caller: give nats:USER", s, KindNATSAccount)
	}
	return nil
}

func kindList() string {
	names := make([]string, 0, numKinds-1)
	for _, k := range Kinds() {
		names = append(names, k.String())
	}
	return strings.Join(names, ", ")
}

// looksLikeNKey reports whether s has the shape of an NKey public key with
// the given prefix byte: 56 characters of base32 (A-Z, 2-7).
func looksLikeNKey(s string, prefix byte) bool {
	if len(s) != nkeyLen || s[0] != prefix {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'A' && c <= 'Z' || c >= '2' && c <= '7') {
			return false
		}
	}
	return true
}

// checkNKeyOrName accepts a valid public key of the given kind, or a name.
// A value shaped like a key must be a valid one: a typo in a key must not
// silently become a name that matches nobody.
func checkNKeyOrName(v string, prefix byte, what string, max int, extra string) error {
	if looksLikeNKey(v, prefix) {
		valid := nkeys.IsValidPublicUserKey(v)
		if prefix == 'A' {
			valid = nkeys.IsValidPublicAccountKey(v)
		}
		if !valid {
			return fmt.Errorf("%q has the shape of a NATS %s public key but is not one (bad checksum)", v, what)
		}
		return nil
	}
	return checkName(v, max, extra)
}

// checkName checks a name: 1 to max bytes of ASCII letters, digits and the
// extra characters, starting with a letter or digit.
func checkName(v string, max int, extra string) error {
	if v == "" {
		return fmt.Errorf("the name is empty")
	}
	if len(v) > max {
		return fmt.Errorf("name is %d bytes, over %d", len(v), max)
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if i == 0 && !alnum {
			return fmt.Errorf("name %q must start with a letter or digit", v)
		}
		if !alnum && strings.IndexByte(extra, c) < 0 {
			return fmt.Errorf("name %q: %s is not allowed (letters, digits and %q only)", v, protocol.CharAt(v, i), extra)
		}
	}
	return nil
}

// checkCommonName checks a certificate common name: 1 to 64 bytes of valid
// UTF-8, every character printable (unicode.IsPrint: the only space is
// U+0020), with no leading or trailing space.
func checkCommonName(v string) error {
	switch {
	case v == "":
		return fmt.Errorf("the common name is empty")
	case len(v) > maxName:
		return fmt.Errorf("common name is %d bytes, over %d", len(v), maxName)
	case !utf8.ValidString(v):
		return fmt.Errorf("common name %q is not valid UTF-8", v)
	case strings.TrimSpace(v) != v:
		return fmt.Errorf("common name %q has leading or trailing space", v)
	}
	for _, r := range v {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("common name %q has the unprintable character %U", v, r)
		}
	}
	return nil
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

// sshFingerprintLen is the length of "SHA256:" and the 43 characters of
// unpadded base64 of a SHA-256 digest.
const sshFingerprintLen = len("SHA256:") + 43

// CheckSSHFingerprint checks an ssh-key: value: an SSH key's SHA-256
// fingerprint as ssh-keygen -l and golang.org/x/crypto/ssh's
// FingerprintSHA256 write it, "SHA256:" then 43 characters of unpadded
// standard base64 (the last one of the 16 that end a 256-bit value).
func CheckSSHFingerprint(v string) error {
	if len(v) != sshFingerprintLen || !strings.HasPrefix(v, "SHA256:") {
		return fmt.Errorf("SSH key fingerprint %q: want SHA256: and 43 base64 characters, as ssh-keygen -lf KEY prints it", clip(v))
	}
	b := v[len("SHA256:"):]
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '/') {
			return fmt.Errorf("SSH key fingerprint %q: character %q is not base64", clip(v), c)
		}
	}
	// 43 characters carry 258 bits; the last one's low 2 bits are zero.
	if strings.IndexByte("AEIMQUYcgkosw048", b[len(b)-1]) < 0 {
		return fmt.Errorf("SSH key fingerprint %q: not the encoding of a SHA-256 digest (bad last character)", clip(v))
	}
	return nil
}

// maxPrincipal bounds an ssh-principal: value, in bytes.
const maxPrincipal = 128

// CheckSSHPrincipal checks an ssh-principal: value: 1 to 128 bytes of
// [A-Za-z0-9._@+-], starting with a letter or digit (user names, e-mail
// addresses and host names; a certificate principal outside this set
// never matches an entry).
func CheckSSHPrincipal(v string) error {
	return checkName(v, maxPrincipal, "._@+-")
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

package identity

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nkeys"

	"github.com/tetherfleet/tether/protocol"
)

// Identity kinds as policies, job owners and audit events write them: the
// KIND of KIND:VALUE. package policy's Kind names these (its String); they
// live here so that a client can check an identity it is given (tether job
// list --owner, tether audit --identity) without linking policy's parser.
const (
	NATS         = "nats"          // a NATS user, by its JWT's name or its public key
	NATSAccount  = "nats-account"  // every user of one NATS account (policy entries only)
	Cert         = "cert"          // a facade client certificate, by its common name
	Token        = "token"         // a facade bearer token, by the name it was issued under
	SSHKey       = "ssh-key"       // an SSH key, by its SHA-256 fingerprint
	SSHPrincipal = "ssh-principal" // an SSH certificate principal
)

// Kinds lists the kinds in the order policy declares them.
var Kinds = []string{
	NATS, NATSAccount, Cert, Token, SSHKey, SSHPrincipal,
}

// Bounds of identity values, in bytes.
const (
	maxNATSName     = 128
	maxIdentityName = 64 // account, token and certificate common names (X.509's ub-common-name)
	nkeyLen         = 56
	maxPrincipal    = 128
)

// Parse parses and checks KIND:VALUE, an identity as a policy's
// identities entries, job owners and audit events write it, returning the
// kind (one of Kinds) and the value. The error quotes s and says
// what is wrong: no colon, an unknown kind, a value too long, a value
// shaped like an NKey with a bad checksum, or the first character its kind
// does not allow.
func Parse(s string) (kind, value string, err error) {
	kind, value, ok := strings.Cut(s, ":")
	if !ok {
		return "", "", fmt.Errorf("identity %q: want KIND:VALUE, KIND one of %s", s, strings.Join(Kinds, ", "))
	}
	switch kind {
	case NATS:
		err = checkNKeyOrName(value, 'U', "user", maxNATSName, "._@+-")
	case NATSAccount:
		err = checkNKeyOrName(value, 'A', "account", maxIdentityName, "._-")
	case Cert:
		err = checkCommonName(value)
	case Token:
		err = CheckName(value, maxIdentityName, "._-")
	case SSHKey:
		err = CheckSSHFingerprint(value)
	case SSHPrincipal:
		err = CheckSSHPrincipal(value)
	default:
		return "", "", fmt.Errorf("identity %q: unknown kind %q: want one of %s", s, kind, strings.Join(Kinds, ", "))
	}
	if err != nil {
		return "", "", fmt.Errorf("identity %q: %w", s, err)
	}
	return kind, value, nil
}

// CheckCaller checks s, one caller's identity as job owners and audit
// events record it: Parse's rule, but nats-account, which names
// every user of an account, is refused.
func CheckCaller(s string) error {
	kind, _, err := Parse(s)
	if err != nil {
		return err
	}
	if kind == NATSAccount {
		return fmt.Errorf("identity %q: %s names every user of an account in a policy, never one caller: give nats:USER", s, NATSAccount)
	}
	return nil
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
	return CheckName(v, max, extra)
}

// CheckName checks a name: 1 to max bytes of ASCII letters, digits and the
// extra characters, starting with a letter or digit. The error names the
// first character not allowed (CharAt).
func CheckName(v string, max int, extra string) error {
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
	case len(v) > maxIdentityName:
		return fmt.Errorf("common name is %d bytes, over %d", len(v), maxIdentityName)
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

// sshFingerprintLen is the length of "SHA256:" and the 43 characters of
// unpadded base64 of a SHA-256 digest.
const sshFingerprintLen = len("SHA256:") + 43

// CheckSSHFingerprint checks an ssh-key: value: an SSH key's SHA-256
// fingerprint as ssh-keygen -l and golang.org/x/crypto/ssh's
// FingerprintSHA256 write it, "SHA256:" then 43 characters of unpadded
// standard base64 (the last one of the 16 that end a 256-bit value).
func CheckSSHFingerprint(v string) error {
	if len(v) != sshFingerprintLen || !strings.HasPrefix(v, "SHA256:") {
		return fmt.Errorf("SSH key fingerprint %q: want SHA256: and 43 base64 characters, as ssh-keygen -lf KEY prints it", clip80(v))
	}
	b := v[len("SHA256:"):]
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '/') {
			return fmt.Errorf("SSH key fingerprint %q: character %q is not base64", clip80(v), c)
		}
	}
	// 43 characters carry 258 bits; the last one's low 2 bits are zero.
	if strings.IndexByte("AEIMQUYcgkosw048", b[len(b)-1]) < 0 {
		return fmt.Errorf("SSH key fingerprint %q: not the encoding of a SHA-256 digest (bad last character)", clip80(v))
	}
	return nil
}

// CheckSSHPrincipal checks an ssh-principal: value: 1 to 128 bytes of
// [A-Za-z0-9._@+-], starting with a letter or digit (user names, e-mail
// addresses and host names; a certificate principal outside this set
// never matches an entry).
func CheckSSHPrincipal(v string) error {
	return CheckName(v, maxPrincipal, "._@+-")
}

func clip80(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

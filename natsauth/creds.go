package natsauth

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Creds is a NATS user's credentials: its user JWT and its seed, the pair a
// .creds file holds. The seed is a secret.
type Creds struct {
	// JWT is the encoded user JWT.
	JWT string
	// Seed is the user's NKey seed ("SU...").
	Seed   []byte
	claims *jwt.UserClaims
}

// newCreds checks that seed is the user key the JWT was issued to. Errors
// carry no package prefix (ParseCreds and ReadCreds add theirs).
func newCreds(token string, seed []byte) (*Creds, error) {
	uc, err := decodeUserClaims(token)
	if err != nil {
		return nil, fmt.Errorf("user JWT: %w", err)
	}
	kp, err := nkeys.FromSeed(seed)
	if err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	if !nkeys.IsValidPublicUserKey(pub) {
		return nil, errors.New("the seed is not a user seed")
	}
	if pub != uc.Subject {
		return nil, fmt.Errorf("the seed is user %s's, the JWT was issued to %s", pub, uc.Subject)
	}
	return &Creds{JWT: token, Seed: bytes.Clone(seed), claims: uc}, nil
}

// decodeUserClaims decodes the claims of a user JWT without checking its
// signature. The holder of a .creds file has no decision to take on that
// signature: the NATS server verifies it at every connect (and refuses a
// JWT its account did not sign), and whoever must trust a JWT decodes it
// with jwt.DecodeUserClaims (validClientCreds, the Verifier). Skipping it
// here spares every client process its first ed25519 verification, which
// builds a second table of the curve's base point on first use (0.2 ms of
// the 3 ms a cold ReadCreds took on a loaded 2-core machine, 0.4-0.7 ms
// alone; issue 12). What remains of a cold ReadCreds is mostly the
// signing table, built for the seed's public key and needed anyway to
// sign the server's nonce at connect. Errors carry no prefix. A token that is not a version-2 user JWT goes to
// jwt.DecodeUserClaims, signature check included.
func decodeUserClaims(token string) (*jwt.UserClaims, error) {
	if len(token) > jwt.MaxTokenSize {
		return nil, fmt.Errorf("%d bytes, more than the %d a JWT may have", len(token), jwt.MaxTokenSize)
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return nil, fmt.Errorf("%d dot-separated parts, want 3 (header, claims, signature)", len(parts))
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return nil, fmt.Errorf("claims: %w", err)
	}
	uc := new(jwt.UserClaims)
	if err := json.Unmarshal(b, uc); err != nil {
		return nil, fmt.Errorf("claims: %w", err)
	}
	if uc.Version != 2 || uc.ClaimType() != jwt.UserClaim || uc.Subject == "" {
		// Not the v2 user JWT every issuer writes today: the library
		// decodes what it can (older versions) and says what is wrong.
		return jwt.DecodeUserClaims(token)
	}
	return uc, nil
}

// ParseCreds parses the contents of a .creds file (nats.go's format: the
// decorated JWT, then the decorated seed) and checks that the seed belongs
// to the JWT's user. Errors start "natsauth: creds: ".
func ParseCreds(data []byte) (*Creds, error) {
	c, err := parseCreds(data)
	if err != nil {
		return nil, fmt.Errorf("natsauth: creds: %w", err)
	}
	return c, nil
}

// parseCreds is ParseCreds with errors that carry no prefix.
func parseCreds(data []byte) (*Creds, error) {
	token, err := jwt.ParseDecoratedJWT(data)
	if err != nil {
		return nil, err
	}
	kp, err := jwt.ParseDecoratedUserNKey(data)
	if err != nil {
		return nil, err
	}
	defer kp.Wipe()
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	return newCreds(token, seed)
}

// ReadCreds reads and parses a .creds file, following symlinks (the target
// is checked). It refuses a file that is not a regular file, that the group
// or others may access (mode & 0077 != 0), or that is owned by neither root
// nor the uid this runs as. Errors are *FileError, naming the file (and a
// symlink's target), what is wrong with it and the chmod or chown that
// fixes it.
func ReadCreds(path string) (*Creds, error) {
	b, err := readSecret(path, "creds file")
	if err != nil {
		return nil, err
	}
	c, err := parseCreds(b)
	if err != nil {
		return nil, &FileError{What: "creds file", Path: path, Err: fmt.Errorf("not NATS user credentials: %w", err)}
	}
	return c, nil
}

// Bytes renders c as a .creds file (jwt.FormatUserConfig).
func (c *Creds) Bytes() ([]byte, error) {
	b, err := jwt.FormatUserConfig(c.JWT, c.Seed)
	if err != nil {
		return nil, fmt.Errorf("natsauth: format creds: %w", err)
	}
	return b, nil
}

// WriteCreds writes c to path as a .creds file of mode 0600, atomically
// (a temporary file renamed over path).
func WriteCreds(path string, c *Creds) error {
	b, err := c.Bytes()
	if err != nil {
		return err
	}
	return writeFileAtomic(path, b)
}

// WriteNewCreds is WriteCreds for a path that must not exist: it fails,
// matching fs.ErrExist, when it does (also when another writer created it
// meanwhile), and leaves that file as it is.
func WriteNewCreds(path string, c *Creds) error {
	b, err := c.Bytes()
	if err != nil {
		return err
	}
	return writeFile(path, b, true)
}

// PublicKey is the user's public key ("U...").
func (c *Creds) PublicKey() string { return c.claims.Subject }

// Name is the name in the user JWT.
func (c *Creds) Name() string { return c.claims.Name }

// InboxPrefix is the user's private inbox prefix, InboxPrefix(PublicKey()).
func (c *Creds) InboxPrefix() string { return InboxPrefix(c.PublicKey()) }

// Options returns the nats.go options that connect as this user: the JWT
// and a signer of the server's nonce (nats.UserJWTAndSeed), and the user's
// private inbox prefix, without which a client user could not receive a
// reply.
func (c *Creds) Options() []nats.Option {
	return []nats.Option{
		nats.UserJWTAndSeed(c.JWT, string(c.Seed)),
		nats.CustomInboxPrefix(c.InboxPrefix()),
	}
}

// Account is the public key ("A...") of the account the user belongs to:
// the JWT's issuer account when a signing key issued it, else its issuer
// (the account key itself). The claims are not verified here: the NATS
// server checks them at connect.
func (c *Creds) Account() string {
	if c.claims.IssuerAccount != "" {
		return c.claims.IssuerAccount
	}
	return c.claims.Issuer
}

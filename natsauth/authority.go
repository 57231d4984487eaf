package natsauth

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// Config tunes the layout Load signs. The zero value is the production
// layout.
type Config struct {
	// ResponseThreshold, if set, replaces every export's response threshold
	// (ServiceExport.ResponseThreshold): how long the server keeps a
	// response mapping without a response. Tests shorten it to exercise
	// the mechanism that keeps a streamed reply alive past the 2-minute
	// default. nats-server applies it when it first loads the TETHER account
	// and silently drops it (back to 2 minutes) when that account's JWT is
	// later updated on a running server, which Layout never does.
	ResponseThreshold time.Duration
}

// Layout is the operator-mode NATS layout of a Tether installation: the
// operator, the SYS, TETHER and CLIENTS accounts and the CLIENTS account's
// client signing key, whose seeds persist in one directory, and the JWTs
// signed from them. Load creates or loads it. Its methods are safe for
// concurrent use.
//
// Files in the directory (mode 0700; every file 0600; see Load for what
// it refuses):
//
//	operator.nk              operator seed (signs the account JWTs)
//	account-SYS.nk           SYS account seed
//	account-TETHER.nk        TETHER account seed (signs coordinator users)
//	account-CLIENTS.nk       CLIENTS account seed
//	account-CLIENTS-client.nk  CLIENTS' client signing key (signs client users)
//	operator.jwt, account-*.jwt  the JWTs, rewritten by every Load; the
//	                         CLIENTS JWT also carries the revocations
type Layout struct {
	dir          string
	cfg          Config
	operator     nkeys.KeyPair
	accounts     map[string]nkeys.KeyPair // by account name
	clientSigner nkeys.KeyPair
	operatorJWT  string
	opClaims     *jwt.OperatorClaims
	keys         map[string]string // public keys, by account name; "" for the operator
	verifier     *Verifier

	// mu guards the CLIENTS account claims (its revocations change) and
	// the JWTs.
	mu          sync.Mutex
	clients     *jwt.AccountClaims
	accountJWTs map[string]string // by account name
}

// accountNames lists the accounts in the order files and configs list
// them.
var accountNames = []string{AccountSYS, AccountTether, AccountClients}

const (
	operatorSeedFile = "operator.nk"
	operatorJWTFile  = "operator.jwt"
	clientSignerFile = "account-" + AccountClients + "-" + ClientRole + ".nk"
)

func accountSeedFile(name string) string { return "account-" + name + ".nk" }
func accountJWTFile(name string) string  { return "account-" + name + ".jwt" }

// jwtFiles lists the account JWT files, in accountNames' order.
func jwtFiles() []string {
	var out []string
	for _, a := range accountNames {
		out = append(out, accountJWTFile(a))
	}
	return out
}

// seedFiles lists every seed file of the layout, in creation order, with
// the key type each must hold.
func seedFiles() []struct {
	name   string
	prefix nkeys.PrefixByte
} {
	type sf = struct {
		name   string
		prefix nkeys.PrefixByte
	}
	out := []sf{}
	for _, a := range accountNames {
		out = append(out, sf{accountSeedFile(a), nkeys.PrefixByteAccount})
	}
	out = append(out, sf{clientSignerFile, nkeys.PrefixByteAccount})
	// The operator last: a directory with the operator seed was complete.
	return append(out, sf{operatorSeedFile, nkeys.PrefixByteOperator})
}

// Load opens the layout kept in dir, creating the directory (0700) and
// generating every key on first use; later calls load the same keys, so
// credentials minted earlier stay valid. A directory with some but not all
// seed files is refused (naming the missing ones) rather than completed:
// new keys would silently invalidate every credential already issued.
// The directory and every file in it (seeds, JWTs) must be owned by root or
// by the uid this runs as and writable by their owner only; seed files must
// be regular files the group and others cannot access at all (0600 or
// 0400). Symlinks are followed: the target is checked. Otherwise the error,
// a *FileError, names the path, a symlink's target, its mode and owner, and
// the chmod or chown that fixes it. Load then signs the
// operator and account JWTs afresh (keeping the CLIENTS revocations found
// in account-CLIENTS.jwt, if that file is signed by this operator) and
// rewrites the .jwt files.
func Load(dir string, cfg Config) (*Layout, error) {
	if cfg.ResponseThreshold < 0 {
		return nil, fmt.Errorf("natsauth: ResponseThreshold %v is negative", cfg.ResponseThreshold)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("natsauth: key directory: %w", err)
	}
	if err := checkPath(dir, "layout directory", true); err != nil {
		return nil, err
	}
	files := seedFiles()
	var present, missing []string
	for _, f := range files {
		ok, err := exists(filepath.Join(dir, f.name))
		if err != nil {
			return nil, err
		}
		if ok {
			present = append(present, f.name)
		} else {
			missing = append(missing, f.name)
		}
	}
	if len(present) > 0 && len(missing) > 0 {
		return nil, fmt.Errorf("natsauth: key directory %s is incomplete: it has %s but not %s; restore the missing files, or remove the directory to start over (every credential issued from it stops working)",
			dir, strings.Join(present, ", "), strings.Join(missing, ", "))
	}
	if len(present) == 0 {
		if err := generate(dir); err != nil {
			return nil, err
		}
	}
	l := &Layout{dir: dir, cfg: cfg, accounts: map[string]nkeys.KeyPair{}, keys: map[string]string{}}
	for _, f := range files {
		kp, err := loadSeed(filepath.Join(dir, f.name), f.prefix)
		if err != nil {
			return nil, err
		}
		switch f.name {
		case operatorSeedFile:
			l.operator = kp
		case clientSignerFile:
			l.clientSigner = kp
		default:
			l.accounts[strings.TrimSuffix(strings.TrimPrefix(f.name, "account-"), ".nk")] = kp
		}
	}
	// The JWTs are rewritten below, but one written by someone else may
	// already have been read (a coordinator's reload of the revocations).
	for _, name := range append([]string{operatorJWTFile}, jwtFiles()...) {
		if err := checkPath(filepath.Join(dir, name), "layout file", false); err != nil {
			return nil, err
		}
	}
	for name, kp := range l.accounts {
		l.keys[name] = mustPublic(kp)
	}
	l.keys[""] = mustPublic(l.operator)
	if err := l.sign(); err != nil {
		return nil, err
	}
	v, err := NewVerifier(l.operatorJWT, l.accountJWTs[AccountClients])
	if err != nil {
		return nil, fmt.Errorf("natsauth: layout in %s: %w", dir, err)
	}
	l.verifier = v
	return l, nil
}

// generate creates every seed file of a fresh layout.
func generate(dir string) error {
	for _, f := range seedFiles() {
		kp, err := nkeys.CreatePair(f.prefix)
		if err != nil {
			return fmt.Errorf("natsauth: generate %s: %w", f.name, err)
		}
		seed, err := kp.Seed()
		if err != nil {
			return fmt.Errorf("natsauth: generate %s: %w", f.name, err)
		}
		err = createExclusive(filepath.Join(dir, f.name), append(seed, '\n'))
		kp.Wipe()
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%w: another process is creating the keys in %s; try again once it is done", err, dir)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func mustPublic(kp nkeys.KeyPair) string {
	pub, err := kp.PublicKey()
	if err != nil {
		// Only a wiped or public-only key pair fails, and Load holds seeds.
		panic(fmt.Sprintf("natsauth: public key of a loaded seed: %v", err))
	}
	return pub
}

// sign builds and signs the operator and account JWTs and writes them.
func (l *Layout) sign() error {
	sysKey, tetherKey, clientsKey := l.keys[AccountSYS], l.keys[AccountTether], l.keys[AccountClients]

	op := jwt.NewOperatorClaims(l.keys[""])
	op.Name = OperatorName
	op.SystemAccount = sysKey
	opJWT, err := op.Encode(l.operator)
	if err != nil {
		return fmt.Errorf("natsauth: sign operator JWT: %w", err)
	}
	l.operatorJWT, l.opClaims = opJWT, op

	sys := jwt.NewAccountClaims(sysKey)
	sys.Name = AccountSYS

	tether := jwt.NewAccountClaims(tetherKey)
	tether.Name = AccountTether
	tether.Limits.JetStreamLimits = jwt.JetStreamLimits{
		MemoryStorage: jwt.NoLimit, DiskStorage: jwt.NoLimit,
		Streams: jwt.NoLimit, Consumer: jwt.NoLimit,
	}
	for _, e := range ServiceExports() {
		x := &jwt.Export{Name: e.Subject, Subject: jwt.Subject(e.Subject), Type: jwt.Service, ResponseType: jwt.ResponseTypeSingleton}
		if e.Streamed {
			x.ResponseType = jwt.ResponseTypeStream
		}
		x.ResponseThreshold = e.ResponseThreshold
		if l.cfg.ResponseThreshold > 0 {
			x.ResponseThreshold = l.cfg.ResponseThreshold
		}
		tether.Exports.Add(x)
	}

	clients := jwt.NewAccountClaims(clientsKey)
	clients.Name = AccountClients
	clients.Limits.DisallowBearer = true
	clients.SigningKeys.AddScopedSigner(clientScope(mustPublic(l.clientSigner)))
	// A user signed by the account key itself with no permissions of its
	// own gets these: nothing. Client users come from the scoped key.
	clients.DefaultPermissions.Pub.Deny.Add(">")
	clients.DefaultPermissions.Sub.Deny.Add(">")
	for _, e := range ServiceExports() {
		clients.Imports.Add(&jwt.Import{Name: e.Subject, Subject: jwt.Subject(e.Subject), Account: tetherKey, Type: jwt.Service, Share: true})
	}
	prev, err := l.storedRevocations()
	if err != nil {
		return err
	}
	clients.Revocations = prev

	l.mu.Lock()
	defer l.mu.Unlock()
	l.clients = clients
	l.accountJWTs = map[string]string{}
	for name, ac := range map[string]*jwt.AccountClaims{AccountSYS: sys, AccountTether: tether, AccountClients: clients} {
		if err := validate(ac); err != nil {
			return fmt.Errorf("natsauth: account %s: %w", name, err)
		}
		s, err := ac.Encode(l.operator)
		if err != nil {
			return fmt.Errorf("natsauth: sign account %s: %w", name, err)
		}
		l.accountJWTs[name] = s
	}
	if err := writeFileAtomic(filepath.Join(l.dir, operatorJWTFile), []byte(opJWT+"\n")); err != nil {
		return err
	}
	for _, name := range accountNames {
		if err := writeFileAtomic(filepath.Join(l.dir, accountJWTFile(name)), []byte(l.accountJWTs[name]+"\n")); err != nil {
			return err
		}
	}
	return nil
}

// validate reports the blocking issues jwt's validation finds, which Encode
// does not check.
func validate(c jwt.Claims) error {
	vr := jwt.CreateValidationResults()
	c.Validate(vr)
	if errs := vr.Errors(); len(errs) > 0 {
		return fmt.Errorf("invalid claims: %v", errs)
	}
	return nil
}

// storedRevocations returns the revocations of the CLIENTS JWT a previous
// Load or Revoke wrote, if it was signed by this operator for this account.
func (l *Layout) storedRevocations() (jwt.RevocationList, error) {
	path := filepath.Join(l.dir, accountJWTFile(AccountClients))
	b, err := readChecked(path, "layout file", false)
	if errors.Is(err, fs.ErrNotExist) {
		return jwt.RevocationList{}, nil
	}
	if err != nil {
		return nil, err
	}
	ac, err := jwt.DecodeAccountClaims(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("natsauth: %s: %w", path, err)
	}
	if ac.Issuer != l.keys[""] || ac.Subject != l.keys[AccountClients] {
		return nil, fmt.Errorf("natsauth: %s is account %s signed by %s, not account %s of operator %s; remove it (its revocations are lost) or restore the matching seeds",
			path, ac.Subject, ac.Issuer, l.keys[AccountClients], l.keys[""])
	}
	if ac.Revocations == nil {
		return jwt.RevocationList{}, nil
	}
	return ac.Revocations, nil
}

// Dir is the key directory.
func (l *Layout) Dir() string { return l.dir }

// OperatorKey is the operator's public key.
func (l *Layout) OperatorKey() string { return l.keys[""] }

// AccountKey is the public key of the account named AccountSYS,
// AccountTether or AccountClients; "" for another name.
func (l *Layout) AccountKey(name string) string { return l.keys[name] }

// OperatorJWT is the signed operator JWT.
func (l *Layout) OperatorJWT() string { return l.operatorJWT }

// AccountJWT is the current signed JWT of the named account; "" for an
// unknown name.
func (l *Layout) AccountJWT(name string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.accountJWTs[name]
}

// Verifier is the layout's identity verifier, trusting the CLIENTS account;
// Revoke updates it.
func (l *Layout) Verifier() *Verifier { return l.verifier }

// Revoke revokes every JWT issued so far to the user with public key
// userKey, in the CLIENTS account: it records the revocation in the CLIENTS
// JWT, rewrites account-CLIENTS.jwt and updates Verifier. Running servers
// learn of it through UpdateServer (embedded) or by being given the new JWT
// (AccountJWT(AccountClients); external: nsc revocations add-user, then push).
func (l *Layout) Revoke(userKey string) error {
	if !nkeys.IsValidPublicUserKey(userKey) {
		return fmt.Errorf("natsauth: revoke %q: not a user public key", userKey)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.clients.RevokeAt(userKey, time.Now())
	s, err := l.clients.Encode(l.operator)
	if err != nil {
		return fmt.Errorf("natsauth: revoke %s: sign account %s: %w", userKey, AccountClients, err)
	}
	l.accountJWTs[AccountClients] = s
	if err := writeFileAtomic(filepath.Join(l.dir, accountJWTFile(AccountClients)), []byte(s+"\n")); err != nil {
		return err
	}
	return l.verifier.SetAccounts(s)
}

// ReloadRevocations takes in the revocations another process recorded in
// account-CLIENTS.jwt (a `tether nats user revoke` while the coordinator
// runs): it adds every revocation found there that this Layout lacks (none
// is ever dropped), re-signs the CLIENTS JWT and updates Verifier. It
// reports whether anything changed; running servers then need
// UpdateServer.
func (l *Layout) ReloadRevocations() (bool, error) {
	stored, err := l.storedRevocations()
	if err != nil {
		return false, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	changed := false
	for key, ts := range stored {
		if cur, ok := l.clients.Revocations[key]; !ok || cur < ts {
			if l.clients.Revocations == nil {
				l.clients.Revocations = jwt.RevocationList{}
			}
			l.clients.Revocations[key] = ts
			changed = true
		}
	}
	if !changed {
		return false, nil
	}
	s, err := l.clients.Encode(l.operator)
	if err != nil {
		return false, fmt.Errorf("natsauth: reload revocations: sign account %s: %w", AccountClients, err)
	}
	l.accountJWTs[AccountClients] = s
	if err := writeFileAtomic(filepath.Join(l.dir, accountJWTFile(AccountClients)), []byte(s+"\n")); err != nil {
		return false, err
	}
	return true, l.verifier.SetAccounts(s)
}

// CheckUserName checks a client user's name as MintClient does: what a
// policy names the user by (nats:NAME).
func CheckUserName(name string) error { return checkName(name) }

// MintClient issues a client user in CLIENTS, signed by the client signing
// key, so the server gives it the client permissions (publish
// ClientPublishAllow; subscribe to its InboxPrefix only). name is the
// identity policies know it by (1 to 128 bytes of letters, digits and
// "._@+-", starting with a letter or digit). ttl > 0 sets an expiry; 0 means
// none. The returned creds hold a new key pair that exists nowhere else.
func (l *Layout) MintClient(name string, ttl time.Duration) (*Creds, error) {
	if err := checkName(name); err != nil {
		return nil, fmt.Errorf("natsauth: mint client: %w", err)
	}
	if ttl < 0 {
		return nil, fmt.Errorf("natsauth: mint client %s: negative ttl %v", name, ttl)
	}
	return l.mint(name, ttl, l.clientSigner, l.keys[AccountClients], true)
}

// MintCoordinator issues a coordinator user in TETHER, signed by the TETHER
// account key, with no permission limits: it may use JetStream, the KV
// buckets and every subject of TETHER. name is for logs and monitoring.
func (l *Layout) MintCoordinator(name string) (*Creds, error) {
	if err := checkName(name); err != nil {
		return nil, fmt.Errorf("natsauth: mint coordinator: %w", err)
	}
	return l.mint(name, 0, l.accounts[AccountTether], "", false)
}

func (l *Layout) mint(name string, ttl time.Duration, signer nkeys.KeyPair, issuerAccount string, scoped bool) (*Creds, error) {
	ukp, err := nkeys.CreateUser()
	if err != nil {
		return nil, fmt.Errorf("natsauth: mint %s: %w", name, err)
	}
	pub := mustPublic(ukp)
	uc := jwt.NewUserClaims(pub)
	uc.Name = name
	uc.IssuerAccount = issuerAccount
	// A scoped signer's users carry no permissions or limits: the server
	// applies the signing key's template.
	uc.SetScoped(scoped)
	if ttl > 0 {
		uc.Expires = time.Now().Add(ttl).Unix()
	}
	token, err := uc.Encode(signer)
	if err != nil {
		return nil, fmt.Errorf("natsauth: mint %s: %w", name, err)
	}
	seed, err := ukp.Seed()
	if err != nil {
		return nil, fmt.Errorf("natsauth: mint %s: %w", name, err)
	}
	c, err := newCreds(token, seed)
	if err != nil {
		return nil, fmt.Errorf("natsauth: mint %s: %w", name, err)
	}
	return c, nil
}

// ServerConfig returns the nats-server configuration block that gives an
// external server this layout: the operator JWT inline, the system account
// and a MEMORY resolver preloaded with the account JWTs. An operator adds
// listen, jetstream { store_dir: ... } and TLS around it. The JWTs change
// on Revoke; after one, write the block again and reload the server
// (nats-server --signal reload), which applies a changed preload.
func (l *Layout) ServerConfig() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "# Tether NATS layout: operator %s (%s).\n", OperatorName, l.keys[""])
	fmt.Fprintf(&b, "operator: %s\n", l.operatorJWT)
	fmt.Fprintf(&b, "system_account: %s\n", l.keys[AccountSYS])
	b.WriteString("resolver: MEMORY\nresolver_preload: {\n")
	names := append([]string(nil), accountNames...)
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(&b, "  # %s\n  %s: %s\n", name, l.keys[name], l.accountJWTs[name])
	}
	b.WriteString("}\n")
	return b.String()
}

// checkName checks a user name: 1 to 128 bytes of letters, digits and
// "._@+-", starting with a letter or digit (what a policy's nats: entry may
// name). A name shaped like a user public key is refused: it would read as
// that key in a policy.
func checkName(v string) error {
	if v == "" {
		return fmt.Errorf("the user name is empty")
	}
	if len(v) > 128 {
		return fmt.Errorf("user name is %d bytes, over 128", len(v))
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if i == 0 && !alnum {
			return fmt.Errorf("user name %q must start with a letter or digit", v)
		}
		if !alnum && strings.IndexByte("._@+-", c) < 0 {
			return fmt.Errorf("user name %q has %q (letters, digits and \"._@+-\" only)", v, c)
		}
	}
	if looksLikeUserKey(v) {
		return fmt.Errorf("user name %q has the shape of a user public key", v)
	}
	return nil
}

// looksLikeUserKey: 56 characters of base32 starting with 'U'.
func looksLikeUserKey(s string) bool {
	if len(s) != 56 || s[0] != 'U' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'A' && c <= 'Z' || c >= '2' && c <= '7') {
			return false
		}
	}
	return true
}

// ErrOtherLayout: coordinator credentials belong to another NATS layout
// than the one the coordinator verifies its callers with.
var ErrOtherLayout = errors.New("natsauth: the coordinator credentials are of another NATS layout")

// CheckCoordinatorCreds checks that c is a user of this layout's TETHER
// account, so that the server c connects to trusts this layout's accounts
// and the callers it vouches for are in this layout's CLIENTS account. The
// error wraps ErrClientCreds for a client user of this layout (CLIENTS),
// else ErrOtherLayout, naming both accounts and the layout's directory. A coordinator whose credentials were minted from another
// layout would join the fleet's queue group and refuse, as not a client,
// every request from a client of the other layout that it is handed.
func (l *Layout) CheckCoordinatorCreds(c *Creds) error {
	if c.Account() == l.keys[AccountClients] {
		return clientCredsError(c, AccountClients, l.keys[AccountClients])
	}
	if got, want := c.Account(), l.keys[AccountTether]; got != want {
		return fmt.Errorf("%w: user %s (%q) is in account %s, but the layout in %s has %s account %s (and %s account %s): every coordinator of a fleet must share one layout",
			ErrOtherLayout, c.PublicKey(), c.Name(), got, l.dir, AccountTether, want, AccountClients, l.keys[AccountClients])
	}
	return nil
}

// ErrClientCreds: credentials given where a coordinator's are expected are
// a client user's (of a client account such as CLIENTS), which have neither
// JetStream nor the service's subjects. Make coordinator credentials with
// `tether nats coordinator-creds NAME` (Layout.MintCoordinator).
var ErrClientCreds = errors.New("natsauth: these are client credentials, not a coordinator's; make coordinator credentials with `tether nats coordinator-creds NAME`")

// clientCredsError is the error, wrapping ErrClientCreds, for client
// credentials c of the account named account (key accountKey).
func clientCredsError(c *Creds, account, accountKey string) error {
	return fmt.Errorf("%w (user %s (%q) is in the client account %s, %s)", ErrClientCreds, c.PublicKey(), c.Name(), account, accountKey)
}

package natsauth

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// clientInfoHdr is the header in which the NATS server stamps a service
// import's requestor (nats-server's server.ClientInfoHdr, spelt here so
// that the client-only build links no nats-server; TestClientInfoHdr
// checks they agree).
const clientInfoHdr = "Nats-Request-Info"

// KindNATS is Identity.Kind for a NATS user (policy's "nats" kind).
const KindNATS = "nats"

// Identity is the caller of a request, as the NATS server proved it.
type Identity struct {
	// Kind is KindNATS.
	Kind string
	// Name is the name in the user's JWT; "" when the JWT names the user
	// by its public key only (or not at all).
	Name string
	// Key is the user's public key ("U...", 56 characters).
	Key string
	// Account is the name of the user's account as its account JWT gives
	// it (AccountClients for a Layout), or the account's public key when
	// the JWT has no name.
	Account string
}

// String is how policies and logs name the identity: "nats:NAME", or
// "nats:KEY" when Name is empty.
func (id Identity) String() string {
	if id.Name != "" {
		return id.Kind + ":" + id.Name
	}
	return id.Kind + ":" + id.Key
}

// Errors of Identify. Each wraps one of them; compare with errors.Is.
var (
	// ErrNoRequestInfo: the request carries no Nats-Request-Info header.
	// The server stamps that header on every request that crosses a
	// service import, so such a request was published inside the exporting
	// account (TETHER) by a holder of coordinator credentials, never by a
	// client. Identify refuses it: the server does not say which TETHER
	// user sent it, and no API caller should hold TETHER credentials (an
	// administrator uses a CLIENTS user that policy makes admin, and is
	// then named in the audit log).
	ErrNoRequestInfo = errors.New("natsauth: request carries no " + clientInfoHdr + " header")
	// ErrUntrusted: the header or the user JWT in it does not prove a
	// client identity (malformed, not a client account, not issued by a
	// client signing key, bearer token, bad name).
	ErrUntrusted = errors.New("natsauth: caller not identified")
	// ErrExpired: the user JWT expired (or is not valid yet).
	ErrExpired = errors.New("natsauth: user JWT expired")
	// ErrRevoked: the account JWT revokes the user JWT.
	ErrRevoked = errors.New("natsauth: user JWT revoked")
)

// requestInfo is the part of the server's ClientInfo (server/events.go)
// that Identify reads.
type requestInfo struct {
	Account   string `json:"acc"`
	User      string `json:"user"`
	JWT       string `json:"jwt"`
	IssuerKey string `json:"issuer_key"`
}

// Verifier turns the Nats-Request-Info header of a request into an
// Identity, trusting the client accounts it was given (signed by the
// operator it was given). It is safe for concurrent use; SetAccounts swaps
// the accounts atomically (after a revocation).
type Verifier struct {
	now      func() time.Time
	operator *jwt.OperatorClaims
	state    atomic.Pointer[verifierState]

	// headers maps a Nats-Request-Info value to what it says, so a
	// connection's requests are parsed once (the value changes only when
	// the server updates the connection's RTT); cache maps a user JWT to its
	// decoded claims, so each user's signature is checked once. Identify's
	// verdict on a header value is kept with it for the accounts it was
	// reached under (judge), so only the checks that depend on the time
	// (expiry, not-before) run on every request.
	mu      sync.Mutex
	headers map[string]*parsedInfo
	cache   map[string]*jwt.UserClaims
}

// parsedInfo is a header value, decoded, and Identify's verdict on it
// (nil until the first Identify, replaced when the accounts change).
type parsedInfo struct {
	ri      requestInfo
	verdict atomic.Pointer[verdict]
}

// maxCache bounds each of Verifier's caches; a full one is emptied.
const maxCache = 4096

type verifierState struct {
	accounts map[string]*clientAccount // by public key
}

type clientAccount struct {
	claims  *jwt.AccountClaims
	name    string
	signers map[string]bool // scoped signing keys with a client template
}

// NewVerifier returns a Verifier for the client accounts whose JWTs are
// given, which the operator of operatorJWT (or one of its signing keys)
// must have signed. Each account needs at least one scoped signing key
// whose template grants at most the client permissions (ClientPublishAllow,
// ClientSubscribeAllow): only users issued by such a key are identified,
// since only their permissions are known to confine them to their own
// inbox.
func NewVerifier(operatorJWT string, accountJWTs ...string) (*Verifier, error) {
	op, err := jwt.DecodeOperatorClaims(operatorJWT)
	if err != nil {
		return nil, fmt.Errorf("natsauth: verifier: operator JWT: %w", err)
	}
	v := &Verifier{now: time.Now, operator: op, headers: map[string]*parsedInfo{}, cache: map[string]*jwt.UserClaims{}}
	if err := v.SetAccounts(accountJWTs...); err != nil {
		return nil, err
	}
	return v, nil
}

// SetAccounts replaces the trusted client accounts (see NewVerifier).
func (v *Verifier) SetAccounts(accountJWTs ...string) error {
	if len(accountJWTs) == 0 {
		return errors.New("natsauth: verifier: no client account")
	}
	st := &verifierState{accounts: map[string]*clientAccount{}}
	for _, s := range accountJWTs {
		ac, err := jwt.DecodeAccountClaims(s)
		if err != nil {
			return fmt.Errorf("natsauth: verifier: account JWT: %w", err)
		}
		if !v.operator.DidSign(ac) {
			return fmt.Errorf("natsauth: verifier: account %s (%s) is signed by %s, not by operator %s", ac.Name, ac.Subject, ac.Issuer, v.operator.Subject)
		}
		ca := &clientAccount{claims: ac, name: ac.Name, signers: map[string]bool{}}
		if ca.name == "" {
			ca.name = ac.Subject
		}
		var why []string
		for key, scope := range ac.SigningKeys {
			us, ok := scope.(*jwt.UserScope)
			if !ok {
				continue
			}
			if err := checkClientScope(us); err != nil {
				why = append(why, fmt.Sprintf("signing key %s: %v", key, err))
				continue
			}
			ca.signers[key] = true
		}
		if len(ca.signers) == 0 {
			return fmt.Errorf("natsauth: verifier: account %s has no scoped signing key with client permissions (pub %q, sub %q) %v", ca.name, ClientPublishAllow, ClientSubscribeAllow, why)
		}
		st.accounts[ac.Subject] = ca
	}
	v.state.Store(st)
	return nil
}

// CheckNotClient returns an error wrapping ErrClientCreds, naming the user
// and the account, if c is a user of one of the trusted client accounts:
// credentials that must be a coordinator's (whose account the Verifier
// does not know) are then a client's. Otherwise nil.
func (v *Verifier) CheckNotClient(c *Creds) error {
	if ca, ok := v.state.Load().accounts[c.Account()]; ok {
		return clientCredsError(c, ca.name, c.Account())
	}
	return nil
}

// Identify returns the identity the NATS server stamped on a request that
// crossed the import into TETHER: h is the request's headers (a
// micro.Request's Headers() converts with nats.Header(...)). The header
// Nats-Request-Info is looked up by its exact name: the server replaces
// any copy a client wrote under that name, but leaves other spellings
// ("nats-request-info") alone, so nothing else may be read as it.
//
// Identify checks that the caller's account is a trusted client account,
// that the user JWT in the header is validly signed by one of that
// account's client signing keys and names the user the server
// authenticated, that it is not a bearer token, not expired and not
// revoked by the account. Errors wrap ErrNoRequestInfo, ErrUntrusted,
// ErrExpired or ErrRevoked, and name the user when known.
func (v *Verifier) Identify(h nats.Header) (Identity, error) {
	pi, err := v.parse(h)
	if err != nil {
		return Identity{}, err
	}
	st := v.state.Load()
	vd := pi.verdict.Load()
	if vd == nil || vd.st != st {
		// First sight of this header value under these accounts: check
		// what does not depend on the time, once.
		vd = v.judge(pi, st)
		pi.verdict.Store(vd)
	}
	if vd.pre != nil {
		return Identity{}, vd.pre
	}
	uc := vd.uc
	now := v.now().Unix()
	if uc.Expires != 0 && now >= uc.Expires {
		return Identity{}, fmt.Errorf("%w: user %s (%s) expired at %s", ErrExpired, uc.Subject, uc.Name, time.Unix(uc.Expires, 0).UTC().Format(time.RFC3339))
	}
	if uc.NotBefore != 0 && now < uc.NotBefore {
		return Identity{}, fmt.Errorf("%w: user %s (%s) is not valid before %s", ErrExpired, uc.Subject, uc.Name, time.Unix(uc.NotBefore, 0).UTC().Format(time.RFC3339))
	}
	if vd.post != nil {
		return Identity{}, vd.post
	}
	return vd.id, nil
}

// verdict is what Identify concluded about one header value under one
// verifierState, except the checks of the JWT's validity period, which
// depend on the time and run on every request: pre is the error of the
// checks before them, post of those after (revocation, the name), id the
// identity when both are nil. uc is the user's claims (nil when pre says
// why there are none).
type verdict struct {
	st        *verifierState
	uc        *jwt.UserClaims
	pre, post error
	id        Identity
}

// judge checks pi's header against the accounts of st (see Identify).
// Everything it reads is fixed for pi's header value (the user JWT's
// claims, decoded once per JWT) or for st (the trusted accounts, their
// signing keys and revocations; SetAccounts replaces st as a whole), so
// its verdict is reused until st changes.
func (v *Verifier) judge(pi *parsedInfo, st *verifierState) *verdict {
	vd := &verdict{st: st}
	ri := pi.ri
	ca := st.accounts[ri.Account]
	if ca == nil {
		vd.pre = fmt.Errorf("%w: user %s is in account %s, not a client account", ErrUntrusted, ri.User, ri.Account)
		return vd
	}
	if ri.JWT == "" {
		vd.pre = fmt.Errorf("%w: the request of user %s in account %s carries no user JWT: the import must share the requestor's identity (share: true) on a server in operator mode", ErrUntrusted, ri.User, ca.name)
		return vd
	}
	uc, err := v.decode(ri.JWT)
	if err != nil {
		vd.pre = fmt.Errorf("%w: user %s in account %s: its JWT: %v", ErrUntrusted, ri.User, ca.name, err)
		return vd
	}
	switch {
	case uc.Subject != ri.User || !nkeys.IsValidPublicUserKey(uc.Subject):
		vd.pre = fmt.Errorf("%w: the JWT in the header is user %s's, the server authenticated %s", ErrUntrusted, uc.Subject, ri.User)
	case uc.IssuerAccount != ca.claims.Subject:
		vd.pre = fmt.Errorf("%w: user %s (%s) was not issued by a client signing key of account %s", ErrUntrusted, uc.Subject, uc.Name, ca.name)
	case !ca.signers[uc.Issuer] || uc.Issuer != ri.IssuerKey:
		vd.pre = fmt.Errorf("%w: user %s (%s) was issued by %s, not by a client signing key of account %s: its permissions are not known to be a client's", ErrUntrusted, uc.Subject, uc.Name, uc.Issuer, ca.name)
	case !uc.HasEmptyPermissions():
		// The server refuses such users of a scoped key at connect; this
		// is a second look at what the header claims.
		vd.pre = fmt.Errorf("%w: user %s (%s) carries permissions of its own", ErrUntrusted, uc.Subject, uc.Name)
	case uc.BearerToken:
		vd.pre = fmt.Errorf("%w: user %s (%s) is a bearer token", ErrUntrusted, uc.Subject, uc.Name)
	}
	if vd.pre != nil {
		return vd
	}
	vd.uc = uc
	if ca.claims.IsClaimRevoked(uc) {
		vd.post = fmt.Errorf("%w: account %s revoked user %s (%s)", ErrRevoked, ca.name, uc.Subject, uc.Name)
		return vd
	}
	vd.id = Identity{Kind: KindNATS, Key: uc.Subject, Account: ca.name}
	switch {
	case uc.Name == "" || uc.Name == uc.Subject:
		// Named by its key (jwt.IssueUserJWT's default): Key says it.
	case checkName(uc.Name) != nil:
		vd.post = fmt.Errorf("%w: user %s: %v", ErrUntrusted, uc.Subject, checkName(uc.Name))
	default:
		vd.id.Name = uc.Name
	}
	return vd
}

// parse returns the decoded Nats-Request-Info of h, from the cache if this
// exact value was seen.
func (v *Verifier) parse(h nats.Header) (*parsedInfo, error) {
	vals := h[clientInfoHdr]
	if len(vals) == 1 {
		v.mu.Lock()
		pi := v.headers[vals[0]]
		v.mu.Unlock()
		if pi != nil {
			return pi, nil
		}
	}
	ri, err := parseRequestInfo(h)
	if err != nil {
		return nil, err
	}
	pi := &parsedInfo{ri: ri}
	v.mu.Lock()
	if len(v.headers) >= maxCache {
		clear(v.headers)
	}
	v.headers[vals[0]] = pi
	v.mu.Unlock()
	return pi, nil
}

// decode returns the claims of a user JWT, checking its signature once.
func (v *Verifier) decode(token string) (*jwt.UserClaims, error) {
	v.mu.Lock()
	uc := v.cache[token]
	v.mu.Unlock()
	if uc != nil {
		return uc, nil
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return nil, err
	}
	v.mu.Lock()
	if len(v.cache) >= maxCache {
		clear(v.cache)
	}
	v.cache[token] = uc
	v.mu.Unlock()
	return uc, nil
}

// parseRequestInfo decodes the one Nats-Request-Info header of h.
func parseRequestInfo(h nats.Header) (requestInfo, error) {
	vals := h[clientInfoHdr]
	switch len(vals) {
	case 0:
		return requestInfo{}, fmt.Errorf("%w: it did not cross the import from a client account (a caller inside account %s, with coordinator credentials, is not identified)", ErrNoRequestInfo, AccountTether)
	case 1:
	default:
		return requestInfo{}, fmt.Errorf("%w: %d %s headers", ErrUntrusted, len(vals), clientInfoHdr)
	}
	var ri requestInfo
	if err := json.Unmarshal([]byte(vals[0]), &ri); err != nil {
		return requestInfo{}, fmt.Errorf("%w: %s header: %v", ErrUntrusted, clientInfoHdr, err)
	}
	if ri.Account == "" || ri.User == "" {
		return requestInfo{}, fmt.Errorf("%w: %s header names no account or user (the import must share the requestor's identity: share: true)", ErrUntrusted, clientInfoHdr)
	}
	return ri, nil
}

// RequestUser returns the account and user public key of the
// Nats-Request-Info header of a message that crossed the import, without
// verifying the user JWT. A coordinator uses it on every message of a pipe
// it opened for an identified user (Identify), to drop messages another
// client published to the pipe's subject: inside TETHER, only the server
// can have written that header on a message from a client account.
func RequestUser(h nats.Header) (account, user string, err error) {
	ri, err := parseRequestInfo(h)
	if err != nil {
		return "", "", err
	}
	return ri.Account, ri.User, nil
}

// RequestHost returns the client's IP address from the Nats-Request-Info
// header of a request that crossed the import: the host of the
// connection the NATS server received it on (its TCP peer, or what a
// PROXY protocol header the server was configured to trust named; for a
// client behind a leafnode, the leafnode's), never a value the client
// chose, since the server writes the header itself on every request
// crossing a service import with share: true. The server stamps no
// port. It returns "" when h carries no such header, more than one, or a
// host that is not an IP address.
func RequestHost(h nats.Header) string {
	vals := h[clientInfoHdr]
	if len(vals) != 1 {
		return ""
	}
	var ci struct {
		Host string `json:"host"`
	}
	if json.Unmarshal([]byte(vals[0]), &ci) != nil {
		return ""
	}
	ip, err := netip.ParseAddr(ci.Host)
	if err != nil {
		return ""
	}
	return ip.String()
}

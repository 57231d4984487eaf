package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tetherfleet/tether/coordinator/authlimit"
	"github.com/tetherfleet/tether/coordinator/facade/hostcheck"
	"github.com/tetherfleet/tether/policy"
)

// cookieName is the session cookie.
const cookieName = "tether_console"

// caller is a request's identity, as identify found it.
type caller struct {
	ID         policy.Identity
	Identified bool
	// Via says how ("token", "session", "loopback"), for the page.
	Via string
	// note collects the request's audit facts (never nil in a page).
	note *note
}

// authed wraps a page handler: it identifies the caller, answers 401
// (with the login form) when it cannot, and records the request's audit
// event (op: the operation's name; page: the route, for the event's
// Method).
func (h *Handler) authed(op, page string, serve func(http.ResponseWriter, *http.Request, caller)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := h.cfg.now()
		sw := &statusWriter{ResponseWriter: w}
		n := &note{}
		c, err := h.identify(r)
		var misdirected *hostcheck.RefusedError
		var throttled *throttledError
		switch {
		case errors.As(err, &throttled):
			n.reason = reasonThrottled
			h.throttledAnswer(sw, throttled.wait, r.URL.RequestURI())
		case errors.As(err, &misdirected):
			n.reason = "host"
			n.detail = err.Error()
			h.fail(sw, caller{}, http.StatusMisdirectedRequest, err.Error())
		case errors.Is(err, errClearText):
			n.reason = reasonClearText
			msg := err.Error()
			if tok, ok := bearer(r); ok {
				n.detail = h.clearTextDetail(r, tok, "bearer")
			} else if ck, cerr := r.Cookie(cookieName); cerr == nil {
				n.detail = h.clearTextDetail(r, ck.Value, "cookie")
			}
			// A session cookie seen on the wire is revoked on sight
			// (review F5: it stayed valid for use from loopback).
			if ck, cerr := r.Cookie(cookieName); cerr == nil && h.endSession(ck.Value) {
				msg += "; " + revokedExposed
				n.detail += "; the session was revoked"
			}
			h.render(sw, http.StatusForbidden, "login", loginView{Error: msg, Next: r.URL.RequestURI(), TokensOn: h.cfg.Tokens != nil})
		case err != nil:
			n.reason = "unauthenticated"
			h.render(sw, http.StatusUnauthorized, "login", loginView{Error: err.Error(), Next: r.URL.RequestURI(), TokensOn: h.cfg.Tokens != nil})
		case !c.Identified:
			n.reason = "unauthenticated"
			h.render(sw, http.StatusUnauthorized, "login", loginView{Error: "sign in: this console needs an identity (a console token, or a loopback connection from a local user the policy names)", Next: r.URL.RequestURI(), TokensOn: h.cfg.Tokens != nil})
		default:
			c.note = n
			serve(sw, r, c)
		}
		h.record(r, op, page, c, n, sw.status, start)
	}
}

// errBadToken: a bearer token that is no console token. Answered 401,
// never falling back to a weaker identity.
var errBadToken = errors.New("the bearer token is not a console token")

// errBadSession: a session cookie that is forged, expired, of an earlier
// process or ended by logout. Answered 401, never falling back to the
// loopback user, as a bad bearer token is.
var errBadSession = errors.New("the session cookie is not valid here (forged, expired, ended by logout, or from before a restart): sign in again, or open /console/logout to drop it")

// errClearText: a credential (bearer token or session cookie) came over a
// connection that is neither TLS nor loopback. Answered 403 before the
// credential is even checked, as the login exchange is: whoever saw it on
// the wire must not be able to use it here, and the caller learns to
// reach the console another way.
var errClearText = errors.New("credentials refused: the connection is neither TLS nor loopback, so the token or session cookie crossed the network in clear text; reach the console through a TLS proxy on the coordinator's host or an SSH tunnel (ssh -L), and replace the token if others could see that network")

// revokedExposed ends errClearText's message when the request's session
// cookie was a live session, now revoked.
const revokedExposed = "that session cookie has been revoked, since others could have read it: sign in again over TLS or loopback"

// reasonClearText is the audit reason of a refusal by errClearText.
const reasonClearText = "clear_text"

// reasonThrottled is the audit reason of a credential refused unchecked
// because its source IP failed too often (throttledError).
const reasonThrottled = "throttled"

// throttledError: the request's source IP failed authentication too
// often (authlimit); its bearer token or login token is refused without
// being checked, a correct one too, for wait. Answered 429.
type throttledError struct{ wait time.Duration }

func (e *throttledError) Error() string {
	return fmt.Sprintf("too many failed sign-ins from this address: credentials from it are refused unchecked for %d s (Retry-After); at most %d failures at once, then one a second", int64(e.wait/time.Second), authlimit.DefaultBurst)
}

// throttledAnswer answers 429 with Retry-After (whole seconds) and the
// login form saying why.
func (h *Handler) throttledAnswer(w http.ResponseWriter, wait time.Duration, next string) {
	w.Header().Set("Retry-After", strconv.FormatInt(int64(wait/time.Second), 10))
	h.render(w, http.StatusTooManyRequests, "login", loginView{Error: (&throttledError{wait}).Error(), Next: next, TokensOn: h.cfg.Tokens != nil})
}

// identify returns the caller of r: by bearer token, by session cookie,
// or as its loopback local user (package doc, Identities). A bad bearer
// token is errBadToken; a bearer token or session cookie over a channel
// that is neither TLS nor loopback is errClearText (checked first, so a
// bad token over clear text says clear text); a bad or expired cookie is
// errBadSession.
func (h *Handler) identify(r *http.Request) (caller, error) {
	tok, hasBearer := bearer(r)
	ck, ckErr := r.Cookie(cookieName)
	if (hasBearer || ckErr == nil) && !privateChannel(r) {
		return caller{}, errClearText
	}
	if hasBearer {
		src := authlimit.Key(r.RemoteAddr)
		if wait, ok := h.limit.Check(src); !ok {
			return caller{}, &throttledError{wait}
		}
		if h.cfg.Tokens != nil && tok != "" {
			if name, ok := h.cfg.Tokens(tok); ok {
				return caller{ID: policy.Identity{Kind: policy.KindToken, Name: name}, Identified: true, Via: "token"}, nil
			}
		}
		h.limit.Fail(src)
		return caller{}, errBadToken
	}
	if ckErr == nil {
		name, ok := h.openSession(ck.Value)
		if !ok {
			return caller{}, errBadSession
		}
		return caller{ID: policy.Identity{Kind: policy.KindToken, Name: name}, Identified: true, Via: "session"}, nil
	}
	if h.cfg.Local != nil {
		if hd := hostcheck.Proxied(r.Header); hd != "" {
			// review F13: behind a root TLS forwarder each remote caller
			// was the root user.
			return caller{}, fmt.Errorf("sign in: this request came through a proxy (it carries %s), so its sender is not the local user of the loopback connection; a proxied request needs a console token or session", hd)
		}
		if id, ok := h.cfg.Local(r); ok {
			if err := h.loopbackHost(r); err != nil {
				return caller{}, err
			}
			return caller{ID: id, Identified: true, Via: "loopback"}, nil
		}
	}
	return caller{}, nil
}

// hostsHint ends the refusal of a Host that is no name of the console.
const hostsHint = "the console answers a loopback caller without credentials only under these names (a web page whose own name resolves to 127.0.0.1 must not read it); if browsers really use that name, add it to --facade-allowed-hosts"

// loopbackHost checks the Host of a request that would get the Local
// identity (no credentials): localhost, 127.0.0.0/8, ::1, the
// connection's local IP or a Config.AllowedHosts name, else a
// *hostcheck.RefusedError (answered 421). Against DNS rebinding: a page
// on evil.example whose name resolves to 127.0.0.1 reaches the console
// over loopback, and its browser sends Host: evil.example (review F4).
func (h *Handler) loopbackHost(r *http.Request) error {
	err := h.hosts.Host("Host", r.Host)
	if err == nil {
		return nil
	}
	// The local IP a caller connected to is a name of the console too
	// (a loopback one is accepted already).
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		if host, _, serr := net.SplitHostPort(a.String()); serr == nil {
			if ip := net.ParseIP(host); ip != nil && !ip.IsLoopback() && !ip.IsUnspecified() {
				if p, perr := hostcheck.New(hostcheck.Config{Listen: "127.0.0.1", Allowed: append(slices.Clip(h.cfg.AllowedHosts), ip.String()), Hint: hostsHint}); perr == nil {
					err = p.Host("Host", r.Host)
				}
			}
		}
	}
	return err
}

// bearer returns the token of an Authorization: Bearer header, and
// whether r carries any Authorization header: one that is not a single
// bearer token with a value (empty, Basic, two headers) yields "", true,
// so that it is refused as a bad token and never falls back to the
// loopback user (fresh-user pass: "Bearer " and Basic were answered as
// the loopback uid).
func bearer(r *http.Request) (string, bool) {
	vs := r.Header.Values("Authorization")
	if len(vs) == 0 {
		return "", false
	}
	if len(vs) > 1 {
		return "", true
	}
	scheme, tok, ok := strings.Cut(vs[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", true
	}
	return strings.TrimSpace(tok), true
}

// Session cookie shape (sealSession, parseSession): four fields joined by
// ".", each of one spelling only, so that the revocation state keyed by
// the session id can never be side-stepped by a respelling.
const (
	sidBytes     = 12 // 96 random bits per login
	macBytes     = sha256.Size
	maxNameBytes = 64 // a token name's longest (cli validTokenName)
)

// sealSession returns the cookie value of a new session of token name
// until the session's end: "NAME.SID.EXPIRY.MAC". NAME is the name in raw
// base64url (a name may hold dots), SID 12 bytes from crypto/rand in raw
// base64url, EXPIRY decimal Unix seconds, MAC the raw base64url
// HMAC-SHA256 of "NAME.SID.EXPIRY" under the process's key. Each login
// is its own session (review F3: logins in one second shared a cookie,
// and signing in again after logout handed back the revoked one).
func (h *Handler) sealSession(name string) string {
	sid := make([]byte, sidBytes)
	rand.Read(sid) // never fails
	exp := strconv.FormatInt(h.cfg.now().Add(h.cfg.SessionTTL).Unix(), 10)
	body := b64.EncodeToString([]byte(name)) + "." + b64.EncodeToString(sid) + "." + exp
	h.sess.mu.RLock()
	sig := b64.EncodeToString(h.sess.mac(body))
	h.sess.mu.RUnlock()
	return body + "." + sig
}

// b64 is the cookie fields' encoding: raw (unpadded) base64url, strict
// (the unused bits of a last character must be zero: one spelling).
var b64 = base64.RawURLEncoding.Strict()

// sessionCookie is a cookie value split into its parts (parseSession).
type sessionCookie struct {
	body, name, sid string // sid: the field as sent (one spelling)
	mac             []byte
	exp             int64
}

// parseSession splits v; false unless it is exactly NAME.SID.EXPIRY.MAC
// of sealSession's shape: four fields, NAME 1-64 bytes, SID 12 bytes and
// MAC 32 bytes in strict raw base64url, EXPIRY a positive decimal without
// sign or leading zero. It checks nothing against the key.
func parseSession(v string) (sessionCookie, bool) {
	f := strings.Split(v, ".")
	if len(f) != 4 {
		return sessionCookie{}, false
	}
	name, err := b64.DecodeString(f[0])
	if err != nil || len(name) == 0 || len(name) > maxNameBytes {
		return sessionCookie{}, false
	}
	sid, err := b64.DecodeString(f[1])
	if err != nil || len(sid) != sidBytes {
		return sessionCookie{}, false
	}
	exp, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil || exp <= 0 || strconv.FormatInt(exp, 10) != f[2] {
		return sessionCookie{}, false
	}
	mac, err := b64.DecodeString(f[3])
	if err != nil || len(mac) != macBytes {
		return sessionCookie{}, false
	}
	return sessionCookie{body: v[:len(v)-len(f[3])-1], name: string(name), sid: f[1], mac: mac, exp: exp}, true
}

// openSession checks a cookie value sealSession made and returns its
// token name; false when forged, malformed, expired or ended by logout.
func (h *Handler) openSession(v string) (string, bool) {
	c, ok := parseSession(v)
	if !ok {
		return "", false
	}
	now := h.cfg.now().Unix()
	h.sess.mu.RLock()
	defer h.sess.mu.RUnlock()
	if !h.sess.validLocked(c, now) {
		return "", false
	}
	return c.name, true
}

// maxRevokedPerName bounds the sessions of one token name that logout
// ended and that are remembered one by one (a few dozen bytes each).
const maxRevokedPerName = 1024

// sessions holds the session MAC key and what logout ended. One lock
// guards both, and openSession holds it (read) from the MAC check to the
// revocation check, so no validation ever sees a revoked set emptied
// under a key that still signs its cookies (review: the set was cleared
// under one lock and the key replaced under another, and a revoked cookie
// passed in between).
//
// The design, against a login/logout flood (review: 65,536 rounds by any
// token holder filled one global set, whose overflow replaced the key and
// signed every user out):
//
//   - Revocations are kept per token name, one per session id (each
//     login's own, so logout ends that session only), each until its
//     cookie's own expiry (a cookie past it is refused anyway), so the
//     state holds only unexpired revoked sessions.
//   - A name holds at most maxRevokedPerName of them. Past that, its
//     entries are replaced by one cutoff: every cookie of that name
//     expiring at or before the latest expiry among them, or than a
//     session sealed now would have, is ended. All of them are covered (a
//     revoked cookie never passes again while unexpired), and only the
//     flooding name's other sessions end with them, never another name's:
//     its holder signs in again.
//   - The key is never replaced at run time. Memory is bounded by the
//     token names (the operator's token file) times maxRevokedPerName.
type sessions struct {
	mu        sync.RWMutex
	key       []byte // the cookies' MAC key, random per process
	byName    map[string]*revokedName
	nextSweep int64 // Unix seconds: when endSession next drops expired state
}

// revokedName is what logout (or a refusal in clear text, which revokes
// the exposed session) ended of one token name's sessions.
type revokedName struct {
	sids   map[string]int64 // a session's id (cookie field) -> its expiry (Unix seconds)
	cutoff int64            // cookies expiring at or before it are ended; 0: none
}

// mac is the MAC of body under the key; s.mu must be held.
func (s *sessions) mac(body string) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(body))
	return m.Sum(nil)
}

// validLocked reports whether c is a live session at now: its MAC under
// the key (constant time), unexpired, not ended. s.mu must be held.
func (s *sessions) validLocked(c sessionCookie, now int64) bool {
	if !hmac.Equal(c.mac, s.mac(c.body)) || now >= c.exp {
		return false
	}
	r := s.byName[c.name]
	if r == nil {
		return true
	}
	if c.exp <= r.cutoff {
		return false
	}
	_, ended := r.sids[c.sid]
	return !ended
}

// endSession revokes the session of cookie value v (its session id), if
// it is a valid one (sessions); the token's other sessions live on. It
// reports whether v was a valid session (now ended).
func (h *Handler) endSession(v string) bool {
	c, ok := parseSession(v)
	if !ok {
		return false
	}
	now := h.cfg.now().Unix()
	s := &h.sess
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.validLocked(c, now) {
		return false
	}
	if now >= s.nextSweep {
		s.sweepLocked(now)
		s.nextSweep = now + 60
	}
	if s.byName == nil {
		s.byName = make(map[string]*revokedName)
	}
	r := s.byName[c.name]
	if r == nil {
		r = &revokedName{sids: make(map[string]int64)}
		s.byName[c.name] = r
	}
	if len(r.sids) >= maxRevokedPerName {
		for k, e := range r.sids {
			if now >= e {
				delete(r.sids, k)
			}
		}
	}
	if len(r.sids) < maxRevokedPerName {
		r.sids[c.sid] = c.exp
		return true
	}
	// Full of unexpired revocations: one cutoff covers them all, this one
	// and every session of the name sealed until now (the clock may have
	// stepped back, so the entries' own expiries count too).
	cut := max(c.exp, now+int64(h.cfg.SessionTTL/time.Second))
	for _, e := range r.sids {
		cut = max(cut, e)
	}
	r.cutoff = max(r.cutoff, cut)
	clear(r.sids)
	h.log.Warn("console: a token's sessions ended by logout exceed what is remembered per token; ended all its sessions so far (its holder signs in again; other tokens' sessions live on)", "token", c.name, "max", maxRevokedPerName)
	return true
}

// sweepLocked drops revocations and cutoffs that expired (their cookies
// are refused as expired anyway). s.mu must be held for writing.
func (s *sessions) sweepLocked(now int64) {
	for name, r := range s.byName {
		for k, e := range r.sids {
			if now >= e {
				delete(r.sids, k)
			}
		}
		if now >= r.cutoff {
			r.cutoff = 0
		}
		if len(r.sids) == 0 && r.cutoff == 0 {
			delete(s.byName, name)
		}
	}
}

// loginView is the login page's data.
type loginView struct {
	Error    string
	Next     string
	TokensOn bool
}

// login serves the login exchange: GET with ?token= or POST with the
// form field token sets the session cookie and redirects to next (a path
// under Prefix, default the console's front page); GET without a token
// shows the form. A login with a token (either method) or any POST from a
// page of another site (crossSite) is refused with 403.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	start := h.cfg.now()
	sw := &statusWriter{ResponseWriter: w}
	n := &note{}
	var who caller
	if h.loginAttempt(sw, r, n, &who) {
		h.record(r, opLogin, "login", who, n, sw.status, start)
	}
}

// opLogin is the audit operation of a login exchange.
const opLogin = "console.login"

// loginAttempt serves login; it reports whether the request tried a
// token (and so is recorded), setting who on success.
func (h *Handler) loginAttempt(w http.ResponseWriter, r *http.Request, n *note, who *caller) bool {
	next := safeNext(r.FormValue("next"))
	tok := r.FormValue("token")
	if r.Method == http.MethodPost || tok != "" {
		// A cross-site form post or link (GET ?token= signs in too) could
		// sign a victim's browser in as the attacker's token (review F5);
		// only this origin's pages, or a typed URL, may.
		if why := crossSite(r); why != "" {
			n.reason = "origin"
			h.render(w, http.StatusForbidden, "login", loginView{Error: "login refused: the request came from another site (" + why + "); open " + Prefix + "login yourself", Next: next, TokensOn: h.cfg.Tokens != nil})
			return true
		}
	}
	if tok == "" {
		h.render(w, http.StatusOK, "login", loginView{Next: next, TokensOn: h.cfg.Tokens != nil})
		return false
	}
	if h.cfg.Tokens == nil {
		n.reason = "unauthenticated"
		h.render(w, http.StatusForbidden, "login", loginView{Error: "this coordinator has no console tokens (tether coordinator --console-token-file)", Next: next})
		return true
	}
	if !privateChannel(r) {
		n.reason = reasonClearText
		n.detail = h.clearTextDetail(r, tok, "login")
		h.render(w, http.StatusForbidden, "login", loginView{Error: "token login refused: the connection is neither TLS nor loopback, so the token would cross the network in clear text; reach the console through a TLS proxy on the coordinator's host or an SSH tunnel", Next: next, TokensOn: true})
		return true
	}
	src := authlimit.Key(r.RemoteAddr)
	if wait, ok := h.limit.Check(src); !ok {
		n.reason = reasonThrottled
		h.throttledAnswer(w, wait, next)
		return true
	}
	name, ok := h.cfg.Tokens(tok)
	if !ok {
		h.limit.Fail(src)
		n.reason = "unauthenticated"
		h.render(w, http.StatusUnauthorized, "login", loginView{Error: "that is not a console token", Next: next, TokensOn: true})
		return true
	}
	*who = caller{ID: policy.Identity{Kind: policy.KindToken, Name: name}, Identified: true, Via: "login"}
	http.SetCookie(w, &http.Cookie{
		Name:     cookieName,
		Value:    h.sealSession(name),
		Path:     Prefix,
		MaxAge:   int(h.cfg.SessionTTL.Seconds()),
		HttpOnly: true, // no script reads it
		Secure:   true, // browsers count loopback http as secure
		SameSite: http.SameSiteStrictMode,
	})
	http.Redirect(w, r, next, http.StatusSeeOther)
	return true
}

// logout ends the session: its cookie is refused from now on, also a copy
// of it elsewhere, and the browser is told to drop it. A request from a
// page of another site (crossSite) is refused with 403 and ends nothing.
func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
	// A GET that ends a session: a page of another site must not make a
	// browser sign out (review F5).
	if why := crossSite(r); why != "" {
		h.render(w, http.StatusForbidden, "login", loginView{Error: "sign out refused: the request came from another site (" + why + "); use the console's own sign out link", Next: Prefix, TokensOn: h.cfg.Tokens != nil})
		return
	}
	if ck, err := r.Cookie(cookieName); err == nil {
		h.endSession(ck.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: Prefix, MaxAge: -1, HttpOnly: true, Secure: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
}

// safeNext returns next when it is a path under Prefix (no scheme, no
// host: no open redirect), else Prefix.
func safeNext(next string) string {
	u, err := url.Parse(next)
	if err != nil || next == "" || u.Scheme != "" || u.Host != "" || u.Opaque != "" ||
		!strings.HasPrefix(next, Prefix) || strings.HasPrefix(next, "//") || strings.Contains(next, "\\") {
		return Prefix
	}
	// Dot segments, also percent-encoded ones (u.Path is decoded), must
	// not climb out of the console: the browser resolves them before it
	// asks, so "/console/../metrics" is a redirect to /metrics.
	if !strings.HasPrefix(path.Clean(u.Path)+"/", Prefix) {
		return Prefix
	}
	return next
}

// sameOrigin reports whether origin is r's own (scheme and Host; https for
// plain HTTP from loopback, as a TLS proxy on the host forwards it).
func sameOrigin(origin string, r *http.Request) bool {
	u, err := url.Parse(origin)
	if err != nil {
		return false
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	// A TLS proxy on the coordinator's host (README, "Signing in") serves
	// the console's pages as https and reaches it in clear text over
	// loopback: its pages' origin is https. Never the other way round.
	proxied := r.TLS == nil && u.Scheme == "https" && privateChannel(r)
	return (u.Scheme == scheme || proxied) && strings.EqualFold(u.Host, r.Host)
}

// crossSite returns why r, a state-changing request (a login with a
// token, a logout), came from a page of another site, "" when it did not.
// A browser marks each request with Sec-Fetch-Site, which a page cannot
// set: only same-origin and none (a typed URL, a bookmark) pass. An Origin
// must be r's own (sameOrigin) in any case. Without Sec-Fetch-Site (an
// older browser) a Referer must be r's own too. A client that sends none
// of them (curl, a script) is no browser a page can drive, and passes.
func crossSite(r *http.Request) string {
	site := r.Header.Get("Sec-Fetch-Site")
	if site != "" && site != "same-origin" && site != "none" {
		return "Sec-Fetch-Site: " + site
	}
	if o := r.Header.Get("Origin"); o != "" && !sameOrigin(o, r) {
		return "Origin: " + o
	}
	if ref := r.Header.Get("Referer"); site == "" && ref != "" && !sameOrigin(ref, r) {
		u, err := url.Parse(ref)
		if err != nil || u.Host == "" {
			return "an unreadable Referer"
		}
		return "Referer: " + u.Scheme + "://" + u.Host
	}
	return ""
}

// privateChannel reports whether r came over TLS or from loopback: the
// only connections a credential may travel on (identify, the login
// exchange). The admin listener serves plain HTTP, so off this host only
// a TLS proxy on the host (which connects over loopback, and must add
// X-Forwarded-For so its callers get no loopback identity) or an SSH tunnel
// reaches the console with credentials.
func privateChannel(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

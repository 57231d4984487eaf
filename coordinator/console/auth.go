package console

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"

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
		switch {
		case errors.Is(err, errClearText):
			n.reason = reasonClearText
			if tok, ok := bearer(r); ok {
				n.detail = h.clearTextDetail(r, tok, "bearer")
			} else if ck, cerr := r.Cookie(cookieName); cerr == nil {
				n.detail = h.clearTextDetail(r, ck.Value, "cookie")
			}
			h.render(sw, http.StatusForbidden, "login", loginView{Error: err.Error(), Next: r.URL.RequestURI(), TokensOn: h.cfg.Tokens != nil})
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

// reasonClearText is the audit reason of a refusal by errClearText.
const reasonClearText = "clear_text"

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
		if h.cfg.Tokens != nil && tok != "" {
			if name, ok := h.cfg.Tokens(tok); ok {
				return caller{ID: policy.Identity{Kind: policy.KindToken, Name: name}, Identified: true, Via: "token"}, nil
			}
		}
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
		if id, ok := h.cfg.Local(r); ok {
			return caller{ID: id, Identified: true, Via: "loopback"}, nil
		}
	}
	return caller{}, nil
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

// sealSession returns the cookie value naming token name until the
// session's end: "NAME.EXPIRY.MAC", EXPIRY in Unix seconds, MAC the
// base64url HMAC-SHA256 of "NAME.EXPIRY" under the process's key. A token
// name may hold dots ([A-Za-z0-9._-]), so openSession splits at the last
// two; neither the expiry nor the MAC holds one.
func (h *Handler) sealSession(name string) string {
	exp := strconv.FormatInt(h.cfg.now().Add(h.cfg.SessionTTL).Unix(), 10)
	body := name + "." + exp
	return body + "." + base64.RawURLEncoding.EncodeToString(h.mac(body))
}

func (h *Handler) mac(body string) []byte {
	h.keyMu.RLock()
	m := hmac.New(sha256.New, h.key)
	h.keyMu.RUnlock()
	m.Write([]byte(body))
	return m.Sum(nil)
}

// openSession checks a cookie value sealSession made and returns its
// token name; false when forged, malformed or expired.
func (h *Handler) openSession(v string) (string, bool) {
	i := strings.LastIndexByte(v, '.')
	if i <= 0 {
		return "", false
	}
	body, sig := v[:i], v[i+1:]
	got, err := base64.RawURLEncoding.Strict().DecodeString(sig) // one spelling per MAC: the revoked set is keyed by it
	if err != nil || !hmac.Equal(got, h.mac(body)) {             // constant time
		return "", false
	}
	j := strings.LastIndexByte(body, '.')
	if j <= 0 {
		return "", false
	}
	exp, err := strconv.ParseInt(body[j+1:], 10, 64)
	if err != nil || h.cfg.now().Unix() >= exp || h.ended.has(sig, h.cfg.now().Unix()) {
		return "", false
	}
	return body[:j], true
}

// maxRevocations bounds the sessions ended by logout that are remembered
// at once (a few dozen bytes each). When it is reached with none expired,
// the MAC key is replaced: every session ends, as on a restart.
const maxRevocations = 1 << 16

// revocations are the MACs of sessions ended by logout, each with its
// cookie's expiry (Unix seconds), after which openSession refuses the
// cookie anyway and the entry is dropped.
type revocations struct {
	mu  sync.Mutex
	exp map[string]int64
}

func (rv *revocations) has(mac string, now int64) bool {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	exp, ok := rv.exp[mac]
	return ok && now < exp
}

// add records mac until exp; it reports false when the set is full of
// unexpired entries (the caller then replaces the key).
func (rv *revocations) add(mac string, exp, now int64) bool {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	if rv.exp == nil {
		rv.exp = make(map[string]int64)
	}
	if len(rv.exp) >= maxRevocations {
		for k, e := range rv.exp {
			if now >= e {
				delete(rv.exp, k)
			}
		}
		if len(rv.exp) >= maxRevocations {
			clear(rv.exp)
			return false
		}
	}
	rv.exp[mac] = exp
	return true
}

// endSession revokes the session of cookie value v, if it is a valid one.
func (h *Handler) endSession(v string) {
	if _, ok := h.openSession(v); !ok {
		return
	}
	i := strings.LastIndexByte(v, '.')
	body, sig := v[:i], v[i+1:]
	exp, _ := strconv.ParseInt(body[strings.LastIndexByte(body, '.')+1:], 10, 64)
	if !h.ended.add(sig, exp, h.cfg.now().Unix()) {
		h.keyMu.Lock()
		h.key = newKey()
		h.keyMu.Unlock()
		h.log.Warn("console: more sessions ended by logout than can be remembered; replaced the session key, which ends every session", "max", maxRevocations)
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
// shows the form.
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
	if r.Method == http.MethodPost {
		// A cross-site form post could sign a victim's browser in as the
		// attacker's token; only this origin's form may post.
		if o := r.Header.Get("Origin"); o != "" && !sameOrigin(o, r) {
			n.reason = "origin"
			h.render(w, http.StatusForbidden, "login", loginView{Error: "login refused: the form was posted from another site (" + o + ")", Next: next, TokensOn: h.cfg.Tokens != nil})
			return true
		}
	}
	tok := r.FormValue("token")
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
	name, ok := h.cfg.Tokens(tok)
	if !ok {
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
// of it elsewhere, and the browser is told to drop it.
func (h *Handler) logout(w http.ResponseWriter, r *http.Request) {
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

// sameOrigin reports whether origin is r's own (scheme and Host).
func sameOrigin(origin string, r *http.Request) bool {
	u, err := url.Parse(origin)
	if err != nil {
		return false
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return u.Scheme == scheme && strings.EqualFold(u.Host, r.Host)
}

// privateChannel reports whether r came over TLS or from loopback: the
// only connections a credential may travel on (identify, the login
// exchange). The admin listener serves plain HTTP, so off this host only
// a TLS proxy on the host (which connects over loopback) or an SSH tunnel
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

package console

import (
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// login signs in with tok through the login exchange and returns the
// session cookie's value.
func (e *env) login(t *testing.T, tok string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, localRequest("GET", "/console/login?token="+tok, nil))
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("login: %d, want 303", rec.Code)
	}
	for _, c := range rec.Result().Cookies() {
		if c.Name == cookieName {
			return c.Value
		}
	}
	t.Fatalf("login set no %s cookie", cookieName)
	return ""
}

// withCookie requests path from loopback with the raw Cookie header value
// cookieName=v and returns the status.
func (e *env) withCookie(path, v string) int {
	req := localRequest("GET", path, nil)
	req.Header.Set("Cookie", cookieName+"="+v)
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	return rec.Code
}

// Each login is its own session (review F3: two logins in the same second
// shared one cookie, so logging one out ended the other, and signing in
// again right after logout handed back the revoked cookie).
func TestSessionsPerLogin(t *testing.T) {
	e := newEnv(t) // the clock stands still: every login is in the same second
	a, b := e.login(t, "alice-token-0123456789"), e.login(t, "alice-token-0123456789")
	if a == b {
		t.Fatalf("two logins in the same second share the cookie %q", a)
	}
	for _, v := range []string{a, b} {
		if code := e.withCookie("/console/jobs", v); code != http.StatusOK {
			t.Fatalf("a fresh session: %d, want 200", code)
		}
	}
	if code := e.withCookie("/console/logout", a); code != http.StatusSeeOther {
		t.Fatalf("logout: %d, want 303", code)
	}
	if code := e.withCookie("/console/jobs", a); code != http.StatusUnauthorized {
		t.Errorf("the logged-out session: %d, want 401", code)
	}
	if code := e.withCookie("/console/jobs", b); code != http.StatusOK {
		t.Errorf("the other session of the same token after one logout: %d, want 200", code)
	}
	c := e.login(t, "alice-token-0123456789")
	if c == a {
		t.Fatalf("signing in again after logout handed back the revoked cookie")
	}
	if code := e.withCookie("/console/jobs", c); code != http.StatusOK {
		t.Errorf("a login right after logout: %d, want 200", code)
	}
}

// The cookie is NAME.SID.EXPIRY.MAC with a 96-bit session id under the
// MAC, and is read strictly: a value of another shape is 401, never a
// session (also one whose MAC would match a lenient reading).
func TestSessionIDStrict(t *testing.T) {
	e := newEnv(t)
	v := e.login(t, "alice-token-0123456789")
	f := strings.Split(v, ".")
	if len(f) != 4 {
		t.Fatalf("cookie %q: %d fields, want NAME.SID.EXPIRY.MAC", v, len(f))
	}
	if sid, err := base64.RawURLEncoding.Strict().DecodeString(f[1]); err != nil || len(sid) != 12 {
		t.Fatalf("cookie %q: session id %q is not 12 bytes of raw base64url (%v)", v, f[1], err)
	}
	if code := e.withCookie("/console/jobs", v); code != http.StatusOK {
		t.Fatalf("the cookie as issued: %d, want 200", code)
	}
	join := func(p ...string) string { return strings.Join(p, ".") }
	name, sid, exp, mac := f[0], f[1], f[2], f[3]
	for what, bad := range map[string]string{
		"no session id":         join(name, exp, mac),
		"a fifth field":         join(name, sid, exp, mac, "x"),
		"an empty fifth field":  v + ".",
		"an empty first field":  "." + v,
		"leading junk":          "x" + v,
		"trailing junk":         v + "x",
		"padded session id":     join(name, sid+"==", exp, mac),
		"short session id":      join(name, sid[:len(sid)-1], exp, mac),
		"long session id":       join(name, sid+"AAAA", exp, mac),
		"std base64 session id": join(name, strings.NewReplacer("-", "+", "_", "/").Replace(sid)+"+/", exp, mac),
		"empty session id":      join(name, "", exp, mac),
		"signed expiry":         join(name, sid, "+"+exp, mac),
		"zero-led expiry":       join(name, sid, "0"+exp, mac),
		"short MAC":             join(name, sid, exp, mac[:len(mac)-4]),
		"padded MAC":            join(name, sid, exp, mac+"="),
		"padded name":           join(name+"=", sid, exp, mac),
		"plain name":            join("alice", sid, exp, mac),
		"another session's id":  join(name, "AAAAAAAAAAAAAAAA", exp, mac),
		"another token's name":  join(base64.RawURLEncoding.EncodeToString([]byte("admin")), sid, exp, mac),
		"empty":                 "",
		"dots only":             "...",
	} {
		if code := e.withCookie("/console/jobs", bad); code != http.StatusUnauthorized {
			t.Errorf("%s (%q): %d, want 401", what, bad, code)
		}
	}
}

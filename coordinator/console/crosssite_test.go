package console

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestLoginAndLogoutCrossSiteRefused (review F5): GET /console/login?token=
// signs in and GET /console/logout ends a session, so a page of another
// site must not make a browser do either (login CSRF: signed in as the
// attacker's token). A request a browser marks cross-site (Sec-Fetch-Site
// cross-site or same-site, or an Origin or Referer of another host) is
// refused with 403 and sets or ends nothing; same-origin, a typed URL
// (Sec-Fetch-Site none) and a client that sends none of them pass.
func TestLoginAndLogoutCrossSiteRefused(t *testing.T) {
	e := newEnv(t)
	const tok = "alice-token-0123456789"
	cross := map[string]map[string]string{
		"cross-site":   {"Sec-Fetch-Site": "cross-site"},
		"same-site":    {"Sec-Fetch-Site": "same-site"},
		"foreign ref":  {"Referer": "http://evil.example/page"},
		"foreign orig": {"Origin": "http://evil.example"},
		"foreign tls":  {"Origin": "https://evil.example"},
	}
	same := map[string]map[string]string{
		"same-origin": {"Sec-Fetch-Site": "same-origin"},
		"typed":       {"Sec-Fetch-Site": "none"},
		"own referer": {"Referer": "http://" + loopbackHost + "/console/"},
		"no headers":  {},
		// A TLS proxy on the host (README): the browser's page is https,
		// the console sees plain HTTP over loopback.
		"tls proxy": {"Origin": "https://" + loopbackHost, "Sec-Fetch-Site": "same-origin"},
	}
	do := func(method, target string, hdr map[string]string, cookie string) *httptest.ResponseRecorder {
		var req *http.Request
		if method == "POST" {
			req = localRequest("POST", "/console/login", strings.NewReader("token="+tok))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		} else {
			req = localRequest(method, target, nil)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		if cookie != "" {
			req.AddCookie(&http.Cookie{Name: cookieName, Value: cookie})
		}
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, req)
		return rec
	}
	setsCookie := func(rec *httptest.ResponseRecorder) bool {
		for _, c := range rec.Result().Cookies() {
			if c.Name == cookieName {
				return true
			}
		}
		return false
	}
	for name, hdr := range cross {
		for _, m := range []string{"GET", "POST"} {
			if rec := do(m, "/console/login?token="+tok, hdr, ""); rec.Code != http.StatusForbidden || setsCookie(rec) {
				t.Errorf("%s %s login: %d (cookie set: %v), want 403 and no cookie:\n%s", name, m, rec.Code, setsCookie(rec), rec.Body.String())
			}
		}
		v := e.login(t, tok)
		if rec := do("GET", "/console/logout", hdr, v); rec.Code != http.StatusForbidden || setsCookie(rec) {
			t.Errorf("%s logout: %d, want 403 that ends nothing", name, rec.Code)
		}
		if code := e.withCookie("/console/jobs", v); code != http.StatusOK {
			t.Errorf("the session after a %s logout: %d, want 200 (still live)", name, code)
		}
	}
	for name, hdr := range same {
		for _, m := range []string{"GET", "POST"} {
			if rec := do(m, "/console/login?token="+tok, hdr, ""); rec.Code != http.StatusSeeOther || !setsCookie(rec) {
				t.Errorf("%s %s login: %d, want 303 with the session cookie:\n%s", name, m, rec.Code, rec.Body.String())
			}
		}
		v := e.login(t, tok)
		if rec := do("GET", "/console/logout", hdr, v); rec.Code != http.StatusSeeOther {
			t.Errorf("%s logout: %d, want 303", name, rec.Code)
		}
		if code := e.withCookie("/console/jobs", v); code != http.StatusUnauthorized {
			t.Errorf("the session after a %s logout: %d, want 401 (ended)", name, code)
		}
	}
	// The form itself (GET without a token) renders for anyone.
	if rec := do("GET", "/console/login", cross["cross-site"], ""); rec.Code != http.StatusOK {
		t.Errorf("the login form, cross-site: %d, want 200", rec.Code)
	}
}

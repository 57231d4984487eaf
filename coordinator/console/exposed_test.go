package console

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestClearTextCookieRevoked (review F5): a session cookie refused because
// it arrived over plain HTTP from another host crossed the network in
// clear text, so whoever saw it must not use it later from loopback: it is
// revoked on sight and the refusal says so; the token's other sessions
// live on.
func TestClearTextCookieRevoked(t *testing.T) {
	e := newEnv(t)
	exposed := e.login(t, "alice-token-0123456789")
	other := e.login(t, "alice-token-0123456789")
	if code := e.withCookie("/console/jobs", exposed); code != http.StatusOK {
		t.Fatalf("the session on loopback before: %d, want 200", code)
	}
	req := httptest.NewRequest("GET", "/console/jobs", nil)
	req.RemoteAddr = remoteAddr
	req.AddCookie(&http.Cookie{Name: cookieName, Value: exposed})
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "revoked") {
		t.Errorf("the session cookie over plain HTTP from %s: %d, want 403 saying it was revoked:\n%s", remoteAddr, rec.Code, rec.Body.String())
	}
	if code := e.withCookie("/console/jobs", exposed); code != http.StatusUnauthorized {
		t.Errorf("the exposed session cookie later on loopback: %d, want 401 (revoked)", code)
	}
	if code := e.withCookie("/console/jobs", other); code != http.StatusOK {
		t.Errorf("another session of the same token: %d, want 200", code)
	}
	// A cookie that was not valid anyway is not said to be revoked.
	req = httptest.NewRequest("GET", "/console/jobs", nil)
	req.RemoteAddr = remoteAddr
	req.AddCookie(&http.Cookie{Name: cookieName, Value: "forged"})
	rec = httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	if rec.Code != http.StatusForbidden || strings.Contains(rec.Body.String(), "revoked") {
		t.Errorf("a forged cookie over plain HTTP: %d, want 403 without a revocation:\n%s", rec.Code, rec.Body.String())
	}
}

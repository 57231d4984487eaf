package console

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/policy"
)

// A request a proxy on the coordinator's host forwarded arrives from
// loopback, but its sender is whoever reached the proxy: without
// credentials it must never get the loopback identity (review F13: behind
// a root TLS forwarder every remote caller was nats:root in dev). Any of
// the headers proxies add marks it; credentials still work through it.
func TestProxiedRequestsGetNoLoopbackIdentity(t *testing.T) {
	e := newEnv(t)
	e.local = &policy.Identity{Kind: policy.KindToken, Name: "admin"}
	if code, _ := e.get(t, "/console/audit", ""); code != http.StatusOK {
		t.Fatalf("unproxied loopback caller: %d, want 200", code)
	}
	for name, value := range map[string]string{
		"Forwarded":         "for=192.0.2.7;proto=https",
		"X-Forwarded-For":   "192.0.2.7",
		"X-Forwarded-Host":  "console.example",
		"X-Forwarded-Proto": "https",
		"X-Real-IP":         "192.0.2.7",
		"Via":               "1.1 proxy",
		"x-forwarded-for":   "", // present though empty
	} {
		req := localRequest("GET", "/console/audit", nil)
		req.Header[http.CanonicalHeaderKey(name)] = []string{value}
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, req)
		if rec.Code != http.StatusUnauthorized || strings.Contains(rec.Body.String(), "token:admin") {
			t.Errorf("%s: %q without credentials over loopback: %d, want 401 without the loopback identity", name, value, rec.Code)
		}
		if !strings.Contains(rec.Body.String(), "proxy") {
			t.Errorf("%s: the refusal does not say why (a proxied request):\n%s", name, rec.Body.String())
		}
		req = localRequest("GET", "/console/audit", nil)
		req.Header.Set(name, value)
		req.Header.Set("Authorization", "Bearer admin-token-0123456789")
		rec = httptest.NewRecorder()
		e.h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Errorf("%s with a bearer token: %d, want 200", name, rec.Code)
		}
	}
}

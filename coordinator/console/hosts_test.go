package console

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/policy"
)

// A web page whose own name resolves to 127.0.0.1 (DNS rebinding) makes
// the browser send its name in Host over loopback: without credentials
// that request must not get the loopback identity (review F4: evil.example
// read the dev admin's job output, audit and nodes). Loopback names, the
// connection's local IP and --facade-allowed-hosts names pass.
func TestConsoleRefusesRebindingHost(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.AllowedHosts = []string{"console.example", "*.corp.example"} })
	e.local = &policy.Identity{Kind: policy.KindToken, Name: "admin"}
	get := func(host, localAddr string) *httptest.ResponseRecorder {
		req := localRequest("GET", "/console/audit", nil)
		req.Host = host
		if localAddr != "" {
			a, err := net.ResolveTCPAddr("tcp", localAddr)
			if err != nil {
				t.Fatal(err)
			}
			req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, a))
		}
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, req)
		return rec
	}
	for _, host := range []string{"evil.example", "evil.example:8081", "127.0.0.1.nip.io:8081", "localhost.evil.example", "console.example.evil", "corp.example"} {
		rec := get(host, "")
		body := rec.Body.String()
		if rec.Code != http.StatusMisdirectedRequest {
			t.Errorf("Host %q over loopback without credentials: %d, want 421", host, rec.Code)
		}
		if strings.Contains(body, "token:admin") || strings.Contains(body, "token:alice") || strings.Contains(body, "exec") {
			t.Errorf("Host %q: the refusal holds the loopback identity or audit data:\n%s", host, body)
		}
		if !strings.Contains(body, host) || !strings.Contains(body, "--facade-allowed-hosts") {
			t.Errorf("Host %q: the refusal does not name the host and the flag:\n%s", host, body)
		}
	}
	if got := e.audit.take(); len(got) == 0 || got[len(got)-1].Reason != "host" || got[len(got)-1].Status != http.StatusMisdirectedRequest {
		t.Errorf("a refused Host's audit events: %+v, want reason host, status 421", got)
	}
	for _, tc := range []struct{ host, local string }{
		{"localhost:8081", ""}, {"LOCALHOST.", ""}, {"127.0.0.1:8081", ""}, {"127.3.4.5", ""}, {"[::1]:8081", ""},
		{"console.example", ""}, {"console.example:443", ""}, {"a.corp.example:8081", ""},
		{"10.1.2.3:8081", "10.1.2.3:8081"}, // the connected local IP
	} {
		if rec := get(tc.host, tc.local); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "token:admin") {
			t.Errorf("Host %q (local %q): %d, want 200 as the loopback identity", tc.host, tc.local, rec.Code)
		}
	}
	// Another host's IP is no name of this connection.
	if rec := get("10.9.9.9:8081", "10.1.2.3:8081"); rec.Code != http.StatusMisdirectedRequest {
		t.Errorf("Host of another IP than the connection's: %d, want 421", rec.Code)
	}
	// A token holder names the console by any name: the token is the
	// credential, not the connection.
	req := localRequest("GET", "/console/audit", nil)
	req.Host = "evil.example"
	req.Header.Set("Authorization", "Bearer admin-token-0123456789")
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Errorf("a bearer token under Host evil.example: %d, want 200", rec.Code)
	}
	// Over a real loopback connection too.
	hreq, _ := http.NewRequest("GET", e.server.URL+"/console/audit", nil)
	hreq.Host = "evil.example"
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("Host evil.example over a loopback connection: %d, want 421", resp.StatusCode)
	}
}

// An --facade-allowed-hosts entry that is no name is New's error.
func TestConsoleBadAllowedHost(t *testing.T) {
	cfg := Config{Policy: newEnv(t).h.cfg.Policy, Fleet: &fakeFleet{}, AllowedHosts: []string{"http://x.example/"}}
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "http://x.example/") {
		t.Errorf("New with a bad allowed host: %v, want an error naming it", err)
	}
}

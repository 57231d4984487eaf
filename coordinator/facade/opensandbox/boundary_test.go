package opensandbox_test

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tetherfleet/tether/coordinator/facade/hostcheck"
	"github.com/tetherfleet/tether/coordinator/facade/opensandbox"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/protocol"
)

// stubNode is a lifecycle server stand-in that knows sandbox sb-1 only
// (200 for /sandboxes/sb-1, an empty list, 404 for anything else) and
// records what it received.
type stubNode struct {
	srv  *httptest.Server
	mu   sync.Mutex
	reqs []*http.Request
}

func newStubNode(t testing.TB, h http.HandlerFunc) *stubNode {
	t.Helper()
	s := &stubNode{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.reqs = append(s.reqs, r.Clone(r.Context()))
		s.mu.Unlock()
		if h != nil {
			h(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch strings.TrimPrefix(r.URL.Path, "/v1") {
		case "/sandboxes/sb-1":
			w.Write([]byte(`{"id":"sb-1","status":{"state":"Running"},"entrypoint":["x"],"createdAt":"2026-01-01T00:00:00Z"}`))
		case "/sandboxes":
			w.Write([]byte(`{"items":[],"pagination":{"page":1,"pageSize":200,"totalItems":0,"totalPages":0,"hasNextPage":false}}`))
		default:
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"code":"KUBERNETES::SANDBOX_NOT_FOUND","message":"not found"}`))
		}
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *stubNode) addr() string { return strings.TrimPrefix(s.srv.URL, "http://") }

func (s *stubNode) last() *http.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.reqs) == 0 {
		return nil
	}
	return s.reqs[len(s.reqs)-1]
}

func decodeError(t testing.TB, body string) (code, msg string) {
	t.Helper()
	var e struct{ Code, Message string }
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	return e.Code, e.Message
}

func TestAuthBoundary(t *testing.T) {
	node := newStubNode(t, nil)
	e := newFacadeEnv(t, func(c *opensandbox.Config) {
		c.CheckToken = func(tok string) bool { return tok == "good" }
	})
	e.fleet.add("n1", node.addr(), nil)
	e.ledger.put(ledger.Record{Provider: protocol.ProviderOpenSandbox, Node: "n1", ID: "sb-1", State: ledger.StateLive})

	for _, tok := range []string{"", "bad"} {
		code, _, body := e.do(t, "GET", "/v1/sandboxes/sb-1", map[string]string{opensandbox.HeaderToken: tok}, "")
		if code != http.StatusUnauthorized {
			t.Errorf("token %q: status %d, want 401", tok, code)
		}
		if c, _ := decodeError(t, body); c != opensandbox.CodeUnauthenticated {
			t.Errorf("token %q: code %q", tok, c)
		}
	}
	if node.last() != nil {
		t.Fatal("an unauthenticated request reached the node")
	}
	if n := metricValue(t, e, "tether_opensandbox_facade_auth_failures_total"); n != 2 {
		t.Errorf("auth failures = %v, want 2", n)
	}

	code, _, body := e.do(t, "GET", "/v1/sandboxes/sb-1", map[string]string{
		opensandbox.HeaderToken: "good",
		"Tether-Other":          "x",
		"OPEN-SANDBOX-API-KEY":  "k",
		"Authorization":         "Bearer gw",
	}, "")
	if code != http.StatusOK {
		t.Fatalf("good token: status %d %s", code, body)
	}
	got := node.last()
	for k := range got.Header {
		if strings.HasPrefix(k, "Tether-") {
			t.Errorf("header %s reached the node", k)
		}
	}
	if got.Header.Get("Open-Sandbox-Api-Key") != "k" || got.Header.Get("Authorization") != "Bearer gw" {
		t.Errorf("gateway credentials not passed through: %v", got.Header)
	}
	if got.Host != e.host || got.Header.Get("X-Forwarded-Host") != e.host || got.Header.Get("X-Forwarded-Proto") != "http" || got.Header.Get("X-Forwarded-For") != "127.0.0.1" {
		t.Errorf("host %q, forwarded headers %v", got.Host, got.Header)
	}
}

func TestAuthClientCertificate(t *testing.T) {
	node := newStubNode(t, nil)
	e := newFacadeEnv(t, func(c *opensandbox.Config) {
		c.CheckToken = func(string) bool { return false }
		// A facade that checks tokens is on the network: any Host.
		hosts, err := hostcheck.New(hostcheck.Config{Listen: "10.0.0.1:7082"})
		if err != nil {
			t.Fatal(err)
		}
		c.Hosts = hosts
	})
	e.fleet.add("n1", node.addr(), nil)
	e.ledger.put(ledger.Record{Provider: protocol.ProviderOpenSandbox, Node: "n1", ID: "sb-1", State: ledger.StateLive})

	for _, tt := range []struct {
		name   string
		chains [][]*x509.Certificate
		want   int
	}{
		{"verified", [][]*x509.Certificate{{{}}}, http.StatusOK},
		{"unverified", nil, http.StatusUnauthorized},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "https://facade/v1/sandboxes/sb-1", nil)
			r.TLS = &tls.ConnectionState{VerifiedChains: tt.chains}
			w := httptest.NewRecorder()
			e.f.ServeHTTP(w, r)
			if w.Code != tt.want {
				t.Fatalf("status %d, want %d: %s", w.Code, tt.want, w.Body)
			}
		})
	}
	if got := node.last(); got == nil || got.Header.Get("X-Forwarded-Proto") != "https" {
		t.Errorf("forwarded request %v: want X-Forwarded-Proto https", got)
	}
}

func TestFacadeErrors(t *testing.T) {
	node := newStubNode(t, nil)
	e := newFacadeEnv(t, nil)

	// No node at all.
	code, _, body := e.do(t, "POST", "/v1/sandboxes", nil, `{}`)
	if c, _ := decodeError(t, body); code != http.StatusServiceUnavailable || c != opensandbox.CodeNoNode {
		t.Errorf("create with no node: %d %s", code, body)
	}

	e.fleet.add("n1", node.addr(), map[string]string{"gpu": "a100"})
	e.fleet.add("n2", "127.0.0.1:1", nil) // nothing listens there
	e.fleet.setTargets("n2", "openshell", opensandbox.Target)
	e.fleet.add("n3", node.addr(), nil)
	e.fleet.setTargets("n3", "openshell")
	// n2 holds a live sandbox, so a list or lookup without it would be
	// incomplete (an unreachable node holding none is left out:
	// TestDeadLifecycleServer).
	e.ledger.put(ledger.Record{Provider: protocol.ProviderOpenSandbox, Node: "n2", ID: "sb-n2", State: ledger.StateLive})

	tests := []struct {
		name       string
		method     string
		path       string
		hdr        map[string]string
		wantStatus int
		wantCode   string
		wantInMsg  []string
	}{
		{"unknown node", "POST", "/v1/sandboxes", map[string]string{opensandbox.HeaderNode: "nx"}, 503, opensandbox.CodeNodeUnavailable, []string{"nx", "not connected"}},
		{"node without target", "POST", "/sandboxes", map[string]string{opensandbox.HeaderNode: "n3"}, 503, opensandbox.CodeNodeUnavailable, []string{"n3", "no opensandbox target"}},
		{"bad selector", "POST", "/v1/sandboxes", map[string]string{opensandbox.HeaderNodeSelector: "a in (b"}, 400, opensandbox.CodeInvalidPlacement, nil},
		{"both headers", "POST", "/v1/sandboxes", map[string]string{opensandbox.HeaderNodeSelector: "gpu", opensandbox.HeaderNode: "n1"}, 400, opensandbox.CodeInvalidPlacement, nil},
		{"selector matches none", "POST", "/v1/sandboxes", map[string]string{opensandbox.HeaderNodeSelector: "gpu=h100"}, 503, opensandbox.CodeNoNode, []string{"gpu=h100"}},
		{"unreachable node", "POST", "/v1/sandboxes", map[string]string{opensandbox.HeaderNode: "n2"}, 502, opensandbox.CodeNodeUnavailable, []string{"node n2", "target opensandbox"}},
		{"lookup with a failing node", "GET", "/v1/sandboxes/sb-unknown", nil, 502, opensandbox.CodeNodeUnavailable, []string{"node n2", "sb-unknown"}},
		{"list with a failing node", "GET", "/v1/sandboxes", nil, 502, opensandbox.CodeNodeUnavailable, []string{"node n2", "target opensandbox"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, body := e.do(t, tt.method, tt.path, tt.hdr, `{}`)
			c, msg := decodeError(t, body)
			if code != tt.wantStatus || c != tt.wantCode {
				t.Fatalf("got %d %s, want %d %s", code, body, tt.wantStatus, tt.wantCode)
			}
			for _, s := range tt.wantInMsg {
				if !strings.Contains(msg, s) {
					t.Errorf("message %q lacks %q", msg, s)
				}
			}
		})
	}

	// The ledger names a node that is gone.
	e.ledger.put(ledger.Record{Provider: protocol.ProviderOpenSandbox, Node: "gone", ID: "sb-9", State: ledger.StateLive})
	code, _, body = e.do(t, "DELETE", "/v1/sandboxes/sb-9", nil, "")
	if c, msg := decodeError(t, body); code != 503 || c != opensandbox.CodeNodeUnavailable || !strings.Contains(msg, "gone") {
		t.Errorf("delete on a gone node: %d %s", code, body)
	}
	// ... which also makes the list incomplete.
	e.fleet.remove("n2")
	code, _, body = e.do(t, "GET", "/v1/sandboxes", nil, "")
	if c, msg := decodeError(t, body); code != 503 || c != opensandbox.CodeNodeUnavailable || !strings.Contains(msg, "node gone") {
		t.Errorf("list with live sandboxes on a gone node: %d %s", code, body)
	}

	// Unknown routes and methods answer like FastAPI.
	if code, _, body := e.do(t, "GET", "/v1/nothing", nil, ""); code != 404 || body != `{"detail":"Not Found"}` {
		t.Errorf("unknown path: %d %s", code, body)
	}
	if code, hdr, _ := e.do(t, "PUT", "/v1/sandboxes", nil, ""); code != 405 || hdr.Get("Allow") != "GET, POST" {
		t.Errorf("PUT /v1/sandboxes: %d allow %q", code, hdr.Get("Allow"))
	}
	if code, _, body := e.do(t, "GET", "/health", nil, ""); code != 200 || body != `{"status":"healthy"}` {
		t.Errorf("health: %d %s", code, body)
	}

	// After Close every request is refused.
	e.f.Close()
	code, _, body = e.do(t, "GET", "/v1/sandboxes", nil, "")
	if c, _ := decodeError(t, body); code != 503 || c != opensandbox.CodeShuttingDown {
		t.Errorf("after Close: %d %s", code, body)
	}

	if got := requestsCount(t, e, "list", "5xx"); got < 3 {
		t.Errorf("requests_total{route=list,status=5xx} = %v, want ≥ 3", got)
	}
}

func TestTransportDroppedOnNewSession(t *testing.T) {
	node := newStubNode(t, nil)
	e := newFacadeEnv(t, nil)
	e.fleet.add("n1", node.addr(), nil)
	e.ledger.put(ledger.Record{Provider: protocol.ProviderOpenSandbox, Node: "n1", ID: "sb-1", State: ledger.StateLive})
	get := func() {
		t.Helper()
		if code, _, body := e.do(t, "GET", "/v1/sandboxes/sb-1", nil, ""); code != 200 {
			t.Fatalf("get: %d %s", code, body)
		}
	}
	get()
	get()
	if n := e.fleet.dialCount("n1"); n != 1 {
		t.Fatalf("dials after two requests on one session = %d, want 1 (kept alive)", n)
	}
	e.fleet.setSession("n1", "s2")
	get()
	if n := e.fleet.dialCount("n1"); n != 2 {
		t.Fatalf("dials after the session changed = %d, want 2", n)
	}
}

// requestsCount returns tether_opensandbox_facade_requests_total{route,status}.
func requestsCount(t testing.TB, e *facadeEnv, route, status string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tether_opensandbox_facade_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if cmp.Equal(labels, map[string]string{"route": route, "status": status}) {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no requests_total{route=%q,status=%q}", route, status)
	return 0
}

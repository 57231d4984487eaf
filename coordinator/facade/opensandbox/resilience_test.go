package opensandbox_test

import (
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/coordinator/facade/opensandbox"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/protocol"
	osb "github.com/tetherfleet/tether/protocol/opensandbox"
	"github.com/tetherfleet/tether/protocol/opensandbox/opensandboxtest"
)

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// wantError checks a facade error answer.
func wantError(t testing.TB, what string, code int, body string, wantCode int, wantErr string, parts ...string) {
	t.Helper()
	var eb osb.ErrorBody
	if code != wantCode {
		t.Fatalf("%s: %d %s, want %d", what, code, body, wantCode)
	}
	mustJSON(t, body, &eb)
	if eb.Code != wantErr {
		t.Fatalf("%s: code %q, want %q (%s)", what, eb.Code, wantErr, body)
	}
	for _, p := range parts {
		if !strings.Contains(eb.Message, p) {
			t.Fatalf("%s: message %q lacks %q", what, eb.Message, p)
		}
	}
}

// TestDeadLifecycleServer: node-f's agent is connected but its lifecycle
// server is not listening. Creates placed by load go to node-e (the one
// failed dial to node-f is retried there, later ones skip node-f), and
// lists and lookups leave node-f out while the ledger says it holds
// nothing.
func TestDeadLifecycleServer(t *testing.T) {
	e := newFacadeEnv(t, nil)
	srv := e.startNode(t, "node-e", nil, opensandboxtest.Config{})
	e.fleet.add("node-f", deadAddr(t), nil)

	for i := range 6 {
		id := e.create(t, nil, nil)
		if _, ok := srv.Sandbox(id); !ok {
			t.Fatalf("create %d not on node-e", i)
		}
	}
	if n := requestsTo(srv, "POST", "/v1/sandboxes"); n != 6 {
		t.Fatalf("node-e got %d creates, want 6", n)
	}
	if e.fleet.dialCount("node-f") == 0 {
		t.Fatal("node-f was never tried; the test proves nothing")
	}

	code, _, body := e.do(t, "GET", "/v1/sandboxes", nil, "")
	var page struct {
		Items []osb.Sandbox `json:"items"`
	}
	if code != http.StatusOK {
		t.Fatalf("list: %d %s", code, body)
	}
	mustJSON(t, body, &page)
	if len(page.Items) != 6 {
		t.Fatalf("list: %d items, want 6", len(page.Items))
	}
	code, _, body = e.do(t, "GET", "/v1/sandboxes/nowhere", nil, "")
	wantError(t, "get of an unknown id", code, body, http.StatusNotFound, osb.CodeSandboxNotFound)

	// Pinned to node-f: its error, no retry elsewhere.
	code, _, body = e.do(t, "POST", "/v1/sandboxes", map[string]string{opensandbox.HeaderNode: "node-f"}, createBody(nil))
	wantError(t, "pinned create", code, body, http.StatusBadGateway, opensandbox.CodeNodeUnavailable, "node-f")
	if n := requestsTo(srv, "POST", "/v1/sandboxes"); n != 6 {
		t.Fatalf("node-e got %d creates; a pinned create must not move", n)
	}

	// The ledger says node-f holds a sandbox: the list would be partial.
	e.ledger.put(ledger.Record{Provider: protocol.ProviderOpenSandbox, Node: "node-f", ID: "f1", State: ledger.StateLive})
	code, _, body = e.do(t, "GET", "/v1/sandboxes", nil, "")
	wantError(t, "list with a live sandbox on node-f", code, body, http.StatusBadGateway, opensandbox.CodeNodeUnavailable, "node node-f")
}

// TestCreateHeaderValidation: a Tether-Run that is no run id is refused
// before anything is forwarded.
func TestCreateHeaderValidation(t *testing.T) {
	e := newFacadeEnv(t, nil)
	srv := e.startNode(t, "n1", nil, opensandboxtest.Config{})
	for _, run := range []string{"bad run!", strings.Repeat("r", 300), "-x"} {
		code, _, body := e.do(t, "POST", "/v1/sandboxes", map[string]string{opensandbox.HeaderRun: run}, createBody(nil))
		wantError(t, "run "+run, code, body, http.StatusBadRequest, opensandbox.CodeInvalidRun, "Tether-Run", "run id")
	}
	if n := requestsTo(srv, "POST", "/v1/sandboxes"); n != 0 {
		t.Fatalf("%d creates reached the node", n)
	}
	id := e.create(t, map[string]string{opensandbox.HeaderRun: "run-1.a_b"}, nil)
	if r, ok := e.ledger.record("n1", id); !ok || r.Owner != "run-1.a_b" {
		t.Fatalf("record %+v, %v", r, ok)
	}
}

// TestListMissingHolderMessage: a node that holds live sandboxes and is
// not connected is named in a sentence that reads.
func TestListMissingHolderMessage(t *testing.T) {
	e := newFacadeEnv(t, nil)
	e.startNode(t, "n1", nil, opensandboxtest.Config{})
	e.ledger.put(ledger.Record{Provider: protocol.ProviderOpenSandbox, Node: "node-b", ID: "b1", State: ledger.StateLive})
	code, _, body := e.do(t, "GET", "/v1/sandboxes", nil, "")
	wantError(t, "list", code, body, http.StatusServiceUnavailable, opensandbox.CodeNodeUnavailable,
		"node node-b holds live sandboxes but is not connected; the list would be incomplete")
}

package opensandbox_test

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tetherfleet/tether/coordinator/facade/opensandbox"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/protocol"
	osb "github.com/tetherfleet/tether/protocol/opensandbox"
	"github.com/tetherfleet/tether/protocol/opensandbox/opensandboxtest"
)

// Placement: the Tether-Node header, the selector header, the least
// loaded node (ledger live count, ties to the smallest id).
func TestPlacement(t *testing.T) {
	e := newFacadeEnv(t, nil)
	a := e.startNode(t, "n1", map[string]string{"gpu": "a100"}, opensandboxtest.Config{})
	b := e.startNode(t, "n2", map[string]string{"gpu": "h100"}, opensandboxtest.Config{})
	on := func(s *opensandboxtest.Server, id string) bool { _, ok := s.Sandbox(id); return ok }

	id := e.create(t, nil, nil) // tie (0, 0) → n1
	if !on(a, id) {
		t.Errorf("first create not on n1")
	}
	id = e.create(t, nil, nil) // n1 has 1 live → n2
	if !on(b, id) {
		t.Errorf("second create not on the least loaded n2")
	}
	id = e.create(t, map[string]string{opensandbox.HeaderNode: "n2"}, nil)
	if !on(b, id) {
		t.Errorf("Tether-Node n2 not honoured")
	}
	id = e.create(t, map[string]string{opensandbox.HeaderNodeSelector: "gpu in (h100, a100)"}, nil) // n1: 1, n2: 2
	if !on(a, id) {
		t.Errorf("selector create not on the least loaded match n1")
	}
	id = e.create(t, map[string]string{opensandbox.HeaderNodeSelector: "gpu=h100"}, nil)
	if !on(b, id) {
		t.Errorf("selector gpu=h100 not on n2")
	}
}

// Requests for an id go to the node the ledger names, at the root and
// under /v1, and nowhere else.
func TestRoutingByID(t *testing.T) {
	e := newFacadeEnv(t, nil)
	a := e.startNode(t, "n1", nil, opensandboxtest.Config{})
	b := e.startNode(t, "n2", nil, opensandboxtest.Config{})
	ida := e.create(t, map[string]string{opensandbox.HeaderNode: "n1"}, nil)
	idb := e.create(t, map[string]string{opensandbox.HeaderNode: "n2"}, nil)

	for _, tt := range []struct {
		path string
		want int
	}{
		{"/v1/sandboxes/" + idb, 200},
		{"/sandboxes/" + idb, 200},
		{"/v1/sandboxes/" + idb + "/endpoints/44772", 200},
		{"/sandboxes/" + idb + "/proxy/44772/ping", 200},
	} {
		if code, _, body := e.do(t, "GET", tt.path, nil, ""); code != tt.want {
			t.Errorf("GET %s: %d %s", tt.path, code, body)
		}
	}
	for _, r := range a.Requests() {
		if strings.Contains(r.Path, idb) {
			t.Errorf("node n1 got %s %s", r.Method, r.Path)
		}
	}
	if n := requestsTo(b, "GET", "/sandboxes/"+idb); n != 1 {
		t.Errorf("node n2 got GET /sandboxes/%s %d times, want 1 (paths pass verbatim)", idb, n)
	}
	code, _, body := e.do(t, "POST", "/v1/sandboxes/"+ida+"/pause", nil, "")
	if code != http.StatusAccepted {
		t.Errorf("pause: %d %s", code, body)
	}
	if n := requestsTo(a, "POST", "/v1/sandboxes/"+ida+"/pause"); n != 1 {
		t.Errorf("pause reached n1 %d times", n)
	}
}

// Ids the ledger does not know are looked up on every node: found once,
// remembered, never written to the ledger (not even NeMo Gym's: the
// inventory does that); several owners is a 409.
func TestLookupUnknownID(t *testing.T) {
	e := newFacadeEnv(t, nil)
	var ghostID atomic.Value // string: an id node n1 claims too
	ghostID.Store("")
	a := e.startNode(t, "n1", nil, opensandboxtest.Config{
		Intercept: func(w http.ResponseWriter, r *http.Request) bool {
			if ghost := ghostID.Load().(string); ghost != "" && r.URL.Path == "/v1/sandboxes/"+ghost {
				w.Header().Set("Content-Type", "application/json")
				w.Write([]byte(`{"id":"` + ghost + `","status":{"state":"Running"},"entrypoint":["x"],"createdAt":"2026-01-01T00:00:00Z"}`))
				return true
			}
			return false
		},
	})
	b := e.startNode(t, "n2", nil, opensandboxtest.Config{})

	plain := createDirect(t, b, map[string]string{"nemo-gym.nvidia.com/run": "run-7"})
	for range 3 {
		if code, _, body := e.do(t, "GET", "/v1/sandboxes/"+plain+"/endpoints/44772", nil, ""); code != 200 {
			t.Fatalf("get unknown id: %d %s", code, body)
		}
	}
	if n := requestsTo(a, "GET", "/v1/sandboxes/"+plain); n != 1 {
		t.Errorf("node n1 asked %d times for %s, want 1 (the answer is remembered)", n, plain)
	}
	if calls := e.ledger.callLog(); len(calls) != 0 {
		t.Errorf("a looked-up sandbox was written to the ledger: %v", calls)
	}
	if code, _, _ := e.do(t, "DELETE", "/v1/sandboxes/"+plain, nil, ""); code != http.StatusNoContent {
		t.Errorf("delete found sandbox: %d", code)
	}

	ghost := createDirect(t, b, nil)
	ghostID.Store(ghost)
	code, _, body := e.do(t, "GET", "/v1/sandboxes/"+ghost, nil, "")
	if c, msg := decodeError(t, body); code != http.StatusConflict || c != opensandbox.CodeAmbiguousSandbox || !strings.Contains(msg, "n1, n2") {
		t.Errorf("id on two nodes: %d %s", code, body)
	}
}

func TestLookupPassesAuthErrors(t *testing.T) {
	e := newFacadeEnv(t, nil)
	e.startNode(t, "n1", nil, opensandboxtest.Config{APIKey: "k"})
	code, hdr, body := e.do(t, "GET", "/v1/sandboxes/sb-1", nil, "")
	if c, _ := decodeError(t, body); code != http.StatusUnauthorized || c != osb.CodeMissingAPIKey || hdr.Get("Content-Type") != "application/json" {
		t.Errorf("lookup without key: %d %s", code, body)
	}
	code, _, body = e.do(t, "GET", "/v1/sandboxes/sb-1", map[string]string{osb.HeaderAPIKey: "k"}, "")
	if code != http.StatusNotFound || !strings.Contains(body, "Sandbox 'sb-1' not found") {
		t.Errorf("lookup with key: %d %s", code, body)
	}
}

// A deleted record does not route: the id is looked up again. A lost one
// does: while its node is away the answer is 503, not a 404.
func TestDeletedAndLostRecords(t *testing.T) {
	e := newFacadeEnv(t, nil)
	b := e.startNode(t, "n2", nil, opensandboxtest.Config{})
	id := createDirect(t, b, nil)
	e.ledger.put(ledger.Record{Provider: protocol.ProviderOpenSandbox, Node: "gone", ID: id, State: ledger.StateDeleted})
	if code, _, body := e.do(t, "GET", "/v1/sandboxes/"+id, nil, ""); code != 200 {
		t.Errorf("get: %d %s", code, body)
	}
	e.ledger.put(ledger.Record{Provider: protocol.ProviderOpenSandbox, Node: "gone", ID: "sb-lost", State: ledger.StateLost})
	code, _, body := e.do(t, "DELETE", "/v1/sandboxes/sb-lost", nil, "")
	if c, _ := decodeError(t, body); code != http.StatusServiceUnavailable || c != opensandbox.CodeNodeUnavailable {
		t.Errorf("delete of a lost sandbox on an absent node: %d %s", code, body)
	}
}

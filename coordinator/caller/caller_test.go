package caller

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/policy"
)

type fakeRequest struct{ micro.Request }

const testPolicy = `version: 1
identities:
  nats:alice:
    rules:
      - nodes: "env=dev"
        operations: [exec]
        run_as: alice
    limits:
      requests_per_second: 1
      burst: 1
`

func testStore(t *testing.T) *policy.Store {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(testPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := policy.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	s, err := policy.NewStore(path, m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestAuthorizer(t *testing.T) {
	a := Authorizer{Policy: testStore(t)}
	alice := &Request{Request: fakeRequest{}, Identity: policy.Identity{Kind: policy.KindNATS, Name: "alice"}}
	bob := &Request{Request: fakeRequest{}, Identity: policy.Identity{Kind: policy.KindNATS, Name: "bob"}}
	dev := policy.Node{ID: "n1", Labels: map[string]string{"env": "dev"}}
	prod := policy.Node{ID: "n2", Labels: map[string]string{"env": "prod"}}

	if id, ok := Of(alice); !ok || id.Name != "alice" {
		t.Fatalf("Of(alice) = %v, %v", id, ok)
	}
	if _, ok := Of(fakeRequest{}); ok {
		t.Fatal("Of(a request the guard did not identify) = true")
	}
	g, e := a.Decide(alice, policy.OpExec, dev, policy.Object{})
	if e != nil || g.RunAs != "alice" {
		t.Fatalf("alice exec on dev: grant %+v, err %v", g, e)
	}
	for _, c := range []struct {
		name   string
		req    micro.Request
		node   policy.Node
		status int
		code   string
	}{
		{"unidentified", fakeRequest{}, dev, 401, "unauthenticated"},
		{"other node", alice, prod, 403, "forbidden"},
		{"unknown identity", bob, dev, 403, "forbidden"},
		{"no node", alice, policy.Node{}, 400, "invalid_request"},
	} {
		_, e := a.Decide(c.req, policy.OpExec, c.node, policy.Object{})
		if e == nil || e.Status != c.status || e.Code != c.code {
			t.Errorf("%s: got %v, want %d %s", c.name, e, c.status, c.code)
		}
	}
	_, e = a.Decide(alice, policy.OpExec, prod, policy.Object{})
	if !strings.Contains(e.Message, "nats:alice") || !strings.Contains(e.Message, "exec") {
		t.Errorf("refusal %q does not name the identity and the operation", e.Message)
	}
	if e := a.Allow(alice, policy.OpExec); e != nil {
		t.Fatalf("first request: %v", e)
	}
	if e := a.Allow(alice, policy.OpExec); e == nil || e.Status != 429 || e.Code != "rate_limited" {
		t.Fatalf("request over the burst: got %v, want 429 rate_limited", e)
	}
	if g, e := (Authorizer{}).Decide(fakeRequest{}, policy.OpAdmin, policy.Node{}, policy.Object{}); e != nil || g.RunAs != "" {
		t.Fatalf("zero Authorizer: %+v, %v", g, e)
	}
}

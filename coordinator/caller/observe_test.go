package caller_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/policy"
)

// fakeRequest is a micro.Request nobody answers; Decide only passes it on.
type fakeRequest struct{ micro.Request }

func TestAuthorizerObservesEveryDecision(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(path, []byte("version: 1\nidentities:\n  nats:alice:\n    rules:\n      - operations: [admin]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	store, err := policy.NewStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	var seen []caller.Decision
	a := caller.Authorizer{Policy: store, Observe: func(d caller.Decision) { seen = append(seen, d) }}
	alice := &caller.Request{Request: fakeRequest{}, Identity: policy.Identity{Kind: policy.KindNATS, Name: "alice"}}
	bob := &caller.Request{Request: fakeRequest{}, Identity: policy.Identity{Kind: policy.KindNATS, Name: "bob"}}

	if _, e := a.Decide(alice, policy.OpAdmin, policy.Node{}, policy.Object{}); e != nil {
		t.Fatal(e)
	}
	if _, e := a.Decide(alice, policy.OpAdmin, policy.Node{}, policy.Object{}); e != nil {
		t.Fatal(e)
	}
	if _, e := a.Decide(bob, policy.OpAdmin, policy.Node{}, policy.Object{}); e == nil || e.Status != 403 {
		t.Fatalf("bob: %v", e)
	}
	if _, e := a.Decide(fakeRequest{}, policy.OpAdmin, policy.Node{}, policy.Object{}); e == nil || e.Status != 401 {
		t.Fatalf("unidentified: %v", e)
	}
	if len(seen) != 4 {
		t.Fatalf("observed %d decisions, want 4", len(seen))
	}
	if d := seen[0]; d.Err != nil || !d.Identified || d.Grant.Rule() == "" || d.Request != alice {
		t.Errorf("grant: %+v", d)
	}
	if d := seen[2]; d.Err == nil || d.Refusal == nil || d.Refusal.Reason != policy.ReasonNoIdentity || d.Identity.Name != "bob" {
		t.Errorf("refusal: %+v", d)
	}
	if d := seen[3]; d.Err == nil || d.Identified || d.Refusal != nil {
		t.Errorf("unidentified: %+v", d)
	}
	// The rule that allowed alice is kept once, for the audit event.
	if r := caller.Rules(alice); len(r) != 1 || !strings.Contains(r[0], "p.yaml") {
		t.Errorf("Rules(alice) = %q", r)
	}
	if r := caller.Rules(bob); r != nil {
		t.Errorf("Rules(bob) = %q, want none", r)
	}
}

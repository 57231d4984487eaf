package caller

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/policy"
)

const authorizePolicy = `version: 1
identities:
  nats:alice:
    rules:
      - nodes: "env=dev"
        operations: [exec, nodes.list]
        run_as: alice
      - operations: [sandboxes.list]
    limits:
      max_concurrent_jobs: 1
  nats:ops:
    rules:
      - operations: [sandboxes.list]
        scope: any
`

func authorizeStore(t *testing.T) *policy.Store {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(authorizePolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := policy.NewStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func as(name string) *Request {
	return &Request{Request: fakeRequest{}, Identity: policy.Identity{Kind: policy.KindNATS, Name: name}}
}

// TestAuthorize: every node must be allowed; a refusal names the first
// refused node's rule and every other refused node; grants come per node.
func TestAuthorize(t *testing.T) {
	var seen []Decision
	a := Authorizer{Policy: authorizeStore(t), Observe: func(d Decision) { seen = append(seen, d) }}
	dev := func(id string) policy.Node { return policy.Node{ID: id, Labels: map[string]string{"env": "dev"}} }
	prod := func(id string) policy.Node { return policy.Node{ID: id, Labels: map[string]string{"env": "prod"}} }

	g, e := a.Authorize(as("alice"), policy.OpExec, []policy.Node{dev("a"), dev("b")}, policy.Object{})
	if e != nil || len(g) != 2 || g[1].RunAs != "alice" {
		t.Fatalf("all dev: %v %v", g, e)
	}
	_, e = a.Authorize(as("alice"), policy.OpExec, []policy.Node{dev("a"), prod("p1"), dev("b"), prod("p2")}, policy.Object{})
	if e == nil || e.Status != 403 || !strings.Contains(e.Message, "nats:alice may not exec on p1") ||
		!strings.Contains(e.Message, "refused on 2 of 4 nodes: also on p2") {
		t.Fatalf("mixed: %v", e)
	}
	if len(seen) == 0 || seen[len(seen)-1].Op != policy.OpExec {
		t.Errorf("Observe saw %v", seen)
	}
	if _, e := a.Authorize(fakeRequest{}, policy.OpExec, []policy.Node{dev("a")}, policy.Object{}); e == nil || e.Status != 401 {
		t.Errorf("no identity: %v", e)
	}
	if g, e := (Authorizer{}).Authorize(fakeRequest{}, policy.OpExec, []policy.Node{dev("a")}, policy.Object{}); e != nil || len(g) != 1 {
		t.Errorf("no policy: %v %v", g, e)
	}
}

// TestFilterScopeAcquire: a listing leaves out what the caller may not
// see; Scope tells own from any; Acquire bounds running jobs.
func TestFilterScopeAcquire(t *testing.T) {
	a := Authorizer{Policy: authorizeStore(t)}
	nodes := []policy.Node{{ID: "a", Labels: map[string]string{"env": "dev"}}, {ID: "p", Labels: map[string]string{"env": "prod"}}}
	idx, e := a.Filter(as("alice"), policy.OpNodesList, nodes, policy.Object{})
	if e != nil || len(idx) != 1 || idx[0] != 0 {
		t.Fatalf("alice sees %v (%v), want node a only", idx, e)
	}
	if _, e := a.Filter(as("mallory"), policy.OpNodesList, nodes, policy.Object{}); e == nil || e.Status != 403 || !strings.Contains(e.Message, "no entry") {
		t.Fatalf("mallory: %v, want 403 no entry", e)
	}
	if idx, e := a.Filter(as("ops"), policy.OpNodesList, nodes, policy.Object{}); e != nil || len(idx) != 0 {
		t.Fatalf("ops (no nodes.list) sees %v, %v; want none", idx, e)
	}

	for _, tt := range []struct {
		who      string
		any, err bool
	}{{"alice", false, false}, {"ops", true, false}, {"mallory", false, true}} {
		any, e := a.Scope(as(tt.who), policy.OpSandboxesList, policy.Node{})
		if any != tt.any || (e != nil) != tt.err {
			t.Errorf("Scope(%s) = %v, %v", tt.who, any, e)
		}
	}

	release, e := a.Acquire(as("alice"), policy.OpExec)
	if e != nil {
		t.Fatal(e)
	}
	if _, e := a.Acquire(as("alice"), policy.OpExec); e == nil || e.Status != 429 || !strings.Contains(e.Message, "max_concurrent_jobs is 1") {
		t.Fatalf("second job: %v", e)
	}
	release()
	release2, e := a.Acquire(as("alice"), policy.OpExec)
	if e != nil {
		t.Fatalf("after release: %v", e)
	}
	release2()
}

// TestDecideAs: a facade caller is decided by its identity; none is
// ErrUnidentified once a policy is in force.
func TestDecideAs(t *testing.T) {
	a := Authorizer{Policy: authorizeStore(t)}
	alice := policy.Identity{Kind: policy.KindNATS, Name: "alice"}
	if _, err := a.DecideAs(alice, true, "", policy.OpSandboxesList, policy.Node{}, policy.Object{Owner: "nats:alice"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.DecideAs(alice, true, "", policy.OpSandboxesList, policy.Node{}, policy.Object{Owner: "nats:bob"}); !errors.Is(err, policy.ErrRefused) {
		t.Fatalf("another's: %v", err)
	}
	if _, err := a.DecideAs(policy.Identity{}, false, "", policy.OpSandboxesList, policy.Node{}, policy.Object{}); !errors.Is(err, ErrUnidentified) {
		t.Fatalf("unidentified: %v", err)
	}
	if _, err := (Authorizer{}).DecideAs(policy.Identity{}, false, "", policy.OpExec, policy.Node{}, policy.Object{}); err != nil {
		t.Fatalf("no policy: %v", err)
	}
}

// TestDecideAsSource: Observe sees the source DecideAs was given (the
// facade call's TCP peer), refused with or without an identity, for the
// audit event of the refusal.
func TestDecideAsSource(t *testing.T) {
	var seen []Decision
	a := Authorizer{Policy: authorizeStore(t), Observe: func(d Decision) { seen = append(seen, d) }}
	alice := policy.Identity{Kind: policy.KindNATS, Name: "alice"}
	a.DecideAs(alice, true, "127.0.0.7:4001", policy.OpSandboxesList, policy.Node{}, policy.Object{Owner: "nats:bob"})
	a.DecideAs(policy.Identity{}, false, "[::1]:4002", policy.OpSandboxesList, policy.Node{}, policy.Object{})
	if len(seen) != 2 || seen[0].Err == nil || seen[0].Source != "127.0.0.7:4001" || seen[1].Err == nil || seen[1].Source != "[::1]:4002" {
		t.Fatalf("decisions seen: %+v", seen)
	}
}

// BenchmarkAuthorize is what authorization adds to one exec request on one
// node: Allow, then Decide (a rule with a selector).
func BenchmarkAuthorize(b *testing.B) {
	path := filepath.Join(b.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(`version: 1
identities:
  nats:alice:
    rules:
      - nodes: "env=dev"
        operations: [exec]
        run_as: alice
    limits:
      requests_per_second: 1000000
      burst: 1000000
`), 0o600); err != nil {
		b.Fatal(err)
	}
	s, err := policy.NewStore(path, nil)
	if err != nil {
		b.Fatal(err)
	}
	a := Authorizer{Policy: s}
	req := as("alice")
	nodes := []policy.Node{{ID: "n1", Labels: map[string]string{"env": "dev", "zone": "a"}}}
	b.ReportAllocs()
	for b.Loop() {
		if _, e := a.Authorize(req, policy.OpExec, nodes, policy.Object{}); e != nil {
			b.Fatal(e)
		}
	}
}

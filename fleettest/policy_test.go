package fleettest_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// The identity of a request travels here in a header only testIdentify
// reads (the tests' Config.Identify); production identifies callers by
// what the NATS server stamped.
const testIdentityHeader = "Test-Identity"

func testIdentify(h nats.Header) (policy.Identity, error) {
	v := h.Get(testIdentityHeader)
	if v == "" {
		return policy.Identity{}, errors.New("no test identity")
	}
	return policy.Identity{Kind: policy.KindNATS, Name: v}, nil
}

// policyFleet is a sandbox fleet whose coordinator decides by the policy
// yaml, identifying callers with testIdentify.
func policyFleet(t *testing.T, yaml string) *fleettest.Fleet {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	store, err := policy.NewStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return fleettest.Start(t, fleettest.Options{Agents: 2, Gateways: &fleettest.GatewayOptions{}, Coordinator: func(c *coordinator.Config) {
		c.Identify = testIdentify
		c.Policy = store
	}})
}

// as sends a request as who and returns the reply's API error (nil for a
// success) and body.
func as(t *testing.T, nc *nats.Conn, who, subject string, body any) (*protocol.APIError, []byte) {
	t.Helper()
	data, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	m := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
	m.Header.Set(testIdentityHeader, who)
	reply, err := nc.RequestMsg(m, 10*time.Second)
	if err != nil {
		t.Fatalf("%s as %s: %v", subject, who, err)
	}
	if reply.Header.Get(micro.ErrorCodeHeader) == "" {
		return nil, reply.Data
	}
	var e protocol.APIError
	if err := json.Unmarshal(reply.Data, &e); err != nil {
		t.Fatal(err)
	}
	return &e, reply.Data
}

func wantForbidden(t *testing.T, what string, e *protocol.APIError, parts ...string) {
	t.Helper()
	if e == nil || e.Status != 403 || e.Code != protocol.ErrCodeForbidden {
		t.Fatalf("%s: %+v, want 403 forbidden", what, e)
	}
	for _, p := range parts {
		if !strings.Contains(e.Message, p) {
			t.Errorf("%s: message %q does not name %q", what, e.Message, p)
		}
	}
}

const runPolicy = `version: 1
roles:
  runner:
    - operations: [sandboxes.list, sandboxes.lease, sandboxes.reap]
    - nodes: "*"
      operations: [sandboxes.register]
identities:
  nats:alice:
    roles: [runner]
  nats:bob:
    roles: [runner]
  nats:ops:
    rules:
      - operations: [sandboxes.list]
        scope: any
`

// TestPolicyRunBelongsToItsOpener is the attack: a second client
// closing a live run's lease deleted its sandboxes within 3 s. Now the run
// belongs to the identity that opened its lease: another identity may not
// close, renew, reopen or reap it, nor register its sandboxes under its own
// run, and sees none of them in a listing; the owner still can, and one
// with scope any sees everyone's.
func TestPolicyRunBelongsToItsOpener(t *testing.T) {
	f := policyFleet(t, runPolicy)
	if e, _ := as(t, f.NC, "alice", protocol.SubjectLeaseOpen, protocol.LeaseOpenRequest{Run: "run-a", TTLMS: 60_000, Holder: "alice"}); e != nil {
		t.Fatalf("alice opens run-a: %v", e)
	}
	cc := openShellClient(t, f)
	sb := createOpenShell(t, cc, "node-0", "ng-a", "run-a")
	id := sb.GetMetadata().GetId()
	if e, _ := as(t, f.NC, "alice", protocol.SubjectSandboxesRegister, protocol.SandboxRegisterRequest{
		Provider: protocol.ProviderOpenShell, Node: "node-1", ID: "reg-a", Name: "reg-a", Run: "run-a"}); e != nil {
		t.Fatalf("alice registers under her run: %v", e)
	}

	run := protocol.LeaseRequest{Run: "run-a"}
	e, _ := as(t, f.NC, "bob", protocol.SubjectLeaseClose, run)
	wantForbidden(t, "bob closes run-a", e, "nats:bob", "sandboxes.lease", "another identity's run")
	e, _ = as(t, f.NC, "bob", protocol.SubjectLeaseRenew, run)
	wantForbidden(t, "bob renews run-a", e, "nats:bob", "sandboxes.lease")
	e, _ = as(t, f.NC, "bob", protocol.SubjectLeaseOpen, protocol.LeaseOpenRequest{Run: "run-a", Holder: "alice"})
	wantForbidden(t, "bob reopens run-a as its holder", e, "nats:bob", "sandboxes.lease")
	e, _ = as(t, f.NC, "bob", protocol.SubjectSandboxesReap, protocol.ReapRequest{Run: "run-a"})
	wantForbidden(t, "bob reaps run-a", e, "nats:bob", "sandboxes.reap")
	e, _ = as(t, f.NC, "bob", protocol.SubjectSandboxesReap, protocol.ReapRequest{DryRun: true})
	wantForbidden(t, "bob previews everyone's reap", e, "nats:bob", "sandboxes.reap")
	if e, _ := as(t, f.NC, "bob", protocol.SubjectLeaseOpen, protocol.LeaseOpenRequest{Run: "run-b", TTLMS: 60_000}); e != nil {
		t.Fatalf("bob opens his own run: %v", e)
	}
	e, _ = as(t, f.NC, "bob", protocol.SubjectSandboxesRegister, protocol.SandboxRegisterRequest{
		Provider: protocol.ProviderOpenShell, Node: "node-0", ID: id, Name: "ng-a", Run: "run-b"})
	wantForbidden(t, "bob re-registers alice's sandbox under his run", e, "nats:bob", "sandboxes.register", "another identity's run")
	e, _ = as(t, f.NC, "bob", protocol.SubjectSandboxesRegister, protocol.SandboxRegisterRequest{
		Provider: protocol.ProviderOpenShell, Node: "node-1", ID: "reg-b", Name: "reg-b", Run: "run-a"})
	wantForbidden(t, "bob registers under alice's run", e, "nats:bob", "sandboxes.register")

	lease, ok := f.Sandboxes.Ledger().LeaseOf("run-a")
	if !ok || lease.Closed || lease.OwnedBy != "nats:alice" {
		t.Fatalf("run-a's lease after bob's attempts: %+v, want open and alice's", lease)
	}
	if rec, ok := f.Sandboxes.Ledger().ByID(protocol.ProviderOpenShell, id); !ok || rec.State != ledger.StateLive || rec.OwnerLease() != "run-a" {
		t.Fatalf("alice's sandbox after bob's attempts: %+v", rec)
	}

	listed := func(who string) []string {
		t.Helper()
		e, body := as(t, f.NC, who, protocol.SubjectSandboxesList, protocol.SandboxesListRequest{State: string(ledger.StateLive)})
		if e != nil {
			t.Fatalf("%s lists: %v", who, e)
		}
		var resp protocol.SandboxesListResponse
		if err := json.Unmarshal(body, &resp); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, s := range resp.Sandboxes {
			ids = append(ids, s.ID)
		}
		return ids
	}
	if got := listed("bob"); len(got) != 0 {
		t.Errorf("bob lists %v, want none of alice's", got)
	}
	if got := listed("alice"); len(got) != 2 {
		t.Errorf("alice lists %v, want her 2", got)
	}
	if got := listed("ops"); len(got) != 2 {
		t.Errorf("ops (scope any) lists %v, want all 2", got)
	}
	e, _ = as(t, f.NC, "mallory", protocol.SubjectSandboxesList, protocol.SandboxesListRequest{})
	wantForbidden(t, "mallory lists", e, "nats:mallory", "no entry")

	if e, _ := as(t, f.NC, "alice", protocol.SubjectLeaseClose, run); e != nil {
		t.Fatalf("alice closes her run: %v", e)
	}
	eventually(t, 20*time.Second, "alice's closed run reaped", func() bool {
		a, _ := onGateways(t, f, "node-0")
		return a == 0
	})
}

// TestPolicySandboxesSyncIsAdmin: a sync makes every node list its
// gateways; only admin may ask.
func TestPolicySandboxesSyncIsAdmin(t *testing.T) {
	f := policyFleet(t, runPolicy+`  nats:root:
    rules:
      - operations: [admin]
`)
	e, _ := as(t, f.NC, "alice", protocol.SubjectSandboxesSync, struct{}{})
	wantForbidden(t, "alice syncs", e, "nats:alice", "admin")
	if e, _ := as(t, f.NC, "root", protocol.SubjectSandboxesSync, struct{}{}); e != nil {
		t.Fatalf("admin syncs: %v", e)
	}
}

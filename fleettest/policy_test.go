package fleettest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/coordinator/sandboxes"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/natsauth/natsauthtest"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/protocol/opensandbox"
	"github.com/tetherfleet/tether/protocol/openshell"
)

// policyFleet is a sandbox fleet whose coordinator decides by the policy
// yaml; callers are real NATS client users (as).
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
	// The loopback facades' callers are alice (as tether dev makes them
	// the dev user).
	local := func(c *sandboxes.Config) {
		c.Local = func(uint32) policy.Identity { return policy.Identity{Kind: policy.KindNATS, Name: "alice"} }
	}
	return fleettest.Start(t, fleettest.Options{Agents: 2, Gateways: &fleettest.GatewayOptions{Sandboxes: local}, Coordinator: func(c *coordinator.Config) {
		c.Policy = store
	}})
}

// conns are the client users' connections a test made, by fleet and name.
var conns sync.Map

// as sends a request as the NATS client user who (identity nats:WHO) and
// returns the reply's API error (nil for a success) and body.
func as(t *testing.T, f *fleettest.Fleet, who, subject string, body any) (*protocol.APIError, []byte) {
	t.Helper()
	key := fmt.Sprintf("%p/%s", f, who)
	c, ok := conns.Load(key)
	if !ok {
		c = natsauthtest.Connect(t, f.NATS.ClientURL(), natsauthtest.ClientCreds(t, f.Layout, who))
		conns.Store(key, c)
		t.Cleanup(func() { conns.Delete(key) })
	}
	data, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	reply, err := c.(*nats.Conn).Request(subject, data, 10*time.Second)
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
    - nodes: "*"
      operations: [forward]
      targets: [openshell]
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
	if e, _ := as(t, f, "alice", protocol.SubjectLeaseOpen, protocol.LeaseOpenRequest{Run: "run-a", TTLMS: 60_000, Holder: "alice"}); e != nil {
		t.Fatalf("alice opens run-a: %v", e)
	}
	cc := openShellClient(t, f)
	sb := createOpenShell(t, cc, "node-0", "ng-a", "run-a")
	id := sb.GetMetadata().GetId()
	if e, _ := as(t, f, "alice", protocol.SubjectSandboxesRegister, protocol.SandboxRegisterRequest{
		Provider: protocol.ProviderOpenShell, Node: "node-1", ID: "reg-a", Name: "reg-a", Run: "run-a"}); e != nil {
		t.Fatalf("alice registers under her run: %v", e)
	}

	run := protocol.LeaseRequest{Run: "run-a"}
	e, _ := as(t, f, "bob", protocol.SubjectLeaseClose, run)
	wantForbidden(t, "bob closes run-a", e, "nats:bob", "sandboxes.lease", "another identity's run")
	e, _ = as(t, f, "bob", protocol.SubjectLeaseRenew, run)
	wantForbidden(t, "bob renews run-a", e, "nats:bob", "sandboxes.lease")
	e, _ = as(t, f, "bob", protocol.SubjectLeaseOpen, protocol.LeaseOpenRequest{Run: "run-a", Holder: "alice"})
	wantForbidden(t, "bob reopens run-a as its holder", e, "nats:bob", "sandboxes.lease")
	e, _ = as(t, f, "bob", protocol.SubjectSandboxesReap, protocol.ReapRequest{Run: "run-a"})
	wantForbidden(t, "bob reaps run-a", e, "nats:bob", "sandboxes.reap")
	e, _ = as(t, f, "bob", protocol.SubjectSandboxesReap, protocol.ReapRequest{DryRun: true})
	wantForbidden(t, "bob previews everyone's reap", e, "nats:bob", "sandboxes.reap")
	if e, _ := as(t, f, "bob", protocol.SubjectLeaseOpen, protocol.LeaseOpenRequest{Run: "run-b", TTLMS: 60_000}); e != nil {
		t.Fatalf("bob opens his own run: %v", e)
	}
	e, _ = as(t, f, "bob", protocol.SubjectSandboxesRegister, protocol.SandboxRegisterRequest{
		Provider: protocol.ProviderOpenShell, Node: "node-0", ID: id, Name: "ng-a", Run: "run-b"})
	wantForbidden(t, "bob re-registers alice's sandbox under his run", e, "nats:bob", "sandboxes.register", "another identity's run")
	e, _ = as(t, f, "bob", protocol.SubjectSandboxesRegister, protocol.SandboxRegisterRequest{
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
		// Every state: an inventory of node-1 may find reg-a (registered
		// only, not on its gateway) and move it out of live meanwhile.
		e, body := as(t, f, who, protocol.SubjectSandboxesList, protocol.SandboxesListRequest{})
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
	e, _ = as(t, f, "mallory", protocol.SubjectSandboxesList, protocol.SandboxesListRequest{})
	wantForbidden(t, "mallory lists", e, "nats:mallory", "no entry")

	if e, _ := as(t, f, "alice", protocol.SubjectLeaseClose, run); e != nil {
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
	e, _ := as(t, f, "alice", protocol.SubjectSandboxesSync, struct{}{})
	wantForbidden(t, "alice syncs", e, "nats:alice", "admin")
	if e, _ := as(t, f, "root", protocol.SubjectSandboxesSync, struct{}{}); e != nil {
		t.Fatalf("admin syncs: %v", e)
	}
}

// facadePolicy: four facade tokens; alice and bob own their runs, ops
// sees and deletes everyone's, n0 reaches node-0 only.
const facadePolicy = `version: 1
roles:
  user:
    - nodes: "*"
      operations: [forward]
      targets: [openshell, opensandbox]
    - operations: [sandboxes.list, sandboxes.lease, sandboxes.reap]
identities:
  token:alice:
    roles: [user]
  token:bob:
    roles: [user]
  token:ops:
    rules:
      - nodes: "*"
        operations: [forward]
        targets: [openshell, opensandbox]
      - operations: [sandboxes.list, sandboxes.reap]
        scope: any
  token:n0:
    rules:
      - nodes: "index=0"
        operations: [forward]
        targets: [openshell, opensandbox]
      - operations: [sandboxes.list]
  token:nowhere:
    rules:
      - nodes: "index=9"
        operations: [forward]
        targets: [openshell, opensandbox]
      - operations: [sandboxes.list, sandboxes.reap]
        scope: any
`

// facadeTokens is each holder's token, as a named token file gives them.
var facadeTokens = map[string]string{
	"alice": "alice-0123456789abcdef", "bob": "bob-0123456789abcdef",
	"ops": "ops-0123456789abcdef", "n0": "n0-0123456789abcdef",
	"nowhere": "nowhere-0123456789abcdef",
}

func facadeFleet(t *testing.T) *fleettest.Fleet {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(facadePolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	store, err := policy.NewStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{}
	for name, tok := range facadeTokens {
		names[tok] = name
	}
	return fleettest.Start(t, fleettest.Options{Agents: 2,
		Coordinator: func(c *coordinator.Config) { c.Policy = store },
		Gateways: &fleettest.GatewayOptions{Sandboxes: func(c *sandboxes.Config) {
			c.CheckToken = func(tok string) bool { _, ok := names[tok]; return ok }
			c.TokenName = func(tok string) string { return names[tok] }
		}},
	})
}

// oshCall invokes an OpenShell method through the facade as who.
func oshCall(t *testing.T, cc *grpc.ClientConn, who, method string, req, resp any, md ...string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, append([]string{"tether-token", facadeTokens[who]}, md...)...)
	return cc.Invoke(ctx, method, req, resp)
}

func wantDenied(t *testing.T, what string, err error, parts ...string) {
	t.Helper()
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("%s: %v, want PERMISSION_DENIED", what, err)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("%s: %q does not name %q", what, err.Error(), p)
		}
	}
}

// TestPolicyOpenShellFacade: a facade caller (named by its token) reaches,
// lists and deletes only its own runs' sandboxes unless policy says any,
// may not add sandboxes to another's run, and reaches only the nodes its
// forward rule matches.
func TestPolicyOpenShellFacade(t *testing.T) {
	f := facadeFleet(t)
	cc := openShellClient(t, f)
	create := func(who, name, node string, md ...string) (*openshell.SandboxResponse, error) {
		req := &openshell.CreateSandboxRequest{Name: name, Spec: &openshell.SandboxSpec{Environment: map[string]string{}},
			Labels: map[string]string{"nemo-gym.sandbox": "1"}}
		if node != "" {
			req.Labels["tether.node"] = node
		}
		var resp openshell.SandboxResponse
		return &resp, oshCall(t, cc, who, openshell.MethodCreateSandbox, req, &resp, md...)
	}
	if _, err := create("alice", "ng-alice", "node-0", "tether-run", "run-alice"); err != nil {
		t.Fatalf("alice creates: %v", err)
	}
	rec, ok := f.Sandboxes.Ledger().ByName(protocol.ProviderOpenShell, "default", "ng-alice")
	if !ok || rec.CreatedBy != "token:alice" {
		t.Fatalf("alice's record: %+v, want created by token:alice", rec)
	}
	get := &openshell.GetSandboxRequest{Name: "ng-alice"}
	var sr openshell.SandboxResponse
	if err := oshCall(t, cc, "alice", openshell.MethodGetSandbox, get, &sr); err != nil {
		t.Fatalf("alice gets hers: %v", err)
	}
	wantDenied(t, "bob gets alice's", oshCall(t, cc, "bob", openshell.MethodGetSandbox, get, &sr), "token:bob", "sandboxes.list", "another identity's run")
	var del openshell.DeleteSandboxResponse
	wantDenied(t, "bob deletes alice's", oshCall(t, cc, "bob", openshell.MethodDeleteSandbox, &openshell.DeleteSandboxRequest{Name: "ng-alice"}, &del), "token:bob", "sandboxes.reap")
	wantDenied(t, "bob execs in alice's", oshCall(t, cc, "bob", openshell.MethodExecSandbox, &openshell.ExecSandboxRequest{SandboxId: rec.ID}, &sr), "token:bob")
	_, err := create("bob", "ng-bob-in-alices-run", "", "tether-run", "run-alice")
	wantDenied(t, "bob creates in alice's run", err, "token:bob", "sandboxes.lease")

	list := func(who string) []string {
		t.Helper()
		var lr openshell.ListSandboxesResponse
		if err := oshCall(t, cc, who, openshell.MethodListSandboxes, &openshell.ListSandboxesRequest{}, &lr); err != nil {
			t.Fatalf("%s lists: %v", who, err)
		}
		var names []string
		for _, s := range lr.GetSandboxes() {
			names = append(names, s.GetMetadata().GetName())
		}
		return names
	}
	if got := list("bob"); len(got) != 0 {
		t.Errorf("bob lists %v, want none", got)
	}
	if got := list("alice"); len(got) != 1 || got[0] != "ng-alice" {
		t.Errorf("alice lists %v, want ng-alice", got)
	}
	if got := list("ops"); len(got) != 1 {
		t.Errorf("ops lists %v, want everyone's", got)
	}

	_, err = create("n0", "ng-n0", "node-1")
	wantDenied(t, "n0 creates on node-1", err, "token:n0", "forward", "node-1")
	for i := range 3 { // placed by load: only ever on node-0
		resp, err := create("n0", fmt.Sprintf("ng-n0-%d", i), "")
		if err != nil {
			t.Fatalf("n0 creates by load: %v", err)
		}
		if r, _ := f.Sandboxes.Ledger().ByID(protocol.ProviderOpenShell, resp.GetSandbox().GetMetadata().GetId()); r.Node != "node-0" {
			t.Fatalf("n0's sandbox placed on %s", r.Node)
		}
	}

	if err := oshCall(t, cc, "ops", openshell.MethodDeleteSandbox, &openshell.DeleteSandboxRequest{Name: "ng-alice"}, &del); err != nil {
		t.Fatalf("ops (reap scope any) deletes alice's: %v", err)
	}
}

// TestPolicyOpenShellFacadeNoReachableNode: a caller whose forward rule
// matches no connected node is refused with PERMISSION_DENIED on every
// call a gateway would serve, never UNAVAILABLE (which NeMo Gym retries,
// and retrying cannot help), even where the sandbox it names is on a node
// it may not reach.
func TestPolicyOpenShellFacadeNoReachableNode(t *testing.T) {
	f := facadeFleet(t)
	cc := openShellClient(t, f)
	var sr openshell.SandboxResponse
	create := &openshell.CreateSandboxRequest{Name: "ng-alice", Spec: &openshell.SandboxSpec{Environment: map[string]string{}}}
	if err := oshCall(t, cc, "alice", openshell.MethodCreateSandbox, create, &sr); err != nil {
		t.Fatalf("alice creates: %v", err)
	}
	id := sr.GetSandbox().GetMetadata().GetId()
	var hr openshell.HealthResponse
	wantDenied(t, "nowhere asks Health", oshCall(t, cc, "nowhere", openshell.MethodHealth, &openshell.HealthRequest{}, &hr), "token:nowhere", "forward")
	wantDenied(t, "nowhere gets alice's by name", oshCall(t, cc, "nowhere", openshell.MethodGetSandbox, &openshell.GetSandboxRequest{Name: "ng-alice"}, &sr), "token:nowhere", "forward")
	wantDenied(t, "nowhere gets a name nobody has", oshCall(t, cc, "nowhere", openshell.MethodGetSandbox, &openshell.GetSandboxRequest{Name: "ng-none"}, &sr), "token:nowhere", "forward")
	wantDenied(t, "nowhere execs in alice's by id", oshCall(t, cc, "nowhere", openshell.MethodExecSandbox, &openshell.ExecSandboxRequest{SandboxId: id}, &sr), "token:nowhere", "forward")
	var del openshell.DeleteSandboxResponse
	wantDenied(t, "nowhere deletes alice's", oshCall(t, cc, "nowhere", openshell.MethodDeleteSandbox, &openshell.DeleteSandboxRequest{Name: "ng-alice"}, &del), "token:nowhere", "forward")
	create.Name = "ng-nowhere"
	wantDenied(t, "nowhere creates", oshCall(t, cc, "nowhere", openshell.MethodCreateSandbox, create, &sr), "token:nowhere", "forward")
	// Named explicitly, a node it may not reach is refused too.
	wantDenied(t, "nowhere gets alice's on node-0", oshCall(t, cc, "nowhere", openshell.MethodGetSandbox, &openshell.GetSandboxRequest{Name: "ng-alice"}, &sr, "tether-node", "node-0"), "token:nowhere", "forward", "node-0")
}

// osbAs sends an OpenSandbox request through the facade as who.
func osbAs(t *testing.T, f *fleettest.Fleet, who, method, path string, body any, hdr ...string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, "http://"+f.OpenSandboxFacade+path, rd)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Tether-Token", facadeTokens[who])
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestPolicyOpenSandboxFacade: the OpenSandbox facade decides as the
// OpenShell one does.
func TestPolicyOpenSandboxFacade(t *testing.T) {
	f := facadeFleet(t)
	createBody := map[string]any{
		"image": map[string]string{"uri": "python:3.12"}, "entrypoint": []string{"tail", "-f", "/dev/null"},
		"timeout": 600, "resourceLimits": map[string]string{"cpu": "1"},
	}
	code, body := osbAs(t, f, "alice", "POST", "/v1/sandboxes", createBody, "Tether-Node", "node-0", "Tether-Run", "run-alice")
	if code != http.StatusAccepted {
		t.Fatalf("alice creates: %d %s", code, body)
	}
	var cr opensandbox.CreateSandboxResponse
	json.Unmarshal(body, &cr)
	if code, body := osbAs(t, f, "alice", "GET", "/v1/sandboxes/"+cr.ID, nil); code != http.StatusOK {
		t.Fatalf("alice gets hers: %d %s", code, body)
	}
	for _, m := range []string{"GET", "DELETE"} {
		code, body := osbAs(t, f, "bob", m, "/v1/sandboxes/"+cr.ID, nil)
		if code != http.StatusForbidden || !strings.Contains(string(body), "token:bob") || !strings.Contains(string(body), "TETHER::FORBIDDEN") {
			t.Errorf("bob %s alice's: %d %s, want 403 naming token:bob", m, code, body)
		}
	}
	if code, body := osbAs(t, f, "bob", "POST", "/v1/sandboxes", createBody, "Tether-Run", "run-alice"); code != http.StatusForbidden {
		t.Errorf("bob creates in alice's run: %d %s", code, body)
	}
	count := func(who string) int {
		t.Helper()
		code, body := osbAs(t, f, who, "GET", "/v1/sandboxes", nil)
		if code != http.StatusOK {
			t.Fatalf("%s lists: %d %s", who, code, body)
		}
		var l opensandbox.ListSandboxesResponse
		json.Unmarshal(body, &l)
		return l.Pagination.TotalItems
	}
	if n := count("bob"); n != 0 {
		t.Errorf("bob lists %d, want 0", n)
	}
	if n := count("alice"); n != 1 {
		t.Errorf("alice lists %d, want 1", n)
	}
	if n := count("ops"); n != 1 {
		t.Errorf("ops lists %d, want 1", n)
	}
	if code, body := osbAs(t, f, "n0", "POST", "/v1/sandboxes", createBody, "Tether-Node", "node-1"); code != http.StatusForbidden || !strings.Contains(string(body), "node-1") {
		t.Errorf("n0 creates on node-1: %d %s, want 403", code, body)
	}
	if code, body := osbAs(t, f, "ops", "DELETE", "/v1/sandboxes/"+cr.ID, nil); code >= 300 {
		t.Errorf("ops deletes alice's: %d %s", code, body)
	}
}

//go:build linux

package fleettest_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/audit"
	"github.com/tetherfleet/tether/coordinator/facade/peeruid"
	"github.com/tetherfleet/tether/coordinator/sandboxes"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/internal/sockdiag/sockdiagtest"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/protocol/opensandbox"
	"github.com/tetherfleet/tether/protocol/openshell"
)

// uidPolicy grants the dev user (nats:alice) everything on the facades,
// and the local user nobody (token:loopback-uid-65534) to reach the
// OpenShell gateways and list: its own sandboxes, none of alice's.
const uidPolicy = `version: 1
identities:
  nats:alice:
    rules:
      - nodes: "*"
        operations: [forward]
        targets: [openshell, opensandbox]
      - operations: [sandboxes.list, sandboxes.lease, sandboxes.reap]
        scope: any
  token:loopback-uid-65534:
    rules:
      - nodes: "*"
        operations: [forward]
        targets: [openshell]
      - operations: [sandboxes.list]
`

// TestFacadeLoopbackCallerIsItsUID is the fresh-user finding: on the
// loopback facades of tether dev, any local user without credentials
// acted as the dev user (a list answered 200, a DELETE reached the
// gateway). Now a caller is named by the uid owning its socket: the dev
// process's uid is the dev user, another uid is token:loopback-uid-N,
// which gets only what the policy grants that name (here: not alice's
// sandboxes, not the OpenSandbox facade), refused with 403 /
// PERMISSION_DENIED naming it.
func TestFacadeLoopbackCallerIsItsUID(t *testing.T) {
	nobody := sockdiagtest.Dialer(t, sockdiagtest.Nobody)
	store := policyStore(t, uidPolicy)
	alice := policy.Identity{Kind: policy.KindNATS, Name: "alice"}
	self := uint32(os.Geteuid())
	f := fleettest.Start(t, fleettest.Options{Agents: 2,
		Coordinator: func(c *coordinator.Config) { c.Policy = store },
		Gateways: &fleettest.GatewayOptions{Sandboxes: func(c *sandboxes.Config) {
			c.Local = func(uid uint32) policy.Identity { // as tether dev names them
				if uid == self {
					return alice
				}
				return peeruid.Identity(uid)
			}
		}},
	})
	const who = "token:loopback-uid-65534"

	// OpenShell: alice's own calls work; nobody's reach only what its
	// rule grants.
	mine := openShellClient(t, f)
	sb := createOpenShell(t, mine, "node-0", "ng-alice", "run-alice")
	theirs, err := grpc.NewClient(f.OpenShellFacade, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(nobody))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { theirs.Close() })
	if l, err := invoke[openshell.ListSandboxesResponse](facadeCtx(t), theirs, openshell.MethodListSandboxes, &openshell.ListSandboxesRequest{}); err != nil || len(l.GetSandboxes()) != 0 {
		t.Errorf("nobody lists: %v, %d sandboxes; want none of alice's", err, len(l.GetSandboxes()))
	}
	for _, m := range []string{openshell.MethodDeleteSandbox, openshell.MethodGetSandbox} {
		_, err := invoke[openshell.DeleteSandboxResponse](facadeCtx(t), theirs, m, &openshell.DeleteSandboxRequest{Name: "ng-alice"})
		wantDenied(t, "nobody "+m, err, who)
	}
	if got := f.OpenShell("node-0").Sandboxes("default"); len(got) != 1 || got[0].GetMetadata().GetId() != sb.GetMetadata().GetId() {
		t.Fatalf("alice's sandbox after nobody's delete: %v", got)
	}
	if l, err := invoke[openshell.ListSandboxesResponse](facadeCtx(t), mine, openshell.MethodListSandboxes, &openshell.ListSandboxesRequest{}); err != nil || len(l.GetSandboxes()) != 1 {
		t.Errorf("alice lists: %v, %d sandboxes; want hers", err, len(l.GetSandboxes()))
	}

	// OpenSandbox: the same on the HTTP facade (per connection: several
	// requests on one keep-alive connection).
	id := createOpenSandbox(t, f, "node-1", "run-alice")
	theirHTTP := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return nobody(ctx, addr) }}}
	t.Cleanup(theirHTTP.CloseIdleConnections)
	if code, body := osbWith(t, theirHTTP, f, "GET", "/v1/sandboxes"); code != http.StatusOK || strings.Contains(body, id) {
		t.Errorf("nobody lists: %d %s; want none of alice's", code, body)
	}
	for _, req := range []struct{ method, path string }{{"DELETE", "/v1/sandboxes/" + id}, {"GET", "/v1/sandboxes/" + id}} {
		code, body := osbWith(t, theirHTTP, f, req.method, req.path)
		if code != http.StatusForbidden || !strings.Contains(body, who) || !strings.Contains(body, "TETHER::FORBIDDEN") {
			t.Errorf("nobody %s %s: %d %s; want 403 naming %s", req.method, req.path, code, body, who)
		}
	}
	if code, body := osbWith(t, http.DefaultClient, f, "GET", "/v1/sandboxes/"+id); code != http.StatusOK {
		t.Errorf("alice gets hers after nobody's delete: %d %s", code, body)
	}
	if code, body := osbWith(t, http.DefaultClient, f, "GET", "/v1/sandboxes"); code != http.StatusOK || !strings.Contains(body, id) {
		t.Errorf("alice lists: %d %s", code, body)
	}
}

// TestFacadeUnknownUIDIsUnidentified: a facade whose Local cannot learn
// the caller's uid (here: the fleet's facades are reached over loopback,
// but Local refuses to name anyone, as for a uid lookup that failed)
// leaves the caller unidentified: refused, never guessed.
func TestFacadeUnknownUIDIsUnidentified(t *testing.T) {
	store := policyStore(t, uidPolicy)
	f := fleettest.Start(t, fleettest.Options{Agents: 1,
		Coordinator: func(c *coordinator.Config) { c.Policy = store },
		Gateways: &fleettest.GatewayOptions{Sandboxes: func(c *sandboxes.Config) {
			c.Local = func(uint32) policy.Identity { return policy.Identity{} }
		}},
	})
	_, err := invoke[openshell.ListSandboxesResponse](facadeCtx(t), openShellClient(t, f), openshell.MethodListSandboxes, &openshell.ListSandboxesRequest{})
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("OpenShell list: %v, want UNAUTHENTICATED", err)
	}
	if code, body := osbWith(t, http.DefaultClient, f, "GET", "/v1/sandboxes"); code != http.StatusUnauthorized {
		t.Errorf("OpenSandbox list: %d %s, want 401", code, body)
	}
}

// TestFacadeCallsAreAudited: every facade call that is answered is one
// audit event (issue 9: allowed calls were not audited, only refusals):
// identity, operation, method, node, sandbox, result, duration; a policy
// refusal is one event too, not two; no token and no body in any event.
func TestFacadeCallsAreAudited(t *testing.T) {
	var rec *audit.Recorder
	store := policyStore(t, facadePolicy)
	names := map[string]string{}
	for name, tok := range facadeTokens {
		names[tok] = name
	}
	f := fleettest.Start(t, fleettest.Options{Agents: 2,
		Coordinator: func(c *coordinator.Config) {
			c.Policy = store
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var err error
			if rec, err = audit.New(ctx, audit.Config{NATS: c.NATS, Coordinator: c.ID, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rec.Close(context.Background()) })
			c.Audit = rec
		},
		Gateways: &fleettest.GatewayOptions{Sandboxes: func(c *sandboxes.Config) {
			c.CheckToken = func(tok string) bool { _, ok := names[tok]; return ok }
			c.TokenName = func(tok string) string { return names[tok] }
		}},
	})

	cc := openShellClient(t, f)
	var created openshell.SandboxResponse
	if err := oshCall(t, cc, "alice", openshell.MethodCreateSandbox, &openshell.CreateSandboxRequest{
		Name: "ng-audit", Spec: &openshell.SandboxSpec{Environment: map[string]string{"SECRET_ENV": "s3cr3t-value"}},
		Labels: map[string]string{"tether.node": "node-0"},
	}, &created, "tether-run", "run-alice"); err != nil {
		t.Fatal(err)
	}
	var listed openshell.ListSandboxesResponse
	if err := oshCall(t, cc, "alice", openshell.MethodListSandboxes, &openshell.ListSandboxesRequest{}, &listed); err != nil {
		t.Fatal(err)
	}
	var del openshell.DeleteSandboxResponse
	wantDenied(t, "bob deletes alice's", oshCall(t, cc, "bob", openshell.MethodDeleteSandbox, &openshell.DeleteSandboxRequest{Name: "ng-audit"}, &del), "token:bob")
	if err := oshCall(t, cc, "alice", openshell.MethodDeleteSandbox, &openshell.DeleteSandboxRequest{Name: "ng-audit"}, &del); err != nil {
		t.Fatal(err)
	}

	createBody := map[string]any{
		"image": map[string]string{"uri": "python:3.12"}, "entrypoint": []string{"tail", "-f", "/dev/null"},
		"timeout": 600, "resourceLimits": map[string]string{"cpu": "1"}, "env": map[string]string{"SECRET_ENV": "s3cr3t-value"},
	}
	code, body := osbAs(t, f, "alice", "POST", "/v1/sandboxes", createBody, "Tether-Node", "node-1", "Tether-Run", "run-alice")
	if code != http.StatusAccepted {
		t.Fatalf("alice creates: %d %s", code, body)
	}
	var cr opensandbox.CreateSandboxResponse
	json.Unmarshal(body, &cr)
	if code, body := osbAs(t, f, "alice", "GET", "/v1/sandboxes", nil); code != http.StatusOK {
		t.Fatalf("alice lists: %d %s", code, body)
	}
	if code, body := osbAs(t, f, "alice", "DELETE", "/v1/sandboxes/"+cr.ID, nil); code >= 300 {
		t.Fatalf("alice deletes: %d %s", code, body)
	}

	type want struct{ facade, method, identity, op, result, node, sandbox string }
	wants := []want{
		{"openshell", "CreateSandbox", "token:alice", "forward", protocol.AuditOK, "node-0", "default/ng-audit"},
		{"openshell", "ListSandboxes", "token:alice", "sandboxes.list", protocol.AuditOK, "node-0", ""},
		{"openshell", "DeleteSandbox", "token:alice", "sandboxes.reap", protocol.AuditOK, "node-0", "default/ng-audit"},
		{"opensandbox", "POST create", "token:alice", "forward", protocol.AuditOK, "node-1", cr.ID},
		{"opensandbox", "GET list", "token:alice", "sandboxes.list", protocol.AuditOK, "node-1", ""},
		{"opensandbox", "DELETE sandbox", "token:alice", "sandboxes.reap", protocol.AuditOK, "node-1", cr.ID},
	}
	var evs []protocol.AuditEvent
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := rec.Query(ctx, protocol.AuditQueryRequest{Order: protocol.AuditOldestFirst}, 1<<20)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		evs = resp.Events
		if facadeEvents(evs) >= len(wants)+1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	var facade []protocol.AuditEvent
	bobs := 0
	for _, e := range evs {
		if e.Identity == "token:bob" {
			bobs++
			if e.Result != protocol.AuditRefused || e.Operation != "sandboxes.reap" {
				t.Errorf("bob's event: %+v, want refused sandboxes.reap", e)
			}
		}
		if e.Facade != "" {
			facade = append(facade, e)
		}
		raw, _ := json.Marshal(e)
		for _, secret := range []string{facadeTokens["alice"], facadeTokens["bob"], "s3cr3t-value", "SECRET_ENV", "python:3.12"} {
			if strings.Contains(string(raw), secret) {
				t.Errorf("an event holds %q: %s", secret, raw)
			}
		}
	}
	if bobs != 1 {
		t.Errorf("bob's refused delete left %d events, want 1", bobs)
	}
	if len(facade) != len(wants) {
		for _, e := range facade {
			t.Logf("facade event: %+v", e)
		}
		t.Fatalf("%d facade events, want %d", len(facade), len(wants))
	}
	for i, w := range wants {
		e := facade[i]
		got := want{e.Facade, e.Method, e.Identity, e.Operation, e.Result, strings.Join(e.Nodes, ","), e.Sandbox}
		if w.node == "node-0" && w.method == "ListSandboxes" || w.method == "GET list" {
			got.node = w.node // a listing asks every node
			if len(e.Nodes) != 2 {
				t.Errorf("event %d: nodes %v, want both", i, e.Nodes)
			}
		}
		if got != w {
			t.Errorf("event %d: %+v\nwant %+v", i, got, w)
		}
		if e.DurationMS <= 0 || e.Time.IsZero() {
			t.Errorf("event %d lacks its duration or time: %+v", i, e)
		}
	}
}

// facadeEvents counts the events of facade calls and of refusals.
func facadeEvents(evs []protocol.AuditEvent) int {
	n := 0
	for _, e := range evs {
		if e.Facade != "" || e.Result == protocol.AuditRefused {
			n++
		}
	}
	return n
}

func policyStore(t *testing.T, yaml string) *policy.Store {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	store, err := policy.NewStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// osbWith sends a bodiless request to the OpenSandbox facade with client.
func osbWith(t *testing.T, client *http.Client, f *fleettest.Fleet, method, path string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(facadeCtx(t), method, "http://"+f.OpenSandboxFacade+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

package openshell_test

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	facade "github.com/tetherfleet/tether/coordinator/facade/openshell"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/protocol"
	osh "github.com/tetherfleet/tether/protocol/openshell"
	"github.com/tetherfleet/tether/protocol/openshell/openshelltest"
)

// TestDeadGatewayNode: node-f's agent is connected but its gateway is not
// listening. Creates placed by load go to node-e (the one failed dial to
// node-f is retried there, later ones skip node-f), lists and lookups
// leave out node-f while the ledger says it holds nothing, and node-f is
// used again once its gateway answers.
func TestDeadGatewayNode(t *testing.T) {
	e := newEnv(t, envConfig{nodes: []string{"node-e"}})
	e.fleet.add("node-f", deadAddr(t), nil)
	ctx := testCtx(t)

	for i := range 6 {
		sb, err := e.create(ctx, &osh.CreateSandboxRequest{Spec: spec()})
		if err != nil {
			t.Fatalf("create %d: %v", i, err)
		}
		if node := e.nodeOf(sb); node != "node-e" {
			t.Fatalf("create %d placed on %q", i, node)
		}
	}
	if n := e.gws["node-e"].Calls(osh.MethodCreateSandbox); n != 6 {
		t.Fatalf("node-e got %d creates, want 6", n)
	}
	if n := e.fleet.dialCount("node-f"); n == 0 {
		t.Fatal("node-f was never tried; the test proves nothing")
	}

	got, err := e.list(ctx, &osh.ListSandboxesRequest{})
	if err != nil || len(got) != 6 {
		t.Fatalf("list: %d sandboxes, %v; want 6 (node-f holds none)", len(got), err)
	}
	_, err = e.get(ctx, "", "nowhere")
	wantCode(t, "get of an unknown name", err, codes.NotFound, "not found")

	// Pinned to node-f: its error, no retry elsewhere.
	_, err = e.create(metadataCtx(ctx, facade.MetaNode, "node-f"), &osh.CreateSandboxRequest{Spec: spec()})
	wantCode(t, "pinned create", err, codes.Unavailable, "")
	if n := e.gws["node-e"].Calls(osh.MethodCreateSandbox); n != 6 {
		t.Fatalf("node-e got %d creates; a pinned create must not move", n)
	}

	// The ledger says node-f holds a sandbox: the list would be partial.
	e.ledger.seed(ledger.Record{Provider: protocol.ProviderOpenShell, Node: "node-f", ID: "f1", Workspace: "default", Name: "f1"})
	_, err = e.list(ctx, &osh.ListSandboxesRequest{})
	wantCode(t, "list with a live sandbox on node-f", err, codes.Unavailable, "node node-f")
	e.ledger.Deleted(ctx, ledger.Key{Provider: protocol.ProviderOpenShell, Node: "node-f", ID: "f1"})

	// node-f's gateway comes back: it is healthy again after a dial
	// succeeds, and the least loaded node gets creates again.
	gw := openshelltest.New(openshelltest.Options{})
	addr, err := gw.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.Close)
	e.gws["node-f"] = gw
	e.fleet.setAddr("node-f", addr)
	checkFor(t, 15*time.Second, func() error {
		_, err := e.create(ctx, &osh.CreateSandboxRequest{Spec: spec()})
		if err != nil {
			t.Fatal(err)
		}
		if gw.Calls(osh.MethodCreateSandbox) == 0 {
			return errString("node-f gets no creates after its gateway came back")
		}
		return nil
	})
}

type errString string

func (e errString) Error() string { return string(e) }

// TestCreateMetadataValidation: what the facade refuses before forwarding
// a create.
func TestCreateMetadataValidation(t *testing.T) {
	e := newEnv(t, envConfig{nodes: []string{"node-a", "node-b"}})
	for _, c := range []struct {
		what string
		kv   []string
		msg  string
	}{
		{"bad run", []string{facade.MetaRun, "bad run!"}, "tether-run: run id"},
		{"node and selector", []string{facade.MetaNode, "node-a", facade.MetaNodeSelector, "gpu=a100"}, "set at most one of"},
		{"negative ttl", []string{facade.MetaTTL, "-5s"}, "must not be negative"},
		{"negative ttl seconds", []string{facade.MetaTTL, "-5"}, "must not be negative"},
		{"bad ttl", []string{facade.MetaTTL, "soon"}, `tether-ttl "soon": want a Go duration`},
	} {
		_, err := e.create(testCtx(t, c.kv...), &osh.CreateSandboxRequest{Spec: spec()})
		wantCode(t, c.what, err, codes.InvalidArgument, c.msg)
	}
	_, err := e.create(testCtx(t), &osh.CreateSandboxRequest{Spec: spec(), Labels: map[string]string{facade.LabelNode: "node-a"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.create(testCtx(t, facade.MetaNodeSelector, "gpu=a100"), &osh.CreateSandboxRequest{Spec: spec(), Labels: map[string]string{facade.LabelNode: "node-a"}})
	wantCode(t, "label and selector", err, codes.InvalidArgument, "set at most one of")
	_, err = e.create(testCtx(t, facade.MetaNode, "node-b"), &osh.CreateSandboxRequest{Spec: spec(), Labels: map[string]string{facade.LabelNode: "node-a"}})
	wantCode(t, "label and metadata naming different nodes", err, codes.InvalidArgument, "name different nodes")
	if n := e.gws["node-a"].Calls(osh.MethodCreateSandbox) + e.gws["node-b"].Calls(osh.MethodCreateSandbox); n != 1 {
		t.Fatalf("%d creates reached gateways, want 1", n)
	}
	if _, err := e.create(testCtx(t, facade.MetaRun, "run-1.a_b"), &osh.CreateSandboxRequest{Spec: spec()}); err != nil {
		t.Fatalf("valid run: %v", err)
	}
}

// TestSameNameOnTwoNodes: a (workspace, name) made directly on two
// gateways is not resolved by picking one.
func TestSameNameOnTwoNodes(t *testing.T) {
	e := newEnv(t, envConfig{nodes: []string{"node-a", "node-b", "node-c"}})
	ctx := testCtx(t)
	for _, n := range []string{"node-a", "node-c"} {
		if _, err := e.gws[n].Create(&osh.CreateSandboxRequest{Spec: spec(), Name: "twin"}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := e.get(ctx, "", "twin")
	wantCode(t, "get", err, codes.FailedPrecondition, "sandbox name default/twin exists on nodes node-a and node-c; set tether-node to choose")
	_, err = e.del(ctx, "", "twin")
	wantCode(t, "delete", err, codes.FailedPrecondition, "exists on nodes node-a and node-c")
	if n := e.gws["node-a"].Calls(osh.MethodDeleteSandbox) + e.gws["node-c"].Calls(osh.MethodDeleteSandbox); n != 0 {
		t.Fatalf("%d deletes reached gateways", n)
	}
	if deleted, err := e.del(metadataCtx(ctx, facade.MetaNode, "node-c"), "", "twin"); err != nil || !deleted {
		t.Fatalf("delete on node-c: %v, %v", deleted, err)
	}
	if _, ok := e.gws["node-a"].Sandbox("", "twin"); !ok {
		t.Fatal("node-a's twin is gone")
	}
}

package fleettest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/coordinator/sandboxes"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/protocol/opensandbox"
	"github.com/tetherfleet/tether/protocol/openshell"
)

// sandboxFleet starts two nodes with fake gateways and the sandbox
// services; adjust tunes them.
func sandboxFleet(t *testing.T, adjust func(*sandboxes.Config)) *fleettest.Fleet {
	t.Helper()
	return fleettest.Start(t, fleettest.Options{Agents: 2, Gateways: &fleettest.GatewayOptions{Sandboxes: adjust}})
}

// openShellClient dials the fleet's OpenShell facade.
func openShellClient(t *testing.T, f *fleettest.Fleet) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(f.OpenShellFacade, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// createOpenShell creates an OpenShell sandbox through the facade on node,
// labelled as NeMo Gym does, owned by run.
func createOpenShell(t *testing.T, cc *grpc.ClientConn, node, name, run string) *openshell.Sandbox {
	t.Helper()
	req := &openshell.CreateSandboxRequest{
		Name: name, Spec: &openshell.SandboxSpec{Environment: map[string]string{}},
		Labels: map[string]string{"nemo-gym.sandbox": "1", "run": run, "tether.node": node},
	}
	var resp openshell.SandboxResponse
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cc.Invoke(ctx, openshell.MethodCreateSandbox, req, &resp); err != nil {
		t.Fatalf("create openshell %s on %s: %v", name, node, err)
	}
	return resp.GetSandbox()
}

// createOpenSandbox creates an OpenSandbox sandbox through the facade on
// node with NeMo Gym's run attribution, and returns its id.
func createOpenSandbox(t *testing.T, f *fleettest.Fleet, node, run string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{
		"image": map[string]string{"uri": "python:3.12"}, "entrypoint": []string{"tail", "-f", "/dev/null"},
		"timeout": 600, "resourceLimits": map[string]string{"cpu": "1"},
		"metadata": map[string]string{"nemo-gym.nvidia.com/run": run},
	})
	req, _ := http.NewRequest("POST", "http://"+f.OpenSandboxFacade+"/v1/sandboxes", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Tether-Node", node)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out opensandbox.CreateSandboxResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("create opensandbox on %s: status %d, %v", node, resp.StatusCode, err)
	}
	return out.ID
}

// onGateways counts the sandboxes node's gateways hold (OpenShell, in the
// default workspace, not being deleted; OpenSandbox, any state).
func onGateways(t *testing.T, f *fleettest.Fleet, node string) (osh, osb int) {
	t.Helper()
	for _, sb := range f.OpenShell(node).Sandboxes("default") {
		if sb.GetStatus().GetPhase() != openshell.SandboxPhase_SANDBOX_PHASE_DELETING {
			osh++
		}
	}
	resp, err := http.Get(f.OpenSandbox(node).URL + "/v1/sandboxes?pageSize=200")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list opensandbox.ListSandboxesResponse
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	return osh, list.Pagination.TotalItems
}

// eventually polls cond every 50 ms until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start)
}

func liveRecords(f *fleettest.Fleet, run, node string) int {
	return len(f.Sandboxes.Ledger().List(ledger.Filter{Run: run, Node: node, State: string(ledger.StateLive)}))
}

// The lease holder dies (stops renewing, as after kill -9) with 50 live
// sandboxes on two nodes, through both facades: every one is deleted
// within the lease TTL + 10 s of its last renewal; another run's sandboxes
// are untouched.
func TestLeaseHolderDeathReapsEverySandbox(t *testing.T) {
	f := sandboxFleet(t, nil)
	ctx := context.Background()
	const ttl = 2 * time.Second
	// The run holds a long lease while it creates (51 creates took longer
	// than 2 s on a loaded machine, and the reaper rightly began before
	// the last); its holder's last act is a renewal with the short TTL.
	if _, err := f.Client.OpenLease(ctx, "run-dies", time.Minute, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Client.OpenLease(ctx, "run-lives", time.Minute, "test"); err != nil {
		t.Fatal(err)
	}
	cc := openShellClient(t, f)
	for i := range 50 {
		node := fmt.Sprintf("node-%d", i%2)
		if i%4 < 2 {
			createOpenShell(t, cc, node, fmt.Sprintf("ng-%016x", i), "run-dies")
		} else {
			createOpenSandbox(t, f, node, "run-dies")
		}
	}
	keep := createOpenShell(t, cc, "node-0", "ng-keep", "run-lives")
	if n := liveRecords(f, "run-dies", ""); n != 50 {
		t.Fatalf("ledger: %d live records of run-dies right after the creates, want 50", n)
	}
	if _, err := f.Client.OpenLease(ctx, "run-dies", ttl, "test"); err != nil {
		t.Fatal(err)
	}
	leased := time.Now()
	eventually(t, ttl+10*time.Second-time.Since(leased), "every sandbox of the dead run deleted", func() bool {
		a0, b0 := onGateways(t, f, "node-0")
		a1, b1 := onGateways(t, f, "node-1")
		return a0+b0+a1+b1 == 1
	})
	t.Logf("50 sandboxes reaped %v after the lease was last renewed (TTL %v)", time.Since(leased).Round(time.Millisecond), ttl)
	if _, ok := f.Sandboxes.Ledger().ByID(protocol.ProviderOpenShell, keep.GetMetadata().GetId()); !ok {
		t.Error("the live run's sandbox has no ledger record")
	}
	if sbs := f.OpenShell("node-0").Sandboxes("default"); len(sbs) != 1 || sbs[0].GetMetadata().GetName() != "ng-keep" {
		t.Errorf("node-0 openshell after the reap: %d sandboxes, want only ng-keep", len(sbs))
	}
}

// A node is partitioned while its run dies: nothing on it is deleted while
// it is cut off (the reaper does not act on partial knowledge), the other
// node's sandboxes go at once, and the partitioned node's go after it
// heals.
func TestPartitionedNodeReapedOnlyAfterHeal(t *testing.T) {
	f := sandboxFleet(t, nil)
	ctx := context.Background()
	if _, err := f.Client.OpenLease(ctx, "run-p", time.Minute, "test"); err != nil {
		t.Fatal(err)
	}
	cc := openShellClient(t, f)
	for i := range 6 {
		node := fmt.Sprintf("node-%d", i%2)
		createOpenShell(t, cc, node, fmt.Sprintf("ng-p%d", i), "run-p")
		createOpenSandbox(t, f, node, "run-p")
	}
	f.Partition(t, "node-1")
	eventually(t, 10*time.Second, "node-1 unreachable", func() bool { return len(f.Coordinator.Nodes(protocol.Selector{})) == 1 })
	if resp, err := f.Client.SyncSandboxes(ctx); err != nil || len(resp.Incomplete) != 1 || resp.Incomplete[0].Node != "node-1" {
		t.Errorf("sync during the partition: %+v, %v; want node-1 reported as not listed", resp, err)
	}
	if _, err := f.Client.CloseLease(ctx, "run-p"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "node-0's sandboxes reaped", func() bool { a, b := onGateways(t, f, "node-0"); return a+b == 0 })
	// Several reaper passes (200 ms) and inventories (1 s) later, node-1's
	// sandboxes must still be there.
	time.Sleep(2 * time.Second)
	if a, b := onGateways(t, f, "node-1"); a != 3 || b != 3 {
		t.Fatalf("node-1 during the partition: %d openshell + %d opensandbox sandboxes, want 3 + 3 (nothing deleted)", a, b)
	}
	plan, err := f.Client.Reap(ctx, protocol.ReapRequest{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	blocked := 0
	for _, c := range plan.Candidates {
		if c.Sandbox.Node == "node-1" && c.Blocked != "" {
			blocked++
		}
	}
	if blocked != 6 {
		t.Errorf("dry run during the partition: %d of node-1's candidates blocked, want 6: %+v", blocked, plan.Candidates)
	}
	f.Heal(t, "node-1")
	took := eventually(t, 20*time.Second, "node-1's sandboxes reaped after the heal", func() bool { a, b := onGateways(t, f, "node-1"); return a+b == 0 })
	t.Logf("node-1 reaped %v after the heal", took.Round(time.Millisecond))
}

// A gateway restart, and sandboxes the facade never saw (created on the
// gateway directly, as when a coordinator dies between the gateway's commit
// and its own record): the inventory records each exactly once, and they
// are reaped with their run.
func TestInventoryConvergesWithoutDuplicates(t *testing.T) {
	f := sandboxFleet(t, nil)
	ctx := context.Background()
	if _, err := f.Client.OpenLease(ctx, "run-g", time.Minute, "test"); err != nil {
		t.Fatal(err)
	}
	cc := openShellClient(t, f)
	for i := range 4 {
		createOpenShell(t, cc, "node-0", fmt.Sprintf("ng-g%d", i), "run-g")
	}
	for i := range 3 { // behind the facade's back
		if _, err := f.OpenShell("node-0").Create(&openshell.CreateSandboxRequest{
			Name: fmt.Sprintf("ng-direct%d", i), Spec: &openshell.SandboxSpec{},
			Labels: map[string]string{"nemo-gym.sandbox": "1", "run": "run-g"},
		}); err != nil {
			t.Fatal(err)
		}
	}
	f.OpenShell("node-0").Restart()
	for range 3 { // through the NATS API, as `tether sandboxes --sync` does
		if _, err := f.Client.SyncSandboxes(ctx); err != nil {
			t.Fatal(err)
		}
	}
	recs := f.Sandboxes.Ledger().List(ledger.Filter{Run: "run-g"})
	if len(recs) != 7 {
		t.Fatalf("ledger after a gateway restart: %d records of run-g, want 7 (4 via the facade, 3 direct, none twice)", len(recs))
	}
	for _, r := range recs {
		if r.State != ledger.StateLive || !r.Managed {
			t.Errorf("record %s/%s: state %s, managed %v; want live and managed", r.Node, r.Name, r.State, r.Managed)
		}
	}
	if _, err := f.Client.CloseLease(ctx, "run-g"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "run-g reaped", func() bool { a, _ := onGateways(t, f, "node-0"); return a == 0 })
}

// Registrations must name a node the coordinator has seen; a typo would
// otherwise hold a live record (and block every merged list) for a node that
// never comes.
func TestRegisterRefusesUnknownNode(t *testing.T) {
	f := sandboxFleet(t, nil)
	ctx := context.Background()
	_, err := f.Client.RegisterSandbox(ctx, protocol.SandboxRegisterRequest{Provider: protocol.ProviderOpenShell, Node: "nosuch", ID: "x1", Name: "phantom", Run: "ph"})
	if !errors.Is(err, &protocol.APIError{Code: protocol.ErrCodeUnknownNode}) {
		t.Fatalf("register on an unknown node: %v, want unknown_node", err)
	}
	si, err := f.Client.RegisterSandbox(ctx, protocol.SandboxRegisterRequest{Provider: protocol.ProviderOpenShell, Node: "node-1", ID: "x2", Name: "known", Run: "ph"})
	if err != nil || si.State != protocol.SandboxLive || !si.Managed {
		t.Fatalf("register on a connected node: %+v, %v", si, err)
	}
}

// One dead gateway on a node must not stop reaping through its other one:
// completeness is judged per provider.
func TestDeadGatewayDoesNotBlockTheOther(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Agents: 2, Gateways: &fleettest.GatewayOptions{},
		Agent: func(i int, c *agent.Config) {
			if i == 1 {
				c.OpenSandbox.Addr = "127.0.0.1:1" // nothing listens
			}
		}})
	ctx := context.Background()
	if _, err := f.Client.OpenLease(ctx, "run-d", time.Minute, "test"); err != nil {
		t.Fatal(err)
	}
	cc := openShellClient(t, f)
	for i := range 3 {
		createOpenShell(t, cc, "node-1", fmt.Sprintf("ng-d%d", i), "run-d")
	}
	resp, err := f.Client.SyncSandboxes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Incomplete) != 1 || resp.Incomplete[0].Node != "node-1" || resp.Incomplete[0].Target != "opensandbox" {
		t.Errorf("sync with node-1's opensandbox down: incomplete %+v, want node-1/opensandbox", resp.Incomplete)
	}
	if _, err := f.Client.CloseLease(ctx, "run-d"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "node-1's OpenShell sandboxes reaped while its OpenSandbox server is down", func() bool {
		a, _ := onOpenShell(f, "node-1")
		return a == 0
	})
}

// onOpenShell counts node's OpenShell sandboxes not being deleted.
func onOpenShell(f *fleettest.Fleet, node string) (int, error) {
	n := 0
	for _, sb := range f.OpenShell(node).Sandboxes("default") {
		if sb.GetStatus().GetPhase() != openshell.SandboxPhase_SANDBOX_PHASE_DELETING {
			n++
		}
	}
	return n, nil
}

// A name deleted on one node (its record still "deleting" until the next
// inventory) does not hold a create that names another node.
func TestCreatePinnedAfterDeleteOfSameName(t *testing.T) {
	f := sandboxFleet(t, func(c *sandboxes.Config) { c.InventoryInterval = time.Hour })
	cc := openShellClient(t, f)
	createOpenShell(t, cc, "node-1", "samename1", "run-s")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var del openshell.DeleteSandboxResponse
	if err := cc.Invoke(ctx, openshell.MethodDeleteSandbox, &openshell.DeleteSandboxRequest{Name: "samename1"}, &del); err != nil || !del.GetDeleted() {
		t.Fatalf("delete: %v, %v", &del, err)
	}
	sb := createOpenShell(t, cc, "node-0", "samename1", "run-s")
	if r, ok := f.Sandboxes.Ledger().ByID(protocol.ProviderOpenShell, sb.GetMetadata().GetId()); !ok || r.Node != "node-0" {
		t.Fatalf("re-created samename1 with tether.node=node-0: ledger %+v (found %v), want it on node-0", r, ok)
	}
	if len(f.OpenShell("node-0").Sandboxes("default")) != 1 {
		t.Error("node-0's gateway does not have the re-created sandbox")
	}
}

// A closed run takes no new sandboxes through either facade.
func TestClosedRunRefusesCreates(t *testing.T) {
	f := sandboxFleet(t, nil)
	ctx := context.Background()
	if _, err := f.Client.OpenLease(ctx, "run-c", time.Minute, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Client.CloseLease(ctx, "run-c"); err != nil {
		t.Fatal(err)
	}
	cc := openShellClient(t, f)
	octx := metadata.AppendToOutgoingContext(ctx, "tether-run", "run-c")
	var resp openshell.SandboxResponse
	err := cc.Invoke(octx, openshell.MethodCreateSandbox, &openshell.CreateSandboxRequest{Name: "late", Spec: &openshell.SandboxSpec{}}, &resp)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "run run-c was closed") {
		t.Errorf("openshell create for a closed run: %v, want FAILED_PRECONDITION naming the run", err)
	}
	req, _ := http.NewRequest("POST", "http://"+f.OpenSandboxFacade+"/v1/sandboxes", strings.NewReader(`{"image":{"uri":"x"},"entrypoint":["tail"],"resourceLimits":{"cpu":"1"}}`))
	req.Header.Set("Tether-Run", "run-c")
	hr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	hr.Body.Close()
	if hr.StatusCode != http.StatusConflict {
		t.Errorf("opensandbox create for a closed run: status %d, want 409", hr.StatusCode)
	}
	if a, b := onGateways(t, f, "node-0"); a+b != 0 {
		t.Errorf("node-0 has %d sandboxes after refused creates", a+b)
	}
}

package fleettest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol/opensandbox"
)

// Two coordinators, each with its own facades and sandbox services, node-0
// held by coordinator 0 and node-1 by coordinator 1. Sandboxes are created
// on both nodes through both coordinators' facades (a facade reaches the
// other coordinator's node through its owner), every coordinator answers
// Reachable for both nodes once their owners inventoried them, and when
// the run's lease lapses the one reaper of the fleet (the lock's holder)
// deletes them all: those on the other coordinator's node through that
// owner.
func TestMultiCoordinatorFacadesAndReaper(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Coordinators: 2, Agents: 2, HeartbeatInterval: time.Second, Gateways: &fleettest.GatewayOptions{}})
	ctx := context.Background()
	if _, err := f.Client.OpenLease(ctx, "run-m", time.Minute, "test"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "both nodes reachable from both coordinators", func() bool {
		for _, c := range f.Coordinators {
			if !c.Reachable("node-0") || !c.Reachable("node-1") {
				return false
			}
		}
		return true
	})
	for k := range 2 {
		cc, err := grpc.NewClient(f.OpenShellFacades[k], grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		for _, node := range []string{"node-0", "node-1"} {
			createOpenShell(t, cc, node, fmt.Sprintf("ng-c%d-%s", k, node), "run-m")
			createOpenSandboxAt(t, f.OpenSandboxFacades[k], node, "run-m")
		}
	}
	for _, node := range []string{"node-0", "node-1"} {
		if a, b := onGateways(t, f, node); a != 2 || b != 2 {
			t.Fatalf("%s holds %d openshell and %d opensandbox sandboxes, want 2 and 2", node, a, b)
		}
	}
	beforeReap := f.Forwarded(t)
	if _, err := f.Client.OpenLease(ctx, "run-m", time.Second, "test"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "every sandbox of the lapsed run deleted on both nodes", func() bool {
		a0, b0 := onGateways(t, f, "node-0")
		a1, b1 := onGateways(t, f, "node-1")
		return a0+b0+a1+b1 == 0
	})
	leaders := 0
	for _, s := range f.SandboxServices {
		if s.Reaper().Leader() {
			leaders++
		}
	}
	if leaders != 1 {
		t.Errorf("%d reapers lead, want 1", leaders)
	}
	// Half the deletes were on the other coordinator's node: through it.
	if f.Forwarded(t) < beforeReap+4 {
		t.Errorf("%v deletes forwarded to the other coordinator, want at least 4", f.Forwarded(t)-beforeReap)
	}
}

// createOpenSandboxAt is createOpenSandbox through the facade at addr.
func createOpenSandboxAt(t *testing.T, addr, node, run string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{
		"image": map[string]string{"uri": "python:3.12"}, "entrypoint": []string{"tail", "-f", "/dev/null"},
		"timeout": 600, "resourceLimits": map[string]string{"cpu": "1"},
		"metadata": map[string]string{"nemo-gym.nvidia.com/run": run},
	})
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/sandboxes", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Tether-Node", node)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out opensandbox.CreateSandboxResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("create opensandbox on %s via %s: status %d, %v", node, addr, resp.StatusCode, err)
	}
	return out.ID
}

// sandboxes.sync takes the inventory of the whole fleet from any
// coordinator: a node with a dead gateway, held by either coordinator, is
// reported whichever coordinator the request lands on.
func TestMultiCoordinatorSyncFleetWide(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Coordinators: 2, Agents: 2, HeartbeatInterval: time.Second, Gateways: &fleettest.GatewayOptions{},
		Agent: func(i int, c *agent.Config) {
			if i == 1 {
				c.OpenSandbox.Addr = "127.0.0.1:1" // nothing listens
			}
		}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 6 {
		r, err := f.Client.SyncSandboxes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, p := range r.Incomplete {
			found = found || p.Node == "node-1"
		}
		if !found {
			t.Fatalf("sync %d: problems %+v do not name node-1, whose opensandbox gateway is dead", i, r.Incomplete)
		}
	}
}

package fleettest_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/coordinator/sandboxes"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
	osh "github.com/tetherfleet/tether/protocol/openshell"
)

// The sandbox benchmarks of issue 4, each against a baseline in the same
// run:
//
//	BenchmarkOpenShellUnary: GetSandbox through the OpenShell facade (client
//	    → facade → dial stream over the tunnel → agent → fake gateway)
//	    against GetSandbox straight to the same gateway; p50/p99 in µs and
//	    the facade's p50 overhead (target: under 500 µs).
//	BenchmarkInventoryReconcile10k: Coordinator.Sync of a node whose
//	    gateway holds 10,000 sandboxes (agent lists them over gRPC,
//	    inventory frames cross the tunnel, the ledger writes its records),
//	    first with every sandbox new, then again unchanged (target: under
//	    5 s). The ledger's own BenchmarkReconcile10k measures Reconcile
//	    alone against raw KV puts.
//
// Run: go test -run '^$' -bench 'OpenShellUnary|InventoryReconcile' -benchtime 1x ./fleettest

// unaryCallsPerOp is how many GetSandbox calls (per path) one op of
// BenchmarkOpenShellUnary makes, so that even -benchtime 1x gives
// percentiles over a thousand samples; ns/op is per op, not per call.
const unaryCallsPerOp = 1000

// quiet sandbox services for benchmarks: no reaper, and inventories only
// when a node connects or on Sync, so no background work competes with
// what is measured.
func quietSandboxes(c *sandboxes.Config) {
	c.NoReaper = true
	c.InventoryInterval = time.Hour
}

// microsAt returns the q-quantile (0..1) of ds in µs; it sorts ds.
func microsAt(ds []time.Duration, q float64) float64 {
	slices.Sort(ds)
	return float64(ds[int(q*float64(len(ds)-1))]) / float64(time.Microsecond)
}

func BenchmarkOpenShellUnary(b *testing.B) {
	var mu sync.Mutex
	gateways := map[string]string{} // node → its gateway's address
	f := fleettest.Start(b, fleettest.Options{
		Agents:   2,
		Gateways: &fleettest.GatewayOptions{Sandboxes: quietSandboxes},
		Agent: func(_ int, c *agent.Config) {
			mu.Lock()
			defer mu.Unlock()
			gateways[c.NodeID] = c.OpenShell.Addr
		},
	})
	dial := func(addr string) *grpc.ClientConn {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cc.Close() })
		return cc
	}
	facade := dial(f.OpenShellFacade)
	mu.Lock()
	direct := dial(gateways["node-1"])
	mu.Unlock()
	ctx := context.Background()
	create := &osh.CreateSandboxRequest{Spec: &osh.SandboxSpec{Environment: map[string]string{}}, Name: "ng-bench",
		Labels: map[string]string{"nemo-gym.sandbox": "1", "tether.node": "node-1"}}
	if err := facade.Invoke(ctx, osh.MethodCreateSandbox, create, new(osh.SandboxResponse)); err != nil {
		b.Fatal(err)
	}
	req := &osh.GetSandboxRequest{Name: "ng-bench", Workspace: "default"}
	get := func(cc *grpc.ClientConn) time.Duration {
		start := time.Now()
		if err := cc.Invoke(ctx, osh.MethodGetSandbox, req, new(osh.SandboxResponse)); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	for range 100 { // warm both paths
		get(facade)
		get(direct)
	}

	b.Run("direct", func(b *testing.B) {
		var ds []time.Duration
		for b.Loop() {
			for range unaryCallsPerOp {
				ds = append(ds, get(direct))
			}
		}
		b.ReportMetric(microsAt(ds, .50), "p50-µs")
		b.ReportMetric(microsAt(ds, .99), "p99-µs")
	})
	// The facade's calls alternate with direct ones, so both see the same
	// machine load and the overhead is measured within this run.
	b.Run("facade", func(b *testing.B) {
		var fs, ds []time.Duration
		for b.Loop() {
			for i := range unaryCallsPerOp {
				if i%2 == 0 {
					fs = append(fs, get(facade))
					ds = append(ds, get(direct))
				} else {
					ds = append(ds, get(direct))
					fs = append(fs, get(facade))
				}
			}
		}
		fp50, dp50 := microsAt(fs, .50), microsAt(ds, .50)
		b.ReportMetric(fp50, "p50-µs")
		b.ReportMetric(microsAt(fs, .99), "p99-µs")
		b.ReportMetric(dp50, "direct-p50-µs")
		b.ReportMetric(fp50-dp50, "overhead-p50-µs")
		b.ReportMetric(fp50/dp50, "ratio-p50")
	})
}

// reconcileSandboxes is the size of BenchmarkInventoryReconcile10k's node.
const reconcileSandboxes = 10000

// BenchmarkInventoryReconcile10k times Coordinator.Sync end to end for one
// node holding reconcileSandboxes OpenShell sandboxes, labelled as NeMo
// Gym labels them: first-s is the first sync (every record new), repeat-s
// a second one (nothing changed). Each op starts its own fleet (not
// timed); use a small -benchtime such as 1x.
func BenchmarkInventoryReconcile10k(b *testing.B) {
	var first, repeat time.Duration
	for range b.N {
		b.StopTimer()
		f := fleettest.Start(b, fleettest.Options{Gateways: &fleettest.GatewayOptions{Sandboxes: quietSandboxes}})
		// The node's first inventory (taken when it connects) must be
		// done before seeding, or it would race the timed sync.
		deadline := time.Now().Add(30 * time.Second)
		for !f.Coordinator.Reachable("node-0") {
			if time.Now().After(deadline) {
				b.Fatal("node-0 never reachable (no complete first inventory)")
			}
			time.Sleep(10 * time.Millisecond)
		}
		gw := f.OpenShell("node-0")
		for i := range reconcileSandboxes {
			if _, err := gw.Create(&osh.CreateSandboxRequest{
				Spec: &osh.SandboxSpec{Environment: map[string]string{}}, Name: fmt.Sprintf("ng-%016x", i),
				Labels: map[string]string{"nemo-gym.sandbox": "1", "run": fmt.Sprintf("run-%d", i%50)},
			}); err != nil {
				b.Fatal(err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		b.StartTimer()

		start := time.Now()
		if _, err := f.Coordinator.Sync(ctx); err != nil {
			b.Fatal(err)
		}
		first += time.Since(start)
		b.StopTimer()
		recs := f.Sandboxes.Ledger().List(ledger.Filter{Node: "node-0", Provider: protocol.ProviderOpenShell, State: string(ledger.StateLive)})
		if len(recs) != reconcileSandboxes || !f.Coordinator.Reachable("node-0") {
			b.Fatalf("after the first sync: %d live records (want %d), complete inventory %v",
				len(recs), reconcileSandboxes, f.Coordinator.Reachable("node-0"))
		}
		b.StartTimer()

		start = time.Now()
		if _, err := f.Coordinator.Sync(ctx); err != nil {
			b.Fatal(err)
		}
		repeat += time.Since(start)
		b.StopTimer()
		if n := len(f.Sandboxes.Ledger().List(ledger.Filter{Node: "node-0", Provider: protocol.ProviderOpenShell})); n != reconcileSandboxes {
			b.Fatalf("after the repeat sync: %d records, want %d", n, reconcileSandboxes)
		}
		cancel()
		b.StartTimer()
	}
	b.ReportMetric(first.Seconds()/float64(b.N), "first-s/sync")
	b.ReportMetric(repeat.Seconds()/float64(b.N), "repeat-s/sync")
	b.ReportMetric(float64(reconcileSandboxes)*float64(b.N)/first.Seconds(), "first-sandboxes/s")
}

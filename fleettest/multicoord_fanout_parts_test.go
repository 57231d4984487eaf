package fleettest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// TestMultiCoordinatorDetachedFanOutTwoNodesOnOther: a detached fan-out
// to three nodes, two of which the coordinator that did not receive the
// request holds (coordinator 0 holds node-0 and node-2, coordinator 1
// node-1). The fan-out's parts are forwarded there under the fan-out's id,
// one per node, and each one runs (it used to be refused "already
// running" for all but the first: the parts were keyed by job id alone).
// The request lands on either coordinator (the micro queue group picks):
// rounds go on until one landed on coordinator 1, which then forwarded
// the two parts, and every round must succeed on every node.
func TestMultiCoordinatorDetachedFanOutTwoNodesOnOther(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Coordinators: 2, Agents: 3, HeartbeatInterval: time.Second, Jobs: true})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	nodes := []string{"node-0", "node-1", "node-2"}
	for i, n := range nodes {
		held := f.Coordinators[i%2].Nodes(protocol.Selector{})
		found := false
		for _, h := range held {
			found = found || h.ID == n
		}
		if !found {
			t.Fatalf("%s is not held by coordinator %d: %+v", n, i%2, held)
		}
	}
	landedOnOne := false
	for round := 0; round < 24 && !landedOnOne; round++ {
		id := fmt.Sprintf("fan-two-%d", round)
		before := forwardedBy(t, f.Registries[1])
		res, err := f.Client.Exec(ctx, &protocol.ExecRequest{ID: id, Target: protocol.Target{All: true}, Detach: true,
			Script: "echo hello-" + id}, nil)
		if err != nil {
			t.Fatalf("round %d: detached fan-out %s: %v", round, id, err)
		}
		// Coordinator 1 forwards two parts when the request landed there,
		// none when it landed on coordinator 0.
		landedOnOne = forwardedBy(t, f.Registries[1])-before >= 2
		if len(res.Results) != 3 {
			t.Fatalf("round %d: job %s: %d results, want 3: %+v", round, id, len(res.Results), res)
		}
		for i, r := range res.Results {
			if r.Node != nodes[i] || !r.Detached || r.Error != "" {
				t.Errorf("round %d (landed on coordinator 1: %v): job %s on %s: detached %v, error %q (code %q); want started",
					round, landedOnOne, id, r.Node, r.Detached, r.Error, r.ErrorCode)
			}
		}
		if t.Failed() {
			t.FailNow()
		}
		rec, err := f.Client.JobWait(ctx, id, 50*time.Millisecond)
		if err != nil {
			t.Fatalf("round %d: job wait %s: %v", round, id, err)
		}
		if rec.State != protocol.JobSucceeded || len(rec.Results) != 3 || rec.Succeeded != 3 {
			t.Errorf("round %d: record of %s: %s, %d results (%d succeeded): %+v; want succeeded on 3", round, id, rec.State, len(rec.Results), rec.Succeeded, rec.Results)
		}
		for _, n := range nodes {
			st, err := f.Client.JobStatus(ctx, n, id)
			if err != nil || st.State != protocol.JobExited || st.ExitCode == nil || *st.ExitCode != 0 {
				t.Errorf("round %d: job status of %s on %s: %+v, %v; want exited 0", round, id, n, st, err)
				continue
			}
			out, err := f.Client.JobOutput(ctx, n, id, "stdout", 0, 0)
			if err != nil || string(out.Data) != "hello-"+id+"\n" {
				t.Errorf("round %d: stdout of %s on %s: %+v, %v", round, id, n, out, err)
			}
		}
	}
	if !landedOnOne {
		t.Fatal("no fan-out request landed on coordinator 1 in 24 rounds (chance 2^-24)")
	}
}

// forwardedBy is the forwarded-requests counter of one coordinator's
// registry.
func forwardedBy(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == "tether_coordinator_forwarded_requests_total" {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

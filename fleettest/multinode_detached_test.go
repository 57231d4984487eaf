package fleettest_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// TestDetachedFanOutEnds: a detached job on both nodes of a fleet (real
// agents, which report their jobs' exits) exits 0 on one node and 3 on
// the other; its record ends failed with both results, JobWait returns
// it, and each node answers job.status by the fan-out's id.
func TestDetachedFanOutEnds(t *testing.T) { testDetachedFanOutEnds(t, 1) }

// TestMultiCoordinatorDetachedFanOutEnds is TestDetachedFanOutEnds with
// the nodes on two coordinators.
func TestMultiCoordinatorDetachedFanOutEnds(t *testing.T) {
	testDetachedFanOutEnds(t, 2)
}

func testDetachedFanOutEnds(t *testing.T, coordinators int) {
	f := fleettest.Start(t, fleettest.Options{Coordinators: coordinators, Agents: 2, HeartbeatInterval: time.Second, Jobs: true})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The node that claims the directory first exits 0, the other 3.
	claim := filepath.Join(t.TempDir(), "claim")
	res, err := f.Client.Exec(ctx, &protocol.ExecRequest{ID: "fan-det", Target: protocol.Target{All: true}, Detach: true,
		Script: "sleep 0.2\nmkdir " + claim + " 2>/dev/null || exit 3"}, nil)
	if err != nil || len(res.Results) != 2 || !res.Results[0].Detached || !res.Results[1].Detached {
		t.Fatalf("detached exec on all: %+v, %v", res, err)
	}
	rec, err := f.Client.JobWait(ctx, "fan-det", 50*time.Millisecond)
	if err != nil {
		t.Fatalf("job wait: %v", err)
	}
	codes := map[string]int{}
	for _, r := range rec.Results {
		codes[r.Node] = r.ExitCode
	}
	if rec.State != protocol.JobFailed || rec.ExitCode() != 1 || len(codes) != 2 || codes["node-0"]+codes["node-1"] != 3 || rec.Succeeded != 1 || rec.Failed != 1 {
		t.Errorf("record %s exit %d, results %v (%d succeeded, %d failed); want failed 1, one node 0 and the other 3", rec.State, rec.ExitCode(), codes, rec.Succeeded, rec.Failed)
	}
	// Each node's job has the fan-out's id, whichever coordinator holds
	// the node.
	for _, node := range []string{"node-0", "node-1"} {
		st, err := f.Client.JobStatus(ctx, node, "fan-det")
		if err != nil || st.State != protocol.JobExited || st.ExitCode == nil || *st.ExitCode != codes[node] {
			t.Errorf("job status of fan-det on %s: %+v, %v; want exited %d", node, st, err, codes[node])
		}
	}
}

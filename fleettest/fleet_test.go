package fleettest_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

func TestFleetExecFanOut(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{
		Agents: 5,
		Labels: func(i int) map[string]string { return map[string]string{"parity": []string{"even", "odd"}[i%2]} },
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var mu sync.Mutex
	out := map[string]*bytes.Buffer{}
	res, err := f.Client.Exec(ctx, &protocol.ExecRequest{
		Target: protocol.Target{Selector: "parity=even"},
		Script: "echo \"$TETHER_TEST_VAR\"\necho err >&2\nexit 3",
		Env:    map[string]string{"TETHER_TEST_VAR": "hello"},
	}, func(node, stream string, data []byte) {
		mu.Lock()
		defer mu.Unlock()
		k := node + "/" + stream
		if out[k] == nil {
			out[k] = new(bytes.Buffer)
		}
		out[k].Write(data)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Results) != 3 {
		t.Fatalf("got %d results, want 3 (nodes 0, 2, 4): %+v", len(res.Results), res.Results)
	}
	for i, r := range res.Results {
		node := fmt.Sprintf("node-%d", 2*i)
		if r.Node != node || r.ExitCode != 3 || r.Error != "" {
			t.Errorf("result %d = %+v, want node %s exit 3", i, r, node)
		}
		if got := out[node+"/stdout"].String(); got != "hello\n" {
			t.Errorf("%s stdout = %q", node, got)
		}
		if got := out[node+"/stderr"].String(); got != "err\n" {
			t.Errorf("%s stderr = %q", node, got)
		}
	}
}

func TestFleetAgentReconnects(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Agents: 2})
	nodes := f.Coordinator.Nodes(protocol.Selector{})
	if len(nodes) != 2 || nodes[0].ID != "node-0" || nodes[1].ID != "node-1" {
		t.Fatalf("nodes = %+v", nodes)
	}
	if nodes[0].Capacity.CPUs != 2 || nodes[0].AgentVersion != "fleettest" {
		t.Fatalf("hello not reflected in registry: %+v", nodes[0])
	}
}

func TestFleetAgentsInChildProcesses(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{Agents: 4, Processes: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	pids := map[string]string{}
	res, err := f.Client.Exec(ctx, &protocol.ExecRequest{Target: protocol.Target{All: true}, Script: "echo $PPID"},
		func(node, stream string, data []byte) {
			mu.Lock()
			pids[node] += string(data)
			mu.Unlock()
		})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Results) != 4 {
		t.Fatalf("got %d results, want 4: %+v", len(res.Results), res.Results)
	}
	// Each child process hosts two agents: their jobs have two distinct
	// parents, neither of which is this test process.
	distinct := map[string]bool{}
	for _, p := range pids {
		distinct[p] = true
	}
	if len(distinct) != 2 || distinct[fmt.Sprintf("%d\n", os.Getpid())] {
		t.Fatalf("job parents %v: want two agent host processes, not this one (%d)", pids, os.Getpid())
	}
}

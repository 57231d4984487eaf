package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// TestJobJSONIsTheRecord: every `job` subcommand's --json prints the job
// record (protocol.JobRecord: the job-state vocabulary of the README's
// table, nodes[], results[]), as `job wait --json` and `job list --json`
// do. Fresh-user pass 17: `job status --json` and `job cancel --json`
// printed the node's status instead ("state":"exited", a "node" and no
// "results") while the text said "state: failed".
func TestJobJSONIsTheRecord(t *testing.T) {
	f := startFleet(t, fleettest.Options{Agents: 2, Jobs: true})
	url := f.NATS.ClientURL()
	ctx := testCtx(t)
	record := func(what string, r result) (*protocol.JobRecord, map[string]any) {
		t.Helper()
		var rec protocol.JobRecord
		var m map[string]any
		// One JSON document (json.Unmarshal refuses a second).
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rec) != nil || json.Unmarshal([]byte(r.stdout), &m) != nil {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q; want one JSON record", what, r.code, r.stdout, r.stderr)
		}
		if _, ok := m["node"]; ok {
			t.Errorf("%s: %s has a node key: the node's status, not the record", what, r.stdout)
		}
		if len(rec.Nodes) == 0 {
			t.Errorf("%s: no nodes", what)
		}
		return &rec, m
	}

	r := runCLI(ctx, nil, "", "exec", "--nats-url", url, "--node", "node-0", "--detach", "--", "sh", "-c", "exit 5")
	id := strings.TrimSpace(r.stdout)
	if r.code != 0 || id == "" {
		t.Fatalf("exec --detach: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = runCLI(ctx, nil, "", "job", "wait", "--nats-url", url, "--poll", "50ms", "--json", id)
	r.code = map[int]int{5: 0}[r.code] // it exits 5, the job's code
	waited, _ := record("job wait --json", r)
	for _, args := range [][]string{{}, {"--node", "node-0"}} {
		what := "job status --json " + strings.Join(args, " ")
		rec, _ := record(what, runCLI(ctx, nil, "", append(append([]string{"job", "status", "--nats-url", url, "--json"}, args...), id)...))
		if rec.State != protocol.JobFailed || waited.State != protocol.JobFailed || len(rec.Results) != 1 || rec.Results[0].ExitCode != 5 || rec.ID != id {
			t.Errorf("%s: state %q (wait: %q), results %+v; want failed, exit 5", what, rec.State, waited.State, rec.Results)
		}
	}

	r = runCLI(ctx, nil, "", "exec", "--nats-url", url, "--node", "node-0", "--detach", "--", "sleep", "60")
	id = strings.TrimSpace(r.stdout)
	rec, _ := record("job status --json of a running job", runCLI(ctx, nil, "", "job", "status", "--nats-url", url, "--json", id))
	if rec.State != protocol.JobStateRunning || len(rec.Results) != 0 {
		t.Errorf("job status --json of a running job: state %q, results %+v; want running, none", rec.State, rec.Results)
	}
	rec, _ = record("job cancel --json", runCLI(ctx, nil, "", "job", "cancel", "--nats-url", url, "--json", id))
	if rec.State != protocol.JobCancelled || len(rec.Results) != 1 || !rec.Results[0].Cancelled {
		t.Errorf("job cancel --json: state %q, results %+v; want cancelled", rec.State, rec.Results)
	}
	// Once more: it had ended; the record still.
	rec, _ = record("job cancel --json of an ended job", runCLI(ctx, nil, "", "job", "cancel", "--nats-url", url, "--node", "node-0", "--json", id))
	if rec.State != protocol.JobCancelled {
		t.Errorf("job cancel --json of an ended job: state %q, want cancelled", rec.State)
	}
	rec, _ = record("job status --json of a cancelled job", runCLI(ctx, nil, "", "job", "status", "--nats-url", url, "--node", "node-0", "--json", id))
	if rec.State != protocol.JobCancelled {
		t.Errorf("job status --json of a cancelled job: state %q, want cancelled", rec.State)
	}

	// A fan-out's cancel: one record, every node's result.
	r = runCLI(ctx, nil, "", "exec", "--nats-url", url, "--all", "--detach", "--", "sleep", "60")
	id = strings.TrimSpace(r.stdout)
	rec, _ = record("job cancel --json of a fan-out", runCLI(ctx, nil, "", "job", "cancel", "--nats-url", url, "--json", id))
	if rec.State != protocol.JobCancelled || len(rec.Nodes) != 2 || len(rec.Results) != 2 {
		t.Errorf("job cancel --json of a fan-out: state %q, nodes %v, results %+v; want cancelled, 2 results", rec.State, rec.Nodes, rec.Results)
	}
}

// TestExecDetachJSONSaysStarted: `exec --detach --json` says each node's
// run started and is running: "state": "running", no exit code (it has not
// exited), and the result counts "started" nodes, not "succeeded" ones.
// Fresh-user pass 17: it printed "exit_code": 0 and "succeeded": 1 for a
// job that had only started.
func TestExecDetachJSONSaysStarted(t *testing.T) {
	f := startFleet(t, fleettest.Options{Agents: 1, Jobs: true})
	url := f.NATS.ClientURL()
	ctx := testCtx(t)
	r := runCLI(ctx, nil, "", "exec", "--nats-url", url, "--node", "node-0", "--detach", "--json", "--", "sleep", "60")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 2 {
		t.Fatalf("exec --detach --json: exit %d, stdout %q, stderr %q; want a node_result line and the result", r.code, r.stdout, r.stderr)
	}
	var nr struct {
		NodeResult map[string]any `json:"node_result"`
	}
	var res map[string]any
	if json.Unmarshal([]byte(lines[0]), &nr) != nil || json.Unmarshal([]byte(lines[1]), &res) != nil || nr.NodeResult == nil {
		t.Fatalf("exec --detach --json: stdout %q", r.stdout)
	}
	started := func(what string, m map[string]any) {
		if _, ok := m["exit_code"]; ok || m["state"] != "running" || m["detached"] != true || m["node"] != "node-0" {
			t.Errorf("%s: %v; want node-0, state running, detached, no exit_code", what, m)
		}
	}
	started("node_result", nr.NodeResult)
	if _, ok := res["succeeded"]; ok || res["started"] != float64(1) || res["failed"] != float64(0) || res["nodes"] != float64(1) || res["id"] == "" {
		t.Errorf("result: %v; want id, nodes 1, started 1, failed 0, no succeeded", res)
	}
	if rs, _ := res["results"].([]any); len(rs) != 1 {
		t.Errorf("result: results %v, want one", res["results"])
	} else {
		m, _ := rs[0].(map[string]any)
		started("result's results[0]", m)
	}
	id, _ := res["id"].(string)
	runCLI(ctx, nil, "", "job", "cancel", "--nats-url", url, id)
}

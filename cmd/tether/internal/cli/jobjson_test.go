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
		if r.code != 0 || strings.Count(strings.TrimSpace(r.stdout), "\n") != 0 ||
			json.Unmarshal([]byte(r.stdout), &rec) != nil || json.Unmarshal([]byte(r.stdout), &m) != nil {
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

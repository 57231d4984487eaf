package cli

import (
	"strings"
	"testing"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// TestPrintJobRecordNodeResults: `job status` of a detached job on
// several nodes shows each node's result, or that it still runs.
func TestPrintJobRecordNodeResults(t *testing.T) {
	rec := &protocol.JobRecord{ID: "fan", State: protocol.JobStateRunning, Nodes: []string{"n1", "n2", "n3"}, Detached: true,
		Results: []protocol.NodeResult{
			{Node: "n1", ExitCode: 0, Detached: true},
			{Node: "n2", ExitCode: 3, Detached: true},
		}}
	var b strings.Builder
	if err := printJobRecord(&b, rec, false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"node:      n1 exit 0, stdout 0 bytes, stderr 0 bytes\n", "node:      n2 exit 3, stdout 0 bytes, stderr 0 bytes\n", "node:      n3 running\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("job status of a running fan-out:\n%s\nwant %q in it", b.String(), want)
		}
	}
	rec.State, rec.Failed, rec.Succeeded = protocol.JobFailed, 2, 1
	rec.Results = append(rec.Results, protocol.NodeResult{Node: "n3", ExitCode: -1, Error: "node n3 lost the job", ErrorCode: protocol.ResultCodeLost})
	b.Reset()
	if err := printJobRecord(&b, rec, false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"exit:      1\n", "node:      n2 exit 3, stdout", "node:      n3 exit 255: node n3 lost the job, stdout 0 bytes, stderr 0 bytes\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("job status of a failed fan-out:\n%s\nwant %q in it", b.String(), want)
		}
	}
	if err := jobRecordOutcome(rec); err == nil {
		t.Errorf("job wait of a failed fan-out: no error, want exit 1")
	} else if ee, ok := err.(*exitError); !ok || ee.code != 1 {
		t.Errorf("job wait of a failed fan-out: %v, want exit 1", err)
	}
}

// tether job status ID of a detached job on several nodes prints its
// record, a node: line each, without --node (fresh-user pass: it was a
// usage error, "ran on 3 nodes; give --node", though exec's own hint
// points at it).
func TestJobStatusOfFanOutWithoutNode(t *testing.T) {
	f := startFleet(t, fleettest.Options{Agents: 2, Jobs: true})
	url := f.NATS.ClientURL()
	ctx := testCtx(t)
	r := runCLI(ctx, nil, "", "exec", "--nats-url", url, "--all", "--detach", "--", "sh", "-c", "exit 3")
	id := strings.TrimSpace(r.stdout)
	if r.code != 0 || id == "" || strings.Contains(id, "\n") {
		t.Fatalf("exec --all --detach: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r = runCLI(ctx, nil, "", "job", "wait", "--nats-url", url, id); r.code != 1 {
		t.Fatalf("job wait: exit %d (stderr %q), want 1 (a node failed)", r.code, r.stderr)
	}
	r = runCLI(ctx, nil, "", "job", "status", "--nats-url", url, id)
	if r.code != 0 {
		t.Fatalf("job status: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, want := range []string{"node:      node-0 exit 3, stdout 0 bytes, stderr 0 bytes\n", "node:      node-1 exit 3, stdout 0 bytes, stderr 0 bytes\n"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("job status lacks %q:\n%s", want, r.stdout)
		}
	}
}

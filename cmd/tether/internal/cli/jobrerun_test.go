package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// TestJobWaitFollowsRerun: `job wait` on a lost idempotent job follows
// its re-run to its final state, also when the re-run is claimed only
// after the wait read the lost record; a job that is not idempotent, or
// whose re-run was refused, ends lost.
func TestJobWaitFollowsRerun(t *testing.T) {
	lost := &protocol.JobRecord{ID: "j", State: protocol.JobStateLost, Detached: true, Idempotent: true, Nodes: []string{"n1"}, Attempt: 1}
	claimed := *lost
	claimed.RerunAs = "j.2"
	done := &protocol.JobRecord{ID: "j.2", State: protocol.JobSucceeded, Detached: true, Idempotent: true, Nodes: []string{"n1"}, Attempt: 2, RerunOf: "j",
		Results: []protocol.NodeResult{{Node: "n1"}}}
	gets := 0
	get := func(_ context.Context, id string) (*protocol.JobRecord, error) {
		gets++
		if gets < 2 {
			return lost, nil
		}
		return &claimed, nil
	}
	wait := func(_ context.Context, id string) (*protocol.JobRecord, error) {
		if id != "j.2" {
			t.Fatalf("waited for %s", id)
		}
		return done, nil
	}
	var stderr bytes.Buffer
	rec, err := followReruns(context.Background(), lost, get, wait, time.Millisecond, &stderr)
	if err != nil || rec.ID != "j.2" || rec.State != protocol.JobSucceeded {
		t.Fatalf("followed to %+v %v, want j.2 succeeded", rec, err)
	}
	if !strings.Contains(stderr.String(), "following its re-run j.2") {
		t.Errorf("stderr %q", stderr.String())
	}

	refused := *lost
	refused.NoRerun = "re-run as j.2 refused (403): nats:alice may not exec on n1"
	if rec, _ := followReruns(context.Background(), &refused, get, wait, time.Millisecond, &stderr); rec.ID != "j" {
		t.Errorf("a refused re-run was followed to %s", rec.ID)
	}
	plain := *lost
	plain.Idempotent = false
	if rec, _ := followReruns(context.Background(), &plain, get, wait, time.Millisecond, &stderr); rec.ID != "j" {
		t.Errorf("a plain job was followed to %s", rec.ID)
	}
	var out bytes.Buffer
	printJobView(&out, done, nil, "")
	if !strings.Contains(out.String(), "attempt:   2 of 3, re-runs j") {
		t.Errorf("job status:\n%s", out.String())
	}
}

package jobstore_test

import (
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/protocol"
)

// TestApplyStatus: a reader's refresh of a record it read (tether job
// status, cancel) follows Observe's rules without writing: a node's end
// ends a one-node job with that node's result and word; a job on several
// nodes ends once every node has a result; a terminal record, a foreign
// node and an unknown state change nothing.
func TestApplyStatus(t *testing.T) {
	start := time.Date(2026, 12, 6, 1, 0, 0, 0, time.UTC)
	end := start.Add(2 * time.Second)
	now := start.Add(time.Hour)
	code := func(n int) *int { return &n }
	exited := func(node string, c int, cancelled bool) *protocol.JobStatus {
		return &protocol.JobStatus{ID: "j", Node: node, State: protocol.JobExited, ExitCode: code(c), Cancelled: cancelled, StartedAt: start, FinishedAt: &end}
	}
	one := func() *protocol.JobRecord {
		return &protocol.JobRecord{ID: "j", State: protocol.JobStateRunning, Nodes: []string{"n1"}, Detached: true, StartedAt: start}
	}

	r := one()
	if !jobstore.ApplyStatus(r, exited("n1", 143, true), now) || r.State != protocol.JobCancelled || len(r.Results) != 1 || r.Results[0].ExitCode != 143 || !r.FinishedAt.Equal(end) {
		t.Errorf("a cancelled node's end: %+v", r)
	}
	if jobstore.ApplyStatus(r, exited("n1", 0, false), now) || r.State != protocol.JobCancelled {
		t.Errorf("a terminal record changed: %+v", r)
	}

	r = one()
	if !jobstore.ApplyStatus(r, &protocol.JobStatus{ID: "j", Node: "n1", State: protocol.JobLost, StartedAt: start}, now) ||
		r.State != protocol.JobStateLost || !strings.Contains(r.Error, "node n1 lost the job") || !r.FinishedAt.Equal(now) {
		t.Errorf("a lost node: %+v", r)
	}

	r = one()
	for _, st := range []*protocol.JobStatus{
		{ID: "j", Node: "n1", State: protocol.JobRunning, StartedAt: start}, // already running
		exited("n9", 0, false), // not the job's node
		{ID: "j", Node: "n1", State: "paused", StartedAt: start}, // unknown state
	} {
		if jobstore.ApplyStatus(r, st, now) {
			t.Errorf("status %+v changed the record: %+v", st, r)
		}
	}
	if r.State != protocol.JobStateRunning || len(r.Results) != 0 {
		t.Errorf("record after no-op statuses: %+v", r)
	}

	fan := &protocol.JobRecord{ID: "j", State: protocol.JobDispatched, Nodes: []string{"n1", "n2"}, Detached: true}
	if !jobstore.ApplyStatus(fan, &protocol.JobStatus{ID: "j", Node: "n2", State: protocol.JobRunning, StartedAt: start}, now) || fan.State != protocol.JobStateRunning {
		t.Errorf("a fan-out's first running node: %+v", fan)
	}
	if !jobstore.ApplyStatus(fan, exited("n2", 0, false), now) || fan.State != protocol.JobStateRunning || len(fan.Results) != 1 {
		t.Errorf("a fan-out's first end: %+v", fan)
	}
	if !jobstore.ApplyStatus(fan, exited("n1", 3, false), now) || fan.State != protocol.JobFailed || fan.Succeeded != 1 || fan.Failed != 1 ||
		len(fan.Results) != 2 || fan.Results[0].Node != "n1" || !fan.FinishedAt.Equal(end) {
		t.Errorf("a fan-out's last end: %+v", fan)
	}
}

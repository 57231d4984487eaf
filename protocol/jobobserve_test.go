package protocol

import (
	"strings"
	"testing"
	"time"
)

// TestObserveJob: the rule of a node's word on a detached job's record
// (the job store's and the CLI's): a one-node job keeps the start it has
// and ends with the node's result; a fan-out lowers its start to its
// earliest node's and ends once every node has a result; an end is never
// before the start; a terminal record, a repeat, a foreign node and an
// unknown state change nothing (the last two are errors).
func TestObserveJob(t *testing.T) {
	start := time.Date(2026, 12, 6, 1, 0, 0, 0, time.UTC) // the node's clock
	recorded := start.Add(9 * time.Millisecond)           // the coordinator's
	now := start.Add(time.Hour)
	code := func(n int) *int { return &n }
	exited := func(node string, c int, after time.Duration) *JobStatus {
		fin := start.Add(after)
		return &JobStatus{ID: "j", Node: node, State: JobExited, ExitCode: code(c), StartedAt: start, FinishedAt: &fin}
	}
	one := func() *JobRecord {
		return &JobRecord{ID: "j", State: JobStateRunning, Nodes: []string{"n1"}, Detached: true, StartedAt: recorded}
	}

	r := one()
	if ok, err := ObserveJob(r, exited("n1", 1, 5*time.Millisecond), now); !ok || err != nil {
		t.Fatalf("a failed node's end = %v, %v", ok, err)
	}
	if r.State != JobFailed || r.Failed != 1 || len(r.Results) != 1 || r.Results[0].DurationMS != 5 || !r.StartedAt.Equal(recorded) || !r.FinishedAt.Equal(recorded) {
		t.Errorf("a one-node job that failed in 5 ms, its start recorded 9 ms late: %+v; want failed, started and finished at the recorded start", r)
	}
	if ok, err := ObserveJob(r, exited("n1", 0, time.Second), now); ok || err != nil || r.State != JobFailed {
		t.Errorf("a terminal record: %v, %v, %+v", ok, err, r)
	}

	r = one()
	if ok, _ := ObserveJob(r, &JobStatus{ID: "j", Node: "n1", State: JobRunning, StartedAt: start}, now); ok || !r.StartedAt.Equal(recorded) {
		t.Errorf("running, recorded running: %v, %+v", ok, r)
	}
	if ok, _ := ObserveJob(r, &JobStatus{ID: "j", State: JobLost, StartedAt: start}, now); !ok || r.State != JobStateLost || r.Error != JobLostError("n1") || !r.FinishedAt.Equal(now) || r.Results != nil {
		t.Errorf("lost (no node named: the job's one): %v, %+v", ok, r)
	}

	r = one()
	r.StartedAt = time.Time{}
	r.State = JobDispatched
	if ok, _ := ObserveJob(r, exited("n1", 0, time.Second), start.Add(-time.Hour)); !ok || r.State != JobSucceeded || !r.StartedAt.Equal(start) || !r.FinishedAt.Equal(start.Add(time.Second)) {
		t.Errorf("an end before the start was recorded: %v, %+v; want the node's start and end", ok, r)
	}

	r = one()
	for _, st := range []*JobStatus{exited("n9", 0, 0), {ID: "j", Node: "n1", State: "paused"}} {
		if ok, err := ObserveJob(r, st, now); ok || err == nil || !strings.Contains(err.Error(), st.State) && !strings.Contains(err.Error(), "n9") {
			t.Errorf("status %+v: %v, %v; want an error naming it", st, ok, err)
		}
	}
	if r.State != JobStateRunning || r.Results != nil {
		t.Errorf("record after refused statuses: %+v", r)
	}

	fan := &JobRecord{ID: "j", State: JobDispatched, Nodes: []string{"n1", "n2"}, Detached: true}
	if ok, _ := ObserveJob(fan, &JobStatus{ID: "j", Node: "n2", State: JobRunning, StartedAt: recorded}, now); !ok || fan.State != JobStateRunning || !fan.StartedAt.Equal(recorded) {
		t.Errorf("a fan-out's first running node: %+v", fan)
	}
	if ok, _ := ObserveJob(fan, exited("n2", 0, time.Second), now); !ok || fan.State != JobStateRunning || len(fan.Results) != 1 || !fan.StartedAt.Equal(start) {
		t.Errorf("a fan-out's first end: %+v; want running, started at the node's earlier start", fan)
	}
	if ok, _ := ObserveJob(fan, exited("n2", 1, time.Second), now); ok {
		t.Errorf("a repeat of a node's end changed the record: %+v", fan)
	}
	if ok, _ := ObserveJob(fan, exited("n1", 3, 2*time.Second), now); !ok || fan.State != JobFailed || fan.Succeeded != 1 || fan.Failed != 1 ||
		len(fan.Results) != 2 || fan.Results[0].Node != "n1" || !fan.FinishedAt.Equal(start.Add(2*time.Second)) {
		t.Errorf("a fan-out's last end: %+v", fan)
	}

	fan = &JobRecord{ID: "j", State: JobStateRunning, Nodes: []string{"n1", "n2"}, Detached: true, StartedAt: recorded}
	if !AddJobResult(fan, JobLostResult("n1", "gone"), now) || AddJobResult(fan, JobLostResult("n9", "gone"), now) ||
		!AddJobResult(fan, JobLostResult("n2", "gone"), recorded.Add(-time.Second)) {
		t.Fatalf("lost results: %+v", fan)
	}
	if fan.State != JobStateLost || fan.Error != "every node lost the job" || !fan.FinishedAt.Equal(recorded) {
		t.Errorf("every node lost, the last stamped before the start: %+v; want lost, finished at the start", fan)
	}
}

// TestJobExitResult: a timeout's kill that exited 0 reads 124, and
// either stream's truncation marks the result truncated.
func TestJobExitResult(t *testing.T) {
	zero := 0
	res := JobExitResult(&JobStatus{Node: "n1", State: JobExited, ExitCode: &zero, TimedOut: true, StderrTruncated: true})
	if res.ExitCode != 124 || !res.Truncated || res.OK() || !res.Detached {
		t.Errorf("result %+v", res)
	}
	if res := JobExitResult(&JobStatus{Node: "n1", State: JobExited}); res.ExitCode != -1 {
		t.Errorf("no exit code: %+v; want -1", res)
	}
}

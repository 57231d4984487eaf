package cli

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/natsauth/natsauthtest"
	"github.com/tetherfleet/tether/protocol"
)

// TestApplyStatus: `job status --json`'s refresh of a detached job's
// record that lags its nodes (refreshRecord; applyStatus before) makes of
// a node's status the record the job store makes of it (Observe), so that
// job status --json and job wait or job list, which read the store's
// record once the node's report reached it, tell one story. The CLI had
// its own copy of the rule and lowered a one-node job's started_at to the
// node's start, where the store keeps its own (stamped when the node
// confirmed the start, some milliseconds later); and the store recorded a
// job that failed at once as finished (the node's clock) before it
// started (the coordinator's).
func TestApplyStatus(t *testing.T) {
	env := natsauthtest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Date(2026, 12, 6, 1, 0, 0, 0, time.UTC) // the node's clock
	var mu sync.Mutex
	clock := start
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	setClock := func(t time.Time) { mu.Lock(); defer mu.Unlock(); clock = t }
	s, err := jobstore.Open(ctx, jobstore.Config{NATS: env.Coordinator(t), Coordinator: "c1", Now: now})
	if err != nil {
		t.Fatal(err)
	}
	code := func(n int) *int { return &n }
	exited := func(node string, c int, after time.Duration) *protocol.JobStatus {
		fin := start.Add(after)
		return &protocol.JobStatus{ID: "j", Node: node, State: protocol.JobExited, ExitCode: code(c), StartedAt: start, FinishedAt: &fin, StdoutBytes: 3}
	}
	lost := func(node string) *protocol.JobStatus {
		return &protocol.JobStatus{ID: "j", Node: node, State: protocol.JobLost, StartedAt: start}
	}
	for i, tc := range []struct {
		name  string
		nodes []string
		sts   []*protocol.JobStatus // the last is the one compared
	}{
		{"fails at once", []string{"n1"}, []*protocol.JobStatus{exited("n1", 1, 5*time.Millisecond)}},
		{"succeeds", []string{"n1"}, []*protocol.JobStatus{exited("n1", 0, time.Second)}},
		{"cancelled", []string{"n1"}, []*protocol.JobStatus{func() *protocol.JobStatus {
			st := exited("n1", 143, time.Second)
			st.Signal, st.Cancelled = "TERM", true
			return st
		}()}},
		{"timed out", []string{"n1"}, []*protocol.JobStatus{func() *protocol.JobStatus {
			st := exited("n1", 0, time.Second)
			st.TimedOut, st.StdoutTruncated = true, true
			return st
		}()}},
		{"lost", []string{"n1"}, []*protocol.JobStatus{lost("n1")}},
		{"running", []string{"n1"}, []*protocol.JobStatus{{ID: "j", Node: "n1", State: protocol.JobRunning, StartedAt: start}}},
		{"fan-out's first end", []string{"n1", "n2"}, []*protocol.JobStatus{exited("n2", 0, time.Second)}},
		{"fan-out's last end", []string{"n1", "n2"}, []*protocol.JobStatus{exited("n2", 0, time.Second), exited("n1", 3, 5*time.Millisecond)}},
		{"fan-out lost", []string{"n1", "n2"}, []*protocol.JobStatus{lost("n2"), lost("n1")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "j" + string(rune('a'+i))
			setClock(start.Add(-time.Second))
			j, err := s.Submit(ctx, jobstore.Submission{ID: id, Nodes: tc.nodes, Detached: true, DispatchNow: true})
			if err != nil {
				t.Fatal(err)
			}
			setClock(start.Add(9 * time.Millisecond)) // the node confirmed the start
			if err := s.Start(ctx, j); err != nil {
				t.Fatal(err)
			}
			setClock(start.Add(2 * time.Second))
			for _, st := range tc.sts[:len(tc.sts)-1] {
				st.ID = id
				if _, err := s.Observe(ctx, j, st); err != nil {
					t.Fatal(err)
				}
			}
			st := tc.sts[len(tc.sts)-1]
			st.ID = id
			lag, err := s.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			cli := refreshRecord(id, &lag.Record, start.Add(2*time.Second), st)
			if _, err := s.Observe(ctx, lag, st); err != nil {
				t.Fatal(err)
			}
			stored, err := s.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(&stored.Record, cli); diff != "" {
				t.Errorf("the CLI's refresh of the record (+) is not the store's (-):\n%s", diff)
			}
			if r := stored.Record; !r.FinishedAt.IsZero() && r.FinishedAt.Before(r.StartedAt) {
				t.Errorf("the store's record finished at %v, before it started at %v", r.FinishedAt, r.StartedAt)
			}
		})
	}
}

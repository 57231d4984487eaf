package coordinator_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/protocol"
)

// reportingAgent is detachedAgent (its status op answers running, and
// counts its job streams in queries) that lists FeatureJobExit.
func reportingAgent(id string, queries *atomic.Int32) agentOpts {
	o := detachedAgent(nil)
	inner := o.stream
	o.stream = func(a *fakeAgent, st *yamux.Stream, h protocol.Header) {
		if h.Kind == protocol.KindJob {
			queries.Add(1)
		}
		inner(a, st, h)
	}
	o.id = id
	o.features = []string{protocol.FeatureJobExit}
	return o
}

// recordState reads job id's record straight from the store (no node is
// asked).
func recordState(t *testing.T, s *jobstore.Store, id string) *jobstore.Job {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	j, err := s.Get(ctx, id)
	if err != nil {
		t.Fatalf("job %s: %v", id, err)
	}
	return j
}

// stateOf is job id's state in the store, "" while it has no record.
func stateOf(s *jobstore.Store, id string) protocol.JobState {
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	j, err := s.Get(ctx, id)
	if err != nil {
		return ""
	}
	return j.State
}

func exitReport(id string, code int) *protocol.JobStatus {
	now := time.Now().UTC()
	return &protocol.JobStatus{ID: id, Node: "whatever", State: protocol.JobExited, ExitCode: intp(code),
		StartedAt: now.Add(-time.Second), FinishedAt: &now, StdoutBytes: 12}
}

// TestJobExitReportSettlesRecord: a coordinator with a job store lists
// FeatureJobExit in its Welcome, and an agent's exit report settles the
// job's record at once (job.list shows it ended) without anyone asking
// the node; the node in the result is the session's, not the payload's.
func TestJobExitReportSettlesRecord(t *testing.T) {
	var st *jobstore.Store
	h := newHarness(t, withStore(t, &st, nil))
	var queries atomic.Int32
	a := h.dialAgent(t, reportingAgent("n1", &queries))
	if a.welcome == nil || !a.welcome.HasFeature(protocol.FeatureJobExit) {
		t.Fatalf("welcome %+v does not list %s", a.welcome, protocol.FeatureJobExit)
	}
	for _, tc := range []struct {
		id   string
		st   *protocol.JobStatus
		want protocol.JobState
	}{
		{"ok", exitReport("ok", 0), protocol.JobSucceeded},
		{"bad", exitReport("bad", 3), protocol.JobFailed},
		{"gone", &protocol.JobStatus{ID: "gone", State: protocol.JobLost, StartedAt: time.Now()}, protocol.JobStateLost},
	} {
		if r := h.exec(protocol.ExecRequest{ID: tc.id, Target: protocol.Target{Node: "n1"}, Script: "sleep 100", Detach: true}); r.err != nil {
			t.Fatal(r.err)
		}
		checkFor(t, defaultTestTimeout, func() error {
			if s := stateOf(st, tc.id); s != protocol.JobStateRunning {
				return fmt.Errorf("job %s %s, want running", tc.id, s)
			}
			return nil
		})
		if err := protocol.WriteJSONFrame(a.ctrl, protocol.FrameJobExit, tc.st); err != nil {
			t.Fatal(err)
		}
		checkFor(t, defaultTestTimeout, func() error {
			if ids := jobList(t, h.client, protocol.JobListRequest{State: tc.want}); !slices.Contains(ids, tc.id) {
				return fmt.Errorf("job.list --state %s = %v, want %s in it", tc.want, ids, tc.id)
			}
			return nil
		})
	}
	if q := queries.Load(); q != 0 {
		t.Errorf("the node was asked %d times; the report alone must settle the record", q)
	}
	j := recordState(t, st, "bad")
	if len(j.Results) != 1 || j.Results[0].Node != "n1" || j.Results[0].ExitCode != 3 || j.Results[0].StdoutBytes != 12 {
		t.Errorf("record results %+v, want n1's exit 3", j.Results)
	}
	// A repeat changes nothing.
	if err := protocol.WriteJSONFrame(a.ctrl, protocol.FrameJobExit, exitReport("bad", 0)); err != nil {
		t.Fatal(err)
	}
	checkFor(t, defaultTestTimeout, func() error {
		if n := h.metric("tether_coordinator_job_exit_reports_total", "result", "unchanged"); n < 1 {
			return fmt.Errorf("%v unchanged reports", n)
		}
		return nil
	})
	if j := recordState(t, st, "bad"); j.State != protocol.JobFailed || j.ExitCode() != 3 {
		t.Errorf("after a repeated report: %s exit %d, want failed 3", j.State, j.ExitCode())
	}
	if n := h.metric("tether_coordinator_job_exit_reports_total", "result", "settled"); n != 3 {
		t.Errorf("settled reports = %v, want 3", n)
	}
}

// TestJobExitReportForeignJob (attack): an agent reports another node's
// detached job as ended, naming that node in the payload, and an
// attached job of its own: neither record changes. Malformed reports (bad
// JSON, an unknown state, an id that is no job id) are counted and
// dropped without ending the session, which settles its own job after.
func TestJobExitReportForeignJob(t *testing.T) {
	var st *jobstore.Store
	h := newHarness(t, withStore(t, &st, nil))
	var queries atomic.Int32
	h.dialAgent(t, reportingAgent("n1", &queries))
	mallory := h.dialAgent(t, reportingAgent("n2", &queries))
	if r := h.exec(protocol.ExecRequest{ID: "victim", Target: protocol.Target{Node: "n1"}, Script: "sleep 100", Detach: true}); r.err != nil {
		t.Fatal(r.err)
	}
	if r := h.exec(protocol.ExecRequest{ID: "mine", Target: protocol.Target{Node: "n2"}, Script: "sleep 100", Detach: true}); r.err != nil {
		t.Fatal(r.err)
	}
	checkFor(t, defaultTestTimeout, func() error {
		for _, id := range []string{"victim", "mine"} {
			if s := stateOf(st, id); s != protocol.JobStateRunning {
				return fmt.Errorf("job %s %s, want running", id, s)
			}
		}
		return nil
	})

	forged := exitReport("victim", 0)
	forged.Node = "n1"
	for _, p := range [][]byte{
		mustJSON(t, forged),
		[]byte(`{"id":"mine","state":`),
		[]byte(`{"id":"mine","state":"succeeded","exit_code":0}`),
		[]byte(`{"id":"../mine","state":"exited","exit_code":0}`),
		[]byte(`{"id":"mine","state":"running"}`),
	} {
		if err := protocol.WriteFrame(mallory.ctrl, protocol.FrameJobExit, p); err != nil {
			t.Fatal(err)
		}
	}
	checkFor(t, defaultTestTimeout, func() error {
		f := h.metric("tether_coordinator_job_exit_reports_total", "result", "foreign")
		m := h.metric("tether_coordinator_job_exit_reports_total", "result", "malformed")
		if f != 1 || m != 4 {
			return fmt.Errorf("foreign %v, malformed %v; want 1 and 4", f, m)
		}
		return nil
	})
	if j := recordState(t, st, "victim"); j.State != protocol.JobStateRunning {
		t.Fatalf("n1's job settled by n2's report: %+v", j.Record)
	}
	// The session survived and still settles its own node's job.
	if err := protocol.WriteJSONFrame(mallory.ctrl, protocol.FrameJobExit, exitReport("mine", 0)); err != nil {
		t.Fatal(err)
	}
	checkFor(t, defaultTestTimeout, func() error {
		if s := stateOf(st, "mine"); s != protocol.JobSucceeded {
			return fmt.Errorf("n2's own job %s, want succeeded", s)
		}
		return nil
	})
	if j := recordState(t, st, "victim"); j.State != protocol.JobStateRunning {
		t.Fatalf("n1's job after n2's reports: %+v", j.Record)
	}
}

// TestJobExitReportAttachedJob (attack): an attached job of the reporting
// node is not settled by a report (it is its coordinator's to end).
func TestJobExitReportAttachedJob(t *testing.T) {
	var st *jobstore.Store
	h := newHarness(t, withStore(t, &st, nil))
	o := agentOpts{id: "n1", features: []string{protocol.FeatureJobExit}}
	a := h.dialAgent(t, o)
	ch := h.execAsync(protocol.ExecRequest{ID: "att", Target: protocol.Target{Node: "n1"}, Argv: []string{"hang"}})
	checkFor(t, defaultTestTimeout, func() error {
		if s := stateOf(st, "att"); s != protocol.JobStateRunning {
			return fmt.Errorf("job att %s, want running", s)
		}
		return nil
	})
	if err := protocol.WriteJSONFrame(a.ctrl, protocol.FrameJobExit, exitReport("att", 0)); err != nil {
		t.Fatal(err)
	}
	checkFor(t, defaultTestTimeout, func() error {
		if f := h.metric("tether_coordinator_job_exit_reports_total", "result", "foreign"); f != 1 {
			return fmt.Errorf("foreign %v, want 1", f)
		}
		return nil
	})
	if s := recordState(t, st, "att").State; s != protocol.JobStateRunning {
		t.Errorf("attached job settled by a report: %s", s)
	}
	h.request(protocol.SubjectCancel, protocol.CancelRequest{ID: "att"})
	<-ch
}

// TestJobExitNotOfferedWithoutStore: a coordinator that keeps no job
// records does not list FeatureJobExit, so agents keep their reports for
// one that does.
func TestJobExitNotOfferedWithoutStore(t *testing.T) {
	h := newHarness(t, nil)
	a := h.dialAgent(t, agentOpts{id: "n1", features: []string{protocol.FeatureJobExit}})
	if a.welcome == nil || a.welcome.HasFeature(protocol.FeatureJobExit) {
		t.Fatalf("welcome %+v: want no %s without a job store", a.welcome, protocol.FeatureJobExit)
	}
}

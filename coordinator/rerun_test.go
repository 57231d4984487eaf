package coordinator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/protocol"
)

// runLog counts the detached runs an agent started, by job id.
type runLog struct {
	mu   sync.Mutex
	runs []string
}

func (l *runLog) add(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.runs = append(l.runs, id)
}

func (l *runLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.runs...)
}

// rerunAgent is reportingAgent that logs each detached run it starts.
func rerunAgent(id string, labels map[string]string, log *runLog) agentOpts {
	var queries atomic.Int32
	o := reportingAgent(id, &queries)
	o.labels = labels
	inner := o.handler
	o.handler = func(a *fakeAgent, st *yamux.Stream, p protocol.ExecParams) {
		log.add(p.JobID)
		inner(a, st, p)
	}
	return o
}

// loseOn has the agent report detached job id lost (its process is gone).
func loseOn(t *testing.T, a *fakeAgent, id string) {
	t.Helper()
	if err := protocol.WriteJSONFrame(a.ctrl, protocol.FrameJobExit, &protocol.JobStatus{ID: id, State: protocol.JobLost, StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
}

func waitState(t *testing.T, st *jobstore.Store, id string, want protocol.JobState) *jobstore.Job {
	t.Helper()
	checkFor(t, defaultTestTimeout, func() error {
		if s := stateOf(st, id); s != want {
			return fmt.Errorf("job %s %q, want %s", id, s, want)
		}
		return nil
	})
	return recordState(t, st, id)
}

// TestAgentLostIdempotentJobRunsAgain: a detached idempotent job whose
// agent reports its process lost runs again, server side, with no client
// asking: the lost record links to its re-run (attempt 2), which runs on
// the same node and ends succeeded.
func TestAgentLostIdempotentJobRunsAgain(t *testing.T) {
	var st *jobstore.Store
	h := newHarness(t, withStore(t, &st, nil))
	var runs runLog
	a := h.dialAgent(t, rerunAgent("n1", nil, &runs))
	if r := h.exec(protocol.ExecRequest{ID: "idem", Target: protocol.Target{Node: "n1"}, Script: "make deploy", Detach: true, Idempotent: true}); r.err != nil {
		t.Fatal(r.err)
	}
	waitState(t, st, "idem", protocol.JobStateRunning)
	// Its spec keeps the server's stamp of its sender, so that a re-run
	// identifies its owner again.
	spec, err := st.Spec(context.Background(), "idem")
	if err != nil || !strings.Contains(string(spec), `"request_info"`) || !strings.Contains(string(spec), `"make deploy"`) {
		t.Fatalf("spec %s %v, want the request with its request info", spec, err)
	}
	loseOn(t, a, "idem")
	first := waitState(t, st, "idem", protocol.JobStateLost)
	checkFor(t, defaultTestTimeout, func() error {
		if first = recordState(t, st, "idem"); first.RerunAs == "" {
			return fmt.Errorf("lost record %+v names no re-run", first.Record)
		}
		return nil
	})
	if first.Attempt != 1 {
		t.Errorf("first attempt %d, want 1", first.Attempt)
	}
	next := waitState(t, st, first.RerunAs, protocol.JobStateRunning)
	if next.Attempt != 2 || next.RerunOf != "idem" || len(next.Nodes) != 1 || next.Nodes[0] != "n1" || !next.Idempotent {
		t.Fatalf("re-run record %+v, want attempt 2 of idem on n1", next.Record)
	}
	if got := runs.all(); len(got) != 2 || got[0] != "idem" || got[1] != first.RerunAs {
		t.Fatalf("agent ran %v, want idem then %s", got, first.RerunAs)
	}
	if err := protocol.WriteJSONFrame(a.ctrl, protocol.FrameJobExit, exitReport(first.RerunAs, 0)); err != nil {
		t.Fatal(err)
	}
	waitState(t, st, first.RerunAs, protocol.JobSucceeded)
	// job.get shows both attempts.
	rec, e := jobGet(t, h.client, first.RerunAs)
	if e != nil || rec.Attempt != 2 || rec.RerunOf != "idem" {
		t.Errorf("job.get of the re-run: %+v %v", rec, e)
	}
}

// TestLostNonIdempotentJobStaysLost: a job that did not say it is
// idempotent runs at most once: lost stays lost, nothing runs again.
func TestLostNonIdempotentJobStaysLost(t *testing.T) {
	var st *jobstore.Store
	h := newHarness(t, withStore(t, &st, nil))
	var runs runLog
	a := h.dialAgent(t, rerunAgent("n1", nil, &runs))
	if r := h.exec(protocol.ExecRequest{ID: "once", Target: protocol.Target{Node: "n1"}, Script: "make deploy", Detach: true}); r.err != nil {
		t.Fatal(r.err)
	}
	waitState(t, st, "once", protocol.JobStateRunning)
	loseOn(t, a, "once")
	waitState(t, st, "once", protocol.JobStateLost)
	time.Sleep(500 * time.Millisecond)
	if j := recordState(t, st, "once"); j.RerunAs != "" || j.State != protocol.JobStateLost {
		t.Errorf("record %+v, want lost with no re-run", j.Record)
	}
	if got := runs.all(); len(got) != 1 {
		t.Errorf("agent ran %v, want once", got)
	}
}

// TestLostIdempotentJobRerunReauthorized: the re-run is authorized again
// as its owner against the policy in force: an owner whose exec grant was
// revoked since gets no re-run, and the lost record says why.
func TestLostIdempotentJobRerunReauthorized(t *testing.T) {
	var st *jobstore.Store
	pol, path := writePolicy(t, stagingPolicy)
	h := newHarness(t, withStore(t, &st, func(c *coordinator.Config) { c.Policy = pol }))
	var runs runLog
	a := h.dialAgent(t, rerunAgent("n1", map[string]string{"env": "staging"}, &runs))
	r := execAs(t, h.as("alice"), protocol.ExecRequest{ID: "rev", Target: protocol.Target{Node: "n1"}, Script: "make deploy", Detach: true, Idempotent: true})
	if r.err != nil {
		t.Fatal(r.err)
	}
	waitState(t, st, "rev", protocol.JobStateRunning)
	replacePolicy(t, path, strings.Replace(stagingPolicy, "operations: [exec, job.status, job.logs, job.cancel, nodes.list]\n        run_as: deploy", "operations: [job.status, job.logs, job.cancel, nodes.list]", 1))
	if _, err := pol.Reload(); err != nil {
		t.Fatal(err)
	}
	if r := execAs(t, h.as("alice"), protocol.ExecRequest{Target: protocol.Target{Node: "n1"}, Argv: []string{"true"}}); r.err == nil || r.err.Status != 403 {
		t.Fatalf("alice's exec after the revocation: %v, want 403", r.err)
	}
	loseOn(t, a, "rev")
	waitState(t, st, "rev", protocol.JobStateLost)
	var j *jobstore.Job
	checkFor(t, defaultTestTimeout, func() error {
		if j = recordState(t, st, "rev"); !strings.Contains(j.Error, "not re-run") {
			return fmt.Errorf("record %+v does not say why it was not re-run", j.Record)
		}
		return nil
	})
	if !strings.Contains(j.Error, "nats:alice") || !strings.Contains(j.Error, "exec") {
		t.Errorf("record error %q, want the refusal of nats:alice's exec", j.Error)
	}
	if got := runs.all(); len(got) != 1 {
		t.Errorf("agent ran %v, want once", got)
	}
}

// TestLostFanoutPartRunsAgainOnItsNode: of a detached idempotent job on
// several nodes, the node that lost its run runs it again, alone; the
// nodes that finished run nothing again.
func TestLostFanoutPartRunsAgainOnItsNode(t *testing.T) {
	var st *jobstore.Store
	h := newHarness(t, withStore(t, &st, nil))
	var runs1, runs2 runLog
	a1 := h.dialAgent(t, rerunAgent("n1", nil, &runs1))
	a2 := h.dialAgent(t, rerunAgent("n2", nil, &runs2))
	if r := h.exec(protocol.ExecRequest{ID: "fan", Target: protocol.Target{All: true}, Script: "make deploy", Detach: true, Idempotent: true}); r.err != nil {
		t.Fatal(r.err)
	}
	waitState(t, st, "fan", protocol.JobStateRunning)
	if err := protocol.WriteJSONFrame(a1.ctrl, protocol.FrameJobExit, exitReport("fan", 0)); err != nil {
		t.Fatal(err)
	}
	loseOn(t, a2, "fan")
	var j *jobstore.Job
	checkFor(t, defaultTestTimeout, func() error {
		if j = recordState(t, st, "fan"); j.RerunAs == "" {
			return fmt.Errorf("record %+v names no re-run", j.Record)
		}
		return nil
	})
	if j.RerunAs != "fan.n1.2" {
		t.Fatalf("re-run %q, want fan.n1.2 (n2, index 1)", j.RerunAs)
	}
	part := waitState(t, st, "fan.n1.2", protocol.JobStateRunning)
	if len(part.Nodes) != 1 || part.Nodes[0] != "n2" || part.Attempt != 2 || part.RerunOf != "fan" {
		t.Errorf("part record %+v, want attempt 2 of fan on n2", part.Record)
	}
	if got := runs1.all(); len(got) != 1 {
		t.Errorf("n1 ran %v, want once", got)
	}
	if got := runs2.all(); len(got) != 2 || got[1] != "fan.n1.2" {
		t.Errorf("n2 ran %v, want fan then fan.n1.2", got)
	}
}

// TestTakenOverIdempotentJobRunsAgain: a coordinator that takes over the
// record of a detached idempotent job from its dead predecessor, and
// finds that the node lost the job, runs it again from its stored spec.
func TestTakenOverIdempotentJobRunsAgain(t *testing.T) {
	var st *jobstore.Store
	h := newHarness(t, func(c *coordinator.Config) {
		// The predecessor: same coordinator id, another process.
		prev, err := jobstore.Open(context.Background(), jobstore.Config{NATS: c.NATS, Coordinator: c.ID})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if _, err := prev.Submit(ctx, jobstore.Submission{ID: "ido", Nodes: []string{"n1"}, Detached: true, Idempotent: true, DispatchNow: true, Script: "make deploy"}); err != nil {
			t.Fatal(err)
		}
		req := mustJSON(t, protocol.ExecRequest{ID: "ido", Target: protocol.Target{Node: "n1"}, Script: "make deploy", Detach: true, Idempotent: true})
		if err := prev.PutSpec(ctx, "ido", mustJSON(t, map[string]any{"request": json.RawMessage(req)})); err != nil {
			t.Fatal(err)
		}
		withStore(t, &st, nil)(c)
	})
	var runs runLog
	o := rerunAgent("n1", nil, &runs)
	inner := o.stream
	o.stream = func(a *fakeAgent, s *yamux.Stream, hd protocol.Header) {
		var p protocol.JobParams
		if hd.Kind == protocol.KindJob && hd.DecodeParams(&p) == nil && p.ID == "ido" {
			defer s.Close()
			protocol.WriteJSONFrame(s, protocol.FrameError, &protocol.ErrorInfo{Code: "job_not_found", Message: "no such job"})
			return
		}
		inner(a, s, hd)
	}
	h.dialAgent(t, o)
	checkFor(t, defaultTestTimeout, func() error {
		if j := recordState(t, st, "ido"); j.State != protocol.JobStateLost || j.RerunAs != "ido.2" {
			return fmt.Errorf("record %+v, want lost, re-run as ido.2", j.Record)
		}
		return nil
	})
	next := waitState(t, st, "ido.2", protocol.JobStateRunning)
	if next.Attempt != 2 || next.RerunOf != "ido" {
		t.Errorf("re-run %+v", next.Record)
	}
	if got := runs.all(); len(got) != 1 || got[0] != "ido.2" {
		t.Errorf("agent ran %v, want ido.2", got)
	}
}

// TestLostIdempotentJobAttemptsExhausted: a job lost on every attempt
// runs jobstore.MaxAttempts times in all, then stays lost, saying so.
func TestLostIdempotentJobAttemptsExhausted(t *testing.T) {
	var st *jobstore.Store
	h := newHarness(t, withStore(t, &st, nil))
	var runs runLog
	a := h.dialAgent(t, rerunAgent("n1", nil, &runs))
	if r := h.exec(protocol.ExecRequest{ID: "flaky", Target: protocol.Target{Node: "n1"}, Script: "make deploy", Detach: true, Idempotent: true}); r.err != nil {
		t.Fatal(r.err)
	}
	for _, id := range []string{"flaky", "flaky.2", "flaky.3"} {
		waitState(t, st, id, protocol.JobStateRunning)
		loseOn(t, a, id)
		waitState(t, st, id, protocol.JobStateLost)
	}
	checkFor(t, defaultTestTimeout, func() error {
		if j := recordState(t, st, "flaky.3"); !strings.Contains(j.Error, "not re-run: attempts exhausted (3 of 3)") || j.RerunAs != "" {
			return fmt.Errorf("last attempt %+v, want lost, attempts exhausted", j.Record)
		}
		return nil
	})
	if got := runs.all(); len(got) != 3 {
		t.Errorf("agent ran %v, want 3 attempts", got)
	}
}

// TestStrandedLostIdempotentJobRunsAgain: a lost idempotent job whose
// re-run nobody claimed (its coordinator stopped right after writing it
// lost) is run again by the next coordinator to start.
func TestStrandedLostIdempotentJobRunsAgain(t *testing.T) {
	t.Cleanup(coordinator.SetStrandedScanForTest(time.Second, 500*time.Millisecond))
	var st *jobstore.Store
	h := newHarness(t, func(c *coordinator.Config) {
		prev, err := jobstore.Open(context.Background(), jobstore.Config{NATS: c.NATS, Coordinator: "gone", Now: func() time.Time { return time.Now().Add(-time.Minute) }})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		j, err := prev.Submit(ctx, jobstore.Submission{ID: "strand", Nodes: []string{"n1"}, Detached: true, Idempotent: true, DispatchNow: true, Script: "make deploy"})
		if err != nil {
			t.Fatal(err)
		}
		req := mustJSON(t, protocol.ExecRequest{ID: "strand", Target: protocol.Target{Node: "n1"}, Script: "make deploy", Detach: true, Idempotent: true})
		if err := prev.PutSpec(ctx, "strand", mustJSON(t, map[string]any{"request": json.RawMessage(req)})); err != nil {
			t.Fatal(err)
		}
		if err := prev.Lose(ctx, j, "node n1 lost the job"); err != nil {
			t.Fatal(err)
		}
		withStore(t, &st, nil)(c)
	})
	var runs runLog
	h.dialAgent(t, rerunAgent("n1", nil, &runs))
	checkFor(t, defaultTestTimeout, func() error {
		if j := recordState(t, st, "strand"); j.RerunAs != "strand.2" {
			return fmt.Errorf("record %+v: no re-run claimed", j.Record)
		}
		return nil
	})
	waitState(t, st, "strand.2", protocol.JobStateRunning)
	if got := runs.all(); len(got) != 1 || got[0] != "strand.2" {
		t.Errorf("agent ran %v, want strand.2 once", got)
	}
}

package coordinator_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/protocol"
)

// withStore opens a job store on the coordinator's connection and sets
// it; *st gets it for the test to inspect.
func withStore(t testing.TB, st **jobstore.Store, mutate func(*coordinator.Config)) func(*coordinator.Config) {
	return func(c *coordinator.Config) {
		s, err := jobstore.Open(context.Background(), jobstore.Config{NATS: c.NATS, Coordinator: c.ID})
		if err != nil {
			t.Fatalf("open job store: %v", err)
		}
		c.Jobs = s
		if st != nil {
			*st = s
		}
		if mutate != nil {
			mutate(c)
		}
	}
}

// jobGet asks tether.v1.job.get on nc: the record, or the API error.
func jobGet(t *testing.T, nc *nats.Conn, id string) (*protocol.JobRecord, *protocol.APIError) {
	t.Helper()
	m, err := nc.Request(protocol.SubjectJobGet, mustJSON(t, protocol.JobGetRequest{ID: id}), defaultTestTimeout)
	if err != nil {
		t.Fatalf("job.get %s: %v", id, err)
	}
	if m.Header.Get(micro.ErrorCodeHeader) != "" {
		var e protocol.APIError
		json.Unmarshal(m.Data, &e)
		return nil, &e
	}
	var r protocol.JobRecord
	if err := json.Unmarshal(m.Data, &r); err != nil {
		t.Fatalf("decode job record %q: %v", m.Data, err)
	}
	return &r, nil
}

func jobList(t *testing.T, nc *nats.Conn, req protocol.JobListRequest) []string {
	t.Helper()
	m, err := nc.Request(protocol.SubjectJobList, mustJSON(t, req), defaultTestTimeout)
	if err != nil {
		t.Fatalf("job.list: %v", err)
	}
	if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
		t.Fatalf("job.list: %s %s", code, m.Data)
	}
	var r protocol.JobListResponse
	if err := json.Unmarshal(m.Data, &r); err != nil {
		t.Fatalf("decode job list %q: %v", m.Data, err)
	}
	ids := []string{}
	for _, j := range r.Jobs {
		ids = append(ids, j.ID)
	}
	return ids
}

// TestDurableAttached: attached jobs are recorded with their owner and end
// in the state their nodes' results give; the record is there as soon as
// the client has the result.
func TestDurableAttached(t *testing.T) {
	h := newHarness(t, withStore(t, nil, nil))
	h.dialAgent(t, agentOpts{id: "n1"})
	h.dialAgent(t, agentOpts{id: "n2"})
	for _, tc := range []struct {
		id, cmd string
		target  protocol.Target
		want    protocol.JobState
		exit    int
	}{
		{"ok1", "ok", protocol.Target{Node: "n1"}, protocol.JobSucceeded, 0},
		{"echo1", "echo", protocol.Target{Node: "n1"}, protocol.JobFailed, 3},
		{"fan", "ok", protocol.Target{All: true}, protocol.JobSucceeded, 0},
		{"hang1", "hang", protocol.Target{Node: "n2"}, protocol.JobCancelled, 137},
	} {
		t.Run(tc.id, func(t *testing.T) {
			var r execReply
			if tc.cmd == "hang" {
				ch := h.execAsync(protocol.ExecRequest{ID: tc.id, Target: tc.target, Argv: []string{tc.cmd}})
				checkFor(t, defaultTestTimeout, func() error {
					if rec, e := jobGet(t, h.client, tc.id); e != nil || rec.State != protocol.JobStateRunning {
						return errorf("job %s not running yet (%v, %v)", tc.id, rec, e)
					}
					return nil
				})
				h.request(protocol.SubjectCancel, protocol.CancelRequest{ID: tc.id})
				r = <-ch
			} else {
				r = h.exec(protocol.ExecRequest{ID: tc.id, Target: tc.target, Argv: []string{tc.cmd}})
			}
			if r.err != nil || r.result == nil {
				t.Fatalf("exec: %+v", r.err)
			}
			// The record is written just after the reply.
			var rec *protocol.JobRecord
			checkFor(t, defaultTestTimeout, func() error {
				var e *protocol.APIError
				if rec, e = jobGet(t, h.client, tc.id); e != nil {
					return errorf("job.get: %+v", e)
				}
				if !rec.State.Terminal() {
					return errorf("job %s still %s", tc.id, rec.State)
				}
				return nil
			})
			exit := rec.ExitCode()
			if tc.cmd == "hang" && exit == -1 && len(rec.Results) == 1 && rec.Results[0].Cancelled {
				// The record says running from accept: the cancel may
				// reach the node before the process started there.
				exit = tc.exit
			}
			if rec.State != tc.want || rec.Owner != "nats:client" || rec.Coordinator != "coord-test" || exit != tc.exit {
				t.Errorf("record = %+v; want state %s, owner nats:client, exit %d", rec, tc.want, tc.exit)
			}
			if rec.StartedAt.IsZero() || rec.FinishedAt.IsZero() || rec.DispatchedAt.IsZero() {
				t.Errorf("record times = %v %v %v", rec.DispatchedAt, rec.StartedAt, rec.FinishedAt)
			}
		})
	}
	if ids := jobList(t, h.client, protocol.JobListRequest{State: protocol.JobFailed}); len(ids) != 1 || ids[0] != "echo1" {
		t.Errorf("failed jobs = %v, want [echo1]", ids)
	}
	if e := func() *protocol.APIError { _, e := jobGet(t, h.client, "nope"); return e }(); e == nil || e.Status != 404 {
		t.Errorf("job.get of an unknown id = %+v, want 404", e)
	}
}

func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }

// TestDurableIdempotent: a repeated idempotent submission does not run
// again; its reply names the first job.
func TestDurableIdempotent(t *testing.T) {
	h := newHarness(t, withStore(t, nil, nil))
	a := h.dialAgent(t, agentOpts{id: "n1"})
	req := protocol.ExecRequest{Target: protocol.Target{Node: "n1"}, Argv: []string{"ok"}, Idempotent: true, IdempotencyKey: "deploy-42"}
	if r := h.exec(req); r.err != nil {
		t.Fatal(r.err)
	}
	r := h.exec(req)
	if r.err == nil || r.err.Status != 409 || r.err.Code != protocol.ErrCodeDuplicateJob {
		t.Fatalf("repeat = %+v, want 409 duplicate_job", r.err)
	}
	if n := a.execs.Load(); n != 1 {
		t.Errorf("agent ran %d execs, want 1", n)
	}
}

// detachedAgent starts detached jobs (an exit frame with Detached) and
// answers status with state (running, or exited with code 5).
func detachedAgent(exited *atomic.Bool) agentOpts {
	return agentOpts{
		handler: func(_ *fakeAgent, st *yamux.Stream, p protocol.ExecParams) {
			protocol.WriteJSONFrame(st, protocol.FrameExit, &protocol.ExitStatus{Detached: true})
		},
		stream: func(_ *fakeAgent, st *yamux.Stream, h protocol.Header) {
			defer st.Close()
			var p protocol.JobParams
			if h.Kind != protocol.KindJob || h.DecodeParams(&p) != nil {
				return
			}
			js := protocol.JobStatus{ID: p.ID, State: protocol.JobRunning, StartedAt: time.Now()}
			if exited != nil && exited.Load() {
				now := time.Now()
				js.State, js.ExitCode, js.FinishedAt = protocol.JobExited, intp(5), &now
			}
			protocol.WriteJSONFrame(st, protocol.FrameJob, &js)
		},
	}
}

// TestDurableDetached: a detached job is running once its node started
// it; job.get asks the node and records its exit.
func TestDurableDetached(t *testing.T) {
	h := newHarness(t, withStore(t, nil, nil))
	var exited atomic.Bool
	o := detachedAgent(&exited)
	o.id = "n1"
	h.dialAgent(t, o)
	if r := h.exec(protocol.ExecRequest{ID: "d1", Target: protocol.Target{Node: "n1"}, Script: "sleep 100", Detach: true}); r.err != nil {
		t.Fatal(r.err)
	}
	rec, e := jobGet(t, h.client, "d1")
	if e != nil || rec.State != protocol.JobStateRunning || !rec.Detached || rec.Command != "sleep 100" {
		t.Fatalf("record = %+v, %+v; want running detached", rec, e)
	}
	exited.Store(true)
	rec, e = jobGet(t, h.client, "d1")
	if e != nil || rec.State != protocol.JobFailed || rec.ExitCode() != 5 {
		t.Fatalf("record after exit = %+v, %+v; want failed, exit 5", rec, e)
	}
}

// TestDurablePolicy: a caller sees only the jobs policy lets it see: bob
// gets 404 for alice's job and does not list it; ops (scope any) sees it.
func TestDurablePolicy(t *testing.T) {
	store, _ := writePolicy(t, stagingPolicy)
	h := newHarness(t, withStore(t, nil, func(c *coordinator.Config) { c.Policy = store }))
	h.dialAgent(t, agentOpts{id: "n-a", labels: map[string]string{"env": "staging"}})
	if r := execAs(t, h.as("alice"), protocol.ExecRequest{ID: "aj", Target: protocol.Target{Node: "n-a"}, Argv: []string{"ok"}}); r.err != nil {
		t.Fatal(r.err)
	}
	if r := execAs(t, h.as("bob"), protocol.ExecRequest{ID: "bj", Target: protocol.Target{Node: "n-a"}, Argv: []string{"ok"}}); r.err != nil {
		t.Fatal(r.err)
	}
	if rec, e := jobGet(t, h.as("alice"), "aj"); e != nil || rec.Owner != "nats:alice" {
		t.Fatalf("alice's own job: %+v, %+v", rec, e)
	}
	if _, e := jobGet(t, h.as("bob"), "aj"); e == nil || e.Status != 404 {
		t.Fatalf("bob reads alice's job: %+v, want 404", e)
	}
	if _, e := jobGet(t, h.as("mallory"), "aj"); e == nil || (e.Status != 404 && e.Status != 403) {
		t.Fatalf("mallory reads alice's job: %+v, want refused", e)
	}
	if rec, e := jobGet(t, h.as("ops"), "aj"); e != nil || rec.ID != "aj" {
		t.Fatalf("ops reads alice's job: %+v, %+v", rec, e)
	}
	if ids := jobList(t, h.as("alice"), protocol.JobListRequest{}); len(ids) != 1 || ids[0] != "aj" {
		t.Errorf("alice lists %v, want [aj]", ids)
	}
	if ids := jobList(t, h.as("ops"), protocol.JobListRequest{}); len(ids) != 2 {
		t.Errorf("ops lists %v, want both", ids)
	}
}

// TestDurableJobGetMine: job.get asked as the submitter (mine) answers
// not_recorded when no record of that id names the caller, whether there
// is none or another's (so it tells nothing of other callers' jobs), and
// the record when it is the caller's; without mine both are not_found.
func TestDurableJobGetMine(t *testing.T) {
	store, _ := writePolicy(t, stagingPolicy)
	h := newHarness(t, withStore(t, nil, func(c *coordinator.Config) { c.Policy = store }))
	h.dialAgent(t, agentOpts{id: "n-a", labels: map[string]string{"env": "staging"}})
	if r := execAs(t, h.as("alice"), protocol.ExecRequest{ID: "aj", Target: protocol.Target{Node: "n-a"}, Argv: []string{"ok"}}); r.err != nil {
		t.Fatal(r.err)
	}
	get := func(nc *nats.Conn, id string, mine bool) (*protocol.JobRecord, *protocol.APIError) {
		t.Helper()
		m, err := nc.Request(protocol.SubjectJobGet, mustJSON(t, protocol.JobGetRequest{ID: id, Mine: mine}), defaultTestTimeout)
		if err != nil {
			t.Fatalf("job.get %s: %v", id, err)
		}
		if m.Header.Get(micro.ErrorCodeHeader) != "" {
			var e protocol.APIError
			json.Unmarshal(m.Data, &e)
			return nil, &e
		}
		var r protocol.JobRecord
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Fatalf("decode job record %q: %v", m.Data, err)
		}
		return &r, nil
	}
	if rec, e := get(h.as("alice"), "aj", true); e != nil || rec.ID != "aj" {
		t.Fatalf("alice's own job, mine: %+v, %+v; want the record", rec, e)
	}
	for _, c := range []struct {
		who, id string
		mine    bool
		code    string
	}{
		{"alice", "never-sent", true, protocol.ErrCodeNotRecorded},
		{"bob", "aj", true, protocol.ErrCodeNotRecorded},
		{"bob", "never-sent", true, protocol.ErrCodeNotRecorded},
		{"bob", "aj", false, protocol.ErrCodeNotFound},
		{"alice", "never-sent", false, protocol.ErrCodeNotFound},
	} {
		if rec, e := get(h.as(c.who), c.id, c.mine); e == nil || e.Status != 404 || e.Code != c.code {
			t.Errorf("%s: job.get %s (mine %v) = %+v, %+v; want 404 %s", c.who, c.id, c.mine, rec, e, c.code)
		}
	}
}

// TestDurableReconcile: a restarted coordinator records the jobs its
// predecessor left as lost (attached, or detached whose node never came
// back within JobLostAfter) or as its node reports them.
func TestDurableReconcile(t *testing.T) {
	var st *jobstore.Store
	var exited atomic.Bool
	exited.Store(true)
	h := newHarness(t, func(c *coordinator.Config) {
		// The predecessor: same coordinator id, another process.
		prev, err := jobstore.Open(context.Background(), jobstore.Config{NATS: c.NATS, Coordinator: c.ID})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		for _, sub := range []jobstore.Submission{
			{ID: "att", Nodes: []string{"n1"}},
			{ID: "det", Nodes: []string{"n1"}, Detached: true},
			{ID: "away", Nodes: []string{"n9"}, Detached: true},
		} {
			j, err := prev.Submit(ctx, sub)
			if err != nil {
				t.Fatal(err)
			}
			if err := prev.Dispatch(ctx, j, !sub.Detached); err != nil {
				t.Fatal(err)
			}
		}
		withStore(t, &st, func(c *coordinator.Config) { c.JobLostAfter = 2 * time.Second })(c)
	})
	o := detachedAgent(&exited)
	o.id = "n1"
	h.dialAgent(t, o)
	want := map[string]protocol.JobState{"att": protocol.JobStateLost, "det": protocol.JobFailed, "away": protocol.JobStateLost}
	checkFor(t, defaultTestTimeout, func() error {
		for id, s := range want {
			rec, e := jobGet(t, h.client, id)
			if e != nil {
				return errorf("job %s: %v", id, e)
			}
			if rec.State != s {
				return errorf("job %s: %s, want %s", id, rec.State, s)
			}
		}
		return nil
	})
}

// TestDurableOwnerOutlivesMemory: a coordinator that does not remember who
// started a detached job (it restarted, or the node moved to it) takes
// the owner from the job's record: the owner keeps job.status on its own
// job, and another caller is still refused.
func TestDurableOwnerOutlivesMemory(t *testing.T) {
	store, _ := writePolicy(t, stagingPolicy)
	h := newHarness(t, withStore(t, nil, func(c *coordinator.Config) { c.Policy = store }))
	var exited atomic.Bool
	o := detachedAgent(&exited)
	o.id, o.labels = "n-a", map[string]string{"env": "staging"}
	h.dialAgent(t, o)
	if r := execAs(t, h.as("alice"), protocol.ExecRequest{ID: "aj", Target: protocol.Target{Node: "n-a"}, Script: "sleep 100", Detach: true}); r.err != nil {
		t.Fatal(r.err)
	}
	coordinator.ForgetJobOwnersForTest(h.c)
	status := func(who string) string {
		t.Helper()
		m, err := h.as(who).Request(protocol.SubjectJobStatus, mustJSON(t, protocol.JobRequest{Node: "n-a", ID: "aj"}), defaultTestTimeout)
		if err != nil {
			t.Fatalf("job.status as %s: %v", who, err)
		}
		return m.Header.Get(micro.ErrorCodeHeader)
	}
	if code := status("alice"); code != "" {
		t.Errorf("alice's job.status on her own job after the coordinator forgot its owner: error %s", code)
	}
	if code := status("bob"); code != "403" && code != "404" {
		t.Errorf("bob's job.status on alice's job: %q, want refused", code)
	}
}

// TestDurableIDReusedAtOnce: a client may reuse a job's id as soon as it
// has the job's result, though the job's final record is written after
// the reply: the next submission of the id waits for it instead of
// finding the job still running (409).
func TestDurableIDReusedAtOnce(t *testing.T) {
	h := newHarness(t, withStore(t, nil, nil))
	h.dialAgent(t, agentOpts{id: "n1"})
	for i := range 30 {
		if r := h.exec(protocol.ExecRequest{ID: "again", Target: protocol.Target{Node: "n1"}, Argv: []string{"ok"}}); r.err != nil || r.result == nil {
			t.Fatalf("exec %d of id again: %+v", i, r.err)
		}
	}
}

// TestDurableJobSlotFreeAtResult: a caller at its max_concurrent_jobs may
// submit its next job as soon as it has the last one's result, though
// that job's final record is written after the reply: the slot is freed
// before the reply, not after the write.
func TestDurableJobSlotFreeAtResult(t *testing.T) {
	const pol = `version: 1
identities:
  nats:serial:
    limits:
      max_concurrent_jobs: 1
    rules:
      - nodes: "*"
        operations: [exec]
        run_as: serial
`
	h, _ := newPolicyHarness(t, pol, withStore(t, nil, nil))
	h.dialAgent(t, agentOpts{id: "n1"})
	for i := range 30 {
		r := execAs(t, h.as("serial"), map[string]any{"target": map[string]any{"node": "n1"}, "argv": []string{"ok"}})
		if r.err != nil || r.result == nil {
			t.Fatalf("job %d: %+v", i, r.err)
		}
	}
}

// TestDurableAgentStartsOnlyRecorded: the job's record is written while
// its exec stream opens, but the agent gets the stream's header (its go)
// only once the record is stored: whenever an exec reaches the agent, its
// job's record is there, running.
func TestDurableAgentStartsOnlyRecorded(t *testing.T) {
	var st *jobstore.Store
	h := newHarness(t, withStore(t, &st, nil))
	var bad, current atomic.Value // current: the id of the job in flight
	h.dialAgent(t, agentOpts{id: "n1", header: func(hd protocol.Header) {
		if hd.Kind != protocol.KindExec {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
		defer cancel()
		id := current.Load().(string)
		if j, err := st.Get(ctx, id); err != nil || j.State != jobstore.Running {
			bad.Store(fmt.Sprintf("job %s reached the agent before its record: %v, %v", id, j, err))
		}
	}})
	for i := range 30 {
		current.Store(fmt.Sprint("r", i))
		if r := h.exec(protocol.ExecRequest{ID: fmt.Sprint("r", i), Target: protocol.Target{Node: "n1"}, Argv: []string{"ok"}}); r.err != nil {
			t.Fatalf("exec %d: %+v", i, r.err)
		}
		if b := bad.Load(); b != nil {
			t.Fatal(b)
		}
	}
}

// TestDurableRefusedUnrecorded: a job whose record cannot be written
// (here its bucket is gone) is refused with 503, and its agent starts
// nothing: the exec stream it opened meanwhile closes without a header.
func TestDurableRefusedUnrecorded(t *testing.T) {
	h := newHarness(t, withStore(t, nil, nil))
	var headers atomic.Int32
	a := h.dialAgent(t, agentOpts{id: "n1", header: func(protocol.Header) { headers.Add(1) }})
	js, err := jetstream.New(h.coordNC)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	if err := js.DeleteKeyValue(ctx, jobstore.BucketName); err != nil {
		t.Fatal(err)
	}
	for _, target := range []protocol.Target{{Node: "n1"}, {All: true}} {
		r := h.exec(protocol.ExecRequest{Target: target, Argv: []string{"ok"}})
		if r.err == nil || r.err.Status != 503 || r.result != nil {
			t.Fatalf("exec on %+v with the store gone = %+v, %+v; want 503", target, r.err, r.result)
		}
	}
	if n, m := a.execs.Load(), headers.Load(); n != 0 || m != 0 {
		t.Errorf("agent got %d execs, %d stream headers; want none", n, m)
	}
}

package jobstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/goleak"

	"github.com/tetherfleet/tether/coordinator/internal/natstest"
	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const defaultTestTimeout = 10 * time.Second

func testContext(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	tb.Cleanup(cancel)
	return ctx
}

// open opens a store for coordinator coord on its own connection to env.
func open(tb testing.TB, env *natstest.Env, coord string) *jobstore.Store {
	tb.Helper()
	s, err := jobstore.Open(testContext(tb), jobstore.Config{NATS: env.Coordinator(tb), Coordinator: coord})
	if err != nil {
		tb.Fatalf("open store for %s: %v", coord, err)
	}
	return s
}

func submit(tb testing.TB, s *jobstore.Store, sub jobstore.Submission) *jobstore.Job {
	tb.Helper()
	j, err := s.Submit(testContext(tb), sub)
	if err != nil {
		tb.Fatalf("submit %s: %v", sub.ID, err)
	}
	return j
}

// waitQueued waits until the stream holds n queue messages (acks are
// sent without waiting for the server).
func waitQueued(tb testing.TB, s *jobstore.Store, n uint64) {
	tb.Helper()
	deadline := time.Now().Add(defaultTestTimeout)
	for {
		got, err := s.Queued(testContext(tb))
		if err == nil && got == n {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("queued messages = %d (%v), want %d", got, err, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestOpenSingleServerReplicas(t *testing.T) {
	env := natstest.Run(t)
	s := open(t, env, "c1")
	if s.Replicas() != 1 {
		t.Errorf("replicas on one server = %d, want 1", s.Replicas())
	}
	// A second coordinator binds the same stream and bucket.
	open(t, env, "c2")
}

func TestLifecycleForwardOnly(t *testing.T) {
	env := natstest.Run(t)
	s := open(t, env, "c1")
	ctx := testContext(t)
	j := submit(t, s, jobstore.Submission{ID: "j1", Owner: "nats:alice", Nodes: []string{"n2", "n1"}, Script: "echo hi\necho more", Detached: true})
	if j.State != jobstore.Queued || j.Coordinator != "c1" || j.Command != "echo hi … (2 lines)" || j.Nodes[0] != "n1" {
		t.Fatalf("submitted record = %+v", j.Record)
	}
	if n, err := s.Queued(ctx); err != nil || n != 1 {
		t.Fatalf("queued messages = %d, %v; want 1", n, err)
	}
	if err := s.Start(ctx, j); !errors.Is(err, nil) {
		// queued → running is forward too (skipping dispatched is allowed).
		t.Fatalf("start from queued: %v", err)
	}
	if err := s.Dispatch(ctx, j, false); !errors.Is(err, jobstore.ErrBackward) {
		t.Fatalf("dispatch after start = %v, want ErrBackward", err)
	}
	res := []protocol.NodeResult{{Node: "n1"}, {Node: "n2", ExitCode: 3}}
	if err := s.Finish(ctx, j, res, false, ""); err != nil {
		t.Fatalf("finish: %v", err)
	}
	got, err := s.Get(ctx, "j1")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != jobstore.Failed || got.Succeeded != 1 || got.Failed != 1 || got.Owner != "nats:alice" || got.FinishedAt.IsZero() || got.StartedAt.IsZero() {
		t.Fatalf("finished record = %+v", got.Record)
	}
	for _, to := range []func() error{
		func() error { return s.Start(ctx, got) },
		func() error { return s.Finish(ctx, got, nil, true, "") },
		func() error { return s.Lose(ctx, got, "x") },
	} {
		if err := to(); !errors.Is(err, jobstore.ErrBackward) {
			t.Errorf("transition out of failed = %v, want ErrBackward", err)
		}
	}
	// Finishing acked the queue message (Start did not dispatch it).
	waitQueued(t, s, 0)
}

// TestQueueHoldsUntilEnd: a job's queue message stays through dispatch
// and start, so that Active finds it, and goes when the job ends.
func TestQueueHoldsUntilEnd(t *testing.T) {
	env := natstest.Run(t)
	s := open(t, env, "c1")
	ctx := testContext(t)
	j := submit(t, s, jobstore.Submission{ID: "j1", Nodes: []string{"n1"}})
	if err := s.Dispatch(ctx, j, false); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx, j); err != nil {
		t.Fatal(err)
	}
	waitQueued(t, s, 1)
	if act, err := s.Active(ctx, nil); err != nil || len(act) != 1 || act[0].ID != "j1" || act[0].State != jobstore.Running {
		t.Fatalf("active = %v, %v; want j1 running", act, err)
	}
	if err := s.Finish(ctx, j, []protocol.NodeResult{{Node: "n1"}}, false, ""); err != nil {
		t.Fatal(err)
	}
	if j.State != jobstore.Succeeded {
		t.Errorf("state = %s, want succeeded", j.State)
	}
	waitQueued(t, s, 0)
	if act, err := s.Active(ctx, nil); err != nil || len(act) != 0 {
		t.Errorf("active after the end = %v, %v; want none", act, err)
	}
}

func TestIDInUseAndReuse(t *testing.T) {
	env := natstest.Run(t)
	s := open(t, env, "c1")
	ctx := testContext(t)
	j := submit(t, s, jobstore.Submission{ID: "j1", Nodes: []string{"n1"}})
	if _, err := s.Submit(ctx, jobstore.Submission{ID: "j1", Nodes: []string{"n1"}}); !errors.Is(err, jobstore.ErrExists) {
		t.Fatalf("second submit of a live id = %v, want ErrExists", err)
	}
	if err := s.Finish(ctx, j, nil, true, ""); err != nil {
		t.Fatal(err)
	}
	j2 := submit(t, s, jobstore.Submission{ID: "j1", Nodes: []string{"n9"}})
	if j2.State != jobstore.Queued || j2.Nodes[0] != "n9" {
		t.Fatalf("reused id record = %+v", j2.Record)
	}
}

func TestIdempotentDeduplicated(t *testing.T) {
	env := natstest.Run(t)
	s := open(t, env, "c1")
	other := open(t, env, "c2")
	ctx := testContext(t)
	j := submit(t, s, jobstore.Submission{ID: "a", Owner: "nats:alice", Nodes: []string{"n1"}, Idempotent: true, IdempotencyKey: "k"})
	// The retry reaches another coordinator, with a new id.
	dup, err := other.Submit(ctx, jobstore.Submission{ID: "b", Owner: "nats:alice", Nodes: []string{"n1"}, Idempotent: true, IdempotencyKey: "k"})
	if !errors.Is(err, jobstore.ErrDuplicate) || dup == nil || dup.ID != "a" {
		t.Fatalf("repeat = %v, %v; want job a and ErrDuplicate", dup, err)
	}
	if n, _ := s.Queued(ctx); n != 1 {
		t.Errorf("queued after repeat = %d, want 1", n)
	}
	if _, err := s.Get(ctx, "b"); !errors.Is(err, jobstore.ErrNotFound) {
		t.Errorf("get b = %v, want ErrNotFound", err)
	}
	// The same key from another owner is another job.
	submit(t, s, jobstore.Submission{ID: "c", Owner: "nats:bob", Nodes: []string{"n1"}, Idempotent: true, IdempotencyKey: "k"})
	_ = j
}

// TestConcurrentIdempotentSubmitsOneJob: many coordinators submitting one
// idempotent job at once make one record and one queue message.
func TestConcurrentIdempotentSubmitsOneJob(t *testing.T) {
	env := natstest.Run(t)
	stores := []*jobstore.Store{open(t, env, "c1"), open(t, env, "c2"), open(t, env, "c3")}
	var wg sync.WaitGroup
	firsts := make(chan string, 12)
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j, err := stores[i%3].Submit(testContext(t), jobstore.Submission{ID: fmt.Sprintf("j%d", i), Owner: "o", Nodes: []string{"n"}, Idempotent: true, IdempotencyKey: "k"})
			switch {
			case err == nil:
				firsts <- j.ID
			case errors.Is(err, jobstore.ErrDuplicate):
			default:
				t.Errorf("submit %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	close(firsts)
	if len(firsts) != 1 {
		t.Errorf("%d submissions accepted, want 1", len(firsts))
	}
	if n, _ := stores[0].Queued(testContext(t)); n != 1 {
		t.Errorf("queued = %d, want 1", n)
	}
}

// TestStaleHolderFenced: once another coordinator claimed the job, the old
// holder can neither dispatch (ack) nor finish it.
func TestStaleHolderFenced(t *testing.T) {
	env := natstest.Run(t)
	old := open(t, env, "c1")
	nu := open(t, env, "c2")
	ctx := testContext(t)
	j := submit(t, old, jobstore.Submission{ID: "j1", Nodes: []string{"n1"}})
	taken, err := nu.Get(ctx, "j1")
	if err != nil {
		t.Fatal(err)
	}
	if err := nu.Claim(ctx, taken); err != nil {
		t.Fatal(err)
	}
	if taken.Coordinator != "c2" || taken.Epoch != 1 {
		t.Fatalf("claimed record = %+v", taken.Record)
	}
	if err := old.Dispatch(ctx, j, false); !errors.Is(err, jobstore.ErrFenced) {
		t.Fatalf("stale dispatch = %v, want ErrFenced", err)
	}
	if n, _ := old.Queued(ctx); n != 1 {
		t.Fatalf("a fenced dispatch acked the queue message (queued %d)", n)
	}
	if err := old.Finish(ctx, j, nil, false, ""); !errors.Is(err, jobstore.ErrFenced) {
		t.Fatalf("stale finish = %v, want ErrFenced", err)
	}
	// A stale claim (from a read before the takeover) loses too.
	if err := old.Claim(ctx, j); !errors.Is(err, jobstore.ErrFenced) {
		t.Fatalf("stale claim = %v, want ErrFenced", err)
	}
	if err := nu.Dispatch(ctx, taken, false); err != nil {
		t.Fatalf("new holder dispatch: %v", err)
	}
	got, _ := nu.Get(ctx, "j1")
	if got.State != jobstore.Dispatched || got.Coordinator != "c2" {
		t.Errorf("record = %+v", got.Record)
	}
}

// TestSameHolderConcurrentWrite: a second writer of the same holder (the
// handle is stale by revision only) is retried, not fenced.
func TestSameHolderConcurrentWrite(t *testing.T) {
	env := natstest.Run(t)
	s := open(t, env, "c1")
	ctx := testContext(t)
	j := submit(t, s, jobstore.Submission{ID: "j1", Nodes: []string{"n1"}})
	other, _ := s.Get(ctx, "j1")
	if err := s.Dispatch(ctx, other, false); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx, j); err != nil {
		t.Fatalf("start on a revision-stale handle of the same holder: %v", err)
	}
	if err := s.Dispatch(ctx, other, false); !errors.Is(err, jobstore.ErrBackward) {
		t.Fatalf("dispatch after start = %v, want ErrBackward", err)
	}
}

func TestList(t *testing.T) {
	env := natstest.Run(t)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); now = now.Add(time.Second); return now }
	s, err := jobstore.Open(testContext(t), jobstore.Config{NATS: env.Coordinator(t), Coordinator: "c1", Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	submit(t, s, jobstore.Submission{ID: "a", Owner: "alice", Nodes: []string{"n1"}})
	b := submit(t, s, jobstore.Submission{ID: "b", Owner: "bob", Nodes: []string{"n2"}})
	submit(t, s, jobstore.Submission{ID: "c", Owner: "alice", Nodes: []string{"n2"}})
	if err := s.Finish(ctx, b, nil, false, ""); err != nil {
		t.Fatal(err)
	}
	ids := func(f jobstore.Filter, limit int) []string {
		js, err := s.List(ctx, f, nil, limit)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, j := range js {
			out = append(out, j.ID)
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		f     jobstore.Filter
		limit int
		want  string
	}{
		{"all newest first", jobstore.Filter{}, 0, "[c b a]"},
		{"owner", jobstore.Filter{Owner: "alice"}, 0, "[c a]"},
		{"node", jobstore.Filter{Node: "n2"}, 0, "[c b]"},
		{"state", jobstore.Filter{State: jobstore.Succeeded}, 0, "[b]"},
		{"active", jobstore.Filter{Active: true}, 0, "[c a]"},
		{"limit", jobstore.Filter{}, 1, "[c]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fmt.Sprint(ids(tc.f, tc.limit)); got != tc.want {
				t.Errorf("list = %s, want %s", got, tc.want)
			}
		})
	}
}

// fakeNodes answers job status queries from a map; missing nodes are
// unreachable.
type fakeNodes map[string]map[string]*protocol.JobStatus

func (f fakeNodes) JobStatus(_ context.Context, node, id string) (*protocol.JobStatus, error) {
	jobs, ok := f[node]
	if !ok {
		return nil, fmt.Errorf("node %s: %w", node, jobstore.ErrNodeUnreachable)
	}
	st, ok := jobs[id]
	if !ok {
		return nil, fmt.Errorf("node %s job %s: %w", node, id, jobstore.ErrNoSuchJob)
	}
	return st, nil
}

func TestReconcile(t *testing.T) {
	env := natstest.Run(t)
	dead := open(t, env, "dead")
	ctx := testContext(t)
	code := 2
	mk := func(id, node string, detached bool, to jobstore.State) {
		j := submit(t, dead, jobstore.Submission{ID: id, Nodes: []string{node}, Detached: detached})
		if to == jobstore.Queued {
			return
		}
		if err := dead.Dispatch(ctx, j, false); err != nil {
			t.Fatal(err)
		}
		if to == jobstore.Running {
			if err := dead.Start(ctx, j); err != nil {
				t.Fatal(err)
			}
		}
	}
	mk("queued", "n1", true, jobstore.Queued)
	mk("attached", "n1", false, jobstore.Running)
	mk("exited", "n1", true, jobstore.Running)
	mk("still", "n1", true, jobstore.Dispatched)
	mk("gone", "n1", true, jobstore.Running)
	mk("away", "n9", true, jobstore.Running)
	// A live coordinator's job is left alone.
	live := open(t, env, "live")
	submit(t, live, jobstore.Submission{ID: "theirs", Nodes: []string{"n1"}})

	// The node's clock: its end is after the record's start (an end
	// before it would be recorded as the start).
	started := time.Now().UTC()
	finished := started.Add(time.Minute)
	nodes := fakeNodes{"n1": {
		"exited": {ID: "exited", Node: "n1", State: protocol.JobExited, ExitCode: &code, StartedAt: started, FinishedAt: &finished},
		"still":  {ID: "still", Node: "n1", State: protocol.JobRunning, StartedAt: started},
	}}
	s := open(t, env, "new")
	isDead := func(h string) bool { return h == "dead" }
	out, err := s.Reconcile(ctx, nodes, isDead, time.Hour)
	if err != nil || out.Errs != nil {
		t.Fatalf("reconcile: %v, %v", err, out.Errs)
	}
	if out.Claimed != 6 || out.Settled != 4 || out.Pending != 2 {
		t.Errorf("outcome = %+v, want 6 claimed, 4 settled, 2 pending", out)
	}
	want := map[string]jobstore.State{
		"queued": jobstore.Lost, "attached": jobstore.Lost, "exited": jobstore.Failed,
		"still": jobstore.Running, "gone": jobstore.Lost, "away": jobstore.Running, "theirs": jobstore.Queued,
	}
	check := func() {
		t.Helper()
		for id, st := range want {
			j, err := s.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if j.State != st {
				t.Errorf("job %s: state %s, want %s (%s)", id, j.State, st, j.Error)
			}
			if id != "theirs" && j.Coordinator != "new" {
				t.Errorf("job %s: holder %s, want new", id, j.Coordinator)
			}
		}
	}
	check()
	if j, _ := s.Get(ctx, "exited"); len(j.Results) != 1 || j.Results[0].ExitCode != 2 || !j.FinishedAt.Equal(finished) {
		t.Errorf("exited record = %+v", j.Record)
	}
	waitQueued(t, s, 3) // theirs, and still and away: not ended
	// Past the bound, the unreachable node's job is lost; the running one
	// on a reachable node stays running.
	if out, err = s.Reconcile(ctx, nodes, isDead, 0); err != nil || out.Errs != nil {
		t.Fatalf("second reconcile: %v, %v", err, out.Errs)
	}
	want["away"] = jobstore.Lost
	check()
	waitQueued(t, s, 2) // theirs and still
}

// TestObserveNotFencedByHolder: a node's report settles a job whichever
// coordinator read it.
func TestObserve(t *testing.T) {
	env := natstest.Run(t)
	holder := open(t, env, "c1")
	reader := open(t, env, "c2")
	ctx := testContext(t)
	j := submit(t, holder, jobstore.Submission{ID: "j", Nodes: []string{"n1"}, Detached: true})
	if err := holder.Start(ctx, j); err != nil {
		t.Fatal(err)
	}
	r, _ := reader.Get(ctx, "j")
	zero := 0
	now := time.Now()
	done, err := reader.Observe(ctx, r, &protocol.JobStatus{ID: "j", Node: "n1", State: protocol.JobExited, ExitCode: &zero, StartedAt: now, FinishedAt: &now})
	if err != nil || !done {
		t.Fatalf("observe = %v, %v", done, err)
	}
	if r.State != jobstore.Succeeded || r.Coordinator != "c1" {
		t.Errorf("record = %+v", r.Record)
	}
	// The holder's handle is now behind a terminal state.
	if err := holder.Finish(ctx, j, nil, true, ""); !errors.Is(err, jobstore.ErrBackward) {
		t.Errorf("holder finish after observe = %v, want ErrBackward", err)
	}
}

// TestObserveLostSaysWhatWasSeen: a node's "lost" says that the job's
// supervisor on the node (its shim) ended while it ran, which is all the
// node knows; not that the agent restarted, which does not lose detached
// jobs (fresh17 item 7: a kill -9 of the shim read "its agent restarted").
func TestObserveLostSaysWhatWasSeen(t *testing.T) {
	env := natstest.Run(t)
	s := open(t, env, "c1")
	ctx := testContext(t)
	want := "node n1 lost the job: its supervisor on the node (the job shim) ended while the job ran, without recording how the job ended (killed? the node rebooted?); the job's main process was killed with it"
	for _, nodes := range [][]string{{"n1"}, {"n1", "n2"}} {
		id := fmt.Sprintf("j%d", len(nodes))
		j := submit(t, s, jobstore.Submission{ID: id, Nodes: nodes, Detached: true})
		if err := s.Start(ctx, j); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Observe(ctx, j, &protocol.JobStatus{ID: id, Node: "n1", State: protocol.JobLost, StartedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		cur, _ := s.Get(ctx, id)
		got := cur.Error
		if len(nodes) > 1 {
			got = ""
			for _, r := range cur.Results {
				if r.Node == "n1" {
					got = r.Error
				}
			}
		}
		if got != want {
			t.Errorf("%d nodes: the lost node's error %q, want %q", len(nodes), got, want)
		}
	}
}

// TestSurvivesServerRestart: an accepted job is on disk: a server
// restarted on the same store still has its record and queue message.
func TestSurvivesServerRestart(t *testing.T) {
	dir := t.TempDir()
	env := natstest.Run(t, func(o *server.Options) { o.StoreDir = dir; o.SyncAlways = true })
	s := open(t, env, "c1")
	submit(t, s, jobstore.Submission{ID: "j1", Owner: "alice", Nodes: []string{"n1"}})
	env.Server.Shutdown()
	env.Server.WaitForShutdown()

	opts := &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true, JetStream: true, StoreDir: dir}
	if err := env.Layout.ConfigureServer(opts); err != nil {
		t.Fatal(err)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(defaultTestTimeout) {
		t.Fatal("restarted server not ready")
	}
	s2 := open(t, &natstest.Env{Server: srv, Layout: env.Layout}, "c1")
	ctx := testContext(t)
	j, err := s2.Get(ctx, "j1")
	if err != nil {
		t.Fatalf("record after restart: %v", err)
	}
	if j.State != jobstore.Queued || j.Owner != "alice" {
		t.Errorf("record after restart = %+v", j.Record)
	}
	if n, err := s2.Queued(ctx); err != nil || n != 1 {
		t.Errorf("queued after restart = %d, %v; want 1", n, err)
	}
}

// TestReconcileOwnPredecessor: a restarted coordinator (same id, new
// process) takes over its predecessor's jobs and fences it, but leaves the
// jobs it runs itself alone.
func TestReconcileOwnPredecessor(t *testing.T) {
	env := natstest.Run(t)
	ctx := testContext(t)
	before := open(t, env, "c1")
	old := submit(t, before, jobstore.Submission{ID: "old", Nodes: []string{"n1"}})
	after := open(t, env, "c1")
	submit(t, after, jobstore.Submission{ID: "mine", Nodes: []string{"n1"}})
	out, err := after.Reconcile(ctx, fakeNodes{}, nil, time.Hour)
	if err != nil || out.Errs != nil || out.Claimed != 1 {
		t.Fatalf("reconcile = %+v, %v", out, err)
	}
	if j, _ := after.Get(ctx, "mine"); j.State != jobstore.Queued {
		t.Errorf("own live job: %s, want queued", j.State)
	}
	if j, _ := after.Get(ctx, "old"); j.State != jobstore.Lost {
		t.Errorf("predecessor's job: %s, want lost", j.State)
	}
	if err := before.Dispatch(ctx, old, false); !errors.Is(err, jobstore.ErrFenced) {
		t.Errorf("predecessor dispatch = %v, want ErrFenced", err)
	}
}

// TestSubmitDispatchedOrRunning: a job dispatched (or started) at once is
// recorded so in the one write, and may still only move forward.
func TestSubmitDispatchedOrRunning(t *testing.T) {
	env := natstest.Run(t)
	s := open(t, env, "c1")
	ctx := testContext(t)
	d := submit(t, s, jobstore.Submission{ID: "d", Nodes: []string{"n1"}, Detached: true, DispatchNow: true})
	r := submit(t, s, jobstore.Submission{ID: "r", Nodes: []string{"n1"}, StartNow: true})
	if d.State != jobstore.Dispatched || d.DispatchedAt.IsZero() || r.State != jobstore.Running || r.StartedAt.IsZero() {
		t.Fatalf("records = %+v, %+v", d.Record, r.Record)
	}
	if err := s.Dispatch(ctx, d, false); !errors.Is(err, jobstore.ErrBackward) {
		t.Errorf("dispatch of a dispatched job = %v, want ErrBackward", err)
	}
	if err := s.Start(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(ctx, r, []protocol.NodeResult{{Node: "n1"}}, false, ""); err != nil {
		t.Fatal(err)
	}
	// Their records are their accept: neither has a queue message.
	if n, err := s.Queued(ctx); err != nil || n != 0 {
		t.Errorf("queued messages = %d, %v; want 0", n, err)
	}
}

// TestBegin: Begin's write is Submit's: a live id is refused (ErrExists),
// an ended one reused, an idempotent repeat deduplicated; the handle it
// returns is at the record's revision, so its holder's next write goes
// through; and no queue message is left.
func TestBegin(t *testing.T) {
	env := natstest.Run(t)
	s := open(t, env, "c1")
	ctx := testContext(t)
	sub := jobstore.Submission{ID: "b1", Owner: "alice", Nodes: []string{"n1"}, StartNow: true}
	j, err := s.Begin(sub)(ctx)
	if err != nil || j.State != jobstore.Running || j.Revision() == 0 {
		t.Fatalf("begin = %+v, %v", j, err)
	}
	if got, err := s.Get(ctx, "b1"); err != nil || got.Revision() != j.Revision() || got.Owner != "alice" {
		t.Fatalf("record = %+v, %v; want revision %d", got, err, j.Revision())
	}
	if _, err := s.Begin(sub)(ctx); !errors.Is(err, jobstore.ErrExists) {
		t.Fatalf("begin of a live id = %v, want ErrExists", err)
	}
	if err := s.Finish(ctx, j, []protocol.NodeResult{{Node: "n1"}}, false, ""); err != nil {
		t.Fatal(err)
	}
	again, err := s.Begin(sub)(ctx)
	if err != nil || again.State != jobstore.Running {
		t.Fatalf("begin of an ended id = %+v, %v; want it reused", again, err)
	}
	idem := jobstore.Submission{ID: "i1", Owner: "alice", Nodes: []string{"n1"}, StartNow: true, Idempotent: true, IdempotencyKey: "k"}
	if _, err := s.Begin(idem)(ctx); err != nil {
		t.Fatal(err)
	}
	idem.ID = "i2"
	if first, err := s.Begin(idem)(ctx); !errors.Is(err, jobstore.ErrDuplicate) || first.ID != "i1" {
		t.Fatalf("idempotent repeat = %+v, %v; want i1, ErrDuplicate", first, err)
	}
	if n, err := s.Queued(ctx); err != nil || n != 0 {
		t.Errorf("queued messages = %d, %v; want 0", n, err)
	}
}

// TestIdempotentRunsAgainAfterLost: an idempotent job is at least once: a
// repeat of one whose first attempt was lost (its coordinator died) runs,
// once (of two repeats at once, one wins), and a repeat of the new attempt
// while it lives is deduplicated again.
func TestIdempotentRunsAgainAfterLost(t *testing.T) {
	env := natstest.Run(t)
	s := open(t, env, "c1")
	other := open(t, env, "c2")
	ctx := testContext(t)
	sub := func(id string) jobstore.Submission {
		return jobstore.Submission{ID: id, Owner: "nats:alice", Nodes: []string{"n1"}, Idempotent: true, IdempotencyKey: "k", StartNow: true}
	}
	first := submit(t, s, sub("a1"))
	if err := s.Lose(ctx, first, "its coordinator stopped while it ran"); err != nil {
		t.Fatal(err)
	}
	type res struct {
		j   *jobstore.Job
		err error
	}
	out := make(chan res, 2)
	for i, st := range []*jobstore.Store{s, other} {
		go func() {
			j, err := st.Submit(ctx, sub(fmt.Sprintf("a%d", i+2)))
			out <- res{j, err}
		}()
	}
	r1, r2 := <-out, <-out
	if (r1.err == nil) == (r2.err == nil) {
		t.Fatalf("two repeats of a lost job: %v and %v; want one run and one duplicate", r1.err, r2.err)
	}
	won, dup := r1, r2
	if r1.err != nil {
		won, dup = r2, r1
	}
	if !errors.Is(dup.err, jobstore.ErrDuplicate) || dup.j == nil || dup.j.ID != won.j.ID {
		t.Errorf("the other repeat = %+v, %v; want ErrDuplicate naming %s", dup.j, dup.err, won.j.ID)
	}
	if won.j.State != jobstore.Running {
		t.Errorf("the repeat that runs is %s, want running", won.j.State)
	}
	if j, err := s.Submit(ctx, sub("a9")); !errors.Is(err, jobstore.ErrDuplicate) || j.ID != won.j.ID {
		t.Errorf("repeat while the second attempt runs = %+v, %v; want ErrDuplicate naming it", j, err)
	}
}

// TestFinishAsyncTogether: end records begun together (as the coordinator
// batches them) are each written once their waits return: a handle stale
// by revision only (another write of the same holder) is retried on the
// fresh revision, one another coordinator claimed meanwhile is fenced and
// written nothing, and the rest end as their results say.
func TestFinishAsyncTogether(t *testing.T) {
	env := natstest.Run(t)
	s := open(t, env, "c1")
	other := open(t, env, "c2")
	ctx := testContext(t)
	const n = 20
	jobs := make([]*jobstore.Job, n)
	for i := range jobs {
		jobs[i] = submit(t, s, jobstore.Submission{ID: fmt.Sprintf("j%d", i), Nodes: []string{"n1"}, StartNow: true})
	}
	// j1: another handle of this holder moved the record on (a cancel's
	// write, say): the batch's handle is stale by revision.
	if h, err := s.Get(ctx, "j1"); err != nil {
		t.Fatal(err)
	} else if err := s.Finish(ctx, h, []protocol.NodeResult{{Node: "n1", ExitCode: 0}}, true, ""); err != nil {
		t.Fatal(err)
	}
	// j2: taken over by c2.
	if h, err := other.Get(ctx, "j2"); err != nil {
		t.Fatal(err)
	} else if err := other.Claim(ctx, h); err != nil {
		t.Fatal(err)
	}
	waits := make([]func(context.Context) error, n)
	for i, j := range jobs {
		code := 0
		if i%2 == 1 {
			code = 3
		}
		waits[i] = s.FinishAsync(j, []protocol.NodeResult{{Node: "n1", ExitCode: code}}, false, "")
	}
	for i, wait := range waits {
		err := wait(ctx)
		rec, gerr := s.Get(ctx, jobs[i].ID)
		if gerr != nil {
			t.Fatal(gerr)
		}
		switch i {
		case 1: // already cancelled by the other write: no backward move
			if !errors.Is(err, jobstore.ErrBackward) || rec.State != jobstore.Cancelled {
				t.Errorf("j1 (stale handle, record cancelled meanwhile): %v, record %s; want ErrBackward, cancelled", err, rec.State)
			}
		case 2:
			if !errors.Is(err, jobstore.ErrFenced) || rec.State != jobstore.Running || rec.Coordinator != "c2" {
				t.Errorf("j2 (claimed by c2): %v, record %s held by %s; want ErrFenced, running held by c2", err, rec.State, rec.Coordinator)
			}
		default:
			want := jobstore.Succeeded
			if i%2 == 1 {
				want = jobstore.Failed
			}
			if err != nil || rec.State != want || jobs[i].State != want || jobs[i].Revision() != rec.Revision() {
				t.Errorf("j%d: %v, record %s (rev %d), handle %s (rev %d); want %s, the handle current", i, err, rec.State, rec.Revision(), jobs[i].State, jobs[i].Revision(), want)
			}
		}
	}
}

// TestObserveFinishedNotBeforeStarted: a detached job that fails at once
// is recorded finished no earlier than it started. Its start is the
// coordinator's clock (stamped when the node confirmed it), its end the
// node's (the exit report), and a job quicker than that confirmation was
// recorded as finishing about 9 ms before it started.
func TestObserveFinishedNotBeforeStarted(t *testing.T) {
	env := natstest.Run(t)
	start := time.Date(2026, 12, 6, 1, 0, 0, 0, time.UTC) // the node's clock
	var mu sync.Mutex
	clock := start
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	ctx := testContext(t)
	s, err := jobstore.Open(ctx, jobstore.Config{NATS: env.Coordinator(t), Coordinator: "c1", Now: now})
	if err != nil {
		t.Fatal(err)
	}
	j := submit(t, s, jobstore.Submission{ID: "j", Nodes: []string{"n1"}, Detached: true, DispatchNow: true})
	mu.Lock()
	clock = start.Add(9 * time.Millisecond) // the node's start confirmed
	mu.Unlock()
	if err := s.Start(ctx, j); err != nil {
		t.Fatal(err)
	}
	one, fin := 1, start.Add(5*time.Millisecond)
	if _, err := s.Observe(ctx, j, &protocol.JobStatus{ID: "j", Node: "n1", State: protocol.JobExited, ExitCode: &one, StartedAt: start, FinishedAt: &fin}); err != nil {
		t.Fatal(err)
	}
	r, err := s.Get(ctx, "j")
	if err != nil {
		t.Fatal(err)
	}
	if r.State != jobstore.Failed || r.FinishedAt.Before(r.StartedAt) {
		t.Errorf("record %s, started %v, finished %v: want failed, finished no earlier than started", r.State, r.StartedAt, r.FinishedAt)
	}
	if len(r.Results) != 1 || r.Results[0].DurationMS != 5 {
		t.Errorf("results %+v: want the node's run of 5 ms", r.Results)
	}
}

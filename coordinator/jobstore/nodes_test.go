package jobstore_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/coordinator/internal/natstest"
	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/protocol"
)

// exited is node's status of job id after it exited with code.
func exited(id, node string, code int) *protocol.JobStatus {
	start := time.Now().Add(-time.Second)
	end := time.Now()
	return &protocol.JobStatus{ID: id, Node: node, State: protocol.JobExited, ExitCode: &code, StartedAt: start, FinishedAt: &end}
}

// resultCodes maps each node result of r to its exit code.
func resultCodes(r *jobstore.Record) map[string]int {
	out := map[string]int{}
	for _, res := range r.Results {
		out[res.Node] = res.ExitCode
	}
	return out
}

// TestObserveNodesConcurrently: three nodes of one detached job report at
// once, each through its own coordinator's store: every result is
// recorded, and the job ends failed (one node exited 3) once the last
// one is in.
func TestObserveNodesConcurrently(t *testing.T) {
	env := natstest.Run(t)
	holder := open(t, env, "c0")
	stores := []*jobstore.Store{open(t, env, "c1"), open(t, env, "c2"), open(t, env, "c3")}
	ctx := testContext(t)
	nodes := []string{"n1", "n2", "n3"}
	codes := map[string]int{"n1": 0, "n2": 3, "n3": 0}
	for round := range 8 {
		id := fmt.Sprintf("fan%d", round)
		j := submit(t, holder, jobstore.Submission{ID: id, Nodes: nodes, Detached: true, DispatchNow: true})
		if err := holder.Start(ctx, j); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, len(nodes))
		for i, n := range nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := stores[i].Get(ctx, id)
				if err != nil {
					errs[i] = err
					return
				}
				_, errs[i] = stores[i].Observe(ctx, r, exited(id, n, codes[n]))
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("round %d: observe: %v", round, err)
		}
		got, err := holder.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != jobstore.Failed || got.Succeeded != 2 || got.Failed != 1 || got.FinishedAt.IsZero() {
			t.Errorf("round %d: record %s, %d succeeded, %d failed, finished %v; want failed, 2, 1, set", round, got.State, got.Succeeded, got.Failed, got.FinishedAt)
		}
		if rc := resultCodes(&got.Record); len(got.Results) != 3 || rc["n1"] != 0 || rc["n2"] != 3 || rc["n3"] != 0 {
			t.Errorf("round %d: results %+v, want n1 0, n2 3, n3 0", round, got.Results)
		}
		if got.ExitCode() != 1 || got.Coordinator != "c0" {
			t.Errorf("round %d: exit code %d, holder %s; want 1, c0", round, got.ExitCode(), got.Coordinator)
		}
	}
}

// TestObserveNodeForeignAndRepeat: a status of a node the job does not
// run on changes nothing; a node's second report changes nothing; the
// holder's late start does not drop the results recorded before it.
func TestObserveNodeForeignAndRepeat(t *testing.T) {
	env := natstest.Run(t)
	holder := open(t, env, "c1")
	other := open(t, env, "c2")
	ctx := testContext(t)
	j := submit(t, holder, jobstore.Submission{ID: "j", Nodes: []string{"n1", "n2"}, Detached: true, DispatchNow: true})

	r, _ := other.Get(ctx, "j")
	rev := r.Revision()
	if done, err := other.Observe(ctx, r, exited("j", "n9", 0)); !errors.Is(err, jobstore.ErrNotInJob) || done {
		t.Errorf("observe of node n9 = %v, %v; want ErrNotInJob", done, err)
	}
	if cur, _ := other.Get(ctx, "j"); cur.Revision() != rev || cur.State != jobstore.Dispatched || len(cur.Results) != 0 {
		t.Errorf("after a foreign report: revision %d (was %d), %s, %+v", cur.Revision(), rev, cur.State, cur.Results)
	}
	// n1 exits before the holder recorded the start.
	if done, err := other.Observe(ctx, r, exited("j", "n1", 0)); err != nil || done {
		t.Fatalf("observe n1 = %v, %v; want not done", done, err)
	}
	if err := holder.Start(ctx, j); !errors.Is(err, jobstore.ErrBackward) {
		t.Errorf("holder start after a node result = %v, want ErrBackward", err)
	}
	// A repeat of n1's report, with another code, from a fresh read.
	r, _ = other.Get(ctx, "j")
	rev = r.Revision()
	if done, err := other.Observe(ctx, r, exited("j", "n1", 5)); err != nil || done {
		t.Errorf("repeat of n1 = %v, %v", done, err)
	}
	cur, _ := other.Get(ctx, "j")
	if cur.Revision() != rev || cur.State != jobstore.Running || resultCodes(&cur.Record)["n1"] != 0 || len(cur.Results) != 1 || !cur.FinishedAt.IsZero() {
		t.Errorf("after a repeat: revision %d (was %d), %s, %+v; want unchanged running, n1 0", cur.Revision(), rev, cur.State, cur.Results)
	}
	if done, err := other.Observe(ctx, cur, exited("j", "n2", 0)); err != nil || !done {
		t.Fatalf("observe n2 = %v, %v; want done", done, err)
	}
	if cur, _ = holder.Get(ctx, "j"); cur.State != jobstore.Succeeded || len(cur.Results) != 2 || cur.ExitCode() != 0 {
		t.Errorf("record %s, results %+v; want succeeded with 2", cur.State, cur.Results)
	}
}

// TestReconcileSeveralNodes: a dead holder's detached job on three nodes
// is settled node by node: the exited node at once, the running one when
// it exits, the unreachable one lost only past the bound.
func TestReconcileSeveralNodes(t *testing.T) {
	env := natstest.Run(t)
	dead := open(t, env, "dead")
	ctx := testContext(t)
	j := submit(t, dead, jobstore.Submission{ID: "fan", Nodes: []string{"n1", "n2", "n3"}, Detached: true, DispatchNow: true})
	if err := dead.Start(ctx, j); err != nil {
		t.Fatal(err)
	}
	nodes := fakeNodes{
		"n1": {"fan": exited("fan", "n1", 0)},
		"n2": {"fan": {ID: "fan", Node: "n2", State: protocol.JobRunning, StartedAt: time.Now()}},
	}
	s := open(t, env, "new")
	isDead := func(h string) bool { return h == "dead" }
	out, err := s.Reconcile(ctx, nodes, isDead, time.Hour)
	if err != nil || out.Errs != nil || out.Claimed != 1 || out.Pending != 1 {
		t.Fatalf("reconcile = %+v, %v; want 1 claimed, 1 pending", out, err)
	}
	cur, _ := s.Get(ctx, "fan")
	if cur.State != jobstore.Running || len(cur.Results) != 1 || cur.Results[0].Node != "n1" || cur.Coordinator != "new" {
		t.Errorf("after a pass: %s, %+v, held by %s; want running with n1's result, new", cur.State, cur.Results, cur.Coordinator)
	}
	nodes["n2"]["fan"] = exited("fan", "n2", 3)
	if out, err = s.Reconcile(ctx, nodes, isDead, 0); err != nil || out.Errs != nil || out.Settled != 1 {
		t.Fatalf("second reconcile = %+v, %v; want 1 settled", out, err)
	}
	cur, _ = s.Get(ctx, "fan")
	rc := resultCodes(&cur.Record)
	if cur.State != jobstore.Failed || len(cur.Results) != 3 || rc["n1"] != 0 || rc["n2"] != 3 || rc["n3"] != -1 || cur.Failed != 2 {
		t.Errorf("record %s, %+v; want failed with n1 0, n2 3, n3 lost", cur.State, cur.Results)
	}
	for _, res := range cur.Results {
		if res.Node == "n3" && (res.ErrorCode != protocol.ResultCodeLost || res.Error == "") {
			t.Errorf("n3's result %+v, want lost with a reason", res)
		}
	}
}

package jobstore_test

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/tetherfleet/tether/coordinator/internal/natstest"
	"github.com/tetherfleet/tether/coordinator/jobstore"
)

// TestClaimRerunOnce: two coordinators that both read a lost idempotent
// job try to claim its re-run: exactly one wins (compare-and-set), the
// other gets ErrFenced and the record names the winner's re-run; a job at
// MaxAttempts is not claimed and says its attempts were exhausted; a job
// that is not idempotent is never claimed.
func TestClaimRerunOnce(t *testing.T) {
	env := natstest.Run(t)
	a, b := open(t, env, "ca"), open(t, env, "cb")
	ctx := testContext(t)
	j := submit(t, a, jobstore.Submission{ID: "r1", Owner: "nats:alice", Nodes: []string{"n1"}, Detached: true, Idempotent: true, DispatchNow: true, Script: "true"})
	if j.Attempt != 1 {
		t.Errorf("first attempt recorded as %d, want 1", j.Attempt)
	}
	if err := a.Lose(ctx, j, "node n1 lost the job"); err != nil {
		t.Fatal(err)
	}
	ja, err := a.Get(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	jb, err := b.Get(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	var ea, eb error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); ea = a.ClaimRerun(ctx, ja, "r1.2") }()
	go func() { defer wg.Done(); eb = b.ClaimRerun(ctx, jb, "r1.2") }()
	wg.Wait()
	if (ea == nil) == (eb == nil) {
		t.Fatalf("claims: a %v, b %v; want exactly one to win", ea, eb)
	}
	loser := ea
	if loser == nil {
		loser = eb
	}
	if !errors.Is(loser, jobstore.ErrFenced) {
		t.Errorf("losing claim: %v, want ErrFenced", loser)
	}
	cur, err := a.Get(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if cur.RerunAs != "r1.2" {
		t.Errorf("record RerunAs %q, want r1.2", cur.RerunAs)
	}
	// A second claim of the same record (read again) is refused too.
	if err := a.ClaimRerun(ctx, cur, "r1.3"); !errors.Is(err, jobstore.ErrRerunClaimed) {
		t.Errorf("claim of a claimed record: %v, want ErrRerunClaimed", err)
	}

	// The last attempt: not re-run, the record says why.
	last := submit(t, a, jobstore.Submission{ID: "r9.3", Owner: "nats:alice", Nodes: []string{"n1"}, Detached: true, Idempotent: true, DispatchNow: true, Script: "true", Attempt: jobstore.MaxAttempts, RerunOf: "r9.2"})
	if err := a.Lose(ctx, last, "node n1 lost the job"); err != nil {
		t.Fatal(err)
	}
	if err := a.ClaimRerun(ctx, last, "r9.4"); !errors.Is(err, jobstore.ErrAttemptsExhausted) {
		t.Fatalf("claim at attempt %d: %v, want ErrAttemptsExhausted", last.Attempt, err)
	}
	if cur, _ := a.Get(ctx, "r9.3"); cur == nil || cur.RerunAs != "" || !strings.Contains(cur.Error, "attempts exhausted") || cur.RerunOf != "r9.2" {
		t.Errorf("exhausted record: %+v", cur)
	}

	plain := submit(t, a, jobstore.Submission{ID: "p1", Owner: "nats:alice", Nodes: []string{"n1"}, Detached: true, DispatchNow: true, Script: "true"})
	if err := a.Lose(ctx, plain, "lost"); err != nil {
		t.Fatal(err)
	}
	if err := a.ClaimRerun(ctx, plain, "p1.2"); !errors.Is(err, jobstore.ErrNotRerunnable) {
		t.Errorf("claim of a plain job: %v, want ErrNotRerunnable", err)
	}
}

// TestRerunSpec: a job's spec is stored and read back by any coordinator.
func TestRerunSpec(t *testing.T) {
	env := natstest.Run(t)
	a, b := open(t, env, "ca"), open(t, env, "cb")
	ctx := testContext(t)
	if err := a.PutSpec(ctx, "s1", []byte(`{"x":1}`)); err != nil {
		t.Fatal(err)
	}
	got, err := b.Spec(ctx, "s1")
	if err != nil || string(got) != `{"x":1}` {
		t.Fatalf("spec: %q %v", got, err)
	}
	if _, err := b.Spec(ctx, "none"); !errors.Is(err, jobstore.ErrNotFound) {
		t.Errorf("missing spec: %v, want ErrNotFound", err)
	}
}

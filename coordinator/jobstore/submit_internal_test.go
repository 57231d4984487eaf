package jobstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/coordinator/internal/natstest"
)

// TestStartedJobRecordCarriesMsgID: a job accepted by its record alone
// (started at once, no queue message) still has its idempotency key as
// the record write's Nats-Msg-Id: a repeat whose idempotency key entry is
// gone (deleted by hand) is refused as the first job's duplicate, not
// accepted and run a second time.
func TestStartedJobRecordCarriesMsgID(t *testing.T) {
	env := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := Open(ctx, Config{NATS: env.Coordinator(t), Coordinator: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	sub := Submission{ID: "a", Owner: "nats:alice", Nodes: []string{"n1"}, Idempotent: true, IdempotencyKey: "k", StartNow: true}
	if _, err := s.Submit(ctx, sub); err != nil {
		t.Fatal(err)
	}
	if err := s.kv.Purge(ctx, idemKey(sub.Owner, "k")); err != nil {
		t.Fatal(err)
	}
	sub.ID = "b"
	first, err := s.Submit(ctx, sub)
	if !errors.Is(err, ErrDuplicate) || first == nil || first.ID != "a" {
		t.Fatalf("repeat = %+v, %v; want job a, ErrDuplicate", first, err)
	}
	if _, err := s.Get(ctx, "b"); !errors.Is(err, ErrNotFound) {
		t.Errorf("record of the repeat: %v, want ErrNotFound", err)
	}
}

// A started job whose record write is not acknowledged in time is either
// accepted (its write landed: the record is its own and running) or
// refused with a terminal record, never refused with a record that says
// running (TestCluster at load 40: the client was told 503, its retry got
// 409 "job id in use", and the job never ran). wait is called with its
// context already ended, so it gives up before the acknowledgement comes.
func TestUnconfirmedRecordWriteIsSettled(t *testing.T) {
	env := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Open(ctx, Config{NATS: env.Coordinator(t), Coordinator: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	ended, end := context.WithCancel(ctx)
	end()
	for i := range 40 {
		id := fmt.Sprintf("j%d", i)
		wait := s.Begin(Submission{ID: id, Owner: "nats:alice", Nodes: []string{"n1"}, StartNow: true})
		j, err := wait(ended)
		rec, gerr := s.Get(ctx, id)
		switch {
		case err == nil:
			if gerr != nil || rec.State != Running || rec.rev != j.rev {
				t.Errorf("%s accepted, but its record is %+v, %v (want running at revision %d)", id, rec, gerr, j.rev)
			}
		case gerr == nil && !rec.State.Terminal():
			t.Errorf("%s refused (%v), but its record says %s", id, err, rec.State)
		}
	}
}

// settleUnconfirmed's outcomes, one by one.
func TestSettleUnconfirmed(t *testing.T) {
	env := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Open(ctx, Config{NATS: env.Coordinator(t), Coordinator: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	sub := func(id string) Submission {
		return Submission{ID: id, Owner: "nats:alice", Nodes: []string{"n1"}, StartNow: true}
	}
	cause := context.DeadlineExceeded

	// The write never arrived: the job is refused and recorded lost, and
	// a retry of its id is accepted.
	j := s.newJob(sub("never"))
	if _, err := s.settleUnconfirmed(ctx, j, 0, cause); err == nil || !errors.Is(err, cause) {
		t.Errorf("never stored: %v, want an error wrapping %v", err, cause)
	}
	if rec, err := s.Get(ctx, "never"); err != nil || rec.State != Lost || !strings.Contains(rec.Error, "did not run") {
		t.Errorf("never stored: record %+v, %v; want lost, saying it did not run", rec, err)
	}
	if _, err := s.Submit(ctx, sub("never")); err != nil {
		t.Errorf("retry of the refused id: %v", err)
	}

	// The write landed late: accepted at its revision.
	j = s.newJob(sub("late"))
	if err := s.create(ctx, j, ""); err != nil {
		t.Fatal(err)
	}
	rev := j.rev
	if got, err := s.settleUnconfirmed(ctx, j, 0, cause); err != nil || got != rev {
		t.Errorf("landed late: revision %d, %v; want accepted at revision %d", got, err, rev)
	}

	// Another coordinator's running job has the id: ErrExists (the
	// first write, refused by the server, whose answer was lost).
	other, err := Open(ctx, Config{NATS: env.Coordinator(t), Coordinator: "c2"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Submit(ctx, sub("taken")); err != nil {
		t.Fatal(err)
	}
	s.js = &lostAckJS{JetStream: s.js, t: t, key: jobKey("taken"), expect: "0", err: cause, drop: true}
	if _, err := s.Begin(sub("taken"))(ctx); !errors.Is(err, ErrExists) {
		t.Errorf("another's running job: %v, want ErrExists", err)
	}

	// An earlier job's terminal record has the id: replaced, accepted.
	done, err := other.Submit(ctx, sub("reused"))
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Finish(ctx, done, nil, false, ""); err != nil {
		t.Fatal(err)
	}
	s.js = &lostAckJS{JetStream: s.js.(*lostAckJS).JetStream, t: t, key: jobKey("reused"), expect: "0", err: cause, drop: true}
	if got, err := s.Begin(sub("reused"))(ctx); err != nil {
		t.Errorf("earlier terminal record: %v, want accepted", err)
	} else if rec, err := s.Get(ctx, "reused"); err != nil || rec.State != Running || rec.Coordinator != "c1" || rec.rev != got.rev {
		t.Errorf("earlier terminal record: now %+v, %v; want c1's running record", rec, err)
	}
}

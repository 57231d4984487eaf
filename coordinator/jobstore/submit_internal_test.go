package jobstore

import (
	"context"
	"errors"
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

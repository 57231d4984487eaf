package jobstore

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tetherfleet/tether/coordinator/internal/natstest"
)

// TestQueuedLostAckDeduplicated: a queued job's queue message that was
// stored but whose PubAck was lost (timed out, or cut by a reconnect) is
// resent under the submission's own Nats-Msg-Id, so the stream's
// duplicate window drops the resend: the job is accepted once and the
// stream holds its one message (before, the submission was refused and
// the client's retry stored a second message for the job). Distinct
// submissions of one id (the id reused after the job ended) each get a
// message of their own.
func TestQueuedLostAckDeduplicated(t *testing.T) {
	env := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := Open(ctx, Config{NATS: env.Coordinator(t), Coordinator: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	if s.cfg.DedupeWindow < minDedupeWindow {
		t.Errorf("duplicate window %v, want at least %v (the span of a submission's resends)", s.cfg.DedupeWindow, minDedupeWindow)
	}
	if info, err := s.stream.Info(ctx); err != nil || info.Config.Duplicates < minDedupeWindow {
		t.Errorf("stream duplicate window: %+v, %v; want at least %v", info, err, minDedupeWindow)
	}
	real := s.js
	// messages is how many queue messages the stream holds for id.
	messages := func(id string) uint64 {
		t.Helper()
		info, err := s.stream.Info(ctx, jetstream.WithSubjectFilter(SubjectPrefix+id))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Subjects[SubjectPrefix+id]
	}
	for i, cause := range []error{context.DeadlineExceeded, nats.ErrDisconnected, jetstream.ErrAsyncPublishTimeout} {
		for _, idem := range []bool{false, true} {
			id := [...]string{"t", "d", "a"}[i] + map[bool]string{false: "-plain", true: "-idem"}[idem]
			sub := Submission{ID: id, Owner: "nats:alice", Nodes: []string{"n1"}, Idempotent: idem}
			s.js = &lostAckJS{JetStream: real, t: t, subject: SubjectPrefix + id, err: cause}
			j, err := s.Submit(ctx, sub)
			if err != nil {
				// Refused (503 from the coordinator): the client's
				// retry stores another message (and the refusal's ack,
				// a purge of the job's subject, races it).
				t.Errorf("%s (%v): refused: %v; want accepted, its message stored once", id, cause, err)
				j, err = s.Submit(ctx, sub)
			}
			s.js = real
			if err != nil || j.State != Queued {
				t.Fatalf("%s: %+v, %v; want accepted, queued", id, j, err)
			}
			if n := messages(id); n != 1 {
				t.Errorf("%s (%v): the stream holds %d messages for the job, want 1", id, cause, n)
			}
			if rec, err := s.Get(ctx, id); err != nil || rec.State != Queued {
				t.Errorf("%s: record %+v, %v; want queued", id, rec, err)
			}
		}
	}

	// Distinct submissions of one id each have their message.
	j, err := s.Submit(ctx, Submission{ID: "reused", Nodes: []string{"n1"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(ctx, j, nil, false, ""); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); messages("reused") != 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond) // the ack is a purge sent without waiting
	}
	if _, err := s.Submit(ctx, Submission{ID: "reused", Nodes: []string{"n1"}}); err != nil {
		t.Fatal(err)
	}
	if n := messages("reused"); n != 1 {
		t.Errorf("a second submission of an ended job's id: the stream holds %d messages for it, want 1 (its own)", n)
	}
}

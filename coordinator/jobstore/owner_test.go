package jobstore_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/coordinator/internal/natstest"
	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/protocol"
)

// TestIDReuseOnlyByOwner: a job id belongs to the owner of its record for
// as long as the record is kept. Another owner's submission under it, the
// job live or ended, plain or idempotent, through Submit or Begin, is
// refused with ErrNotOwner (also ErrExists) and writes nothing: the
// record keeps its owner, state and results, and the refusal reads the
// same whether the job is live or ended. The owner reuses the id once the
// job ended, as before. An idempotency key is the owner's own: another
// owner's key of the same text, or a key of its own that a refused
// submission left naming the id, never answers with the first owner's job.
func TestIDReuseOnlyByOwner(t *testing.T) {
	env := natstest.Run(t)
	s := open(t, env, "c1")
	other := open(t, env, "c2")
	ctx := testContext(t)
	alice := func(id string) jobstore.Submission {
		return jobstore.Submission{ID: id, Owner: "nats:alice", Nodes: []string{"n1"}, Script: "make", StartNow: true}
	}
	mallory := func(id string) jobstore.Submission {
		return jobstore.Submission{ID: id, Owner: "nats:mallory", Nodes: []string{"n2"}, Script: "cat secrets", StartNow: true}
	}
	tries := func(id string) map[string]func() error {
		try := func(f func() (*jobstore.Job, error)) func() error {
			return func() error { _, err := f(); return err }
		}
		queued, detached, idem := mallory(id), mallory(id), mallory(id)
		queued.StartNow = false
		detached.StartNow, detached.DispatchNow, detached.Detached = false, true, true
		idem.Idempotent, idem.IdempotencyKey = true, "mk-"+id
		return map[string]func() error{
			"submit":     try(func() (*jobstore.Job, error) { return s.Submit(ctx, mallory(id)) }),
			"begin":      try(func() (*jobstore.Job, error) { return other.Begin(mallory(id))(ctx) }),
			"queued":     try(func() (*jobstore.Job, error) { return other.Submit(ctx, queued) }),
			"detached":   try(func() (*jobstore.Job, error) { return other.Begin(detached)(ctx) }),
			"idempotent": try(func() (*jobstore.Job, error) { return other.Submit(ctx, idem) }),
		}
	}
	refusals := func(id string, want *jobstore.Job) map[string]string {
		t.Helper()
		texts := map[string]string{}
		for name, try := range tries(id) {
			err := try()
			if !errors.Is(err, jobstore.ErrNotOwner) || !errors.Is(err, jobstore.ErrExists) {
				t.Errorf("%s: mallory's %s of %s = %v; want ErrNotOwner and ErrExists", want.State, name, id, err)
			} else {
				texts[name] = strings.ReplaceAll(err.Error(), id, "ID")
			}
			got, err := s.Get(ctx, id)
			if err != nil || !reflect.DeepEqual(got.Record, want.Record) || got.Revision() != want.Revision() {
				t.Errorf("%s: after mallory's %s of %s, record = %+v (revision %d), %v; want %+v (revision %d)", want.State, name, id, got, got.Revision(), err, want.Record, want.Revision())
			}
		}
		return texts
	}

	live := submit(t, s, alice("build-0"))
	liveTexts := refusals("build-0", live)

	j := submit(t, s, alice("build-1"))
	res := []protocol.NodeResult{{Node: "n1", ExitCode: 0, StdoutBytes: 42}}
	if err := s.Finish(ctx, j, res, false, ""); err != nil {
		t.Fatal(err)
	}
	ended, err := s.Get(ctx, "build-1")
	if err != nil || ended.State != jobstore.Succeeded || ended.Owner != "nats:alice" || len(ended.Results) != 1 {
		t.Fatalf("alice's ended record = %+v, %v", ended, err)
	}
	endedTexts := refusals("build-1", ended)
	if !reflect.DeepEqual(liveTexts, endedTexts) {
		t.Errorf("refusals of a live job's id %q differ from an ended one's %q: they tell mallory its state", liveTexts, endedTexts)
	}
	for name, text := range endedTexts {
		if strings.Contains(text, "alice") || strings.Contains(text, "c1") || strings.Contains(text, "succeeded") {
			t.Errorf("mallory's %s refusal %q names the owner, holder or state", name, text)
		}
	}

	// The idempotent refusal left mallory's key naming build-1: her repeat
	// under a new id runs her job, and is never told of alice's.
	rep, err := other.Submit(ctx, jobstore.Submission{ID: "m-2", Owner: "nats:mallory", Nodes: []string{"n2"}, StartNow: true, Idempotent: true, IdempotencyKey: "mk-build-1"})
	if err != nil || rep.ID != "m-2" || rep.Owner != "nats:mallory" {
		t.Errorf("mallory's repeat of her refused idempotent submission = %+v, %v; want her job m-2 run", rep, err)
	}
	// Alice's idempotency key, repeated by mallory, is a key of mallory's.
	ak := alice("a-idem")
	ak.Idempotent, ak.IdempotencyKey = true, "release"
	submit(t, s, ak)
	mk := mallory("m-idem")
	mk.Idempotent, mk.IdempotencyKey = true, "release"
	if got, err := other.Submit(ctx, mk); err != nil || got.ID != "m-idem" || got.Owner != "nats:mallory" {
		t.Errorf("mallory repeating alice's idempotency key = %+v, %v; want her own job m-idem", got, err)
	}
	ak.ID = "a-idem2"
	if got, err := s.Submit(ctx, ak); !errors.Is(err, jobstore.ErrDuplicate) || got == nil || got.ID != "a-idem" {
		t.Errorf("alice repeating her key = %+v, %v; want ErrDuplicate naming a-idem", got, err)
	}

	// Alice reuses her own ended id, as before.
	again, err := other.Begin(alice("build-1"))(ctx)
	if err != nil || again.Owner != "nats:alice" || again.State != jobstore.Running {
		t.Fatalf("alice's reuse of build-1 = %+v, %v; want it running", again, err)
	}
}

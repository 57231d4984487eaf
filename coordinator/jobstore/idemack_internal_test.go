package jobstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tetherfleet/tether/coordinator/internal/natstest"
)

// lostAckKV stores the first Create of key and then answers as if its
// acknowledgement never came (err); with getFails, that many reads of key
// after it fail too (the connection still down). Every other call goes
// through.
type lostAckKV struct {
	jetstream.KeyValue
	key      string
	err      error
	getFails int
	hit      bool
}

func (f *lostAckKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	if key != f.key || f.hit {
		return f.KeyValue.Create(ctx, key, value, opts...)
	}
	f.hit = true
	if _, err := f.KeyValue.Create(ctx, key, value, opts...); err != nil {
		return 0, err
	}
	return 0, f.err
}

func (f *lostAckKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if key == f.key && f.hit && f.getFails > 0 {
		f.getFails--
		return nil, nats.ErrTimeout
	}
	return f.KeyValue.Get(ctx, key)
}

// TestIdempotencyKeyUnconfirmedCreate: an idempotency key whose create
// reached the server but whose acknowledgement was lost (timed out, or
// cut by a reconnect) does not make the client's repeat of the request
// (same key, same owner) fail for good (503 from the coordinator: the key
// named a job with no record). The repeat settles it: it runs the job,
// once, under the id it asked for, and a further repeat is the job's
// duplicate. A submission that can read its key back settles at once.
func TestIdempotencyKeyUnconfirmedCreate(t *testing.T) {
	env := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := Open(ctx, Config{NATS: env.Coordinator(t), Coordinator: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	real := s.kv
	const owner = "nats:alice"
	sub := func(id, key string) Submission {
		return Submission{ID: id, Owner: owner, Nodes: []string{"n1"}, StartNow: true, Idempotent: true, IdempotencyKey: key}
	}
	// runs: the live records of key's jobs; the one job must be want.
	runs := func(name, key, want string) {
		t.Helper()
		jobs, err := s.List(ctx, Filter{Owner: owner, Active: true}, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, j := range jobs {
			if e, err := real.Get(ctx, idemKey(owner, key)); err == nil && string(e.Value()) == j.ID {
				ids = append(ids, j.ID)
			} else if j.ID == want {
				ids = append(ids, j.ID+" (not named by the key)")
			}
		}
		if len(ids) != 1 || ids[0] != want {
			t.Errorf("%s: live jobs of key %s: %v, want [%s]", name, key, ids, want)
		}
	}
	// dup: a further repeat is the job's duplicate.
	dup := func(name, key, want string) {
		t.Helper()
		first, err := s.Submit(ctx, sub("again-"+key, key))
		if !errors.Is(err, ErrDuplicate) || first == nil || first.ID != want || first.State != Running {
			t.Errorf("%s: a further repeat: %+v, %v; want job %s (running) and ErrDuplicate", name, first, err, want)
		}
	}

	for _, cause := range []error{context.DeadlineExceeded, nats.ErrDisconnected} {
		c := map[error]string{context.DeadlineExceeded: "t", nats.ErrDisconnected: "d"}[cause]

		// The key cannot be read back either: the submission is refused
		// (503), and its repeat with the same id runs it.
		key := "same-" + c
		s.kv = &lostAckKV{KeyValue: real, key: idemKey(owner, key), err: cause, getFails: 100}
		if j, err := s.Submit(ctx, sub("a-"+c, key)); err == nil || errors.Is(err, ErrDuplicate) || errors.Is(err, ErrExists) {
			t.Fatalf("%v, unreadable: first submission %+v, %v; want refused, its fate unknown", cause, j, err)
		}
		s.kv = real
		j, err := s.Submit(ctx, sub("a-"+c, key))
		if err != nil || j.ID != "a-"+c || j.State != Running {
			t.Errorf("%v: repeat with the same id: %+v, %v; want job a-%s accepted, running", cause, j, err, c)
		}
		runs(cause.Error()+": repeat with the same id", key, "a-"+c)
		dup(cause.Error()+": repeat with the same id", key, "a-"+c)

		// The repeat comes with a new id: it runs under it, once; the
		// first id, never recorded, is not left to run.
		key = "new-" + c
		s.kv = &lostAckKV{KeyValue: real, key: idemKey(owner, key), err: cause, getFails: 100}
		if _, err := s.Submit(ctx, sub("b1-"+c, key)); err == nil {
			t.Fatalf("%v, unreadable: first submission accepted", cause)
		}
		s.kv = real
		j, err = s.Submit(ctx, sub("b2-"+c, key))
		if err != nil || j.ID != "b2-"+c {
			t.Errorf("%v: repeat with a new id: %+v, %v; want job b2-%s accepted", cause, j, err, c)
		}
		if rec, err := s.Get(ctx, "b1-"+c); err == nil && !rec.State.Terminal() {
			t.Errorf("%v: the unrecorded first id b1-%s is %s", cause, c, rec.State)
		}
		runs(cause.Error()+": repeat with a new id", key, "b2-"+c)
		dup(cause.Error()+": repeat with a new id", key, "b2-"+c)

		// The key can be read back: the submission itself is accepted.
		key = "readable-" + c
		s.kv = &lostAckKV{KeyValue: real, key: idemKey(owner, key), err: cause}
		j, err = s.Submit(ctx, sub("c-"+c, key))
		s.kv = real
		if err != nil || j.ID != "c-"+c {
			t.Errorf("%v, readable: %+v, %v; want job c-%s accepted", cause, j, err, c)
		}
		runs(cause.Error()+": readable", key, "c-"+c)
		dup(cause.Error()+": readable", key, "c-"+c)
	}
}

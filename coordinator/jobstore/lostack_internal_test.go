package jobstore

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tetherfleet/tether/coordinator/internal/natstest"
)

// lostAckJS stores (unless drop: loses) the first record write of key
// (the first publish to subject, when set) whose expected last sequence
// is expect (any, with expect "") and then
// answers as if their acknowledgement never came: the synchronous publish
// with err, the asynchronous one with a future failing with err. Every
// other call goes through.
type lostAckJS struct {
	jetstream.JetStream
	t       *testing.T
	key     string
	subject string
	expect  string
	err     error
	drop    bool
	hit     int
}

func (f *lostAckJS) matches(m *nats.Msg) bool {
	want := recordSubject(f.key)
	if f.subject != "" {
		want = f.subject
	}
	if m.Subject != want || f.hit > 0 {
		return false
	}
	if f.expect != "" && m.Header.Get(jetstream.ExpectedLastSubjSeqHeader) != f.expect {
		return false
	}
	f.hit++
	return true
}

// store writes m for real and waits for it to land.
func (f *lostAckJS) store(m *nats.Msg) {
	if f.drop {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := f.JetStream.PublishMsg(ctx, m); err != nil {
		f.t.Errorf("storing the write whose ack is lost: %v", err)
	}
}

func (f *lostAckJS) PublishMsg(ctx context.Context, m *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if f.matches(m) {
		f.store(m)
		return nil, f.err
	}
	return f.JetStream.PublishMsg(ctx, m, opts...)
}

func (f *lostAckJS) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	if f.matches(m) {
		f.store(m)
		return failedFuture{m: m, err: f.err}, nil
	}
	return f.JetStream.PublishMsgAsync(m, opts...)
}

type failedFuture struct {
	m   *nats.Msg
	err error
}

func (p failedFuture) Ok() <-chan *jetstream.PubAck { return make(chan *jetstream.PubAck) }
func (p failedFuture) Err() <-chan error {
	c := make(chan error, 1)
	c <- p.err
	return c
}
func (p failedFuture) Msg() *nats.Msg { return p.m }

// A record write that was stored but whose acknowledgement was lost
// (timed out, or the connection dropped and nats.go failed the pending
// publish with ErrDisconnected) never leaves a running record for a job
// that was refused: on every submission path (Begin's first write,
// Begin's replacement of an ended job's record of the same id, an
// idempotent Submit) the job is either accepted at the record's revision
// or refused with a terminal record.
func TestLostAckNeverLeavesRefusedJobRunning(t *testing.T) {
	env := natstest.Run(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := Open(ctx, Config{NATS: env.Coordinator(t), Coordinator: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	real := s.js
	sub := func(id string, idem bool) Submission {
		return Submission{ID: id, Owner: "nats:alice", Nodes: []string{"n1"}, StartNow: true, Idempotent: idem}
	}
	check := func(name, id string, j *Job, err error) {
		t.Helper()
		rec, gerr := s.Get(ctx, id)
		switch {
		case err == nil:
			if gerr != nil || rec.State != Running || rec.rev != j.rev {
				t.Errorf("%s: accepted, but its record is %+v, %v (want running at revision %d)", name, rec, gerr, j.rev)
			}
		case gerr == nil && !rec.State.Terminal():
			t.Errorf("%s: refused (%v), but its record says %s", name, err, rec.State)
		}
	}
	for _, cause := range []error{context.DeadlineExceeded, nats.ErrDisconnected} {
		// Begin's first write (expecting an empty key).
		id := "first-" + map[error]string{context.DeadlineExceeded: "t", nats.ErrDisconnected: "d"}[cause]
		s.js = &lostAckJS{JetStream: real, t: t, key: jobKey(id), expect: "0", err: cause}
		j, err := s.Begin(sub(id, false))(ctx)
		check(cause.Error()+": first write", id, j, err)

		// Begin's replacement of an ended job's record of the same id.
		s.js = real
		old, err := s.Submit(ctx, sub(id+"-reused", false))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Finish(ctx, old, nil, false, ""); err != nil {
			t.Fatal(err)
		}
		// The first write (expecting an empty key) is refused by the
		// server; the replacement's ack is lost.
		s.js = &lostAckJS{JetStream: real, t: t, key: jobKey(id + "-reused"), expect: strconv.FormatUint(old.rev, 10), err: cause}
		j, err = s.Begin(sub(id+"-reused", false))(ctx)
		check(cause.Error()+": replacing an ended job's record", id+"-reused", j, err)

		// An idempotent submission (Submit's synchronous write).
		s.js = &lostAckJS{JetStream: real, t: t, key: jobKey(id + "-idem"), expect: "0", err: cause}
		j, err = s.Submit(ctx, sub(id+"-idem", true))
		check(cause.Error()+": idempotent", id+"-idem", j, err)
		s.js = real
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("test timed out")
	}
}

package client_test

import (
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/protocol"
)

// JobWait goes on past a poll lost with its coordinator (no answer) and a
// 503 (one draining): the record lives in JetStream, and the next poll
// reaches another coordinator. It stops at an error that does not pass.
func TestJobWaitPastLostPolls(t *testing.T) {
	s := runServer(t)
	nc := serve(t, s)
	var polls atomic.Int32
	if _, err := nc.Subscribe(protocol.SubjectJobGet, func(m *nats.Msg) {
		switch polls.Add(1) {
		case 1: // lost: its coordinator died with it
		case 2:
			microError(m, protocol.NewAPIError(503, protocol.ErrCodeUnavailable, "coordinator c1 is draining"))
		case 3:
			b, _ := json.Marshal(protocol.JobRecord{ID: "j1", State: protocol.JobStateRunning})
			m.Respond(b)
		default:
			b, _ := json.Marshal(protocol.JobRecord{ID: "j1", State: protocol.JobSucceeded})
			m.Respond(b)
		}
	}); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	c := client.New(connect(t, s))
	r, err := c.JobWait(testCtx(t), "j1", 10*time.Millisecond)
	if err != nil || r.State != protocol.JobSucceeded || polls.Load() != 4 {
		t.Fatalf("wait = %+v, %v after %d polls; want succeeded after 4", r, err, polls.Load())
	}

	nc2 := serve(t, s)
	if _, err := nc2.Subscribe(protocol.SubjectJobGet, func(m *nats.Msg) {
		microError(m, protocol.NewAPIError(404, protocol.ErrCodeNotFound, "no job j2"))
	}); err != nil {
		t.Fatal(err)
	}
	nc2.Flush()
	nc.Close()
	if _, err := c.JobWait(testCtx(t), "j2", 10*time.Millisecond); !errorsIsNotFound(err) {
		t.Fatalf("wait of an unknown job = %v, want 404", err)
	}
}

func errorsIsNotFound(err error) bool {
	var e *protocol.APIError
	return errors.As(err, &e) && e.Status == 404
}

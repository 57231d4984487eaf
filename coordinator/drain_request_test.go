package coordinator_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator"
)

// answerRecorder is a micro.Request that only records whether it was
// answered with an error (the other methods are not used by goRequest).
type answerRecorder struct {
	micro.Request
	errors chan string
}

func (r *answerRecorder) Error(code, description string, _ []byte, _ ...micro.RespondOpt) error {
	r.errors <- code + " " + description
	return nil
}

// A request goroutine waiting on something slow (a job.get's remote status
// on another coordinator waits up to 30 s) must not hold a drain past its
// DrainTimeout: its context ends when the timeout passes, and Serve
// returns. The request here waits only for its context, so without that
// cancel the drain would wait for it forever.
func TestDrainTimeoutEndsWaitingRequests(t *testing.T) {
	h := newHarness(t, func(c *coordinator.Config) { c.DrainTimeout = 50 * time.Millisecond })
	started, ended := make(chan struct{}), make(chan struct{})
	req := &answerRecorder{errors: make(chan string, 1)}
	coordinator.GoRequestForTest(h.c, req, func(life context.Context) {
		close(started)
		<-life.Done()
		close(ended)
	})
	<-started

	stopped := make(chan error, 1)
	go func() { stopped <- h.stop() }()
	select {
	case <-ended:
	case <-time.After(defaultTestTimeout):
		t.Fatal("the request's context did not end after the drain timeout")
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Serve: %v", err)
	}

	// Once the coordinator is shutting down a new request is answered at
	// once (503), not run.
	late := &answerRecorder{errors: make(chan string, 1)}
	coordinator.GoRequestForTest(h.c, late, func(context.Context) { t.Error("a request ran after shutdown") })
	select {
	case got := <-late.errors:
		if got[:3] != "503" {
			t.Errorf("request after shutdown answered %q, want 503", got)
		}
	default:
		t.Error("request after shutdown was not answered")
	}
}

package coordinator_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// lockedBuffer collects log output written from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRequestWithoutReplyIsNotAnswered: a cancel published without a reply
// subject (what the Go client sends when its context ends) cancels the job
// and is not answered, nor warned about; the same for any other request
// that cannot be answered (an unknown job's cancel, a bad body).
func TestRequestWithoutReplyIsNotAnswered(t *testing.T) {
	var logs lockedBuffer
	h := newHarness(t, func(c *coordinator.Config) {
		c.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), &logs), &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	a := h.dialAgent(t, agentOpts{id: "n1"})
	done := h.execAsync(protocol.ExecRequest{ID: "job-nr", Target: protocol.Target{Node: "n1"}, Script: "hang"})
	checkFor(t, defaultTestTimeout, func() error {
		if a.execs.Load() != 1 {
			return fmt.Errorf("agent has not seen the exec yet")
		}
		return nil
	})
	for _, body := range [][]byte{
		mustJSON(t, protocol.CancelRequest{ID: "job-nr"}),
		mustJSON(t, protocol.CancelRequest{ID: "no-such-job"}),
		[]byte(`{"bogus":1}`),
	} {
		if err := h.client.Publish(protocol.SubjectCancel, body); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.client.Publish(protocol.SubjectNodes, []byte(`{"limit":-1}`)); err != nil {
		t.Fatal(err)
	}
	h.client.Flush()
	select {
	case r := <-done:
		if r.err != nil || len(r.result.Results) != 1 || !r.result.Results[0].Cancelled {
			t.Fatalf("result %+v, error %v; want the job cancelled", r.result, r.err)
		}
	case <-time.After(defaultTestTimeout):
		t.Fatal("the cancel published without a reply subject did not cancel the job")
	}
	// The requests after the cancel were handled too (micro serves an
	// endpoint's requests in order): wait for one that answers.
	h.request(protocol.SubjectNodes, protocol.NodesRequest{})
	h.request(protocol.SubjectCancel, protocol.CancelRequest{ID: "sync"})
	for _, bad := range []string{"does not have a reply", "send reply", "send error reply"} {
		if strings.Contains(logs.String(), bad) {
			t.Errorf("log mentions %q:\n%s", bad, logs.String())
		}
	}
}

// TestStreamParamsLimitMessage: params too large for a stream header are
// refused with the same number and meaning as everywhere else (the
// stream header limit of 65536 bytes), not another figure.
func TestStreamParamsLimitMessage(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	_, err := f.Client.OpenStream(ctx, "node-0", protocol.KindExec, protocol.ExecParams{Script: strings.Repeat("x", protocol.MaxHeaderSize)})
	want := fmt.Sprintf("over the stream header limit of %d bytes (64 KiB)", protocol.MaxHeaderSize)
	var e *protocol.APIError
	if !errors.As(err, &e) || e.Status != 413 || !strings.Contains(e.Message, want) {
		t.Fatalf("err = %v, want 413 containing %q", err, want)
	}
}

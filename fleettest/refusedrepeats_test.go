package fleettest_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// TestRefusedRepeatsLeaveNodeUsable is coordinator's
// TestRefusedAcceptsStallNode with a real agent: repeats of an idempotent
// job are refused at accept (409, their exec streams closed without a
// header), and the node's tunnel is left as it was: the next jobs there
// run at once. A stream the agent never acknowledged would hold the
// coordinator's one open slot to the node (AcceptBacklog 1), and every
// later open would wait out its deadline ("context deadline exceeded").
func TestRefusedRepeatsLeaveNodeUsable(t *testing.T) {
	// The agent logs each stream it refused for want of a header: that
	// the refused repeats' streams did reach it is what this test is
	// about.
	rejected := &countHandler{msg: "rejected stream"}
	f := fleettest.Start(t, fleettest.Options{Agents: 1, HeartbeatInterval: time.Second, Jobs: true, Logger: slog.New(rejected)})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	idem := func(id string) *protocol.ExecRequest {
		return &protocol.ExecRequest{ID: id, Target: protocol.Target{Node: "node-0"}, Argv: []string{"true"},
			Idempotent: true, IdempotencyKey: "refused-repeats"}
	}
	if res, err := f.Client.Exec(ctx, idem("first"), nil); err != nil || res.Succeeded != 1 {
		t.Fatalf("first: %+v, %v", res, err)
	}
	for i := range 3 {
		id := fmt.Sprint("again-", i)
		_, err := f.Client.Exec(ctx, idem(id), nil)
		var ae *protocol.APIError
		if !errors.As(err, &ae) || ae.Status != 409 || ae.Code != protocol.ErrCodeDuplicateJob {
			t.Errorf("repeat %s: %v; want 409 duplicate_job", id, err)
		}
	}
	for i := range 3 {
		id := fmt.Sprint("next-", i)
		start := time.Now()
		res, err := f.Client.Exec(ctx, &protocol.ExecRequest{ID: id, Target: protocol.Target{Node: "node-0"}, Argv: []string{"true"}}, nil)
		var why string
		if res != nil && len(res.Results) > 0 {
			why = res.Results[0].Error
		}
		if err != nil || res == nil || res.Succeeded != 1 || strings.Contains(why, "context deadline exceeded") {
			t.Fatalf("%s after the refusals, %v: %+v, %v (node error %q); want it run", id, time.Since(start), res, err, why)
		}
	}
	for rejected.n.Load() < 3 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	if n := rejected.n.Load(); n != 3 {
		t.Errorf("the agent rejected %d headerless streams, want the 3 repeats'", n)
	}
}

// countHandler counts the log records whose message is msg.
type countHandler struct {
	msg string
	n   atomic.Int32
}

func (h *countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.n.Add(1)
	}
	return nil
}
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countHandler) WithGroup(string) slog.Handler      { return h }

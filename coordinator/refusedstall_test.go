package coordinator_test

import (
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// TestRefusedAcceptsStallNode: exec streams refused at accept (their
// record not written: here idempotent repeats, 409) must leave the node's
// tunnel as it was. Known bug, found on branch idreuse17 and not fixed
// there: after two such refusals every later open of a stream to the node
// blocks in yamux's OpenStream (its semaphore of un-acknowledged SYNs,
// which AcceptBacklog 1 of the coordinator's agent sessions makes one
// deep) until the open's 10 s deadline, so the next jobs on the node fail
// with "open exec stream: ... context deadline exceeded".
func TestRefusedAcceptsStallNode(t *testing.T) {
	t.Skip("known bug: refused accepts stall later stream opens to the node (see the doc comment)")
	h := newHarness(t, withStore(t, nil, nil))
	h.dialAgent(t, agentOpts{id: "n1"})
	req := func(id string) protocol.ExecRequest {
		return protocol.ExecRequest{ID: id, Target: protocol.Target{Node: "n1"}, Argv: []string{"ok"}, Idempotent: true, IdempotencyKey: "k"}
	}
	if r := h.exec(req("first")); r.err != nil || r.result == nil {
		t.Fatalf("first: %+v", r.err)
	}
	for _, id := range []string{"again-1", "again-2", "again-3"} {
		start := time.Now()
		if r := h.exec(req(id)); r.err == nil || r.err.Code != protocol.ErrCodeDuplicateJob || time.Since(start) > 2*time.Second {
			t.Errorf("repeat %s after %v: %+v; want 409 duplicate_job at once", id, time.Since(start), r.err)
		}
	}
	start := time.Now()
	if r := h.exec(protocol.ExecRequest{ID: "next", Target: protocol.Target{Node: "n1"}, Argv: []string{"ok"}}); r.err != nil || r.result == nil || r.result.Succeeded != 1 || time.Since(start) > 2*time.Second {
		t.Errorf("next job after the refusals, %v: %+v, %+v; want it run at once", time.Since(start), r.err, r.result)
	}
}

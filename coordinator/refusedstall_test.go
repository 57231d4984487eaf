package coordinator_test

import (
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// TestRefusedAcceptsStallNode: exec streams refused at accept (their
// record not written: here idempotent repeats, 409) must leave the node's
// tunnel as it was. Found on branch idreuse17: after two such refusals
// every later open of a stream to the node blocked in yamux's OpenStream
// (its semaphore of un-acknowledged SYNs, which AcceptBacklog 1 of the
// coordinator's agent sessions makes one deep) until the open's deadline,
// and the next jobs on the node failed with "open exec stream: ...
// context deadline exceeded". The coordinator did its part (each refused
// stream closed without a header); the harness's fake agent stopped
// accepting, because tunnel.Session.Accept's error for the headerless
// stream wrapped io.EOF, its word for the session's end, so the streams
// after it were never acknowledged. The real agent reads each header in
// the stream's own goroutine and was not affected (fleettest
// TestRefusedRepeatsLeaveNodeUsable).
func TestRefusedAcceptsStallNode(t *testing.T) {

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

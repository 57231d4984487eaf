package coordinator_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/protocol"
)

const idReusePolicy = `version: 1
identities:
  nats:alice:
    rules:
      - nodes: "*"
        operations: [exec, job.status, job.logs, job.cancel]
        run_as: alice
  nats:mallory:
    rules:
      - nodes: "*"
        operations: [exec, job.status, job.logs, job.cancel]
        run_as: mallory
`

// TestIDReuseOnlyByOwner: a job id is its record's owner's. Another
// caller's exec under it (plain, idempotent or detached; on the job's node,
// where the job's run is found in memory, or another, where the job store
// refuses it), the job live or ended, is refused with 409 duplicate_job
// "job ID ... is already in use", one text whatever that job is, and
// changes nothing: the owner's record keeps its owner, state and results,
// and stays hidden from the other caller (404). The owner reuses the id
// once the job ended, as before.
func TestIDReuseOnlyByOwner(t *testing.T) {
	store, _ := writePolicy(t, idReusePolicy)
	h := newHarness(t, withStore(t, nil, func(c *coordinator.Config) { c.Policy = store }))
	// Each refused attempt gets a node of its own, and alice's reuse a
	// node that saw one refusal only: a node whose exec streams were
	// refused at accept twice stalls later opens (a known bug:
	// TestRefusedAcceptsStallNode, skipped).
	for _, n := range []string{"n1", "n2", "n3", "n4", "n5"} {
		h.dialAgent(t, agentOpts{id: n})
	}
	alice, mallory := h.as("alice"), h.as("mallory")

	texts := map[string]string{}
	attempts := func(state, id string) {
		t.Helper()
		for name, req := range map[string]protocol.ExecRequest{
			"same node":  {ID: id, Target: protocol.Target{Node: "n1"}, Argv: []string{"ok"}},
			"other node": {ID: id, Target: protocol.Target{Node: "n2"}, Argv: []string{"ok"}},
			"all":        {ID: id, Target: protocol.Target{All: true}, Argv: []string{"ok"}},
			"idempotent": {ID: id, Target: protocol.Target{Node: "n3"}, Argv: []string{"ok"}, Idempotent: true, IdempotencyKey: "k-" + id},
			"detached":   {ID: id, Target: protocol.Target{Node: "n4"}, Script: "ok", Detach: true},
		} {
			r := execAs(t, mallory, req)
			if r.err == nil || r.err.Status != 409 || r.err.Code != protocol.ErrCodeDuplicateJob {
				t.Errorf("%s: mallory's %s exec of alice's %s = %+v, result %+v; want 409 %s", state, name, id, r.err, r.result, protocol.ErrCodeDuplicateJob)
				continue
			}
			texts[state+" "+name] = strings.ReplaceAll(r.err.Message, id, "ID")
		}
		if _, e := jobGet(t, mallory, id); e == nil || e.Status != 404 {
			t.Errorf("%s: mallory's job.get of alice's %s = %+v, want 404", state, id, e)
		}
	}

	// Live: alice's job hangs on n1.
	live := make(chan execReply, 1)
	go func() {
		r, err := execRaw(alice, mustJSON(t, protocol.ExecRequest{ID: "live-1", Target: protocol.Target{Node: "n1"}, Argv: []string{"hang"}}))
		if err != nil {
			r.err = &protocol.APIError{Code: "test_transport", Message: err.Error()}
		}
		live <- r
	}()
	checkFor(t, defaultTestTimeout, func() error {
		if rec, e := jobGet(t, alice, "live-1"); e != nil || rec.State != protocol.JobStateRunning {
			return errorf("live-1 not running yet (%+v, %+v)", rec, e)
		}
		return nil
	})
	attempts("live", "live-1")
	if e, _ := requestAs(t, alice, protocol.SubjectCancel, protocol.CancelRequest{ID: "live-1"}); e != nil {
		t.Fatalf("alice cancels live-1: %+v", e)
	}
	if r := <-live; r.err != nil || r.result == nil || r.result.ID != "live-1" {
		t.Fatalf("alice's live-1 = %+v, %+v; want her own (cancelled) result", r.err, r.result)
	}

	// Ended: alice's job printed and failed.
	if r := execAs(t, alice, protocol.ExecRequest{ID: "build-1", Target: protocol.Target{Node: "n1"}, Argv: []string{"echo"}}); r.err != nil || r.result == nil {
		t.Fatalf("alice's build-1: %+v", r.err)
	}
	var ended *protocol.JobRecord
	checkFor(t, defaultTestTimeout, func() error {
		var e *protocol.APIError
		if ended, e = jobGet(t, alice, "build-1"); e != nil || !ended.State.Terminal() {
			return errorf("build-1 not ended yet (%+v, %+v)", ended, e)
		}
		return nil
	})
	if ended.Owner != "nats:alice" || ended.State != protocol.JobFailed || len(ended.Results) != 1 || ended.Results[0].StdoutBytes != 10 {
		t.Fatalf("alice's ended record = %+v", ended)
	}
	attempts("ended", "build-1")
	if got, e := jobGet(t, alice, "build-1"); e != nil || !reflect.DeepEqual(got, ended) {
		t.Errorf("alice's record after mallory's attempts = %+v, %+v; want it unchanged: %+v", got, e, ended)
	}

	var first string
	for k, text := range texts {
		if first == "" {
			first = text
		}
		if text != first || strings.Contains(text, "alice") || strings.Contains(text, "running") || strings.Contains(text, "coord-test") {
			t.Errorf("%s: refusal %q; want one text naming nothing of alice's job (as %q)", k, text, first)
		}
	}
	if !strings.Contains(first, "already in use") {
		t.Errorf("refusal %q does not say the id is in use", first)
	}

	// Back to back: a refused fan-out leaves nothing behind that the
	// next attempt could meet. (The refused job used to stay registered
	// until its goroutine unwound, after its 409 went out, so the very
	// next attempt was told "job ... is already running": mallory's own
	// refused job, not alice's, but another text.)
	for i := range 30 {
		for _, req := range []protocol.ExecRequest{
			{ID: "build-1", Target: protocol.Target{All: true}, Argv: []string{"ok"}},
			{ID: "build-1", Target: protocol.Target{Node: "n1"}, Argv: []string{"ok"}},
		} {
			r := execAs(t, mallory, req)
			if r.err == nil || r.err.Status != 409 || strings.ReplaceAll(r.err.Message, "build-1", "ID") != first {
				t.Fatalf("back-to-back attempt %d (%+v) = %+v; want 409 %q", i, req.Target, r.err, first)
			}
		}
	}

	// Alice reuses her own ended id.
	if r := execAs(t, alice, protocol.ExecRequest{ID: "build-1", Target: protocol.Target{Node: "n5"}, Argv: []string{"ok"}}); r.err != nil || r.result == nil || r.result.Succeeded != 1 {
		t.Fatalf("alice's reuse of build-1: %+v, %+v", r.err, r.result)
	}
	checkFor(t, defaultTestTimeout, func() error {
		if rec, e := jobGet(t, alice, "build-1"); e != nil || rec.Owner != "nats:alice" || rec.State != protocol.JobSucceeded || rec.Nodes[0] != "n5" {
			return errorf("alice's reused build-1 = %+v, %+v", rec, e)
		}
		return nil
	})
}

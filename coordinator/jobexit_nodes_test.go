package coordinator_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/protocol"
)

// TestDetachedJobOnSeveralNodesEnds: a detached job on three nodes ends
// when each node's run ended: n1 and n2 report their exits (0 and 3, at
// once), n3 (no exit reports) is asked by job.get once it exited (5).
// The record keeps each node's result as it comes, ends failed with all
// three, and JobWait returns it with exit code 1.
func TestDetachedJobOnSeveralNodesEnds(t *testing.T) {
	var st *jobstore.Store
	h := newHarness(t, withStore(t, &st, nil))
	var queries atomic.Int32
	a1 := h.dialAgent(t, reportingAgent("n1", &queries))
	a2 := h.dialAgent(t, reportingAgent("n2", &queries))
	var n3Exited atomic.Bool
	o3 := detachedAgent(&n3Exited)
	o3.id = "n3"
	h.dialAgent(t, o3)
	if r := h.exec(protocol.ExecRequest{ID: "fan", Target: protocol.Target{All: true}, Script: "sleep 100", Detach: true}); r.err != nil {
		t.Fatal(r.err)
	}
	checkFor(t, defaultTestTimeout, func() error {
		if s := stateOf(st, "fan"); s != protocol.JobStateRunning {
			return fmt.Errorf("job fan %s, want running", s)
		}
		return nil
	})
	if j := recordState(t, st, "fan"); len(j.Nodes) != 3 {
		t.Fatalf("job fan runs on %v, want n1, n2, n3", j.Nodes)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*defaultTestTimeout)
	defer cancel()
	type waited struct {
		rec *protocol.JobRecord
		err error
	}
	done := make(chan waited, 1)
	go func() {
		rec, err := client.New(h.client).JobWait(ctx, "fan", 20*time.Millisecond)
		done <- waited{rec, err}
	}()

	for _, r := range []struct {
		a    *fakeAgent
		code int
	}{{a1, 0}, {a2, 3}} {
		if err := protocol.WriteJSONFrame(r.a.ctrl, protocol.FrameJobExit, exitReport("fan", r.code)); err != nil {
			t.Fatal(err)
		}
	}
	checkFor(t, defaultTestTimeout, func() error {
		j := recordState(t, st, "fan")
		if j.State != protocol.JobStateRunning || len(j.Results) != 2 {
			return fmt.Errorf("job fan %s with results %+v; want running with n1's and n2's", j.State, j.Results)
		}
		return nil
	})
	select {
	case w := <-done:
		t.Fatalf("JobWait returned while n3 runs: %+v, %v", w.rec, w.err)
	default:
	}

	n3Exited.Store(true)
	var w waited
	select {
	case w = <-done:
	case <-ctx.Done():
		t.Fatalf("JobWait did not return after every node ended: %+v", recordState(t, st, "fan").Record)
	}
	if w.err != nil {
		t.Fatalf("JobWait: %v", w.err)
	}
	codes := map[string]int{}
	for _, res := range w.rec.Results {
		codes[res.Node] = res.ExitCode
	}
	if w.rec.State != protocol.JobFailed || w.rec.ExitCode() != 1 || w.rec.Succeeded != 1 || w.rec.Failed != 2 ||
		len(codes) != 3 || codes["n1"] != 0 || codes["n2"] != 3 || codes["n3"] != 5 {
		t.Errorf("JobWait = %s exit %d, %d succeeded, %d failed, results %v; want failed 1, n1 0, n2 3, n3 5",
			w.rec.State, w.rec.ExitCode(), w.rec.Succeeded, w.rec.Failed, codes)
	}
	if n := h.metric("tether_coordinator_job_exit_reports_total", "result", "foreign"); n != 0 {
		t.Errorf("%v reports refused as foreign, want 0", n)
	}
}

// TestDetachedJobStartedOnSomeNodes: a detached job that one node could
// not start runs on in its record, holding that node's error, until the
// node that started it reports its exit; it then ends failed with both
// results (it used to end at once, the started node's run unrecorded).
func TestDetachedJobStartedOnSomeNodes(t *testing.T) {
	var st *jobstore.Store
	h := newHarness(t, withStore(t, &st, nil))
	var queries atomic.Int32
	a1 := h.dialAgent(t, reportingAgent("n1", &queries))
	h.dialAgent(t, agentOpts{id: "n2", handler: func(_ *fakeAgent, s *yamux.Stream, _ protocol.ExecParams) {
		protocol.WriteJSONFrame(s, protocol.FrameError, &protocol.ErrorInfo{Code: protocol.CodeStartFailed, Message: "start bash: no such file"})
	}})
	h.exec(protocol.ExecRequest{ID: "half", Target: protocol.Target{All: true}, Script: "sleep 100", Detach: true})
	checkFor(t, defaultTestTimeout, func() error {
		j := recordState(t, st, "half")
		if j.State != protocol.JobStateRunning || len(j.Results) != 1 || j.Results[0].Node != "n2" || j.Results[0].ErrorCode != protocol.CodeStartFailed {
			return fmt.Errorf("job half %s with results %+v; want running with n2's start error", j.State, j.Results)
		}
		return nil
	})
	if err := protocol.WriteJSONFrame(a1.ctrl, protocol.FrameJobExit, exitReport("half", 0)); err != nil {
		t.Fatal(err)
	}
	checkFor(t, defaultTestTimeout, func() error {
		j := recordState(t, st, "half")
		if j.State != protocol.JobFailed || len(j.Results) != 2 || j.Succeeded != 1 || j.Failed != 1 {
			return fmt.Errorf("job half %s with results %+v; want failed with n1's exit and n2's error", j.State, j.Results)
		}
		return nil
	})
}

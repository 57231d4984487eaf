package cli

import (
	"errors"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

// TestJobWaitExitsAsExec: `tether job wait` exits as the `tether exec`
// that submitted the job does, by its target: a --node job with its
// node's code (124 for its timeout, not 255), a fan-out with 0 or 1 also
// when it matched one node (it exited with that node's code, where
// `tether exec --selector` exits 1), 255 when lost.
func TestJobWaitExitsAsExec(t *testing.T) {
	one := func(target string, r protocol.NodeResult, st protocol.JobState) *protocol.JobRecord {
		r.Node = "n1"
		return &protocol.JobRecord{ID: "j", Target: target, State: st, Nodes: []string{"n1"}, Results: []protocol.NodeResult{r}}
	}
	for _, tt := range []struct {
		name string
		rec  *protocol.JobRecord
		want int
	}{
		{"--node exit 0", one("", protocol.NodeResult{ExitCode: 0}, protocol.JobSucceeded), exitOK},
		{"--node exit 3", one("", protocol.NodeResult{ExitCode: 3}, protocol.JobFailed), 3},
		{"--node timed out", one("", protocol.NodeResult{ExitCode: -1, TimedOut: true}, protocol.JobFailed), exitTimedOut},
		{"--node cancelled", one("", protocol.NodeResult{ExitCode: -1, Cancelled: true}, protocol.JobCancelled), exitInterrupted},
		{"--node signal", one("", protocol.NodeResult{ExitCode: 137, Signal: "KILL"}, protocol.JobFailed), 137},
		{"--node command not found", one("", protocol.NodeResult{ExitCode: -1, Error: "no such file", ErrorCode: protocol.CodeCommandNotFound}, protocol.JobFailed), exitNotFound},
		{"--node lost", one("", protocol.NodeResult{ExitCode: -1, Error: "lost", ErrorCode: protocol.ResultCodeLost}, protocol.JobStateLost), exitTether},
		{"selector, one node, exit 0", one("selector role=web", protocol.NodeResult{ExitCode: 0}, protocol.JobSucceeded), exitOK},
		{"selector, one node, exit 3", one("selector role=web", protocol.NodeResult{ExitCode: 3}, protocol.JobFailed), exitFailure},
		{"all, one node, timed out", one("all nodes", protocol.NodeResult{ExitCode: -1, TimedOut: true}, protocol.JobFailed), exitFailure},
		{"all, one node, lost", one("all nodes", protocol.NodeResult{ExitCode: -1, Error: "lost", ErrorCode: protocol.ResultCodeLost}, protocol.JobStateLost), exitTether},
		{"all, two nodes, one failed", &protocol.JobRecord{ID: "j", Target: "all nodes", State: protocol.JobFailed, Nodes: []string{"n1", "n2"}, Failed: 1, Succeeded: 1,
			Results: []protocol.NodeResult{{Node: "n1"}, {Node: "n2", ExitCode: 3}}}, exitFailure},
		{"all, two nodes, results omitted", &protocol.JobRecord{ID: "j", Target: "all nodes", State: protocol.JobFailed, Nodes: []string{"n1", "n2"}, Failed: 2, ResultsOmitted: true}, exitFailure},
		{"all, two nodes, ok", &protocol.JobRecord{ID: "j", Target: "all nodes", State: protocol.JobSucceeded, Nodes: []string{"n1", "n2"}, Succeeded: 2,
			Results: []protocol.NodeResult{{Node: "n1"}, {Node: "n2"}}}, exitOK},
	} {
		err := jobRecordOutcome(tt.rec)
		got := exitOK
		var ee *exitError
		if errors.As(err, &ee) {
			got = ee.code
		} else if err != nil {
			got = -1
		}
		if got != tt.want {
			t.Errorf("%s: job wait exits %d (%v), want %d", tt.name, got, err, tt.want)
		}
	}
}

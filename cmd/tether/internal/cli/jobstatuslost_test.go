package cli

import (
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// TestApplyStatusLostSaysWhatStoreSays: a node's "lost", applied by the
// CLI to a record that lags its nodes (job status --json), reads as the
// job store records it (its Observe), so that job status and job wait of
// one job do not tell two stories. The CLI said "its outcome is unknown",
// the store that the job's shim ended while the job ran.
func TestApplyStatusLostSaysWhatStoreSays(t *testing.T) {
	want := "node n1 lost the job: its supervisor on the node (the job shim) ended while the job ran, without recording how the job ended (killed? the node rebooted?); the job's main process was killed with it"
	st := protocol.JobStatus{ID: "j1", Node: "n1", State: protocol.JobLost, StartedAt: time.Now()}

	one := refreshRecord("j1", &protocol.JobRecord{ID: "j1", Nodes: []string{"n1"}, Detached: true, State: protocol.JobStateRunning}, time.Now(), &st)
	if one.State != protocol.JobStateLost || one.Error != want {
		t.Errorf("one node: state %s, error %q; want lost, %q", one.State, one.Error, want)
	}

	two := refreshRecord("j1", &protocol.JobRecord{ID: "j1", Nodes: []string{"n1", "n2"}, Detached: true, Target: "all", State: protocol.JobStateRunning}, time.Now(), &st)
	if len(two.Results) != 1 || two.Results[0].Error != want || two.Results[0].ErrorCode != protocol.ResultCodeLost {
		t.Errorf("two nodes: results %+v; want n1's error %q", two.Results, want)
	}
}

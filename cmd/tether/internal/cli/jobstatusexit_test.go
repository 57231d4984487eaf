package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// TestJobStatusExitIsWaits: the exit: line of `tether job status` for a
// detached job (a node's status) is the code `tether job wait` exits with,
// as job list's EXIT is, with what the process really got beside it: a
// cancelled --node job 130, a fan-out's (also one that matched one node) 1.
// It printed the node's raw 143 before (fresh-user pass fresh17b).
func TestJobStatusExitIsWaits(t *testing.T) {
	code := func(n int) *int { return &n }
	fin := time.Now()
	for _, tc := range []struct {
		name   string
		target string
		st     protocol.JobStatus
		want   string
	}{
		{"cancelled", "", protocol.JobStatus{State: protocol.JobExited, ExitCode: code(143), Signal: "TERM", Cancelled: true}, "exit:      130 (cancelled: signal TERM, exit code 143)\n"},
		{"cancelled fan-out of one node", "all", protocol.JobStatus{State: protocol.JobExited, ExitCode: code(143), Signal: "TERM", Cancelled: true}, "exit:      1 (cancelled: signal TERM, exit code 143)\n"},
		{"timed out", "", protocol.JobStatus{State: protocol.JobExited, ExitCode: code(143), Signal: "TERM", TimedOut: true}, "exit:      124 (timed out: signal TERM, exit code 143)\n"},
		{"exit 3", "", protocol.JobStatus{State: protocol.JobExited, ExitCode: code(3)}, "exit:      3\n"},
		{"exit 3 in a fan-out", "all", protocol.JobStatus{State: protocol.JobExited, ExitCode: code(3)}, "exit:      1 (exit code 3)\n"},
		{"killed", "", protocol.JobStatus{State: protocol.JobExited, ExitCode: code(137), Signal: "KILL"}, "exit:      137 (signal KILL, exit code 137)\n"},
		// A lost job had no exit: line at all (fresh-user pass fresh17c).
		{"lost", "", protocol.JobStatus{State: protocol.JobLost}, "exit:      - (lost: node n1 lost the job: its supervisor on the node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := tc.st
			st.ID, st.Node, st.StartedAt, st.FinishedAt = "j1", "n1", fin.Add(-time.Second), &fin
			rec := refreshRecord("j1", &protocol.JobRecord{ID: "j1", Nodes: []string{"n1"}, Detached: true, Target: tc.target, State: protocol.JobStateRunning}, fin, &st)
			var b strings.Builder
			if err := printJobView(&b, rec, []*protocol.JobStatus{&st}, ""); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(b.String(), "\n"+tc.want) {
				t.Errorf("job status:\n%s\nwant the line %q", b.String(), tc.want)
			}
		})
	}
}

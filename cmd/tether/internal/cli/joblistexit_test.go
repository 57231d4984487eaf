package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// TestJobListExitMatchesExec: the EXIT that `tether job list` and `job
// status` show for a job is the code its `tether exec` exited with, and
// `job wait` exits with it too: 127 and 126 for a command the node could
// not find or execute, 255 for a bad cwd, 124 for a timeout, the
// command's own code otherwise. Before, a spawn failure (exit code -1 in
// the record, with its error code) listed EXIT "-" and a timeout its
// SIGTERM's 143.
func TestJobListExitMatchesExec(t *testing.T) {
	f := startFleet(t, fleettest.Options{Agents: 1, Jobs: true})
	url := f.NATS.ClientURL()
	ctx := testCtx(t)
	noexec := filepath.Join(t.TempDir(), "noexec")
	if err := os.WriteFile(noexec, []byte("echo hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{"command not found", []string{"--", "nosuchcmd-exitrec"}, exitNotFound},
		{"not executable", []string{"--", noexec}, exitNotExecutable},
		{"bad cwd", []string{"--cwd", "/nonexistent", "--", "true"}, exitTether},
		{"timeout", []string{"--timeout", "1", "--", "sleep", "10"}, exitTimedOut},
		{"own exit code", []string{"--", "sh", "-c", "exit 7"}, 7},
		{"success", []string{"--", "true"}, exitOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCLI(ctx, nil, "", append([]string{"exec", "--nats-url", url, "--node", "node-0", "--json"}, tc.args...)...)
			lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
			var res protocol.ExecResult
			if r.code != tc.code || json.Unmarshal([]byte(lines[len(lines)-1]), &res) != nil || res.ID == "" {
				t.Fatalf("exec: exit %d, want %d; stdout %q, stderr %q", r.code, tc.code, r.stdout, r.stderr)
			}
			want := strconv.Itoa(tc.code)
			if got := listedExit(ctx, t, url, res.ID); got != want {
				t.Errorf("job list: EXIT %q, want %s (what tether exec exited with)", got, want)
			}
			r = runCLI(ctx, nil, "", "job", "status", "--nats-url", url, res.ID)
			if !regexp.MustCompile(`(?m)^exit: +` + want + `( \(.*\))?$`).MatchString(r.stdout) {
				t.Errorf("job status: exit %d, stdout %q, want exit: %s", r.code, r.stdout, want)
			}
			r = runCLI(ctx, nil, "", "job", "wait", "--nats-url", url, "--poll", "50ms", res.ID)
			if r.code != tc.code {
				t.Errorf("job wait: exit %d, want %d; stderr %q", r.code, tc.code, r.stderr)
			}
		})
	}
}

// TestJobRecordOfInterruptedExec: a `tether exec` interrupted by SIGINT
// exits 130 (the client's own code for its interruption) and its job is
// cancelled: the record says state cancelled, and its node's result the
// signal the agent's cancel really sent the process group (TERM, exit
// code 143). `job list` shows the code `job wait` exits with: 130 for a
// --node job (cancelled), 1 for a fan-out (a node did not succeed).
func TestJobRecordOfInterruptedExec(t *testing.T) {
	f := startFleet(t, fleettest.Options{Agents: 1, Jobs: true})
	url := f.NATS.ClientURL()
	for _, tc := range []struct {
		name   string
		target []string
		list   string
	}{
		{"node", []string{"--node", "node-0"}, strconv.Itoa(exitInterrupted)},
		{"all", []string{"--all"}, strconv.Itoa(exitFailure)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(testCtx(t))
			defer cancel(nil)
			var stdout, stderr syncBuffer
			e := &env{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, getenv: testGetenv(nil), now: time.Now}
			done := make(chan int, 1)
			args := append(append([]string{"exec", "--nats-url", url, "-n"}, tc.target...), "--", "sh", "-c", "echo started-"+tc.name+"; exec sleep 60")
			go func() { done <- run(ctx, args, e) }()
			checkFor(t, defaultTestTimeout, func() error {
				if !strings.Contains(stdout.String(), "started-"+tc.name) {
					return fmt.Errorf("not started; stdout %q", stdout.String())
				}
				return nil
			})
			cancel(SignalCause(syscall.SIGINT))
			if code := <-done; code != exitInterrupted {
				t.Fatalf("exec: exit %d, want %d; stderr %q", code, exitInterrupted, stderr.String())
			}
			lctx := testCtx(t)
			var rec protocol.JobRecord
			checkFor(t, defaultTestTimeout, func() error {
				r := runCLI(lctx, nil, "", "job", "list", "--nats-url", url, "--json")
				var list protocol.JobListResponse
				if err := json.Unmarshal([]byte(r.stdout), &list); err != nil {
					return fmt.Errorf("job list --json: %v; stdout %q, stderr %q", err, r.stdout, r.stderr)
				}
				for _, j := range list.Jobs {
					if strings.Contains(j.Command, "started-"+tc.name) && j.State.Terminal() {
						rec = j
						return nil
					}
				}
				return fmt.Errorf("no ended job of %q in %+v", tc.name, list.Jobs)
			})
			if rec.State != protocol.JobCancelled || len(rec.Results) != 1 || !rec.Results[0].Cancelled ||
				rec.Results[0].Signal != "TERM" || rec.Results[0].ExitCode != 128+int(syscall.SIGTERM) {
				t.Errorf("record: state %s, results %+v; want cancelled, one result cancelled by TERM (exit code 143)", rec.State, rec.Results)
			}
			if got := listedExit(lctx, t, url, rec.ID); got != tc.list {
				t.Errorf("job list: EXIT %q, want %s (what job wait exits with)", got, tc.list)
			}
			r := runCLI(lctx, nil, "", "job", "wait", "--nats-url", url, "--poll", "50ms", rec.ID)
			if strconv.Itoa(r.code) != tc.list {
				t.Errorf("job wait: exit %d, want %s; stderr %q", r.code, tc.list, r.stderr)
			}
		})
	}
}

// listedExit is the EXIT column of job id's row in `tether job list`.
//
// The record's final write follows the exec's reply (durable.go: the
// client waits for no store), so a list right after exec may still show
// the job running, EXIT "-": it asks again until the record has ended.
func listedExit(ctx context.Context, t *testing.T, url, id string) string {
	t.Helper()
	var exit string
	checkFor(t, defaultTestTimeout, func() error {
		r := runCLI(ctx, nil, "", "job", "list", "--nats-url", url)
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(id) + ` +(\S+) +(\S+) `).FindStringSubmatch(r.stdout)
		if r.code != 0 || m == nil {
			t.Fatalf("job list: exit %d, no row of %s; stdout %q, stderr %q", r.code, id, r.stdout, r.stderr)
		}
		exit = m[2]
		if !protocol.JobState(m[1]).Terminal() {
			return fmt.Errorf("job %s is still %s", id, m[1])
		}
		return nil
	})
	return exit
}

// TestRecordOutcome: the one mapping from a record to its exit code, as
// `job wait` exits and `job list` / `job status` show it; known is false
// when the record holds no exit status (lost, not ended, no result).
func TestRecordOutcome(t *testing.T) {
	one := func(state protocol.JobState, r protocol.NodeResult) *protocol.JobRecord {
		r.Node = "n"
		return &protocol.JobRecord{ID: "j", State: state, Nodes: []string{"n"}, Results: []protocol.NodeResult{r}}
	}
	fan := func(rec *protocol.JobRecord) *protocol.JobRecord { rec.Target = "all nodes"; return rec }
	for _, tc := range []struct {
		name  string
		rec   *protocol.JobRecord
		code  int
		known bool
	}{
		{"exit 0", one(protocol.JobSucceeded, protocol.NodeResult{}), 0, true},
		{"exit 3", one(protocol.JobFailed, protocol.NodeResult{ExitCode: 3}), 3, true},
		{"killed", one(protocol.JobFailed, protocol.NodeResult{ExitCode: 137, Signal: "KILL"}), 137, true},
		{"not found", one(protocol.JobFailed, protocol.NodeResult{ExitCode: -1, Error: "not found", ErrorCode: protocol.CodeCommandNotFound}), exitNotFound, true},
		{"not executable", one(protocol.JobFailed, protocol.NodeResult{ExitCode: -1, Error: "denied", ErrorCode: protocol.CodeNotExecutable}), exitNotExecutable, true},
		{"start failed", one(protocol.JobFailed, protocol.NodeResult{ExitCode: -1, Error: "cwd", ErrorCode: "start_failed"}), exitTether, true},
		{"timed out", one(protocol.JobFailed, protocol.NodeResult{ExitCode: 143, Signal: "TERM", TimedOut: true}), exitTimedOut, true},
		{"cancelled", one(protocol.JobCancelled, protocol.NodeResult{ExitCode: 143, Signal: "TERM", Cancelled: true}), exitInterrupted, true},
		// exec exits 254 for a job that exited 0 with output dropped; wait
		// exited 0 for it (fresh-user pass fresh20).
		{"truncated", one(protocol.JobSucceeded, protocol.NodeResult{StdoutTruncated: true, Truncated: true}), exitTruncated, true},
		{"fan-out truncated", fan(one(protocol.JobSucceeded, protocol.NodeResult{StderrTruncated: true, Truncated: true})), exitTruncated, true},
		{"truncated, exit 3", one(protocol.JobFailed, protocol.NodeResult{ExitCode: 3, StdoutTruncated: true, Truncated: true}), 3, true},
		{"fan-out of one, exit 3", fan(one(protocol.JobFailed, protocol.NodeResult{ExitCode: 3})), exitFailure, true},
		{"fan-out of one, ok", fan(one(protocol.JobSucceeded, protocol.NodeResult{})), 0, true},
		{"fan-out, counts only", &protocol.JobRecord{ID: "j", State: protocol.JobFailed, Target: "all nodes", Nodes: []string{"a", "b"}, ResultsOmitted: true, Succeeded: 1, Failed: 1}, exitFailure, true},
		{"lost", one(protocol.JobStateLost, protocol.NodeResult{ExitCode: -1, Error: "lost", ErrorCode: protocol.ResultCodeLost}), exitTether, false},
		{"no result", &protocol.JobRecord{ID: "j", State: protocol.JobFailed, Nodes: []string{"n"}, Error: "x"}, exitTether, false},
		{"running", &protocol.JobRecord{ID: "j", State: protocol.JobStateRunning, Nodes: []string{"n"}}, exitTether, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, known := recordOutcome(tc.rec)
			if code != tc.code || known != tc.known {
				t.Errorf("recordOutcome: %d, known %v; want %d, %v", code, known, tc.code, tc.known)
			}
		})
	}
}

// job logs --follow ends with the code job wait and job list's EXIT give
// the same job (nodeOutcome): a cancelled job 130, not its SIGTERM's 143
// (fresh-user pass fresh20); a timed-out one 124; a node's own error
// (an output file it could not write) 255.
func TestJobOutcomeAsWait(t *testing.T) {
	code := func(n int) *int { return &n }
	for _, tc := range []struct {
		name string
		st   protocol.JobStatus
		want int
	}{
		{"exit 0", protocol.JobStatus{ExitCode: code(0)}, exitOK},
		{"exit 3", protocol.JobStatus{ExitCode: code(3)}, 3},
		{"cancelled", protocol.JobStatus{ExitCode: code(143), Signal: "TERM", Cancelled: true}, exitInterrupted},
		{"timed out", protocol.JobStatus{ExitCode: code(143), Signal: "TERM", TimedOut: true}, exitTimedOut},
		{"killed", protocol.JobStatus{ExitCode: code(137), Signal: "KILL"}, 137},
		{"truncated", protocol.JobStatus{ExitCode: code(0), StdoutTruncated: true}, exitTruncated},
		{"node error", protocol.JobStatus{ExitCode: code(0), Error: "write stdout: no space left on device"}, exitTether},
		{"unknown", protocol.JobStatus{State: protocol.JobLost}, exitTether},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := tc.st
			st.ID, st.Node = "j", "n"
			var stderr syncBuffer
			err := jobOutcome(&env{stderr: &stderr}, &st, false)
			got := exitOK
			var ee *exitError
			if errors.As(err, &ee) {
				got = ee.code
			} else if err != nil {
				t.Fatalf("jobOutcome: %v", err)
			}
			if got != tc.want {
				t.Errorf("jobOutcome = %d (%v), want %d", got, err, tc.want)
			}
		})
	}
}

//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// TestJobsSurviveAgentKill: an agent killed with SIGKILL and restarted on
// the same data directory. Its detached job keeps running meanwhile (its
// output file grows while no agent runs), is found again running, its
// output has no gap (contiguous sequence numbers), status and logs work,
// `tether job logs --follow` started before the kill resumes and ends with
// the job's exit code; and the process group of an attached exec that
// lost its agent is killed by the restarted agent.
func TestJobsSurviveAgentKill(t *testing.T) {
	f := startFleet(t)
	dataDir := t.TempDir()
	agentArgs := []string{"agent", "--coordinator", f.tunnelAddr, "--shared-token", "--token-file", f.tokenFile,
		"--ca-file", filepath.Join(f.dataDir, "pki", "ca.crt"), "--node-id", "e2e-jobs", "--labels", "role=jobs",
		"--data-dir", dataDir}
	agent := start(t, "agent-e2e-jobs", agentArgs...)
	f.waitNodes(t, "e2e-jobs")

	ctx, cancel := context.WithTimeout(context.Background(), 2*defaultTestTimeout)
	defer cancel()
	release := filepath.Join(t.TempDir(), "release")
	script := "i=0\nwhile [ ! -e " + release + " ]; do i=$((i+1)); echo $i; sleep 0.2; done\necho done\nexit 7"
	res, err := f.cl.Exec(ctx, &protocol.ExecRequest{Target: protocol.Target{Node: "e2e-jobs"}, ID: "seq-1", Script: script, Detach: true}, nil)
	if err != nil || len(res.Results) != 1 || !res.Results[0].Detached {
		t.Fatalf("detached exec: %+v, %v", res, err)
	}
	t.Cleanup(func() { os.WriteFile(release, nil, 0o600) }) // whatever happens, end the job
	outFile := filepath.Join(dataDir, "jobs", "seq-1", "stdout")

	// An attached exec whose group outlives its leader: its sleeps run
	// on unless someone ends them.
	attachedDone := make(chan string, 1)
	go func() {
		res, err := f.cl.Exec(ctx, &protocol.ExecRequest{Target: protocol.Target{Node: "e2e-jobs"}, Script: "sleep 3161 & sleep 3161 & wait"}, nil)
		switch {
		case err != nil:
			attachedDone <- ""
		case len(res.Results) != 1 || res.Results[0].OK():
			attachedDone <- fmt.Sprintf("result %+v, want a failure", res)
		default:
			attachedDone <- ""
		}
	}()
	checkFor(t, defaultTestTimeout, func() error {
		if p := processesWith("sleep", "3161"); len(p) != 2 {
			return fmt.Errorf("sleep 3161 pids %v, want 2", p)
		}
		return nil
	})

	// Follow the job's logs with the CLI, from before the kill to its end.
	follow := exec.CommandContext(ctx, *tetherBin, "job", "logs", "--follow", "--poll", "200ms", "--node", "e2e-jobs", "seq-1")
	follow.Env = append(os.Environ(), natsEnv(f.natsURL)...)
	var followOut, followErr strings.Builder
	follow.Stdout, follow.Stderr = &followOut, &followErr
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	followDone := make(chan error, 1)
	go func() { followDone <- follow.Wait() }()

	checkFor(t, defaultTestTimeout, func() error {
		if n := seqLines(t, outFile); n < 3 {
			return fmt.Errorf("%d lines of output so far", n)
		}
		return nil
	})

	// kill -9 of the agent.
	if err := agent.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-agent.done
	// The job runs on with no agent at all: its output grows.
	atKill := seqLines(t, outFile)
	checkFor(t, defaultTestTimeout, func() error {
		if n := seqLines(t, outFile); n < atKill+3 {
			return fmt.Errorf("%d lines with the agent dead, %d at its kill: the job stopped", n, atKill)
		}
		return nil
	})
	// The attached exec's group is orphaned: its sleeps still run.
	if p := processesWith("sleep", "3161"); len(p) != 2 {
		t.Fatalf("sleep 3161 pids %v with the agent dead, want 2 (the test would prove nothing)", p)
	}

	agent = start(t, "agent-e2e-jobs-restarted", agentArgs...)
	f.waitNodes(t, "e2e-jobs")
	// The restarted agent killed the orphaned group.
	checkFor(t, defaultTestTimeout, func() error {
		if p := processesWith("sleep", "3161"); len(p) > 0 {
			return fmt.Errorf("sleep 3161 still running after the agent's restart: pids %v", p)
		}
		return nil
	})
	select {
	case bad := <-attachedDone:
		if bad != "" {
			t.Errorf("the attached exec, whose agent was killed: %s", bad)
		}
	case <-time.After(defaultTestTimeout):
		t.Errorf("the attached exec's client was not told its node was lost")
	}

	// Found again: running, with all its output so far.
	var st *protocol.JobStatus
	checkFor(t, defaultTestTimeout, func() error {
		var err error
		st, err = f.cl.JobStatus(ctx, "e2e-jobs", "seq-1")
		return err
	})
	if st.State != protocol.JobRunning || st.StdoutBytes == 0 {
		t.Fatalf("status after the restart: %+v, want running", st)
	}
	out, _, code := runCLI(t, f.natsURL, "", "job", "logs", "--node", "e2e-jobs", "seq-1")
	if code != 0 {
		t.Fatalf("job logs after the restart: code %d", code)
	}
	n := checkSeqOutput(t, out, atKill+3, false)

	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	checkFor(t, defaultTestTimeout, func() error {
		var err error
		st, err = f.cl.JobStatus(ctx, "e2e-jobs", "seq-1")
		if err == nil && st.State != protocol.JobExited {
			err = fmt.Errorf("state %s", st.State)
		}
		return err
	})
	if st.ExitCode == nil || *st.ExitCode != 7 || st.FinishedAt == nil {
		t.Errorf("final status %+v, want exited 7", st)
	}
	out, _, code = runCLI(t, f.natsURL, "", "job", "logs", "--node", "e2e-jobs", "seq-1")
	if code != 0 || int64(len(out)) != st.StdoutBytes {
		t.Errorf("job logs at the end: code %d, %d bytes, status says %d", code, len(out), st.StdoutBytes)
	}
	checkSeqOutput(t, out, n, true)

	// The follower rode through the restart and ends with the job's code.
	select {
	case err := <-followDone:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 7 {
			t.Errorf("job logs --follow: %v, want exit code 7; stderr %q", err, followErr.String())
		}
	case <-time.After(defaultTestTimeout):
		t.Fatalf("job logs --follow did not end; stderr %q", followErr.String())
	}
	if followOut.String() != out {
		t.Errorf("job logs --follow printed %d bytes, the job wrote %d; stderr %q", len(followOut.String()), len(out), followErr.String())
	}
	checkSeqOutput(t, followOut.String(), n, true)
	if !strings.Contains(followErr.String(), "still following") {
		t.Logf("the follower saw no outage (the restart was quick): stderr %q", followErr.String())
	}

	// Cancel works on a job found again, too.
	res, err = f.cl.Exec(ctx, &protocol.ExecRequest{Target: protocol.Target{Node: "e2e-jobs"}, ID: "long-1", Argv: []string{"sleep", "3162"}, Detach: true}, nil)
	if err != nil || !res.Results[0].Detached {
		t.Fatalf("detached exec: %+v, %v", res, err)
	}
	agent.stop(t) // a graceful stop leaves it running too
	agent = start(t, "agent-e2e-jobs-again", agentArgs...)
	f.waitNodes(t, "e2e-jobs")
	checkFor(t, defaultTestTimeout, func() error {
		var err error
		st, err = f.cl.JobCancel(ctx, "e2e-jobs", "long-1")
		return err
	})
	if st.State != protocol.JobExited || !st.Cancelled {
		t.Errorf("cancel after a restart: %+v", st)
	}
	checkFor(t, defaultTestTimeout, func() error {
		if p := processesWith("sleep", "3162"); len(p) > 0 {
			return fmt.Errorf("sleep 3162 still running: %v", p)
		}
		return nil
	})
	// The shims are race-built too: their logs must hold no report.
	logs, _ := filepath.Glob(filepath.Join(dataDir, "jobs", "*", "shim.log"))
	if len(logs) != 2 {
		t.Errorf("shim logs %v, want one per job", logs)
	}
	for _, l := range logs {
		if b, _ := os.ReadFile(l); strings.Contains(string(b), "DATA RACE") {
			t.Errorf("%s: the race detector reported a data race:\n%s", l, b)
		}
	}
}

// seqLines counts the complete lines of the file at path.
func seqLines(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0
		}
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

// checkSeqOutput checks that out is "1\n2\n...\nN\n" (then "done\n" if
// done) with N at least min, and returns N.
func checkSeqOutput(t *testing.T, out string, min int, done bool) int {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if done {
		if lines[len(lines)-1] != "done" {
			t.Fatalf("output does not end with done: %q", out)
		}
		lines = lines[:len(lines)-1]
	}
	for i, l := range lines {
		if l != strconv.Itoa(i+1) {
			t.Fatalf("line %d is %q, want %d: the output has a gap or a repeat: %q", i+1, l, i+1, out)
		}
	}
	if len(lines) < min {
		t.Fatalf("%d lines of output, want at least %d", len(lines), min)
	}
	return len(lines)
}

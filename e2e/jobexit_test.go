//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/tetherfleet/tether/protocol"
)

// TestJobListCurrent: `tether job list` shows a detached job that ended as
// succeeded or failed, with its exit code, soon after its end, although
// nobody asks its status (no job status, wait or get): the agent reports
// the end and the coordinator settles the record. Also when the agent was
// killed (-9) while the job exited (the restarted agent reports it at its
// first session), and for a job found running again by the restarted agent
// that ends later.
func TestJobListCurrent(t *testing.T) {
	f := startFleet(t)
	dataDir := t.TempDir()
	agentArgs := []string{"agent", "--coordinator", f.tunnelAddr, "--shared-token", "--token-file", f.tokenFile,
		"--ca-file", filepath.Join(f.dataDir, "pki", "ca.crt"), "--node-id", "e2e-report", "--data-dir", dataDir}
	agent := start(t, "agent-e2e-report", agentArgs...)
	f.waitNodes(t, "e2e-report")

	ctx, cancel := context.WithTimeout(context.Background(), 2*defaultTestTimeout)
	defer cancel()
	detach := func(id, script string) {
		t.Helper()
		res, err := f.cl.Exec(ctx, &protocol.ExecRequest{Target: protocol.Target{Node: "e2e-report"}, ID: id, Script: script, Detach: true}, nil)
		if err != nil || len(res.Results) != 1 || !res.Results[0].Detached {
			t.Fatalf("detached exec %s: %+v, %v", id, res, err)
		}
	}
	// list is `tether job list --json --node e2e-report`, by job id.
	list := func() map[string]protocol.JobRecord {
		t.Helper()
		out, errOut, code := runCLI(t, f.natsURL, "", "job", "list", "--json", "--node", "e2e-report")
		if code != 0 {
			t.Fatalf("tether job list: code %d, stderr %q", code, errOut)
		}
		var resp protocol.JobListResponse
		if err := json.Unmarshal([]byte(out), &resp); err != nil {
			t.Fatalf("tether job list --json: %v: %q", err, out)
		}
		m := map[string]protocol.JobRecord{}
		for _, r := range resp.Jobs {
			m[r.ID] = r
		}
		return m
	}
	// settled waits until job list shows every job of want in its state
	// with its exit code.
	type end struct {
		state protocol.JobState
		code  int
	}
	settled := func(want map[string]end) {
		t.Helper()
		checkFor(t, defaultTestTimeout, func() error {
			got := list()
			for id, w := range want {
				r, ok := got[id]
				if !ok {
					return fmt.Errorf("job %s not listed", id)
				}
				if r.State != w.state || r.ExitCode() != w.code {
					return fmt.Errorf("job %s listed %s exit %d, want %s exit %d", id, r.State, r.ExitCode(), w.state, w.code)
				}
			}
			return nil
		})
	}

	detach("list-ok", "exit 0")
	detach("list-bad", "sleep 0.5; exit 3")
	settled(map[string]end{"list-ok": {protocol.JobSucceeded, 0}, "list-bad": {protocol.JobFailed, 3}})

	// Two jobs waiting for a file each; the agent is killed, the first
	// one exits while no agent runs.
	release1 := filepath.Join(t.TempDir(), "release1")
	release2 := filepath.Join(t.TempDir(), "release2")
	t.Cleanup(func() { os.WriteFile(release1, nil, 0o600); os.WriteFile(release2, nil, 0o600) })
	waitScript := func(f string, code int) string {
		return fmt.Sprintf("while [ ! -e %s ]; do sleep 0.1; done; exit %d", f, code)
	}
	detach("list-rel1", waitScript(release1, 6))
	detach("list-rel2", waitScript(release2, 0))
	checkFor(t, defaultTestTimeout, func() error {
		got := list()
		for _, id := range []string{"list-rel1", "list-rel2"} {
			if s := got[id].State; s != protocol.JobStateRunning {
				return fmt.Errorf("job %s listed %q, want running", id, s)
			}
		}
		return nil
	})
	if err := agent.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-agent.done
	if err := os.WriteFile(release1, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	checkFor(t, defaultTestTimeout, func() error {
		if _, err := os.Stat(filepath.Join(dataDir, "jobs", "list-rel1", "status.json")); err != nil {
			return fmt.Errorf("job list-rel1 not ended yet: %v", err)
		}
		return nil
	})
	// With no agent, nothing can settle it.
	if s := list()["list-rel1"].State; s != protocol.JobStateRunning {
		t.Fatalf("job list-rel1 listed %s with its agent dead, want running (the test would prove nothing)", s)
	}

	start(t, "agent-e2e-report-restarted", agentArgs...)
	f.waitNodes(t, "e2e-report")
	settled(map[string]end{"list-rel1": {protocol.JobFailed, 6}})
	if s := list()["list-rel2"].State; s != protocol.JobStateRunning {
		t.Fatalf("job list-rel2 listed %s before it ended, want running", s)
	}
	// The job the restarted agent found running ends now.
	if err := os.WriteFile(release2, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	settled(map[string]end{"list-rel2": {protocol.JobSucceeded, 0}})
}

package cli

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
)

// A client command ended by its terminal going away (SIGHUP) or by the
// reader of its output leaving (SIGPIPE: `tether exec ... | head -1`)
// cancels its job as Ctrl-C does and exits 128+N, like a filter the
// signal killed. Before, the runtime's default killed the process on the
// spot, and the remote job ran on until the coordinator missed three
// heartbeats (15 s; fresh-user pass fresh19).
func TestExecHangupAndBrokenPipeCancelTheJob(t *testing.T) {
	f := startFleet(t, fleettest.Options{Agents: 1, Jobs: true})
	url := f.NATS.ClientURL()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		sig  syscall.Signal
		code int
	}{{syscall.SIGHUP, 129}, {syscall.SIGPIPE, 141}} {
		t.Run(tc.sig.String(), func(t *testing.T) {
			ctx := testCtx(t)
			script := "echo started; exec sleep 60"
			if tc.sig == syscall.SIGPIPE {
				script = "echo started; while :; do echo more; sleep 0.05; done"
			}
			cmd := exec.CommandContext(ctx, exe, "exec", "--nats-url", url, "--node", "node-0", "--", "sh", "-c", script)
			cmd.Env = append(os.Environ(), cliMainEnv+"=1", natsCredsEnv+"="+f.CredsFile)
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			var stderr syncBuffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if err != nil || line != "started\n" {
				t.Fatalf("first line %q, %v; stderr %q", line, err, stderr.String())
			}
			if tc.sig == syscall.SIGPIPE {
				stdout.Close() // the reader leaves: the next write gets EPIPE
			} else {
				cmd.Process.Signal(tc.sig)
			}
			cmd.Wait()
			ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
			if ws.Signaled() || cmd.ProcessState.ExitCode() != tc.code {
				t.Fatalf("tether exec after %v: %v (signaled %v), want exit %d; stderr %q", tc.sig, cmd.ProcessState, ws.Signaled(), tc.code, stderr.String())
			}
			checkFor(t, defaultTestTimeout, func() error {
				r := runCLI(ctx, nil, "", "job", "list", "--nats-url", url, "--json", "--limit", "1")
				var list struct{ Jobs []protocol.JobRecord }
				if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list.Jobs) != 1 {
					return fmt.Errorf("job list: exit %d, %v, stdout %q, stderr %q", r.code, err, r.stdout, r.stderr)
				}
				j := list.Jobs[0]
				if j.State != protocol.JobCancelled || !strings.Contains(j.Command, "sh -c") {
					return fmt.Errorf("latest job %s (%q): state %s, want cancelled", j.ID, j.Command, j.State)
				}
				// Cancelled by the client, not by three missed heartbeats
				// (15 s after it went silent).
				if ran := j.FinishedAt.Sub(j.StartedAt); ran >= 12*time.Second {
					t.Errorf("job %s ran %v after its client's %v: cancelled by the heartbeat lapse, not by the client", j.ID, ran, tc.sig)
				}
				return nil
			})
		})
	}
}

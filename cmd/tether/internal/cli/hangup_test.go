package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
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
			if tc.sig == syscall.SIGPIPE && stderr.String() != "" {
				// As a filter SIGPIPE killed: nothing to say (it said
				// "node node-0: cancelled"; fresh-user pass fresh20).
				t.Errorf("tether exec after its reader left printed %q, want nothing", stderr.String())
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

// A write to a standard output or error whose reader left ends the
// command quietly with 141 (`tether audit -f | head -1` printed "write
// /dev/stdout: broken pipe" and exited 255); other EPIPEs (a socket) are
// errors as before.
func TestBrokenStdoutIsQuiet(t *testing.T) {
	bg := context.Background()
	sigpipe, cancel := context.WithCancelCause(bg)
	cancel(SignalCause(syscall.SIGPIPE))
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"stdout", bg, fmt.Errorf("write result: %w", &fs.PathError{Op: "write", Path: "/dev/stdout", Err: syscall.EPIPE}), true},
		{"stderr", bg, &fs.PathError{Op: "write", Path: "/dev/stderr", Err: syscall.EPIPE}, true},
		{"after SIGPIPE", sigpipe, errors.New("interrupted"), true},
		{"socket", bg, &net.OpError{Op: "write", Net: "tcp", Err: syscall.EPIPE}, false},
		{"a file", bg, &fs.PathError{Op: "write", Path: "/tmp/x", Err: syscall.EPIPE}, false},
		{"stdout, other error", bg, &fs.PathError{Op: "write", Path: "/dev/stdout", Err: syscall.ENOSPC}, false},
	} {
		if got := brokenStdout(tc.ctx, tc.err); got != tc.want {
			t.Errorf("%s: brokenStdout = %v, want %v", tc.name, got, tc.want)
		}
	}
}

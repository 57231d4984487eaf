package cli

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/natsauth/natsauthtest"
	"github.com/tetherfleet/tether/protocol"
)

// exitRow is one row of the exit code table (the package doc, README and
// `tether exec --help`): a command line and the code it must end with.
type exitRow struct {
	name string
	args []string
	// ctx, if set, replaces the test's context (an interrupted run).
	ctx    func(t *testing.T) context.Context
	code   int
	stderr string // a part of stderr, if not empty
}

func checkExitRows(t *testing.T, rows []exitRow) {
	t.Helper()
	for _, tt := range rows {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testCtx(t)
			if tt.ctx != nil {
				ctx = tt.ctx(t)
			}
			r := runCLI(ctx, nil, "", tt.args...)
			if r.code != tt.code || !strings.Contains(r.stderr, tt.stderr) {
				t.Errorf("tether %s: exit %d, want %d; stderr %q (want it to contain %q)", strings.Join(tt.args, " "), r.code, tt.code, r.stderr, tt.stderr)
			}
			// Go's own words for a cancelled request are no user's.
			if strings.Contains(r.stderr, "context canceled") {
				t.Errorf("tether %s: stderr %q names Go's context", strings.Join(tt.args, " "), r.stderr)
			}
			// The --help hint belongs to usage errors only.
			if hint := strings.Contains(r.stderr, usageHint); hint != (r.code == exitUsage) {
				t.Errorf("tether %s (exit %d): usage hint printed = %v; stderr %q", strings.Join(tt.args, " "), r.code, hint, r.stderr)
			}
		})
	}
}

// cancelledCtx is a context already ended by sig, as main's signal
// handling ends Run's.
func cancelledCtx(sig syscall.Signal) func(t *testing.T) context.Context {
	return func(t *testing.T) context.Context {
		ctx, cancel := context.WithCancelCause(testCtx(t))
		cancel(SignalCause(sig))
		return ctx
	}
}

// natsWithoutCoordinator starts a NATS server that no coordinator serves.
func natsWithoutCoordinator(t *testing.T) string {
	t.Helper()
	// The running fleet's layout, so its client credentials get in.
	l := fleetLayout.Load()
	if l == nil {
		l = natsauthtest.NewLayout(t)
	}
	ns, err := coordinator.StartEmbeddedNATS(coordinator.EmbeddedNATSConfig{Host: "127.0.0.1", Port: server.RANDOM_PORT, StoreDir: t.TempDir(), Auth: l})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns.ClientURL()
}

// TestExecExitCodes: with --node, who failed is in the exit code: the
// remote command's own code, 126/127 as a shell reports a command it could
// not run, 124 for the timeout, 254 for a truncated output, and 255 when
// Tether failed (the node is not connected, the cwd is missing, no
// coordinator answers). With several nodes: 0, 1 when a node failed, 254
// when every node succeeded but an output was truncated, 255 when Tether
// failed.
func TestExecExitCodes(t *testing.T) {
	f := startFleet(t, fleettest.Options{Agents: 2})
	url := f.NATS.ClientURL()
	dir0 := f.DataDir("node-0")
	if err := os.WriteFile(filepath.Join(dir0, "plain.txt"), []byte("not a program\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir0, "only-on-node-0"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	idle := natsWithoutCoordinator(t)
	unreachable := "nats://127.0.0.1:1"
	exec := func(args ...string) []string { return append([]string{"exec", "--nats-url", url}, args...) }

	checkExitRows(t, []exitRow{
		{name: "success", args: exec("--node", "node-0", "--", "true"), code: 0},
		{name: "remote exit 1", args: exec("--node", "node-0", "-c", "exit 1"), code: 1},
		{name: "remote exit code", args: exec("--node", "node-0", "--", "sh", "-c", "exit 3"), code: 3},
		{name: "usage", args: exec("--", "true"), code: 2, stderr: "no target"},
		{name: "usage: no script file", args: exec("--node", "node-0", "--script", "/nonexistent/job.sh"), code: 2, stderr: "--script /nonexistent/job.sh: no such file or directory"},
		{name: "timed out", args: exec("--node", "node-0", "--timeout", "1", "--", "sleep", "10"), code: 124, stderr: "timed out after 1s"},
		{name: "not executable", args: exec("--node", "node-0", "--", "./plain.txt"), code: 126, stderr: "(not_executable)"},
		{name: "directory is not executable", args: exec("--node", "node-0", "--", "/"), code: 126, stderr: "(not_executable)"},
		{name: "command not found", args: exec("--node", "node-0", "--", "no-such-command-tether-test"), code: 127, stderr: "(command_not_found)"},
		{name: "path not found", args: exec("--node", "node-0", "--", "/no/such/program"), code: 127, stderr: "(command_not_found)"},
		{name: "killed by a signal", args: exec("--node", "node-0", "-c", "kill -KILL $$"), code: 137, stderr: "killed by signal KILL"},
		{name: "interrupted", args: exec("--node", "node-0", "--", "sleep", "60"), ctx: cancelledCtx(syscall.SIGINT), code: 130, stderr: "tether: interrupted\n"},
		{name: "terminated", args: exec("--node", "node-0", "--", "sleep", "60"), ctx: cancelledCtx(syscall.SIGTERM), code: 143},
		{name: "output truncated", args: exec("--node", "node-0", "--output-limit", "1KiB", "--", "head", "-c", "5000", "/dev/zero"), code: 254, stderr: "stdout was truncated"},
		{name: "node not connected", args: exec("--node", "node-9", "--", "true"), code: 255, stderr: "unknown_node)"},
		{name: "cwd does not exist", args: exec("--node", "node-0", "--cwd", "/nonexistent", "--", "true"), code: 255, stderr: "cwd /nonexistent: no such file or directory"},
		{name: "coordinator unreachable", args: []string{"exec", "--nats-url", unreachable, "--node", "node-0", "--", "true"}, code: 255, stderr: "connect to NATS"},
		{name: "no coordinator", args: []string{"exec", "--nats-url", idle, "--node", "node-0", "--", "true"}, code: 255, stderr: "no Tether coordinator"},

		{name: "fan-out success", args: exec("--all", "--", "true"), code: 0},
		{name: "fan-out some node failed", args: exec("--all", "--", "test", "-e", "only-on-node-0"), code: 1, stderr: "2 nodes: 1 succeeded, 1 failed"},
		{name: "fan-out command not found", args: exec("--all", "--", "no-such-command-tether-test"), code: 1, stderr: "command_not_found"},
		{name: "fan-out truncated", args: exec("--all", "--output-limit", "4", "--", "echo", "0123456789"), code: 254, stderr: "stdout was truncated"},
		{name: "fan-out no match", args: exec("--selector", "index=9", "--", "true"), code: 255, stderr: "no_match)"},
		{name: "fan-out coordinator unreachable", args: []string{"exec", "--nats-url", unreachable, "--all", "--", "true"}, code: 255, stderr: "connect to NATS"},
		{name: "fan-out no coordinator", args: []string{"exec", "--nats-url", idle, "--all", "--", "true"}, code: 255, stderr: "no Tether coordinator"},
	})

	// A truncated result says so in --json too.
	r := runCLI(testCtx(t), nil, "", "exec", "--nats-url", url, "--node", "node-0", "--json", "--output-limit", "10", "--", "echo", "0123456789abcdef")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	var res struct {
		Truncated bool `json:"truncated"`
		Results   []struct {
			Truncated bool `json:"truncated"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil || r.code != 254 || !res.Truncated || len(res.Results) != 1 || !res.Results[0].Truncated {
		t.Errorf("--json truncated: exit %d, result %+v (%v)\n%s", r.code, res, err, r.stdout)
	}
}

// TestClientCommandExitCodes: the other client commands use 255 for
// Tether's own failures too, and pass a remote or local command's code on.
func TestClientCommandExitCodes(t *testing.T) {
	f := startFleet(t, fleettest.Options{Gateways: &fleettest.GatewayOptions{}})
	url := f.NATS.ClientURL()
	unreachable := "nats://127.0.0.1:1"
	checkExitRows(t, []exitRow{
		{name: "shell remote exit code", args: []string{"shell", "node-0", "--nats-url", url, "--", "sh", "-c", "exit 6"}, code: 6},
		{name: "shell command not found", args: []string{"shell", "node-0", "--nats-url", url, "--", "no-such-command-tether-test"}, code: 127, stderr: "command_not_found"},
		{name: "shell node not connected", args: []string{"shell", "node-9", "--nats-url", url}, code: 255, stderr: "unknown_node"},
		{name: "shell coordinator unreachable", args: []string{"shell", "node-0", "--nats-url", unreachable}, code: 255, stderr: "connect to NATS"},
		{name: "job unknown", args: []string{"job", "status", "--nats-url", url, "--node", "node-0", "nope"}, code: 255, stderr: "not_found"},
		{name: "job node not connected", args: []string{"job", "logs", "--nats-url", url, "--node", "node-9", "nope"}, code: 255, stderr: "unknown_node"},
		{name: "job logs --follow interrupted", args: []string{"job", "logs", "--follow", "--nats-url", url, "--node", "node-0", "nope"}, ctx: cancelledCtx(syscall.SIGINT), code: 130, stderr: "tether: interrupted\n"},
		{name: "nodes coordinator unreachable", args: []string{"nodes", "--nats-url", unreachable}, code: 255, stderr: "connect to NATS"},
		{name: "forward node not connected", args: []string{"forward", "--nats-url", url, "node-9", "openshell"}, code: 255, stderr: "not connected"},
		{name: "run-lease command not found", args: []string{"run-lease", "--nats-url", url, "--", "/nonexistent/cmd"}, code: 127},
		{name: "run-lease coordinator unreachable", args: []string{"run-lease", "--nats-url", unreachable, "--", "true"}, code: 255, stderr: "connect to NATS"},
	})

	// A shell whose standard input is not open gives the command an
	// empty one instead of leaving it waiting.
	closed, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	r := runCLIWith(testCtx(t), nil, closed, "shell", "node-0", "--nats-url", url, "--", "wc", "-c")
	if r.code != 0 || strings.TrimSpace(r.stdout) != "0" {
		t.Errorf("shell with a closed stdin: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

// TestExitCodeTableDocumented: `tether exec --help` carries the table.
func TestExitCodeTableDocumented(t *testing.T) {
	r := runCLI(testCtx(t), nil, "", "exec", "--help")
	for _, want := range []string{"126", "127", "124", "254", "255", "130", "143"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("exec --help lacks exit code %s:\n%s", want, r.stdout)
		}
	}
}

// TestBlankSelectors: a selector with an empty term, or an empty one given
// explicitly, is a usage error; --all is how to say every node.
func TestBlankSelectors(t *testing.T) {
	f := startFleet(t, fleettest.Options{})
	url := f.NATS.ClientURL()
	var rows []exitRow
	for _, sel := range []string{" ", ",", ",,", "index=0,,index=0", "index=0,"} {
		rows = append(rows,
			exitRow{name: "exec " + sel, args: []string{"exec", "--nats-url", url, "--selector", sel, "--", "true"}, code: 2, stderr: "--selector"},
			exitRow{name: "nodes " + sel, args: []string{"nodes", "--nats-url", url, "--selector", sel}, code: 2, stderr: "--selector"})
	}
	rows = append(rows,
		exitRow{name: "exec empty", args: []string{"exec", "--nats-url", url, "--selector", "", "--", "true"}, code: 2, stderr: "--all"},
		exitRow{name: "nodes empty", args: []string{"nodes", "--nats-url", url, "--selector", ""}, code: 2, stderr: "--selector is empty"})
	checkExitRows(t, rows)

	// The API, asked directly, answers 400 invalid_request.
	for _, sel := range []string{" ", ",", "index=0,,index=0"} {
		_, err := f.Client.Nodes(testCtx(t), sel)
		if !errors.Is(err, &protocol.APIError{Code: protocol.ErrCodeInvalid}) {
			t.Errorf("nodes with selector %q: %v, want invalid_request", sel, err)
		}
		_, err = f.Client.Exec(testCtx(t), &protocol.ExecRequest{Target: protocol.Target{Selector: sel}, Argv: []string{"true"}}, nil)
		if !errors.Is(err, &protocol.APIError{Code: protocol.ErrCodeInvalid}) {
			t.Errorf("exec with selector %q: %v, want invalid_request", sel, err)
		}
	}
}

// TestExecOutputLimit: --output-limit raises or lowers the agent's cap, or
// lifts it, on the job path and for detached jobs; a truncated detached
// job's `job logs --follow` exits 254 too.
func TestExecOutputLimit(t *testing.T) {
	f := startFleet(t, fleettest.Options{Agent: func(_ int, c *agent.Config) { c.OutputLimit = 1000 }})
	url := f.NATS.ClientURL()
	for _, tt := range []struct {
		limit      []string
		code, size int
	}{
		{nil, 254, 1000},
		{[]string{"--output-limit", "2KiB"}, 254, 2048},
		{[]string{"--output-limit", "10"}, 254, 10},
		{[]string{"--output-limit", "unlimited"}, 0, 5000},
		{[]string{"--output-limit", "1MB"}, 0, 5000},
	} {
		args := append(append([]string{"exec", "--nats-url", url, "--node", "node-0"}, tt.limit...), "--", "head", "-c", "5000", "/dev/zero")
		r := runCLI(testCtx(t), nil, "", args...)
		if r.code != tt.code || len(r.stdout) != tt.size {
			t.Errorf("%v: exit %d, %d bytes; want %d, %d bytes; stderr %q", tt.limit, r.code, len(r.stdout), tt.code, tt.size, r.stderr)
		}
	}
	for _, tt := range []struct {
		limit      []string
		code, size int
	}{
		{nil, 254, 1000},
		{[]string{"--output-limit", "unlimited"}, 0, 5000},
	} {
		args := append(append([]string{"exec", "--nats-url", url, "--node", "node-0", "--detach"}, tt.limit...), "--", "head", "-c", "5000", "/dev/zero")
		r := runCLI(testCtx(t), nil, "", args...)
		m := regexp.MustCompile(`job (\S+) started detached`).FindStringSubmatch(r.stderr)
		if r.code != 0 || m == nil {
			t.Fatalf("--detach %v: exit %d, stderr %q", tt.limit, r.code, r.stderr)
		}
		r = runCLI(testCtx(t), nil, "", "job", "logs", "--nats-url", url, "--node", "node-0", "--follow", "--poll", "50ms", m[1])
		if r.code != tt.code || len(r.stdout) != tt.size || (tt.code == 254) != strings.Contains(r.stderr, "stdout was truncated") {
			t.Errorf("job logs --follow of --detach %v: exit %d, %d bytes; want %d, %d bytes; stderr %q", tt.limit, r.code, len(r.stdout), tt.code, tt.size, r.stderr)
		}
	}
	for _, bad := range []string{"0", "-1", "5XB", "1.5GiB", "99999999999TiB"} {
		r := runCLI(testCtx(t), nil, "", "exec", "--nats-url", url, "--node", "node-0", "--output-limit", bad, "--", "true")
		if r.code != exitUsage || !strings.Contains(r.stderr, "--output-limit") {
			t.Errorf("--output-limit %s: exit %d, stderr %q; want a usage error", bad, r.code, r.stderr)
		}
	}
}

// TestExecOutputCutIsTruncated: an agent with --pipe-wait kills a job's
// process group when a background child holds its output past the wait
// after the main process exited; output after that is lost, so the result
// is truncated: exit 254 (not 0), stderr says why, and the JSON result says
// truncated, whether the exec ran as a job or streamed stdin.
func TestExecOutputCutIsTruncated(t *testing.T) {
	f := startFleet(t, fleettest.Options{Agent: func(_ int, c *agent.Config) { c.PipeWait = 100 * time.Millisecond }})
	url := f.NATS.ClientURL()
	// The background sleep keeps stdout open after sh exited.
	cmd := []string{"--", "sh", "-c", "sleep 30 & echo parent"}
	for _, tc := range []struct {
		name  string
		stdin string // "" runs it as a job; otherwise streamed stdin
	}{{"job", ""}, {"streamed stdin", "in\n"}} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"exec", "--nats-url", url, "--node", "node-0"}, cmd...)
			r := runCLI(testCtx(t), nil, tc.stdin, args...)
			if r.code != exitTruncated || r.stdout != "parent\n" || !strings.Contains(r.stderr, "node node-0: output cut") {
				t.Errorf("exit %d, stdout %q, stderr %q; want %d and the output cut on stderr", r.code, r.stdout, r.stderr, exitTruncated)
			}
			args = append([]string{"exec", "--nats-url", url, "--node", "node-0", "--json"}, cmd...)
			r = runCLI(testCtx(t), nil, tc.stdin, args...)
			lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
			var res protocol.ExecResult
			if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil || r.code != exitTruncated || !res.Truncated ||
				len(res.Results) != 1 || !res.Results[0].Truncated || !res.Results[0].OutputCut {
				t.Errorf("--json: exit %d, result %+v (%v)\n%s", r.code, res, err, r.stdout)
			}
		})
	}
}

// usageHint is the line run prints after a usage error's message.
const usageHint = " --help' for usage."

// TestUsageHintOnlyOnUsageErrors: "Run '... --help' for usage." follows
// usage errors (exit 2) only; Tether's failures (255: here no NATS
// answers) and a command's own failures (1) print their message alone.
func TestUsageHintOnlyOnUsageErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nonexist")
	for _, tt := range []struct {
		code int
		args []string
	}{
		{exitTether, []string{"nodes", "--nats-url", unreachableNATS}},
		{exitTether, []string{"exec", "--nats-url", unreachableNATS, "--node", "n1", "--", "true"}},
		{exitTether, []string{"job", "status", "--nats-url", unreachableNATS, "abc"}},
		{exitTether, []string{"forward", "--nats-url", unreachableNATS, "n1", "openshell"}},
		{exitTether, []string{"node", "revoke", "--nats-url", unreachableNATS, "n1"}},
		{exitFailure, []string{"policy", "check", missing}},
		{exitUsage, []string{"exec", "--nats-url", unreachableNATS, "--", "true"}},
		{exitUsage, []string{"nodes", "--no-such-flag"}},
	} {
		r := runCLI(testCtx(t), nil, "", tt.args...)
		if r.code != tt.code {
			t.Errorf("tether %q: exit %d, want %d; stderr %q", tt.args, r.code, tt.code, r.stderr)
			continue
		}
		if hint := strings.Contains(r.stderr, usageHint); hint != (tt.code == exitUsage) {
			t.Errorf("tether %q (exit %d): usage hint printed = %v, want %v; stderr %q", tt.args, r.code, hint, tt.code == exitUsage, r.stderr)
		}
	}
}

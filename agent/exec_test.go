package agent

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel/tunneltest"
)

func TestExecExitStatus(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	tests := []struct {
		name       string
		params     protocol.ExecParams
		wantCode   int
		wantSignal string
		wantStdout string
	}{
		{"true", protocol.ExecParams{Argv: []string{"true"}}, 0, "", ""},
		{"exit 3", protocol.ExecParams{Script: "exit 3"}, 3, "", ""},
		{"killed by SIGKILL", protocol.ExecParams{Argv: []string{"bash", "-c", "kill -KILL $$"}}, 128 + 9, "KILL", ""},
		{"script: only the last status counts", protocol.ExecParams{Script: "false\necho a"}, 0, "", "a\n"},
		{"script: last command fails", protocol.ExecParams{Script: "echo a\nfalse"}, 1, "", "a\n"},
		{"argv runs without a shell", protocol.ExecParams{Argv: []string{"echo", "$HOME", "a;b", "*"}}, 0, "", "$HOME a;b *\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := h.open(t, protocol.KindExec, tt.params)
			e.finish(t)
			if e.errInfo != nil {
				t.Fatalf("error frame: %v", e.errInfo)
			}
			if e.exit.ExitCode != tt.wantCode || e.exit.Signal != tt.wantSignal {
				t.Errorf("exit = %d signal %q, want %d signal %q", e.exit.ExitCode, e.exit.Signal, tt.wantCode, tt.wantSignal)
			}
			if got := e.stdout.String(); got != tt.wantStdout {
				t.Errorf("stdout = %q, want %q", got, tt.wantStdout)
			}
			if e.exit.TimedOut || e.exit.Cancelled {
				t.Errorf("status %+v: unexpected timed_out or cancelled", e.exit)
			}
			if e.exit.DurationMS <= 0 {
				t.Errorf("duration_ms = %v, want > 0", e.exit.DurationMS)
			}
		})
	}
}

func TestExecStdoutStderrSeparateAndOrdered(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	// The process writes each line only after the test saw the previous
	// one, so the frame order is deterministic.
	e := h.open(t, protocol.KindExec, protocol.ExecParams{
		Argv:  []string{"bash", "-c", "read; echo out1; read; echo err1 >&2; read; echo out2"},
		Stdin: true,
	})
	e.send(t, protocol.FrameStdin, []byte("\n"))
	e.until(t, "out1", func() bool { return e.stdout.String() == "out1\n" })
	e.send(t, protocol.FrameStdin, []byte("\n"))
	e.until(t, "err1", func() bool { return e.stderr.String() == "err1\n" })
	e.send(t, protocol.FrameStdin, []byte("\n"))
	e.send(t, protocol.FrameStdinClose, nil)
	e.finish(t)
	if e.exit == nil || e.exit.ExitCode != 0 {
		t.Fatalf("exit = %+v, error %v", e.exit, e.errInfo)
	}
	if got, want := e.stdout.String(), "out1\nout2\n"; got != want {
		t.Errorf("stdout = %q, want %q", got, want)
	}
	if got, want := e.stderr.String(), "err1\n"; got != want {
		t.Errorf("stderr = %q, want %q", got, want)
	}
	want := []protocol.FrameType{protocol.FrameStdout, protocol.FrameStderr, protocol.FrameStdout}
	if diff := cmp.Diff(want, e.order); diff != "" {
		t.Errorf("frame order (-want +got):\n%s", diff)
	}
	if e.exit.StdoutBytes != 10 || e.exit.StderrBytes != 5 {
		t.Errorf("byte counts = %d/%d, want 10/5", e.exit.StdoutBytes, e.exit.StderrBytes)
	}
}

func TestExecEnvAndCwd(t *testing.T) {
	t.Parallel()
	var dataDir string
	h := newHarness(t, func(c *Config) { dataDir = c.DataDir })
	work := t.TempDir()
	if err := os.Mkdir(filepath.Join(dataDir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		params protocol.ExecParams
		want   string
	}{
		{"env and absolute cwd", protocol.ExecParams{
			Argv: []string{"bash", "-c", `printf '%s\n' "$FOO" "$(pwd)" "$PWD" "$HOME"`},
			Env:  map[string]string{"FOO": "bar baz", "HOME": "/nowhere"},
			Cwd:  work,
		}, "bar baz\n" + work + "\n" + work + "\n/nowhere\n"},
		{"default cwd is the data dir", protocol.ExecParams{Script: "pwd"}, dataDir + "\n"},
		{"relative cwd is under the data dir", protocol.ExecParams{Script: "pwd", Cwd: "sub"}, filepath.Join(dataDir, "sub") + "\n"},
		{"agent environment is inherited", protocol.ExecParams{Script: `test -n "$PATH" && echo ok`}, "ok\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := h.open(t, protocol.KindExec, tt.params)
			e.finish(t)
			if e.exit == nil || e.exit.ExitCode != 0 {
				t.Fatalf("exit = %+v, error %v, stderr %q", e.exit, e.errInfo, e.stderr.String())
			}
			if got := e.stdout.String(); got != tt.want {
				t.Errorf("stdout = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestExecStdinRoundTrip(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"cat"}, Stdin: true})
	big := bytes.Repeat([]byte("0123456789abcdef"), 8<<10) // 128 KiB: more than a pipe holds
	e.send(t, protocol.FrameStdin, []byte("hello "))
	for i := 0; i < len(big); i += protocol.ChunkSize {
		e.send(t, protocol.FrameStdin, big[i:i+protocol.ChunkSize])
	}
	e.send(t, protocol.FrameStdin, []byte("world"))
	e.send(t, protocol.FrameStdinClose, nil)
	e.finish(t)
	if e.exit == nil || e.exit.ExitCode != 0 {
		t.Fatalf("exit = %+v, error %v", e.exit, e.errInfo)
	}
	want := "hello " + string(big) + "world"
	if got := e.stdout.String(); got != want {
		t.Errorf("stdout: got %d bytes, want %d (mismatch)", len(got), len(want))
	}
}

func TestExecHalfCloseIsNotCancel(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	tests := []struct {
		name   string
		params protocol.ExecParams
		stdin  string
		want   string
	}{
		{"no stdin", protocol.ExecParams{Script: "sleep 0.2; echo done"}, "", "done\n"},
		{"half-close ends stdin", protocol.ExecParams{Argv: []string{"cat"}, Stdin: true}, "data", "data"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := h.open(t, protocol.KindExec, tt.params)
			if tt.stdin != "" {
				e.send(t, protocol.FrameStdin, []byte(tt.stdin))
			}
			if err := e.st.Close(); err != nil { // half-close: we send nothing more
				t.Fatal(err)
			}
			e.finish(t)
			if e.exit == nil || e.exit.ExitCode != 0 || e.exit.Cancelled {
				t.Fatalf("exit = %+v, error %v", e.exit, e.errInfo)
			}
			if got := e.stdout.String(); got != tt.want {
				t.Errorf("stdout = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestExecTimeoutKillsProcessTree(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	start := time.Now()
	e := h.open(t, protocol.KindExec, protocol.ExecParams{
		Argv:      []string{"bash", "-c", "echo $$; sleep 300 & sleep 300 & wait"},
		TimeoutMS: 300,
	})
	e.finish(t)
	if e.exit == nil {
		t.Fatalf("error frame: %v", e.errInfo)
	}
	if e.exit.ExitCode != 124 || !e.exit.TimedOut || e.exit.Cancelled {
		t.Errorf("status = %+v, want exit 124 timed_out", e.exit)
	}
	if e.exit.Signal != "TERM" {
		t.Errorf("signal = %q, want TERM", e.exit.Signal)
	}
	// An upper bound for a loaded machine, far below the sleeps' own end.
	if d := time.Since(start); d > time.Minute {
		t.Errorf("took %v", d)
	}
	pgid := firstLinePID(t, e.stdout.String())
	// The final frame comes after the group was killed; only zombies
	// waiting for their new parent may remain.
	if pids := groupMembers(t, pgid); len(pids) > 0 {
		t.Errorf("process group %d still has live members %v", pgid, pids)
	}
}

func TestExecTimeoutEscalatesToKill(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	e := h.open(t, protocol.KindExec, protocol.ExecParams{
		Argv:      []string{"bash", "-c", "trap '' TERM; echo $$; sleep 300 & wait; wait"},
		TimeoutMS: 200,
	})
	e.finish(t)
	if e.exit == nil {
		t.Fatalf("error frame: %v", e.errInfo)
	}
	if e.exit.ExitCode != 124 || !e.exit.TimedOut || e.exit.Signal != "KILL" {
		t.Errorf("status = %+v, want exit 124 timed_out by KILL", e.exit)
	}
	pgid := firstLinePID(t, e.stdout.String())
	if pids := groupMembers(t, pgid); len(pids) > 0 {
		t.Errorf("process group %d still has live members %v", pgid, pids)
	}
}

func TestExecCancelFrame(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	e := h.open(t, protocol.KindExec, protocol.ExecParams{
		Argv: []string{"bash", "-c", "echo $$; sleep 300 & sleep 300 & wait"},
	})
	e.until(t, "the pid", func() bool { return strings.Contains(e.stdout.String(), "\n") })
	pgid := firstLinePID(t, e.stdout.String())
	e.send(t, protocol.FrameCancel, nil)
	e.finish(t)
	if e.exit == nil {
		t.Fatalf("error frame: %v", e.errInfo)
	}
	if !e.exit.Cancelled || e.exit.TimedOut || e.exit.ExitCode != 128+15 || e.exit.Signal != "TERM" {
		t.Errorf("status = %+v, want cancelled, exit 143 by TERM", e.exit)
	}
	if pids := groupMembers(t, pgid); len(pids) > 0 {
		t.Errorf("process group %d still has live members %v", pgid, pids)
	}
}

func TestExecSessionLossKillsGroup(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	e := h.open(t, protocol.KindExec, protocol.ExecParams{
		Argv: []string{"bash", "-c", "echo $$; sleep 300 & sleep 300 & wait"},
	})
	e.until(t, "the pid", func() bool { return strings.Contains(e.stdout.String(), "\n") })
	pgid := firstLinePID(t, e.stdout.String())
	h.srv.Close() // the coordinator goes away without a final frame
	select {
	case <-h.done:
	case <-time.After(testWait):
		t.Fatal("serveStreams did not return after the session closed")
	}
	// serveStreams waits for its execs, so the group is dead by now.
	if pids := groupMembers(t, pgid); len(pids) > 0 {
		t.Errorf("process group %d still has live members %v", pgid, pids)
	}
	if got := h.a.running.Load(); got != 0 {
		t.Errorf("running execs = %d, want 0", got)
	}
}

func TestExecBackgroundChildHoldingPipes(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	start := time.Now()
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Script: "echo $$\nsleep 1000 &\necho started"})
	e.finish(t)
	if e.exit == nil || e.exit.ExitCode != 0 {
		t.Fatalf("exit = %+v, error %v", e.exit, e.errInfo)
	}
	// An upper bound for a loaded machine, far below the child's own end.
	if d := time.Since(start); d > time.Minute {
		t.Errorf("took %v; a background child holding stdout must not hang the exec", d)
	}
	if !strings.HasSuffix(e.stdout.String(), "started\n") {
		t.Errorf("stdout = %q", e.stdout.String())
	}
	pgid := firstLinePID(t, e.stdout.String())
	if pids := groupMembers(t, pgid); len(pids) > 0 {
		t.Errorf("process group %d still has live members %v", pgid, pids)
	}
}

func TestExecBackgroundChildWithRedirectedOutputIsLeftAlone(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Script: "sleep 100 >/dev/null 2>&1 &\necho $!"})
	e.finish(t)
	if e.exit == nil || e.exit.ExitCode != 0 {
		t.Fatalf("exit = %+v, error %v", e.exit, e.errInfo)
	}
	pid := firstLinePID(t, e.stdout.String())
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	if err := syscall.Kill(pid, 0); err != nil {
		t.Errorf("background child %d is gone: %v", pid, err)
	}
}

func TestExecOutputLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.OutputLimit = 100_000 })
	tests := []struct {
		name                   string
		params                 protocol.ExecParams
		wantOut, wantErr       int
		wantOutBytes           int64
		wantOutTrunc, errTrunc bool
	}{
		{"params limit", protocol.ExecParams{
			Script:      "head -c 300000 /dev/zero; head -c 50 /dev/zero >&2",
			OutputLimit: 1000,
		}, 1000, 50, 300000, true, false},
		{"config default limit", protocol.ExecParams{
			Script: "head -c 300000 /dev/zero",
		}, 100_000, 0, 300000, true, false},
		{"under the limit", protocol.ExecParams{
			Script: "head -c 99999 /dev/zero",
		}, 99999, 0, 99999, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := h.open(t, protocol.KindExec, tt.params)
			e.finish(t)
			if e.exit == nil || e.exit.ExitCode != 0 {
				t.Fatalf("exit = %+v, error %v", e.exit, e.errInfo)
			}
			if e.stdout.Len() != tt.wantOut || e.stderr.Len() != tt.wantErr {
				t.Errorf("received %d/%d bytes, want %d/%d", e.stdout.Len(), e.stderr.Len(), tt.wantOut, tt.wantErr)
			}
			if e.exit.StdoutBytes != tt.wantOutBytes || e.exit.StdoutTruncated != tt.wantOutTrunc || e.exit.StderrTruncated != tt.errTrunc {
				t.Errorf("status = %+v", e.exit)
			}
		})
	}
}

func TestExecErrors(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	badInterpreter := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(badInterpreter, []byte("#!/nonexistent/interpreter\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		kind     protocol.Kind
		params   any
		wantCode string
		wantIn   []string // substrings of the message
	}{
		{"no script or argv", protocol.KindExec, protocol.ExecParams{}, protocol.CodeBadRequest, []string{"node-a", "one of script, argv or commands"}},
		{"script with stdin", protocol.KindExec, protocol.ExecParams{Script: "cat", Stdin: true}, protocol.CodeBadRequest, []string{"stdin"}},
		{"unknown param field", protocol.KindExec, map[string]any{"argv": []string{"true"}, "bogus": 1}, protocol.CodeBadRequest, []string{"bogus"}},
		{"command not found", protocol.KindExec, protocol.ExecParams{Argv: []string{"/nonexistent/tool", "x"}}, protocol.CodeCommandNotFound, []string{"node-a", "/nonexistent/tool"}},
		{"not on PATH", protocol.KindExec, protocol.ExecParams{Argv: []string{"no-such-tool-xyz"}}, protocol.CodeCommandNotFound, []string{"node-a: command \"no-such-tool-xyz\" not found in PATH"}},
		{"a directory", protocol.KindExec, protocol.ExecParams{Argv: []string{"/"}}, protocol.CodeNotExecutable, []string{"node-a", "/"}},
		{"not executable", protocol.KindExec, protocol.ExecParams{Argv: []string{"/etc/passwd"}}, protocol.CodeNotExecutable, []string{"node-a", "/etc/passwd"}},
		{"missing interpreter", protocol.KindExec, protocol.ExecParams{Argv: []string{badInterpreter}}, protocol.CodeNotExecutable, []string{"node-a", badInterpreter}},
		{"cwd missing", protocol.KindExec, protocol.ExecParams{Argv: []string{"true"}, Cwd: "/nonexistent/dir"}, protocol.CodeStartFailed, []string{"node-a", "/nonexistent/dir"}},
		{"ssh without params", protocol.KindSSH, struct{}{}, protocol.CodeBadRequest, []string{"node-a", "ssh stream params", "logins is empty"}},
		{"control kind from the coordinator", protocol.KindControl, protocol.ControlParams{}, protocol.CodeUnsupported, []string{"control"}},
		{"undefined kind", protocol.Kind(99), struct{}{}, protocol.CodeUnsupported, []string{"99"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := h.open(t, tt.kind, tt.params)
			e.finish(t)
			if e.errInfo == nil {
				t.Fatalf("got exit %+v, want error %s", e.exit, tt.wantCode)
			}
			if e.errInfo.Code != tt.wantCode {
				t.Errorf("code = %q, want %q (message %q)", e.errInfo.Code, tt.wantCode, e.errInfo.Message)
			}
			for _, s := range tt.wantIn {
				if !strings.Contains(e.errInfo.Message, s) {
					t.Errorf("message %q does not mention %q", e.errInfo.Message, s)
				}
			}
			// Go's words are not the user's (issue 13): no "exec: ",
			// "fork/exec", "$PATH" or "executable file not found".
			for _, s := range []string{"exec: ", "fork/exec", "$PATH", "executable file"} {
				if strings.Contains(e.errInfo.Message, s) {
					t.Errorf("message %q has Go's %q", e.errInfo.Message, s)
				}
			}
			if e.stdout.Len()+e.stderr.Len() > 0 {
				t.Errorf("unexpected output %q %q", e.stdout.String(), e.stderr.String())
			}
		})
	}
}

func TestExecConcurrent(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	const n = 8
	streams := make([]*execStream, n)
	for i := range streams {
		streams[i] = h.open(t, protocol.KindExec, protocol.ExecParams{Script: "for i in 1 2 3; do echo line$i; echo err$i >&2; done"})
	}
	for i, e := range streams {
		e.finish(t)
		if e.exit == nil || e.exit.ExitCode != 0 {
			t.Fatalf("exec %d: exit = %+v, error %v", i, e.exit, e.errInfo)
		}
		if got := e.stdout.String(); got != "line1\nline2\nline3\n" {
			t.Errorf("exec %d: stdout %q", i, got)
		}
		if got := e.stderr.String(); got != "err1\nerr2\nerr3\n" {
			t.Errorf("exec %d: stderr %q", i, got)
		}
	}
}

// TestExecAgentShutdownSaysSo: an exec ended by the agent's own shutdown
// (its session still up) gets a final error frame that says so, with the
// shutdown code, instead of a stream that just ends (which the
// coordinator reported as "tunnel lost: unexpected EOF").
func TestExecAgentShutdownSaysSo(t *testing.T) {
	t.Parallel()
	a, err := New(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	client, srv := tunneltest.PairWith(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.serveStreams(ctx, client)
	}()
	t.Cleanup(func() {
		cancel()
		client.Close()
		<-done
	})
	h := &harness{a: a, client: client, srv: srv, done: done}
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"bash", "-c", "echo $$; sleep 300"}})
	e.until(t, "the pid", func() bool { return strings.Contains(e.stdout.String(), "\n") })
	pgid := firstLinePID(t, e.stdout.String())
	cancel() // the agent stops; the session is still up
	e.finish(t)
	if e.errInfo == nil || e.errInfo.Code != protocol.ResultCodeShutdown || !strings.Contains(e.errInfo.Message, "node node-a: its agent shut down") {
		t.Fatalf("final frame: exit %+v, error %+v; want the agent's shutdown", e.exit, e.errInfo)
	}
	if pids := groupMembers(t, pgid); len(pids) > 0 {
		t.Errorf("process group %d still has live members %v", pgid, pids)
	}
}

package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

func intp(i int) *int { return &i }

// Batches: NeMo Gym's SSH run (one bash -s script, only the last status
// counts; wire-facts NG-1/NG-2) and its local run (fail-fast, one by one).
func TestExecBatches(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	tests := []struct {
		name       string
		params     protocol.ExecParams
		wantCode   int
		wantFailed *int
		wantStdout string
		wantStderr string
	}{
		{"NG-1: script mode, last command fails", protocol.ExecParams{Commands: []string{"echo a", "false"}}, 1, nil, "a\n", ""},
		{"NG-2: script mode, a failing line does not stop the script", protocol.ExecParams{Commands: []string{"false", "echo a"}}, 0, nil, "a\n", ""},
		{"script mode shares shell state across lines", protocol.ExecParams{Commands: []string{"x=1", "echo $x"}}, 0, nil, "1\n", ""},
		{"fail-fast stops at the first failure", protocol.ExecParams{Commands: []string{"echo a", "echo e >&2; exit 3", "echo b"}, FailFast: true}, 3, intp(1), "a\n", "e\n"},
		{"fail-fast all succeed", protocol.ExecParams{Commands: []string{"echo a", "echo b"}, FailFast: true}, 0, nil, "a\nb\n", ""},
		{"fail-fast first fails", protocol.ExecParams{Commands: []string{"false", "echo b"}, FailFast: true}, 1, intp(0), "", ""},
		{"fail-fast commands share cwd and env, not shell state", protocol.ExecParams{
			Commands: []string{"x=1; echo $FOO", "pwd", "echo ${x:-unset}"}, FailFast: true, Env: map[string]string{"FOO": "bar"}, Cwd: "/",
		}, 0, nil, "bar\n/\nunset\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := h.open(t, protocol.KindExec, tt.params)
			e.finish(t)
			if e.errInfo != nil {
				t.Fatalf("error frame: %v", e.errInfo)
			}
			if e.exit.ExitCode != tt.wantCode {
				t.Errorf("exit = %d, want %d", e.exit.ExitCode, tt.wantCode)
			}
			if (e.exit.FailedCommand == nil) != (tt.wantFailed == nil) || (tt.wantFailed != nil && *e.exit.FailedCommand != *tt.wantFailed) {
				t.Errorf("failed_command = %v, want %v", e.exit.FailedCommand, tt.wantFailed)
			}
			if got := e.stdout.String(); got != tt.wantStdout {
				t.Errorf("stdout = %q, want %q", got, tt.wantStdout)
			}
			if got := e.stderr.String(); got != tt.wantStderr {
				t.Errorf("stderr = %q, want %q", got, tt.wantStderr)
			}
			if int(e.exit.StdoutBytes) != len(tt.wantStdout) {
				t.Errorf("stdout_bytes = %d, want %d", e.exit.StdoutBytes, len(tt.wantStdout))
			}
		})
	}
}

func TestExecFailFastTimeoutAndCancel(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Commands: []string{"true", "sleep 30", "echo never"}, FailFast: true, TimeoutMS: 300})
	e.finish(t)
	if e.exit == nil || !e.exit.TimedOut || e.exit.ExitCode != 124 || e.exit.FailedCommand == nil || *e.exit.FailedCommand != 1 {
		t.Fatalf("exit = %+v, error %v; want timed out in command 1", e.exit, e.errInfo)
	}

	e = h.open(t, protocol.KindExec, protocol.ExecParams{Commands: []string{"echo go; sleep 30", "echo never"}, FailFast: true})
	e.until(t, "go", func() bool { return e.stdout.String() == "go\n" })
	e.send(t, protocol.FrameCancel, nil)
	e.finish(t)
	if e.exit == nil || !e.exit.Cancelled || e.exit.FailedCommand == nil || *e.exit.FailedCommand != 0 || strings.Contains(e.stdout.String(), "never") {
		t.Fatalf("exit = %+v, stdout %q; want cancelled in command 0", e.exit, e.stdout.String())
	}
}

// With the default PipeWait (0) an exec waits for its output pipes like ssh:
// a background child's late output arrives.
func TestExecWaitsForBackgroundOutput(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.PipeWait = 0 })
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Script: "(sleep 1; echo late) &\necho parent"})
	e.finish(t)
	if e.exit == nil || e.exit.ExitCode != 0 || e.exit.OutputCut {
		t.Fatalf("exit = %+v, error %v", e.exit, e.errInfo)
	}
	if got := e.stdout.String(); got != "parent\nlate\n" {
		t.Errorf("stdout = %q, want both lines", got)
	}

	// The timeout still bounds a background child that never lets go. (The
	// bound on the wait is for a loaded machine, far below the child's own
	// end.)
	start := time.Now()
	e = h.open(t, protocol.KindExec, protocol.ExecParams{Script: "sleep 3000 &\necho parent", TimeoutMS: 300})
	e.finish(t)
	if e.exit == nil || !e.exit.TimedOut || e.exit.ExitCode != 124 {
		t.Fatalf("exit = %+v, error %v; want timed out", e.exit, e.errInfo)
	}
	if d := time.Since(start); d > time.Minute {
		t.Errorf("took %v", d)
	}
}

// A positive PipeWait kills the group and says so.
func TestExecPipeWaitCutsOutput(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.PipeWait = 200 * time.Millisecond })
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Script: "(sleep 3; echo late) &\necho parent"})
	e.finish(t)
	if e.exit == nil || e.exit.ExitCode != 0 || !e.exit.OutputCut {
		t.Fatalf("exit = %+v, error %v; want output_cut", e.exit, e.errInfo)
	}
	if got := e.stdout.String(); got != "parent\n" {
		t.Errorf("stdout = %q", got)
	}
}

func TestExecCwdErrors(t *testing.T) {
	t.Parallel()
	file := t.TempDir() + "/file"
	h := newHarness(t, nil)
	if err := writeFile(file); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ cwd, want string }{
		{"/nonexistent/dir", "node node-a: cwd /nonexistent/dir: no such file or directory"},
		{file, "node node-a: cwd " + file + ": not a directory"},
		// A name a terminal would not show as it is (a newline, an
		// escape) is quoted, so it cannot forge lines of the error.
		{"/tmp\nx", `node node-a: cwd "/tmp\nx": no such file or directory`},
		{"/tmp/\x1b[2J", `node node-a: cwd "/tmp/\x1b[2J": no such file or directory`},
	} {
		e := h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"true"}, Cwd: tt.cwd})
		e.finish(t)
		if e.errInfo == nil || e.errInfo.Code != protocol.CodeStartFailed || e.errInfo.Message != tt.want {
			t.Errorf("cwd %s: error %+v, want %q", tt.cwd, e.errInfo, tt.want)
		}
	}
	// The program's name, likewise.
	e := h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"/no/such\nprog"}})
	e.finish(t)
	if want := `node node-a: start "/no/such\nprog": no such file or directory`; e.errInfo == nil || e.errInfo.Message != want {
		t.Errorf("argv[0] with a newline: error %+v, want %q", e.errInfo, want)
	}
	e = h.open(t, protocol.KindExec, protocol.ExecParams{Argv: []string{"true"}, Env: map[string]string{"A": "b\x00"}})
	e.finish(t)
	if e.errInfo == nil || e.errInfo.Code != protocol.CodeBadRequest || !strings.Contains(e.errInfo.Message, "NUL") {
		t.Errorf("NUL in env value: error %+v", e.errInfo)
	}
}

package agent

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// interactiveBash runs bash as an interactive shell without startup files,
// with a prompt that never matches test output.
var interactiveBash = []string{"bash", "--norc", "--noprofile", "-i"}

func sendJSON(t *testing.T, e *execStream, ft protocol.FrameType, v any) {
	t.Helper()
	if err := protocol.WriteJSONFrame(e.st, ft, v); err != nil {
		t.Fatalf("send %s frame: %v", ft, err)
	}
}

// sessionMembers lists the live processes of session sid.
func sessionMembers(sid int) []int {
	var pids []int
	for _, p := range sessionProcs(sid) {
		pids = append(pids, p.pid)
	}
	return pids
}

func TestPTYSizeResizeAndExitCode(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	e := h.open(t, protocol.KindPTY, protocol.PTYParams{
		Argv: interactiveBash, Rows: 30, Cols: 100, Env: map[string]string{"PS1": "prompt> "},
	})
	e.send(t, protocol.FrameStdin, []byte("stty size\r"))
	e.until(t, "initial size", func() bool { return strings.Contains(e.stdout.String(), "30 100") })
	sendJSON(t, e, protocol.FrameResize, protocol.WindowSize{Rows: 40, Cols: 120})
	e.send(t, protocol.FrameStdin, []byte("stty size\r"))
	e.until(t, "new size", func() bool { return strings.Contains(e.stdout.String(), "40 120") })
	e.send(t, protocol.FrameStdin, []byte("exit 7\r"))
	e.finish(t)
	if e.exit == nil {
		t.Fatalf("error frame: %v", e.errInfo)
	}
	if e.exit.ExitCode != 7 || e.exit.Signal != "" || e.exit.Cancelled {
		t.Errorf("status = %+v, want exit 7", e.exit)
	}
	if e.exit.StdoutBytes != int64(e.stdout.Len()) {
		t.Errorf("stdout_bytes = %d, got %d bytes", e.exit.StdoutBytes, e.stdout.Len())
	}
	if len(e.order) != 1 || e.order[0] != protocol.FrameStdout {
		t.Errorf("data frames %v, want stdout only", e.order)
	}
}

func TestPTYDefaultsAndEnvironment(t *testing.T) {
	t.Parallel()
	var dataDir string
	h := newHarness(t, func(c *Config) { dataDir = c.DataDir })
	if err := os.Mkdir(filepath.Join(dataDir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	shell := os.Getenv("SHELL")
	if shell == "" {
		shell = "/bin/bash"
	}
	tests := []struct {
		name   string
		params protocol.PTYParams
		input  string
		want   string
	}{
		{
			"argv with env, cwd and term",
			protocol.PTYParams{
				Argv: []string{"bash", "-c", `printf '<%s|%s|%s|%s>\n' "$FOO" "$PWD" "$TERM" "$(stty size)"`},
				Env:  map[string]string{"FOO": "bar baz"}, Cwd: "sub", Term: "vt100",
			},
			"",
			"<bar baz|" + filepath.Join(dataDir, "sub") + "|vt100|24 80>",
		},
		{
			"login shell by default",
			protocol.PTYParams{},
			"echo \"<$0|$TERM|$PWD>\"; exit\r",
			"<-" + filepath.Base(shell) + "|xterm-256color|" + dataDir + ">",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := h.open(t, protocol.KindPTY, tt.params)
			if tt.input != "" {
				e.send(t, protocol.FrameStdin, []byte(tt.input))
			}
			e.finish(t)
			if e.exit == nil || e.exit.ExitCode != 0 {
				t.Fatalf("exit = %+v, error %v, output %q", e.exit, e.errInfo, e.stdout.String())
			}
			if !strings.Contains(e.stdout.String(), tt.want) {
				t.Errorf("output %q does not contain %q", e.stdout.String(), tt.want)
			}
		})
	}
}

func TestPTYStdinCloseEndsCat(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	e := h.open(t, protocol.KindPTY, protocol.PTYParams{Argv: []string{"cat"}})
	e.send(t, protocol.FrameStdin, []byte("hello\r"))
	// The terminal echoes the line, then cat writes it back.
	e.until(t, "cat's copy", func() bool { return strings.Count(e.stdout.String(), "hello") == 2 })
	e.send(t, protocol.FrameStdinClose, nil)
	e.finish(t)
	if e.exit == nil || e.exit.ExitCode != 0 {
		t.Fatalf("exit = %+v, error %v", e.exit, e.errInfo)
	}
}

func TestPTYLargeOutputIsDrained(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	const n = 300_000
	e := h.open(t, protocol.KindPTY, protocol.PTYParams{
		Argv: []string{"bash", "-c", fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x; exit 3", n)},
	})
	e.finish(t) // checks every chunk against ChunkSize
	if e.exit == nil || e.exit.ExitCode != 3 {
		t.Fatalf("exit = %+v, error %v", e.exit, e.errInfo)
	}
	if got := e.stdout.Len(); got != n {
		t.Errorf("got %d bytes of output before the exit frame, want %d", got, n)
	}
}

func TestPTYSignal(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	t.Run("to the command", func(t *testing.T) {
		e := h.open(t, protocol.KindPTY, protocol.PTYParams{Argv: []string{"bash", "-c", "echo ready; exec sleep 300"}})
		e.until(t, "ready", func() bool { return strings.Contains(e.stdout.String(), "ready") })
		sendJSON(t, e, protocol.FrameSignal, protocol.Signal{Name: "TERM"})
		e.finish(t)
		if e.exit == nil || e.exit.ExitCode != 128+15 || e.exit.Signal != "TERM" || e.exit.Cancelled {
			t.Fatalf("exit = %+v, error %v; want 143 TERM", e.exit, e.errInfo)
		}
	})
	t.Run("to the foreground job, not the shell", func(t *testing.T) {
		e := h.open(t, protocol.KindPTY, protocol.PTYParams{Argv: interactiveBash, Env: map[string]string{"PS1": "prompt> "}})
		e.send(t, protocol.FrameStdin, []byte("echo \"sid=$$\"\r"))
		sid := readSID(t, e)
		e.send(t, protocol.FrameStdin, []byte("sleep 300\r"))
		waitFor(t, testWait, "sleep in the foreground", func() bool { return foreground(sid) == "sleep" })
		sendJSON(t, e, protocol.FrameSignal, protocol.Signal{Name: "INT"})
		// The shell survived the job's interrupt and reads the next line.
		e.send(t, protocol.FrameStdin, []byte("echo \"status=$?\"\r"))
		e.until(t, "sleep's status", func() bool { return strings.Contains(e.stdout.String(), "status=130") })
		sendJSON(t, e, protocol.FrameSignal, protocol.Signal{Name: "NOSUCH"}) // ignored
		e.send(t, protocol.FrameStdin, []byte("exit 4\r"))
		e.finish(t)
		if e.exit == nil || e.exit.ExitCode != 4 {
			t.Fatalf("exit = %+v, error %v", e.exit, e.errInfo)
		}
	})
}

var sidRE = regexp.MustCompile(`sid=([0-9]+)`)

// readSID reads output until the shell printed "sid=<pid>" and returns pid.
func readSID(t *testing.T, e *execStream) int {
	t.Helper()
	e.until(t, "sid", func() bool { return sidRE.MatchString(e.stdout.String()) })
	sid, _ := strconv.Atoi(sidRE.FindStringSubmatch(e.stdout.String())[1])
	return sid
}

// foreground returns the command name of a process of session sid that is
// in its terminal's foreground process group, other than the leader.
func foreground(sid int) string {
	for _, p := range sessionProcs(sid) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid))
		if err != nil || p.pid == sid {
			continue
		}
		s := string(b)
		i, j := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		f := strings.Fields(s[j+1:])
		// state ppid pgrp session tty_nr tpgid
		if len(f) < 6 {
			continue
		}
		if tpgid, _ := strconv.Atoi(f[5]); tpgid == p.pgrp {
			return s[i+1 : j]
		}
	}
	return ""
}

func TestPTYHangupKillsSession(t *testing.T) {
	t.Parallel()
	// The shell prints its pid (the session id), starts a job that ignores
	// SIGHUP and one that does not, and waits.
	script := `echo "sid=$$"; (trap '' HUP; exec sleep 300) & sleep 300 & wait`
	tests := []struct {
		name          string
		end           func(t *testing.T, h *harness, e *execStream)
		wantExit      bool // an exit frame arrives
		wantCancelled bool
	}{
		{"cancel frame", func(t *testing.T, _ *harness, e *execStream) {
			e.send(t, protocol.FrameCancel, nil)
		}, true, true},
		{"client closes the stream", func(t *testing.T, _ *harness, e *execStream) {
			if err := e.st.Close(); err != nil {
				t.Fatal(err)
			}
		}, true, false},
		{"tunnel session lost", func(t *testing.T, h *harness, _ *execStream) {
			h.client.Close()
		}, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, nil)
			e := h.open(t, protocol.KindPTY, protocol.PTYParams{Argv: []string{"bash", "-c", script}})
			sid := readSID(t, e)
			waitFor(t, time.Minute, "both jobs", func() bool { return len(sessionMembers(sid)) >= 3 })
			tt.end(t, h, e)
			if tt.wantExit {
				e.finish(t)
				if e.exit == nil || e.exit.ExitCode != 128+1 || e.exit.Signal != "HUP" || e.exit.Cancelled != tt.wantCancelled {
					t.Errorf("exit = %+v, error %v; want 129 HUP cancelled=%v", e.exit, e.errInfo, tt.wantCancelled)
				}
			}
			// The job that ignores SIGHUP is killed after the grace
			// (200 ms): the wait is an upper bound for a loaded machine,
			// far below the jobs' own 300 s.
			waitFor(t, time.Minute, "the session to die", func() bool { return len(sessionMembers(sid)) == 0 })
		})
	}
}

func TestPTYBadRequests(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	tests := []struct {
		name     string
		params   any
		wantCode string
	}{
		{"empty argv[0]", protocol.PTYParams{Argv: []string{""}}, protocol.CodeBadRequest},
		{"bad env key", protocol.PTYParams{Argv: []string{"true"}, Env: map[string]string{"A=B": "c"}}, protocol.CodeBadRequest},
		{"unknown field", map[string]any{"argv": []string{"true"}, "bogus": 1}, protocol.CodeBadRequest},
		{"no such command", protocol.PTYParams{Argv: []string{"/nonexistent/tether-test"}}, protocol.CodeCommandNotFound},
		{"not on PATH", protocol.PTYParams{Argv: []string{"no-such-tool-xyz"}}, protocol.CodeCommandNotFound},
		{"not executable", protocol.PTYParams{Argv: []string{"/etc/passwd"}}, protocol.CodeNotExecutable},
		{"no such cwd", protocol.PTYParams{Argv: []string{"true"}, Cwd: "/nonexistent/dir"}, protocol.CodeStartFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := h.open(t, protocol.KindPTY, tt.params)
			e.finish(t)
			if e.errInfo == nil || e.errInfo.Code != tt.wantCode {
				t.Fatalf("got exit %+v error %+v, want error code %s", e.exit, e.errInfo, tt.wantCode)
			}
			for _, s := range []string{"exec: ", "fork/exec", "$PATH", "executable file"} {
				if strings.Contains(e.errInfo.Message, s) {
					t.Errorf("message %q has Go's %q", e.errInfo.Message, s)
				}
			}
		})
	}
}

// holdFirstPTYRead is a test hook that holds a pty's first read of its
// terminal until the handler took drains steps of its end (pty-drain), as
// an output copier starved of CPU would be.
func holdFirstPTYRead(drains int) func(string, any) {
	steps := make(chan struct{}, 100)
	var held atomic.Bool
	return func(point string, _ any) {
		switch point {
		case "pty-drain":
			steps <- struct{}{}
		case "pty-output":
			if held.Swap(true) {
				return
			}
			for range drains {
				select {
				case <-steps:
				case <-time.After(time.Minute):
					return
				}
			}
		}
	}
}

// A pty's last output before its process exits reaches the client even
// when the agent's copier reads the terminal only after the handler saw the
// exit and, with the default PipeWait (0), ended the session: the copier
// reads the terminal until it closes, it is not cut off from what the
// kernel still buffers. (Under load the copier often runs after the waiter;
// "got-usr1" went missing from tether shell's screen that way.)
func TestPTYOutputBeforeExitIsDelivered(t *testing.T) {
	t.Parallel()
	h := newHarnessWith(t, func(c *Config) { c.PipeWait = 0 }, func(a *Agent) { a.testHook = holdFirstPTYRead(2) })
	const last = "last words before exit"
	e := h.open(t, protocol.KindPTY, protocol.PTYParams{Argv: []string{"bash", "-c", "printf '" + last + "'; exit 9"}})
	e.finish(t)
	if e.exit == nil || e.exit.ExitCode != 9 {
		t.Fatalf("exit = %+v, error %v", e.exit, e.errInfo)
	}
	if got := e.stdout.String(); got != last {
		t.Errorf("output %q, want %q", got, last)
	}
	if e.exit.StdoutBytes != int64(len(last)) {
		t.Errorf("stdout_bytes = %d, want %d", e.exit.StdoutBytes, len(last))
	}
}

// A terminal that a process outside the session keeps open (it called
// setsid) is abandoned once the session is dead: the pty ends with the
// leader's status, and what was written before is still delivered.
func TestPTYTerminalHeldOutsideItsSessionIsAbandoned(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("needs setsid(1)")
	}
	h := newHarnessWith(t, func(c *Config) { c.PipeWait = 0 }, func(a *Agent) { a.testHook = holdFirstPTYRead(2) })
	pidFile := filepath.Join(t.TempDir(), "outsider")
	t.Cleanup(func() {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	script := fmt.Sprintf(`setsid sh -c 'echo outsider-ready; echo $$ > %[1]s.tmp; mv %[1]s.tmp %[1]s; exec sleep 3134' &
while [ ! -s %[1]s ]; do sleep 0.01; done
printf 'leader done'; exit 5`, pidFile)
	e := h.open(t, protocol.KindPTY, protocol.PTYParams{Argv: []string{"bash", "-c", script}})
	e.finish(t)
	if e.exit == nil || e.exit.ExitCode != 5 {
		t.Fatalf("exit = %+v, error %v", e.exit, e.errInfo)
	}
	for _, want := range []string{"outsider-ready", "leader done"} {
		if !strings.Contains(e.stdout.String(), want) {
			t.Errorf("output %q lacks %q", e.stdout.String(), want)
		}
	}
	if b, err := os.ReadFile(pidFile); err != nil {
		t.Error(err)
	} else if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); syscall.Kill(pid, 0) != nil {
		t.Errorf("the outsider %d is gone: the test proved nothing", pid)
	}
}

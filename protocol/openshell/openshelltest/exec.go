package openshelltest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/tetherfleet/tether/protocol/openshell"
)

// ExecFunc runs one ExecSandbox (or ExecSandboxInteractive) command. It
// writes output to x.Stdout and x.Stderr (each Write becomes one event,
// split at 256 KiB) and returns the exit code, which the gateway sends as
// the one exit event. A non-nil error ends the stream with that status
// instead (non-status errors become INTERNAL); ErrNoExit ends it OK without
// an exit event (OS-14). The gateway has validated the request and found
// the sandbox READY before calling it. ctx ends when the client goes away,
// the gateway closes, or timeout_seconds elapse — the gateway then reports
// exit code 124 itself — and ExecFunc must return promptly when it does.
type ExecFunc func(ctx context.Context, x *Exec) (exitCode int32, err error)

// Exec is one command to run.
type Exec struct {
	Sandbox *openshell.Sandbox            // a copy of the sandbox, READY
	Request *openshell.ExecSandboxRequest // as received (the start message for interactive execs)
	// Dir is the sandbox's private directory on the host; it exists and
	// lives as long as the sandbox's record.
	Dir string
	// Stdin is the command's input: the request's stdin bytes then EOF, or
	// for an interactive exec the stdin inputs until the client half-closes.
	// The ExecFunc may close it to stop reading.
	Stdin  io.ReadCloser
	Stdout io.Writer
	Stderr io.Writer
}

// ErrNoExit, returned by an ExecFunc, ends the exec stream OK without an
// exit event, as a broken gateway might; clients must treat that as an
// error (wire-facts §1.4, OS-14).
var ErrNoExit = errors.New("openshelltest: end the exec stream without an exit event")

// maxEventData bounds the data of one stdout/stderr event, in bytes.
const maxEventData = 256 << 10

// eventSender serialises sends of output events on one stream (grpc
// allows only one concurrent SendMsg) and stops them once the exec ended.
type eventSender struct {
	stream grpc.ServerStream
	mu     sync.Mutex
	err    error
	done   bool
}

func (s *eventSender) send(ev *openshell.ExecSandboxEvent) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return errors.New("openshelltest: exec output after the exec returned")
	}
	if s.err == nil {
		s.err = s.stream.SendMsg(ev)
	}
	return s.err
}

// finish stops further output and returns the first send error.
func (s *eventSender) finish() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done = true
	return s.err
}

type outWriter struct {
	s      *eventSender
	stderr bool
}

func (w outWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), maxEventData)]
		ev := &openshell.ExecSandboxEvent{Payload: &openshell.ExecSandboxEvent_Stdout{Stdout: &openshell.ExecSandboxStdout{Data: chunk}}}
		if w.stderr {
			ev = &openshell.ExecSandboxEvent{Payload: &openshell.ExecSandboxEvent_Stderr{Stderr: &openshell.ExecSandboxStderr{Data: chunk}}}
		}
		// SendMsg has encoded chunk when it returns, so p may be reused.
		if err := w.s.send(ev); err != nil {
			return n, err
		}
		n += len(chunk)
		p = p[len(chunk):]
	}
	return n, nil
}

// defaultPath is the PATH of an exec when the host process has none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// DefaultExec runs the command on the host with os/exec, as the sandbox's
// supervisor would run it in the sandbox: argv as given (NeMo Gym sends
// ["/bin/sh", "-c", script]); in x.Dir, or in workdir (relative to x.Dir
// unless absolute; a missing one fails like `cd` in sh, exit 2); with an
// environment of PATH, HOME=x.Dir, the spec's environment and then the
// request's (the request wins); stdin from x.Stdin. An argv[0] that cannot
// be found exits 127, one that cannot be run 126, as a shell reports them;
// a signal exits 128+signo. The command runs in its own process group,
// which is killed when ctx ends. There is no terminal (tty is ignored), and
// commands see the host's filesystem: tests should write below x.Dir.
func DefaultExec(ctx context.Context, x *Exec) (int32, error) {
	argv := x.Request.GetCommand()
	dir := x.Dir
	if wd := x.Request.GetWorkdir(); wd != "" {
		if !filepath.IsAbs(wd) {
			wd = filepath.Join(x.Dir, wd)
		}
		if fi, err := os.Stat(wd); err != nil || !fi.IsDir() {
			fmt.Fprintf(x.Stderr, "sh: cd: can't cd to %s\n", x.Request.GetWorkdir())
			return 2, nil
		}
		dir = wd
	}
	path := os.Getenv("PATH")
	if path == "" {
		path = defaultPath
	}
	env := []string{"PATH=" + path, "HOME=" + x.Dir}
	for _, m := range []map[string]string{x.Sandbox.GetSpec().GetEnvironment(), x.Request.GetEnvironment()} {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			env = append(env, k+"="+m[k]) // later duplicates win in os/exec
		}
	}

	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = x.Stdout, x.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// Background processes that keep the output open do not hold the exec
	// longer than this after the command ended.
	cmd.WaitDelay = time.Second
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		stdin.Close()
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		code := int32(126)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			code = 127
		}
		fmt.Fprintf(x.Stderr, "sh: %s: %v\n", argv[0], err)
		return code, nil
	}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		io.Copy(stdin, x.Stdin) // ends at EOF, or when the command's input closes
		stdin.Close()
	}()
	err = cmd.Wait() // closes stdin's write end once the command exited
	x.Stdin.Close()  // unblocks the copier if it waits for more input
	<-copied

	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int32(ws.Signal()), nil
		}
		return int32(ee.ExitCode()), nil
	case errors.Is(err, exec.ErrWaitDelay):
		return int32(cmd.ProcessState.ExitCode()), nil
	}
	return 0, err
}

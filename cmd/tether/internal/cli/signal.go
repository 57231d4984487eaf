package cli

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
)

// Exit codes after a signal ended the command, 128+N as shells report.
const (
	exitTerminated = 143 // SIGTERM
	exitHangup     = 129 // SIGHUP
	exitBrokenPipe = 141 // SIGPIPE
)

// hangupReloads and pipeKeepsServing tell Main's signal handler that the
// running daemon has claimed SIGHUP for its reload (reloadsOnHangup) and
// lives on through a closed log pipe (keepServingOnBrokenPipe), so that
// neither cancels it.
var hangupReloads, pipeKeepsServing atomic.Bool

// reloadsOnHangup says the command reloads on SIGHUP (the coordinator's
// config and policy, the agent's local policy) rather than stopping; call
// it before registering the reload's own signal.Notify.
func reloadsOnHangup() { hangupReloads.Store(true) }

// signalError is the cause main gives the command context when a signal
// arrives (SignalCause), so commands can exit 130 for SIGINT and 143 for
// SIGTERM.
type signalError struct{ sig os.Signal }

func (e *signalError) Error() string { return "received signal " + e.sig.String() }

// SignalCause returns the error main cancels the context of Run with when sig
// arrives.
func SignalCause(sig os.Signal) error { return &signalError{sig: sig} }

// interruptCode is the exit code of a command stopped because ctx ended:
// 143 after SIGTERM, 129 after SIGHUP, 141 after SIGPIPE, else 130
// (SIGINT, or a context cancelled without a signal).
func interruptCode(ctx context.Context) int {
	var se *signalError
	if errors.As(context.Cause(ctx), &se) {
		switch se.sig {
		case syscall.SIGTERM:
			return exitTerminated
		case syscall.SIGHUP:
			return exitHangup
		case syscall.SIGPIPE:
			return exitBrokenPipe
		}
	}
	return exitInterrupted
}

// interruptedError is what a client command returns when a signal ended
// ctx (and with it the request): "interrupted", with interruptCode's exit
// code; not the request's own error, which is Go's "context canceled".
func interruptedError(ctx context.Context) error {
	code := interruptCode(ctx)
	if code == exitBrokenPipe {
		return &exitError{code: code} // the reader left: no one to tell
	}
	return &exitError{code: code, err: errors.New("interrupted")}
}

// keepServingOnBrokenPipe makes a daemon (dev, coordinator, agent) live on
// when the reader of its standard output or error goes away (`tether dev
// 2>&1 | head -1`, a log collector restarting): a write there then fails
// with EPIPE, and the lines are lost, instead of the runtime killing the
// whole process with SIGPIPE, which stopped the coordinator, NATS and the
// agent at once, with no drain. The signal is caught (signal.Notify), not
// ignored: an ignored SIGPIPE would be inherited by the jobs the agent
// starts, and `yes | head` in a job would then never end. Client commands
// keep the default: `tether exec ... | head` ends as any Unix filter does.
func keepServingOnBrokenPipe() {
	pipeKeepsServing.Store(true)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGPIPE)
	go func() {
		for range ch {
		}
	}()
}

// brokenStdout reports whether err ended the command because the reader
// of its standard output or error left: a write there failed with EPIPE
// (os.Stdout's and os.Stderr's names are /dev/stdout and /dev/stderr),
// or Main's SIGPIPE, which the runtime raises for such a write, ended ctx.
// Run then exits 141 without a word, as a filter SIGPIPE killed does;
// an EPIPE from a socket or a file is an error as any other.
func brokenStdout(ctx context.Context, err error) bool {
	var se *signalError
	if errors.As(context.Cause(ctx), &se) && se.sig == syscall.SIGPIPE {
		return true
	}
	var pe *fs.PathError
	return errors.As(err, &pe) && (pe.Path == "/dev/stdout" || pe.Path == "/dev/stderr") && errors.Is(pe.Err, syscall.EPIPE)
}

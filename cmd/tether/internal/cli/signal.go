package cli

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"syscall"
)

// exitTerminated is the exit code after SIGTERM (128+15), as shells report.
const exitTerminated = 143

// signalError is the cause main gives the command context when a signal
// arrives (SignalCause), so commands can exit 130 for SIGINT and 143 for
// SIGTERM.
type signalError struct{ sig os.Signal }

func (e *signalError) Error() string { return "received signal " + e.sig.String() }

// SignalCause returns the error main cancels the context of Run with when sig
// arrives.
func SignalCause(sig os.Signal) error { return &signalError{sig: sig} }

// interruptCode is the exit code of a command stopped because ctx ended:
// 143 after SIGTERM, else 130 (SIGINT, or a context cancelled without a
// signal).
func interruptCode(ctx context.Context) int {
	var se *signalError
	if errors.As(context.Cause(ctx), &se) && se.sig == syscall.SIGTERM {
		return exitTerminated
	}
	return exitInterrupted
}

// interruptedError is what a client command returns when a signal ended
// ctx (and with it the request): "interrupted", with interruptCode's exit
// code; not the request's own error, which is Go's "context canceled".
func interruptedError(ctx context.Context) error {
	return &exitError{code: interruptCode(ctx), err: errors.New("interrupted")}
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
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGPIPE)
	go func() {
		for range ch {
		}
	}()
}

package cli

import (
	"context"
	"errors"
	"os"
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

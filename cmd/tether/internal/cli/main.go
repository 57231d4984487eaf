package cli

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// Main runs tether as the process: os.Args, the standard streams, and the
// signals. It returns the exit code for os.Exit. The first SIGINT,
// SIGTERM or SIGHUP (the terminal went away, or OpenSSH ending its
// ProxyCommand) cancels the command's context with the signal as its
// cause, so that a client command cancels its job and exits 128+N (130,
// 143, 129); daemons drain. Then the default handling of those is
// restored, so that a second Ctrl-C kills a process that is still
// draining. A daemon that reloads on SIGHUP (coordinator, agent: see
// reloadsOnHangup) keeps it for that.
//
// SIGPIPE is caught too, so that a write to a closed standard output or
// error fails with EPIPE instead of the runtime killing the process where
// it stands: a client command (`tether exec ... | head -1`) then cancels
// its job and exits 141 without a word, as a filter SIGPIPE killed would,
// where before the job ran on until the coordinator missed three
// heartbeats; a daemon keeps serving (keepServingOnBrokenPipe).
func Main() int {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	go func() {
		for s := range sigs {
			if s == syscall.SIGHUP && hangupReloads.Load() || s == syscall.SIGPIPE && pipeKeepsServing.Load() {
				continue
			}
			cancel(SignalCause(s))
			// SIGPIPE stays caught: the command's last words to a closed
			// stdout must fail, not kill it before it cancels its job.
			signal.Reset(os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
			return
		}
	}()
	return Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
}

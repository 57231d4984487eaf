package cli

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// Main runs tether as the process: os.Args, the standard streams, and the
// signals. It returns the exit code for os.Exit. The first SIGINT or
// SIGTERM cancels the command's context with the signal as its cause
// (client commands exit 130 for SIGINT, 143 for SIGTERM; daemons drain);
// then the default handling is restored, so that a second Ctrl-C kills a
// process that is still draining.
func Main() int {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sigs
		cancel(SignalCause(s))
		signal.Reset(os.Interrupt, syscall.SIGTERM)
	}()
	return Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
}

// Command tether is Tether's single binary: the coordinator, the node agent,
// a zero-config dev stack and the client commands. Everything lives in
// package cli; main only wires the process's signals, arguments and standard
// streams to cli.Run and exits with its code.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/tetherfleet/tether/cmd/tether/internal/cli"
)

func main() {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	// The first signal cancels ctx with the signal as its cause (client
	// commands exit 130 for SIGINT, 143 for SIGTERM); then the default
	// handling is restored so that a second Ctrl-C kills a process that is
	// still draining.
	go func() {
		s := <-sigs
		cancel(cli.SignalCause(s))
		signal.Reset(os.Interrupt, syscall.SIGTERM)
	}()
	os.Exit(cli.Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal, restore the default handling so that a
	// second Ctrl-C kills a process that is still draining.
	go func() {
		<-ctx.Done()
		stop()
	}()
	os.Exit(cli.Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

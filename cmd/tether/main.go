// Command tether is Tether's single binary: the coordinator, the node agent,
// a zero-config dev stack and the client commands. Everything lives in
// package cli; main only exits with the code of cli.Main, which wires the
// process's signals, arguments and standard streams to cli.Run.
package main

import (
	"os"

	"github.com/tetherfleet/tether/cmd/tether/internal/cli"
)

func main() { os.Exit(cli.Main()) }

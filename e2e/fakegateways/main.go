//go:build e2e

// Command fakegateways is a helper of the e2e tests: it serves one node's
// sandbox gateways as a separate process, so a test can kill, stop and
// restart them like real ones. It runs a fake OpenShell gateway
// (protocol/openshell/openshelltest) and a fake OpenSandbox lifecycle server
// (protocol/opensandbox/opensandboxtest) on loopback, prints their
// addresses as one JSON line on stdout,
//
//	{"openshell":"127.0.0.1:P","opensandbox":"127.0.0.1:Q"}
//
// and serves until SIGTERM or SIGINT, when it closes both (killing the
// fake sandboxes' exec processes) and exits 0. SIGHUP restarts the OpenShell
// gateway (openshelltest.Gateway.Restart): every connection and in-flight
// call is cut, the sandboxes survive, as a real gateway restarting on its
// database. Sandboxes live only in the process: killing it loses them, as a
// gateway that loses its database would.
//
// Flags:
//
//	--openshell-listen ADDR  the OpenShell gateway's address (default 127.0.0.1:0, any free port)
//	--create-delay D         every OpenShell CreateSandbox commits, then answers D late
//	                         (openshelltest.Fault{AfterCommit: true, Delay: D}): a slow
//	                         gateway, for killing the caller mid-create
//	--opensandbox-pending D  how long a new OpenSandbox sandbox stays Pending
//	-v                       log the OpenSandbox server's requests to stderr
//
// The package carries the build tag e2e and is built by the e2e tests
// (go build -race -tags e2e); it is never part of a release.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/tetherfleet/tether/protocol/opensandbox/opensandboxtest"
	"github.com/tetherfleet/tether/protocol/openshell"
	"github.com/tetherfleet/tether/protocol/openshell/openshelltest"
)

// addrs is the line printed once both gateways listen.
type addrs struct {
	OpenShell   string `json:"openshell"`   // host:port of the OpenShell gRPC gateway
	OpenSandbox string `json:"opensandbox"` // host:port of the OpenSandbox lifecycle server
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "fakegateways:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("fakegateways", flag.ContinueOnError)
	listen := fs.String("openshell-listen", "127.0.0.1:0", "OpenShell gateway listen address")
	createDelay := fs.Duration("create-delay", 0, "answer every OpenShell CreateSandbox this long after it committed")
	pending := fs.Duration("opensandbox-pending", 0, "how long a new OpenSandbox sandbox stays Pending")
	verbose := fs.Bool("v", false, "log the OpenSandbox server's requests to stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *createDelay < 0 || *pending < 0 {
		return fmt.Errorf("--create-delay %v and --opensandbox-pending %v must not be negative", *createDelay, *pending)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("openshell listener: %w", err)
	}
	gw := openshelltest.New(openshelltest.Options{})
	if *createDelay > 0 {
		// Times: every create for the process's life.
		gw.Inject(openshell.MethodCreateSandbox, openshelltest.Fault{AfterCommit: true, Delay: *createDelay, Times: 1 << 30})
	}
	oshAddr := gw.Serve(ln)
	defer gw.Close()

	cfg := opensandboxtest.Config{PendingFor: *pending}
	if *verbose {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	osb := opensandboxtest.NewServer(cfg)
	defer osb.Close()

	line, _ := json.Marshal(addrs{OpenShell: oshAddr, OpenSandbox: osb.Host()})
	if _, err := fmt.Printf("%s\n", line); err != nil {
		return fmt.Errorf("print addresses: %w", err)
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-hup:
			gw.Restart()
			fmt.Fprintln(os.Stderr, "fakegateways: SIGHUP: OpenShell gateway restarted (connections cut, sandboxes kept)")
		case <-ctx.Done():
			fmt.Fprintln(os.Stderr, "fakegateways: signalled; closing")
			return nil
		}
	}
}

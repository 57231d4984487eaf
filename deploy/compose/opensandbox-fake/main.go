// Command opensandbox-fake serves the repository's OpenSandbox test double
// (protocol/opensandbox/opensandboxtest: the lifecycle REST API at the root
// and under /v1, and one real execd per sandbox) on a fixed address, so that
// the compose fleet test (deploy/compose/test.sh) can put a sandbox server
// behind one agent and reach it through the coordinator's facade.
//
// It is a test harness, never part of an image or a release: `make
// compose-test` builds it to bin/opensandbox-fake and the test's compose
// override (deploy/compose/docker-compose.test.yml) bind-mounts it into a
// container that shares agent-1's network namespace, where it listens on
// loopback as a real OpenSandbox server beside an agent would.
//
// Usage: opensandbox-fake [-listen 127.0.0.1:8090] [-api-key-file FILE]
//
// It runs until SIGTERM or SIGINT, then stops every sandbox's execd (and
// their processes) and exits 0.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/tetherfleet/tether/protocol/opensandbox/opensandboxtest"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "opensandbox-fake:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("opensandbox-fake", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8090", "address of the lifecycle API (host:port)")
	keyFile := fs.String("api-key-file", "", "file holding the API key every lifecycle call must carry (default: none required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	cfg := opensandboxtest.Config{Logger: log}
	if *keyFile != "" {
		b, err := os.ReadFile(*keyFile)
		if err != nil {
			return fmt.Errorf("-api-key-file: %w", err)
		}
		if cfg.APIKey = strings.TrimSpace(string(b)); cfg.APIKey == "" {
			return fmt.Errorf("-api-key-file %s is empty", *keyFile)
		}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("-listen: %w", err)
	}
	// NewServer also listens on a loopback port of its own; the handler is
	// the same, so the fixed address serves exactly what tests get.
	fake := opensandboxtest.NewServer(cfg)
	defer fake.Close()
	srv := &http.Server{Handler: fake, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("serving the OpenSandbox fake", "addr", ln.Addr().String())
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Package natstest runs a real, embedded nats-server for tests, as
// nats-server's own tests do. Only _test.go files may import it; the
// production embedded server is coordinator.StartEmbeddedNATS.
package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Run starts a nats-server with JetStream on 127.0.0.1 and a random port,
// with logging off and no signal handlers, its store in a temporary
// directory. The server is shut down when the test ends. Connect with
// nats.Connect(s.ClientURL()). Each mutate function may adjust the options
// (e.g. MaxPayload) before the server starts.
func Run(tb testing.TB, mutate ...func(*server.Options)) *server.Server {
	tb.Helper()
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		NoLog:     true,
		NoSigs:    true,
		JetStream: true,
		StoreDir:  tb.TempDir(),
	}
	for _, m := range mutate {
		m(opts)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		tb.Fatalf("natstest: new server: %v", err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		s.WaitForShutdown()
		tb.Fatal("natstest: server not ready for connections within 10s")
	}
	tb.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

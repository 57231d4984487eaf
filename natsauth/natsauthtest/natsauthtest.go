// Package natsauthtest runs a real, embedded nats-server with Tether's NATS
// layout (package natsauth) for tests: no anonymous client gets in, the
// coordinator's connections hold TETHER credentials and clients CLIENTS
// credentials with their private inbox prefix, exactly as in production.
// Only _test.go files and test harnesses (fleettest) may import it.
package natsauthtest

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/natsauth"
)

// Env is an embedded nats-server configured by a fresh Layout.
type Env struct {
	Server *server.Server
	Layout *natsauth.Layout
}

// Run starts a nats-server with JetStream on 127.0.0.1 and a random port,
// logging off, no signal handlers, its store and its layout's keys in
// temporary directories, its authentication set by Layout.ConfigureServer.
// The server is shut down when the test ends. Each mutate function may
// adjust the options (e.g. MaxPayload) before the server starts.
func Run(tb testing.TB, mutate ...func(*server.Options)) *Env {
	tb.Helper()
	l := NewLayout(tb)
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
	if err := l.ConfigureServer(opts); err != nil {
		tb.Fatalf("natsauthtest: %v", err)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		tb.Fatalf("natsauthtest: new server: %v", err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		s.WaitForShutdown()
		tb.Fatal("natsauthtest: server not ready for connections within 10s")
	}
	tb.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return &Env{Server: s, Layout: l}
}

// NewLayout loads a fresh layout in a temporary directory.
func NewLayout(tb testing.TB) *natsauth.Layout {
	tb.Helper()
	l, err := natsauth.Load(filepath.Join(tb.TempDir(), "nats-auth"), natsauth.Config{})
	if err != nil {
		tb.Fatalf("natsauthtest: %v", err)
	}
	return l
}

// URL is the server's client URL.
func (e *Env) URL() string { return e.Server.ClientURL() }

// Coordinator connects with fresh coordinator (TETHER) credentials: no
// permission limits, JetStream, the service's queue group. The connection
// closes when the test ends.
func (e *Env) Coordinator(tb testing.TB, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	return Connect(tb, e.URL(), CoordinatorCreds(tb, e.Layout, "coordinator"), opts...)
}

// Client connects as a fresh client user named name (CLIENTS): it may
// publish API requests and read the replies on its private inbox prefix.
// The connection closes when the test ends.
func (e *Env) Client(tb testing.TB, name string, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	return Connect(tb, e.URL(), ClientCreds(tb, e.Layout, name), opts...)
}

// CoordinatorCreds mints coordinator credentials of l or fails the test.
func CoordinatorCreds(tb testing.TB, l *natsauth.Layout, name string) *natsauth.Creds {
	tb.Helper()
	c, err := l.MintCoordinator(name)
	if err != nil {
		tb.Fatalf("natsauthtest: %v", err)
	}
	return c
}

// ClientCreds mints a client user of l or fails the test.
func ClientCreds(tb testing.TB, l *natsauth.Layout, name string) *natsauth.Creds {
	tb.Helper()
	c, err := l.MintClient(name, 0)
	if err != nil {
		tb.Fatalf("natsauthtest: %v", err)
	}
	return c
}

// CredsFile writes c as a .creds file (0600) in a temporary directory and
// returns its path, for commands that take --nats-creds.
func CredsFile(tb testing.TB, c *natsauth.Creds) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), c.Name()+".creds")
	if err := natsauth.WriteCreds(path, c); err != nil {
		tb.Fatalf("natsauthtest: %v", err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		tb.Fatalf("natsauthtest: creds file %s: %v %v", path, fi.Mode(), err)
	}
	return path
}

// Connect connects to url with c (c.Options: its JWT, seed and private
// inbox prefix) and opts. The connection closes when the test ends.
func Connect(tb testing.TB, url string, c *natsauth.Creds, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	all := append([]nats.Option{nats.Name(c.Name())}, c.Options()...)
	nc, err := nats.Connect(url, append(all, opts...)...)
	if err != nil {
		tb.Fatalf("natsauthtest: connect as %s: %v", c.Name(), err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

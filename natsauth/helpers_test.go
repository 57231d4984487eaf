package natsauth

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// wait bounds every wait for an event in these tests: generous, since the
// machine may be busy; tests wait for events, not for time.
const wait = 30 * time.Second

// testLayout loads a fresh layout in a temporary directory.
func testLayout(tb testing.TB, cfg Config) *Layout {
	tb.Helper()
	l, err := Load(tb.TempDir()+"/keys", cfg)
	if err != nil {
		tb.Fatalf("Load: %v", err)
	}
	return l
}

// startServer runs an embedded nats-server with JetStream, configured by l,
// on 127.0.0.1 and a random port, until the test ends.
func startServer(tb testing.TB, l *Layout) *server.Server {
	tb.Helper()
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		NoLog:     true,
		NoSigs:    true,
		JetStream: true,
		StoreDir:  tb.TempDir(),
	}
	if err := l.ConfigureServer(opts); err != nil {
		tb.Fatalf("ConfigureServer: %v", err)
	}
	return runServer(tb, opts)
}

func runServer(tb testing.TB, opts *server.Options) *server.Server {
	tb.Helper()
	s, err := server.NewServer(opts)
	if err != nil {
		tb.Fatalf("new server: %v", err)
	}
	s.Start()
	if !s.ReadyForConnections(wait) {
		s.Shutdown()
		s.WaitForShutdown()
		tb.Fatalf("server not ready for connections within %v", wait)
	}
	tb.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// errSink collects a connection's asynchronous errors (permission
// violations).
type errSink struct{ ch chan error }

// waitFor waits for an asynchronous error whose text contains every part.
func (e *errSink) waitFor(tb testing.TB, parts ...string) error {
	tb.Helper()
	deadline := time.After(wait)
	for {
		select {
		case err := <-e.ch:
			ok := true
			for _, p := range parts {
				if !strings.Contains(err.Error(), p) {
					ok = false
				}
			}
			if ok {
				return err
			}
			tb.Logf("other async error: %v", err)
		case <-deadline:
			tb.Fatalf("no async error containing %q within %v", parts, wait)
			return nil
		}
	}
}

// connect connects to s with creds (nil: anonymous) and returns the
// connection and its asynchronous errors. The connection closes when the
// test ends.
func connect(tb testing.TB, s *server.Server, c *Creds, opts ...nats.Option) (*nats.Conn, *errSink) {
	tb.Helper()
	nc, errs, err := dial(s, c, opts...)
	if err != nil {
		tb.Fatalf("connect as %s: %v", credsName(c), err)
	}
	tb.Cleanup(nc.Close)
	return nc, errs
}

func dial(s *server.Server, c *Creds, opts ...nats.Option) (*nats.Conn, *errSink, error) {
	errs := &errSink{ch: make(chan error, 64)}
	all := []nats.Option{
		nats.NoReconnect(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs.ch <- err:
			default:
			}
		}),
	}
	if c != nil {
		all = append(all, c.Options()...)
	}
	all = append(all, opts...)
	nc, err := nats.Connect(s.ClientURL(), all...)
	return nc, errs, err
}

func credsName(c *Creds) string {
	if c == nil {
		return "anonymous"
	}
	return c.Name()
}

// mint mints a client user or fails the test.
func mintClient(tb testing.TB, l *Layout, name string) *Creds {
	tb.Helper()
	c, err := l.MintClient(name, 0)
	if err != nil {
		tb.Fatalf("MintClient(%s): %v", name, err)
	}
	return c
}

func mintCoordinator(tb testing.TB, l *Layout, name string) *Creds {
	tb.Helper()
	c, err := l.MintCoordinator(name)
	if err != nil {
		tb.Fatalf("MintCoordinator(%s): %v", name, err)
	}
	return c
}

// recv waits for the next message of a synchronous subscription.
func recv(tb testing.TB, sub *nats.Subscription) *nats.Msg {
	tb.Helper()
	m, err := sub.NextMsg(wait)
	if err != nil {
		tb.Fatalf("next message on %s: %v", sub.Subject, err)
	}
	return m
}

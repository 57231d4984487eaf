// Package tunneltest provides in-memory tunnel sessions for tests of packages
// that run on top of a tunnel, the way grpc-go's bufconn serves gRPC tests,
// a connection whose peer can be frozen (FrozenConn), and Synctest, which
// runs a test that uses yamux on testing/synctest's fake clock.
// Only _test.go files import it.
package tunneltest

import (
	"net"
	"testing"
	"time"

	"github.com/tetherfleet/tether/tunnel"
)

// Config returns a tunnel config for tests: default tuning, short timeouts.
func Config(tb testing.TB) tunnel.Config {
	cfg := tunnel.DefaultConfig()
	cfg.KeepAliveInterval = 0
	cfg.WriteTimeout = 5 * time.Second
	cfg.HeaderTimeout = 5 * time.Second
	return cfg
}

// Pair returns a connected client (agent side) and server (coordinator side)
// session over loopback TCP. Both are closed when the test ends.
func Pair(tb testing.TB) (client, server *tunnel.Session) {
	tb.Helper()
	return PairWith(tb, nil)
}

// PairWith is Pair with both sessions' config (Config) adjusted by mutate,
// if not nil: e.g. a small MaxStreamWindow, so that a test can fill a
// stream's window with little data.
func PairWith(tb testing.TB, mutate func(*tunnel.Config)) (client, server *tunnel.Session) {
	tb.Helper()
	cfg := Config(tb)
	if mutate != nil {
		mutate(&cfg)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	cc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		tb.Fatal(r.err)
	}
	client, err = tunnel.Client(cc, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	server, err = tunnel.Server(r.c, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		client.Close()
		server.Close()
	})
	return client, server
}

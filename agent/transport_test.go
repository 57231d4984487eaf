package agent

import (
	"context"
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/tunnel"
)

// TestDialTransports dials a coordinator-like listener (TLS over Cork, the
// WebSocket upgrade on ALPN http/1.1; a raw TLS dial only needs the TLS
// handshake to succeed) with each transport, falling back
// from one that fails. The connection is the transport's own, unwrapped:
// the session finds the cork beneath its TLS, or the WebSocket's frame
// writer, only on those types.
func TestDialTransports(t *testing.T) {
	pki, err := tunnel.EnsureDevPKI(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := tunnel.LoadServerTLS(pki.ServerCert, pki.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := tunnel.LoadClientTLS(pki.CACert)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns := make(chan net.Conn, 4)
	srv := &http.Server{
		// The raw TLS dial's connection is no HTTP: not worth a line.
		ErrorLog: log.New(io.Discard, "", 0),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != tunnel.WebSocketPath {
				http.NotFound(w, r)
				return
			}
			if c, err := tunnel.UpgradeWebSocket(w, r); err == nil {
				conns <- c
			}
		}),
	}
	go srv.Serve(tunnel.NewListener(ln, tunnel.ServeALPN(sc)))
	t.Cleanup(func() { srv.Close() })

	cfg := testConfig(t)
	cfg.TLS = cc
	cfg.WebSocketPing = -1
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	a.cfg.Transports = []string{TransportWebSocket}
	c, err := a.dialTransports(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if !tunnel.IsWebSocket(c) || a.dialedTransport() != TransportWebSocket {
		t.Errorf("wss dial gave %T (%q)", c, a.dialedTransport())
	}

	a.cfg.Transports = []string{TransportTLS}
	c, err = a.dialTransports(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, ok := c.(*tls.Conn); !ok || a.dialedTransport() != TransportTLS {
		t.Errorf("tls dial gave %T (%q), want the *tls.Conn itself", c, a.dialedTransport())
	}

	// A path the server does not upgrade: wss fails, tls is next.
	a.cfg.Transports, a.cfg.WebSocketPath = []string{TransportWebSocket, TransportTLS}, "/nope"
	a.lastTransport.Store(nil)
	c, err = a.dialTransports(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if a.dialedTransport() != TransportTLS {
		t.Errorf("after wss failed: %q, want tls", a.dialedTransport())
	}
	// Both failing: one error naming each.
	a.cfg.Transports = []string{TransportWebSocket}
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closed.Close()
	_, err = a.dialTransports(ctx, closed.Addr().String())
	if err == nil || !strings.Contains(err.Error(), "wss: ") {
		t.Errorf("dial of a closed port: %v, want an error naming wss", err)
	}
}

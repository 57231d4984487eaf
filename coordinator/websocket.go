package coordinator

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/tetherfleet/tether/tunnel"
)

// The WebSocket transport, the coordinator's side. A connection to the
// tunnel port whose TLS handshake negotiated ALPN http/1.1 is handed, still
// inside serveConn (so its admission place, the pacing it went through and
// the handshake deadline all hold, as for a raw TLS agent), to one HTTP
// server shared by all such connections. That server upgrades GET
// tunnel.WebSocketPath and gives the WebSocket connection back to
// serveConn, which runs the same tunnel session and handshake over it as
// over raw TLS, with the client certificate of the TLS handshake as the
// agent's identity: an agent without a valid certificate is refused by
// the same Hello checks, with the same reasons. Every other request is
// answered 404 and its connection closed.

// transportTLS and transportWebSocket name how a session reached the
// coordinator (protocol.NodeInfo.Transport).
const (
	transportTLS       = "tls"
	transportWebSocket = "wss"
)

// errNoUpgrade is why a connection handed to the HTTP server carries no
// tunnel: it was closed without an upgrade (a 404, a bad request).
var errNoUpgrade = errors.New("no websocket upgrade of " + tunnel.WebSocketPath)

// dispatchALPN picks the tunnel's transport by the ALPN protocol tc's
// handshake negotiated: raw TLS for none or tunnel.ALPNTunnel, the
// WebSocket upgrade for tunnel.ALPNHTTP. It returns the connection the
// session runs over and its transport name, or an error (tc is then
// closed).
func (c *Coordinator) dispatchALPN(ctx context.Context, tc *tls.Conn, deadline time.Time) (net.Conn, string, error) {
	switch p := tc.ConnectionState().NegotiatedProtocol; p {
	case tunnel.ALPNHTTP:
		conn, err := c.acceptWebSocket(ctx, tc, deadline)
		return conn, transportWebSocket, err
	default:
		return tc, transportTLS, nil
	}
}

// transportRefused counts and logs a connection dispatchALPN refused:
// reason timeout when it sent no upgrade in time, else protocol. An HTTP
// request that is no upgrade (a scanner, a browser) is logged at debug.
func (c *Coordinator) transportRefused(err error, transport string, log *slog.Logger) {
	reason := reasonProtocol
	if errors.Is(err, context.DeadlineExceeded) {
		reason = reasonTimeout
	}
	c.m.authFailures.WithLabelValues(reason).Inc()
	if errors.Is(err, errNoUpgrade) {
		log.Debug("HTTP request on the tunnel port without a websocket upgrade (counted in tether_coordinator_auth_failures_total)", "transport", transport, "err", err)
		return
	}
	log.Warn("agent transport refused (each one counted in tether_coordinator_auth_failures_total)", "reason", reason, "transport", transport, "err", err)
}

// acceptWebSocket hands tc to the HTTP server and waits, until deadline
// (or ctx's end), for it to be upgraded. It closes tc on failure.
func (c *Coordinator) acceptWebSocket(ctx context.Context, tc *tls.Conn, deadline time.Time) (net.Conn, error) {
	p := &pendingConn{Conn: tc, up: make(chan net.Conn, 1), closed: make(chan struct{})}
	if !c.ws.offer(ctx, p) {
		tc.Close()
		return nil, errors.New("the coordinator is shutting down")
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case conn := <-p.up:
		return conn, nil
	case <-p.closed:
		return nil, errNoUpgrade
	case <-ctx.Done():
		tc.Close()
		return nil, ctx.Err()
	case <-t.C:
		tc.Close()
		return nil, fmt.Errorf("no websocket upgrade within the handshake timeout: %w", context.DeadlineExceeded)
	}
}

// pendingConn is a TLS connection handed to the HTTP server; serveConn
// waits for its upgrade (up) or its close (closed).
type pendingConn struct {
	net.Conn
	up     chan net.Conn // the upgraded connection; buffered, sent once
	once   sync.Once
	closed chan struct{}
}

func (p *pendingConn) Close() error {
	p.once.Do(func() { close(p.closed) })
	return p.Conn.Close()
}

// NetConn is the TLS connection.
func (p *pendingConn) NetConn() net.Conn { return p.Conn }

type pendingKey struct{}

// wsServer is the HTTP server of WebSocket dials: one for the coordinator,
// fed by serveConn through its listener.
type wsServer struct {
	srv   *http.Server
	conns chan net.Conn
	once  sync.Once
	done  chan struct{} // closed by close: offer refuses, Accept fails
	serve chan struct{} // closed when Serve returned
}

func newWSServer(handshakeTimeout time.Duration, log *slog.Logger) *wsServer {
	s := &wsServer{conns: make(chan net.Conn), done: make(chan struct{}), serve: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+tunnel.WebSocketPath, s.upgrade)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		http.Error(w, "tether tunnel: not found; agents upgrade GET "+tunnel.WebSocketPath, http.StatusNotFound)
	})
	s.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: handshakeTimeout,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, pendingKey{}, c)
		},
	}
	return s
}

// upgrade serves GET tunnel.WebSocketPath: the WebSocket connection goes
// back to the serveConn waiting for it.
func (s *wsServer) upgrade(w http.ResponseWriter, r *http.Request) {
	p, ok := r.Context().Value(pendingKey{}).(*pendingConn)
	if !ok {
		http.Error(w, "tether tunnel: internal error", http.StatusInternalServerError)
		return
	}
	// A refused upgrade closes the connection: serveConn stops waiting.
	w.Header().Set("Connection", "close")
	conn, err := tunnel.UpgradeWebSocket(w, r)
	if err != nil {
		return
	}
	p.up <- conn
}

// run serves until close; it runs in a goroutine of Serve's.
func (s *wsServer) run() {
	defer close(s.serve)
	s.srv.Serve(s)
}

// offer hands conn to the server; false once it is closed.
func (s *wsServer) offer(ctx context.Context, conn net.Conn) bool {
	select {
	case s.conns <- conn:
		return true
	case <-s.done:
		return false
	case <-ctx.Done():
		return false
	}
}

// close stops the server (connections not yet upgraded are closed; the
// upgraded ones are serveConn's) and waits for run to return, if it ran.
func (s *wsServer) close(started bool) {
	s.once.Do(func() { close(s.done) })
	s.srv.Close()
	if started {
		<-s.serve
	}
}

// Accept, Close and Addr make wsServer the server's net.Listener.
func (s *wsServer) Accept() (net.Conn, error) {
	select {
	case c := <-s.conns:
		return c, nil
	case <-s.done:
		return nil, net.ErrClosed
	}
}

func (s *wsServer) Close() error {
	s.once.Do(func() { close(s.done) })
	return nil
}

func (s *wsServer) Addr() net.Addr { return wsAddr{} }

type wsAddr struct{}

func (wsAddr) Network() string { return "websocket" }
func (wsAddr) String() string  { return "tunnel-port" + tunnel.WebSocketPath }

package tunnel

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"golang.org/x/net/http/httpproxy"
)

// The WebSocket transport carries the same yamux session as raw TLS, inside
// binary WebSocket messages, over a TLS connection to the coordinator's own
// tunnel port: the TLS handshake is the same one (the same server
// certificate, verified the same way, and the agent's node certificate as
// the TLS client certificate), only its ALPN differs. So the node's
// identity still comes from the TLS handshake, never from anything inside
// HTTP, and a CONNECT proxy in between sees only TLS.
//
// Framing: each Write is one binary message (one frame while it fits the
// write buffer), written in one system call beneath the TLS (Cork); Read
// assembles the byte stream across messages. A text message from the peer
// is a protocol error: the connection is closed with status 1003 and a
// message saying why.
//
// Keepalive: the dialing side sends a WebSocket ping (a control frame, which
// every WebSocket-aware proxy forwards and counts as traffic) whenever it
// has written nothing for PingInterval; the peer's pong is traffic the other
// way. This keeps a path through a proxy that kills idle connections alive
// even with the session's own yamux keepalive turned off; with it on (the
// agent's default, every 5 s) the yamux pings alone already do.

// ALPN protocol names on the coordinator's tunnel port.
const (
	// ALPNTunnel is offered by agents dialing raw TLS (no ALPN at all is
	// taken the same way, as older agents send none).
	ALPNTunnel = "tether/1"
	// ALPNHTTP is offered by WebSocket dials: the coordinator hands the
	// connection to its HTTP server, which upgrades WebSocketPath.
	ALPNHTTP = "http/1.1"
)

// WebSocketPath is the path the coordinator upgrades to a tunnel; every
// other path on its HTTP server is 404.
const WebSocketPath = "/v1/tunnel"

// DefaultPingInterval is WebSocketDialer's default PingInterval: below the
// idle timeouts proxies commonly apply (30 s and up), with room for a ping
// that waits behind a full send buffer.
const DefaultPingInterval = 15 * time.Second

// ErrTextFrame is what Read returns when the peer sent a text message: the
// tunnel carries binary messages only. The connection is closed (status
// 1003, unsupported data).
var ErrTextFrame = errors.New("tunnel: websocket peer sent a text message; the tunnel carries binary messages only")

// wsBufferSize is the WebSocket write buffer: a yamux frame of up to this
// size (the coalesced header and first 16 KiB of a data frame, window
// updates, pings) becomes one WebSocket frame. Larger writes are sent as
// several frames of one message. Buffers are borrowed from wsWritePool per
// message, so an idle connection holds none.
const wsBufferSize = 64<<10 + 4<<10

// wsReadBufferSize is gorilla's read buffer, held for the connection's
// life: payloads larger than it are read straight into the caller's buffer.
const wsReadBufferSize = 4 << 10

var wsWritePool = &sync.Pool{}

// wsServerBufferSize is the coordinator's write buffer: smaller, since
// gorilla writes a server's body of more than twice its buffer straight
// from the caller's slice (frame header and body as two writes beneath,
// corked into one). Measured against a buffer of wsBufferSize
// (BenchmarkWebSocketServerBuffer), the CPU per byte is the same
// (0.98–1.01×), and each message borrows a quarter of the memory: the
// coordinator writes to many agents at once.
const wsServerBufferSize = 16 << 10

var wsServerWritePool = &sync.Pool{}

// wsServerReadBufferSize is the coordinator's read buffer, held for the
// connection's life: frame headers are read through it, payloads straight
// into yamux's buffer. Smaller than the HTTP server's 4 KiB reader, which
// is dropped at the upgrade, since an idle agent's cost is mostly such
// buffers.
const wsServerReadBufferSize = 512

// ServeALPN returns a copy of cfg, the coordinator's tunnel listener config,
// that offers ALPNTunnel and ALPNHTTP (keeping any protocols cfg offers
// already, first), so WebSocket dials reach the HTTP server and raw TLS
// agents (no ALPN, or ALPNTunnel) the tunnel.
func ServeALPN(cfg *tls.Config) *tls.Config {
	c := cfg.Clone()
	for _, p := range []string{ALPNTunnel, ALPNHTTP} {
		found := false
		for _, q := range c.NextProtos {
			found = found || q == p
		}
		if !found {
			c.NextProtos = append(c.NextProtos, p)
		}
	}
	return c
}

// ProxyFunc picks the HTTP proxy for a target URL (scheme https, host the
// coordinator's host:port): nil for none.
type ProxyFunc func(target *url.URL) (*url.URL, error)

// ProxyFromEnvironment returns the ProxyFunc of HTTPS_PROXY, https_proxy and
// NO_PROXY, no_proxy as they are now, with net/http's ProxyFromEnvironment
// semantics (golang.org/x/net/http/httpproxy, which it uses): a NO_PROXY
// entry matches the host and its subdomains, and localhost and loopback
// addresses are never proxied. A proxy URL without a scheme is http://.
func ProxyFromEnvironment() ProxyFunc {
	f := httpproxy.FromEnvironment().ProxyFunc()
	return func(u *url.URL) (*url.URL, error) { return f(u) }
}

// WebSocketDialer dials the coordinator's tunnel port over TLS, directly or
// through an HTTP CONNECT proxy, and upgrades WebSocketPath.
type WebSocketDialer struct {
	// TLS is the client TLS configuration, as DialTLS takes it (cloned;
	// NextProtos is replaced by ALPNHTTP). Required.
	TLS *tls.Config
	// Path is the path to upgrade; empty means WebSocketPath.
	Path string
	// Proxy picks the CONNECT proxy for the coordinator's host:port (the
	// host name the address was resolved from, when the Redialer resolved
	// it: proxies and NO_PROXY match names). Nil means no proxy. Only
	// http:// proxies are supported; the URL's user info, if any, is sent
	// as Proxy-Authorization: Basic.
	Proxy ProxyFunc
	// PingInterval is how long the connection may go without a write
	// before it sends a WebSocket ping. Zero means DefaultPingInterval;
	// negative, no pings.
	PingInterval time.Duration
}

// Dial dials addr (host:port) and returns the WebSocket connection as a
// net.Conn carrying binary messages, ready for Client. ctx bounds the TCP
// dial, the proxy's CONNECT, the TLS handshake and the upgrade; the
// connection outlives it. Errors name the step that failed; a busy refusal
// before TLS is a *RetryAfterError, as from DialTLS. The returned conn has
// ConnectionState, the TLS state, for the enrollment's pinning.
func (d *WebSocketDialer) Dial(ctx context.Context, addr string) (net.Conn, error) {
	if d.TLS == nil {
		return nil, errors.New("tunnel: websocket dial: no TLS config")
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("tunnel: websocket dial %s: %w", addr, err)
	}
	// The name the address was resolved from is what a proxy must be
	// asked for (and NO_PROXY matched against).
	target := addr
	if name := ServerNameFrom(ctx); name != "" {
		target = net.JoinHostPort(name, port)
	}
	var proxy *url.URL
	if d.Proxy != nil {
		proxy, err = d.Proxy(&url.URL{Scheme: "https", Host: target})
		if err != nil {
			return nil, fmt.Errorf("tunnel: websocket dial %s: pick proxy: %w", target, err)
		}
	}
	var raw net.Conn
	if proxy != nil {
		raw, err = dialConnect(ctx, proxy, target)
	} else {
		nd := net.Dialer{KeepAlive: 15 * time.Second}
		raw, err = nd.DialContext(ctx, "tcp", addr)
		if err != nil {
			err = fmt.Errorf("tunnel: dial %s: %w", addr, err)
		}
	}
	if err != nil {
		return nil, err
	}
	cfg := d.TLS.Clone()
	cfg.NextProtos = []string{ALPNHTTP}
	c, err := HandshakeTLS(ctx, raw, addr, cfg)
	if err != nil {
		return nil, err
	}
	tc := c.(*tls.Conn)
	if np := tc.ConnectionState().NegotiatedProtocol; np != ALPNHTTP {
		tc.Close()
		return nil, fmt.Errorf("tunnel: websocket dial %s: the coordinator did not take ALPN %s (got %q): it serves no WebSocket on this port (an older coordinator?)", addr, ALPNHTTP, np)
	}
	path := d.Path
	if path == "" {
		path = WebSocketPath
	}
	wd := websocket.Dialer{
		// The TLS connection is made already; gorilla only upgrades.
		NetDialTLSContext: func(context.Context, string, string) (net.Conn, error) { return tc, nil },
		ReadBufferSize:    wsReadBufferSize,
		WriteBufferSize:   wsBufferSize,
		WriteBufferPool:   wsWritePool,
	}
	u := url.URL{Scheme: "wss", Host: target, Path: path}
	ws, resp, err := wd.DialContext(ctx, u.String(), nil)
	if err != nil {
		tc.Close()
		if resp != nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			return nil, fmt.Errorf("tunnel: websocket upgrade of %s at %s: %s: %q: %w", u.String(), addr, resp.Status, body, err)
		}
		return nil, fmt.Errorf("tunnel: websocket upgrade of %s at %s: %w", u.String(), addr, err)
	}
	return newWSConn(ws, tc, d.PingInterval), nil
}

// ProxyDialError is a failure to connect to the HTTP proxy itself (before
// any CONNECT). A proxy that refuses connections is down, which says
// nothing about the coordinator behind it: the Redialer backs off from it
// as from any failure, not as from a coordinator's restart (RefusedMax).
type ProxyDialError struct {
	Proxy  string // the proxy URL, password redacted
	Target string // the coordinator's host:port asked for
	Err    error
}

func (e *ProxyDialError) Error() string {
	return fmt.Sprintf("tunnel: dial proxy %s for %s: %v", e.Proxy, e.Target, e.Err)
}

func (e *ProxyDialError) Unwrap() error { return e.Err }

// dialConnect opens a tunnel to target (host:port) through the HTTP proxy
// proxy with CONNECT, within ctx.
func dialConnect(ctx context.Context, proxy *url.URL, target string) (net.Conn, error) {
	if proxy.Scheme != "http" && proxy.Scheme != "" {
		return nil, fmt.Errorf("tunnel: proxy %s: scheme %q is not supported (only http:// CONNECT proxies)", proxy.Redacted(), proxy.Scheme)
	}
	paddr := proxy.Host
	if proxy.Port() == "" {
		paddr = net.JoinHostPort(proxy.Hostname(), "80")
	}
	nd := net.Dialer{KeepAlive: 15 * time.Second}
	raw, err := nd.DialContext(ctx, "tcp", paddr)
	if err != nil {
		return nil, &ProxyDialError{Proxy: proxy.Redacted(), Target: target, Err: err}
	}
	if dl, ok := ctx.Deadline(); ok {
		raw.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { raw.SetDeadline(time.Now()) })
	defer stop()
	req := &http.Request{
		Method: http.MethodConnect,
		URL:    &url.URL{Opaque: target},
		Host:   target,
		Header: http.Header{},
	}
	if u := proxy.User; u != nil {
		pw, _ := u.Password()
		req.Header.Set("Proxy-Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(u.Username()+":"+pw)))
	}
	fail := func(err error) (net.Conn, error) {
		raw.Close()
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return nil, fmt.Errorf("tunnel: CONNECT %s through proxy %s: %w", target, proxy.Redacted(), err)
	}
	if err := req.Write(raw); err != nil {
		return fail(err)
	}
	br := bufio.NewReader(raw)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return fail(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fail(fmt.Errorf("proxy answered %s", resp.Status))
	}
	if !stop() {
		return fail(ctx.Err())
	}
	raw.SetDeadline(time.Time{})
	if br.Buffered() > 0 {
		// Bytes of the coordinator's (a busy refusal) read with the
		// response: read them first.
		return &bufferedConn{Conn: raw, r: br}, nil
	}
	return raw, nil
}

// bufferedConn reads what r buffered before reading Conn.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// UpgradeWebSocket upgrades r, a tunnel request (GET WebSocketPath) that w
// answers, to a WebSocket connection carrying binary messages, ready for
// Server. It answers what it refuses itself (400 for a request that is not
// a WebSocket upgrade, 403 for one with an Origin header: agents send none,
// browsers always do) and returns the error. It sends no pings: the agent
// does, and the pongs answer them.
func UpgradeWebSocket(w http.ResponseWriter, r *http.Request) (net.Conn, error) {
	return upgradeWebSocket(w, r, wsServerReadBufferSize, wsServerBufferSize, wsServerWritePool)
}

// upgradeWebSocket is UpgradeWebSocket with gorilla's buffer sizes and
// write pool (benchmarks compare sizes).
func upgradeWebSocket(w http.ResponseWriter, r *http.Request, readSize, writeSize int, pool websocket.BufferPool) (net.Conn, error) {
	up := websocket.Upgrader{
		ReadBufferSize:  readSize,
		WriteBufferSize: writeSize,
		WriteBufferPool: pool,
		CheckOrigin:     func(r *http.Request) bool { return r.Header.Get("Origin") == "" },
		Error: func(w http.ResponseWriter, r *http.Request, status int, reason error) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(status)
			fmt.Fprintf(w, "tether tunnel: %v\n", reason)
		},
	}
	ws, err := up.Upgrade(w, r, nil)
	if err != nil {
		return nil, fmt.Errorf("tunnel: websocket upgrade from %s: %w", r.RemoteAddr, err)
	}
	return newWSConn(ws, nil, -1), nil
}

// wsConn is a WebSocket connection as a net.Conn: each Write one binary
// message, Read the concatenation of the messages read. It is safe for
// one reader and several writers at once.
type wsConn struct {
	ws   *websocket.Conn
	tls  *tls.Conn // the TLS beneath, for ConnectionState; nil if unknown
	cork *corkConn // the transport beneath the TLS, if made with Cork

	r io.Reader // the message being read; used by the reader only

	wmu       sync.Mutex
	start     time.Time
	lastWrite atomic.Int64 // time since start of the last write, ns
	pingEvery time.Duration
	ping      *time.Timer // nil without pings
	closeOnce sync.Once
	closed    atomic.Bool
}

func newWSConn(ws *websocket.Conn, tc *tls.Conn, pingEvery time.Duration) *wsConn {
	if tc == nil {
		tc = tlsBeneath(ws.NetConn())
	}
	c := &wsConn{ws: ws, tls: tc, start: time.Now()}
	if tc != nil {
		c.cork = corkOf(tc)
	}
	// Pings and closes are written by gorilla's WriteControl; the
	// default ping handler answers pings with pongs.
	if pingEvery == 0 {
		pingEvery = DefaultPingInterval
	}
	if pingEvery > 0 {
		c.pingEvery = pingEvery
		c.ping = time.AfterFunc(pingEvery, c.pingIfIdle)
	}
	return c
}

// tlsBeneath finds the *tls.Conn under c, following NetConn.
func tlsBeneath(c net.Conn) *tls.Conn {
	for range 8 {
		switch v := c.(type) {
		case *tls.Conn:
			return v
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return nil
		}
	}
	return nil
}

// pingIfIdle runs on the ping timer: a ping when nothing was written for
// pingEvery, then the timer re-armed for the rest of the interval.
func (c *wsConn) pingIfIdle() {
	if c.closed.Load() {
		return
	}
	idle := time.Since(c.start) - time.Duration(c.lastWrite.Load())
	if idle >= c.pingEvery {
		// Bounded: a peer that reads nothing must not hold the timer's
		// goroutine; the session's own timeouts find it dead.
		if err := c.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(c.pingEvery)); err != nil {
			return
		}
		c.lastWrite.Store(int64(time.Since(c.start)))
		idle = 0
	}
	if !c.closed.Load() {
		c.ping.Reset(c.pingEvery - idle)
	}
}

func (c *wsConn) Read(p []byte) (int, error) {
	for {
		if c.r == nil {
			typ, r, err := c.ws.NextReader()
			if err != nil {
				var ce *websocket.CloseError
				if errors.As(err, &ce) && (ce.Code == websocket.CloseNormalClosure || ce.Code == websocket.CloseGoingAway) {
					return 0, io.EOF
				}
				return 0, fmt.Errorf("tunnel: websocket read from %s: %w", c.RemoteAddr(), err)
			}
			if typ != websocket.BinaryMessage {
				c.ws.WriteControl(websocket.CloseMessage,
					websocket.FormatCloseMessage(websocket.CloseUnsupportedData, "tether tunnel: binary messages only"),
					time.Now().Add(time.Second))
				c.Close()
				return 0, fmt.Errorf("%w (from %s)", ErrTextFrame, c.RemoteAddr())
			}
			c.r = r
		}
		n, err := c.r.Read(p)
		if err == io.EOF {
			c.r = nil
			if n > 0 {
				return n, nil
			}
			continue
		}
		if err != nil {
			return n, fmt.Errorf("tunnel: websocket read from %s: %w", c.RemoteAddr(), err)
		}
		return n, nil
	}
}

// Write sends p as one binary message: one frame while p fits the write
// buffer, and in one write beneath the TLS when the TLS was made over Cork.
func (c *wsConn) Write(p []byte) (int, error) { return c.writeFrame(nil, p) }

// writeFrame sends hdr and body as one binary message (coalesceConn: a
// yamux data frame's header and body), as Write does.
func (c *wsConn) writeFrame(hdr, body []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.cork != nil {
		c.cork.cork()
	}
	w, err := c.ws.NextWriter(websocket.BinaryMessage)
	if err == nil {
		if len(hdr) > 0 {
			_, err = w.Write(hdr)
		}
		if err == nil {
			_, err = w.Write(body)
		}
		if cerr := w.Close(); err == nil {
			err = cerr
		}
	}
	if c.cork != nil {
		if uerr := c.cork.uncork(); err == nil {
			err = uerr
		}
	}
	if c.ping != nil {
		c.lastWrite.Store(int64(time.Since(c.start)))
	}
	if err != nil {
		return 0, fmt.Errorf("tunnel: websocket write to %s: %w", c.RemoteAddr(), err)
	}
	return len(body), nil
}

// Close closes the connection beneath at once (no close handshake: the
// session above already ended).
func (c *wsConn) Close() error {
	var err error
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		if c.ping != nil {
			c.ping.Stop()
		}
		err = c.ws.Close()
	})
	return err
}

func (c *wsConn) LocalAddr() net.Addr  { return c.ws.LocalAddr() }
func (c *wsConn) RemoteAddr() net.Addr { return c.ws.RemoteAddr() }

// SetDeadline sets both deadlines. As with gorilla's, a read or write that
// times out leaves the connection unusable.
func (c *wsConn) SetDeadline(t time.Time) error {
	if err := c.ws.SetReadDeadline(t); err != nil {
		return err
	}
	return c.ws.SetWriteDeadline(t)
}
func (c *wsConn) SetReadDeadline(t time.Time) error  { return c.ws.SetReadDeadline(t) }
func (c *wsConn) SetWriteDeadline(t time.Time) error { return c.ws.SetWriteDeadline(t) }

// ConnectionState is the TLS state of the connection beneath (the
// coordinator's certificate chain, for the enrollment's pinning).
func (c *wsConn) ConnectionState() tls.ConnectionState {
	if c.tls == nil {
		return tls.ConnectionState{}
	}
	return c.tls.ConnectionState()
}

// NetConn is the connection beneath the WebSocket framing.
func (c *wsConn) NetConn() net.Conn { return c.ws.NetConn() }

// IsWebSocket reports whether c is a WebSocket transport connection (from
// WebSocketDialer.Dial or UpgradeWebSocket).
func IsWebSocket(c net.Conn) bool { _, ok := c.(*wsConn); return ok }

var _ net.Conn = (*wsConn)(nil)

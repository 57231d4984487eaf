//go:build !tetherclient

package cli

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// httpLimits bound what a client of one of Tether's own HTTP servers (the
// coordinator's admin endpoints, the agent's /metrics) can make it hold.
// The facades' servers have their own limits (coordinator/sandboxes).
type httpLimits struct {
	// ReadHeaderTimeout bounds the wait for a request's headers, from the
	// connection's accept or the end of the previous response: a client
	// that sends its headers a byte at a time (slow loris) is cut.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, body included (admin
	// requests are GETs without one).
	ReadTimeout time.Duration
	// WriteTimeout bounds writing a response, from the end of the
	// request's headers: a client that stops reading a large /metrics
	// response is cut.
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that sends no next
	// request for that long.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers, in bytes; net/http answers
	// 431 past it (plus its own 4 KiB of slack).
	MaxHeaderBytes int
	// MaxConns bounds the connections open at once; a connection past it
	// is closed at once, unread, so that idle clients cannot take the file
	// descriptors the tunnel needs.
	MaxConns int
}

// adminLimits are the limits of the admin and metrics servers. Prometheus
// scrapes every 15-60 s over one kept-alive connection and probes open a
// connection each; neither needs more.
var adminLimits = httpLimits{
	ReadHeaderTimeout: 5 * time.Second,
	ReadTimeout:       10 * time.Second,
	WriteTimeout:      30 * time.Second, // a fleet's /metrics is large
	IdleTimeout:       30 * time.Second,
	MaxHeaderBytes:    16 << 10,
	MaxConns:          128,
}

// newHTTPServer returns a server of h with l's timeouts and header limit.
// Serve it on limitConns(ln, l.MaxConns).
func newHTTPServer(h http.Handler, l httpLimits) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
	}
}

// limitConns returns ln with at most max connections open at once: Accept
// closes a connection past it at once and waits for the next. max <= 0
// means no limit. Closing the returned listener closes ln.
func limitConns(ln net.Listener, max int) net.Listener {
	if max <= 0 {
		return ln
	}
	return &limitListener{Listener: ln, max: int64(max)}
}

type limitListener struct {
	net.Listener
	max  int64
	open atomic.Int64
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			c.Close()
			continue
		}
		return &limitedConn{Conn: c, l: l}, nil
	}
}

// limitedConn gives its place back when closed, once.
type limitedConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *limitedConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}

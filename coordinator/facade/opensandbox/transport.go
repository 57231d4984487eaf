package opensandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"
)

// errClosed is returned for requests that arrive after Close.
var errClosed = errors.New("opensandbox facade: closed")

// dialError is a failed tunnel dial to a node's lifecycle server.
type dialError struct {
	Node string
	Err  error
}

func (e *dialError) Error() string {
	return fmt.Sprintf("dial %s on node %s: %v", Target, e.Node, e.Err)
}

func (e *dialError) Unwrap() error { return e.Err }

// transports holds one http.Transport per node, each dialing that node's
// lifecycle server through the tunnel, and every tunnel conn they opened
// (so that Close can end them, spliced WebSockets included).
//
// Lock order: transports.mu is a leaf lock; conns are never closed under
// it (trackedConn.Close takes it).
type transports struct {
	fleet Fleet

	mu     sync.Mutex
	nodes  map[string]*nodeTransport // by node id
	conns  map[*trackedConn]struct{}
	closed bool
}

// nodeTransport is the transport of one node's tunnel session.
type nodeTransport struct {
	session string
	tr      *http.Transport
}

func newTransports(fleet Fleet) *transports {
	return &transports{fleet: fleet, nodes: map[string]*nodeTransport{}, conns: map[*trackedConn]struct{}{}}
}

// get returns node's transport for its tunnel session session, replacing
// (and closing the idle conns of) a transport of an older session.
func (t *transports) get(node, session string) (*http.Transport, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, errClosed
	}
	old, ok := t.nodes[node]
	if ok && old.session == session {
		t.mu.Unlock()
		return old.tr, nil
	}
	nt := &nodeTransport{session: session, tr: t.newTransport(node)}
	t.nodes[node] = nt
	t.mu.Unlock()
	if ok {
		// Closing conns takes t.mu (trackedConn.Close): not under it.
		old.tr.CloseIdleConnections()
	}
	return nt.tr, nil
}

// prune drops the transports of nodes not in live (node id → session id)
// or whose session changed.
func (t *transports) prune(live map[string]string) {
	var drop []*http.Transport
	t.mu.Lock()
	for id, nt := range t.nodes {
		if s, ok := live[id]; !ok || s != nt.session {
			drop = append(drop, nt.tr)
			delete(t.nodes, id)
		}
	}
	t.mu.Unlock()
	for _, tr := range drop {
		tr.CloseIdleConnections()
	}
}

// close refuses further transports and closes every tracked conn.
func (t *transports) close() {
	t.mu.Lock()
	t.closed = true
	nodes, conns := t.nodes, t.conns
	t.nodes, t.conns = map[string]*nodeTransport{}, map[*trackedConn]struct{}{}
	t.mu.Unlock()
	for _, nt := range nodes {
		nt.tr.CloseIdleConnections()
	}
	for c := range conns {
		c.Conn.Close()
	}
}

// newTransport builds node's transport. It speaks HTTP/1.1 only (the
// lifecycle server's WebSocket proxy needs the Upgrade handshake), never
// compresses or decompresses on its own (bodies pass verbatim), and dials
// through the tunnel whatever address the request names.
func (t *transports) newTransport(node string) *http.Transport {
	return &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return t.dial(ctx, node)
		},
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
}

// dial opens a tunnel conn to node's lifecycle server and tracks it.
func (t *transports) dial(ctx context.Context, node string) (net.Conn, error) {
	c, err := t.fleet.DialTarget(ctx, node, Target)
	if err != nil {
		return nil, &dialError{Node: node, Err: err}
	}
	tc := &trackedConn{Conn: c, t: t}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		c.Close()
		return nil, &dialError{Node: node, Err: errClosed}
	}
	t.conns[tc] = struct{}{}
	t.mu.Unlock()
	return tc, nil
}

// trackedConn is a tunnel conn that leaves the registry when closed.
type trackedConn struct {
	net.Conn
	t    *transports
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.t.mu.Lock()
		delete(c.t.conns, c)
		c.t.mu.Unlock()
	})
	return c.Conn.Close()
}

package opensandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/protocol"
)

// errClosed is returned for requests that arrive after Close.
var errClosed = errors.New("opensandbox facade: closed")

// failingFor is how long a node whose lifecycle server could not be
// dialed counts as failing (placement by load passes it over) unless a
// dial in the same tunnel session succeeds first.
const failingFor = 30 * time.Second

// dialError is a failed tunnel dial to a node's lifecycle server: nothing
// of the request was sent.
type dialError struct {
	Node string
	Err  error
}

// Error is Err's text, which names the node and target (Fleet.DialTarget's
// contract), or says so itself.
func (e *dialError) Error() string {
	if errors.Is(e.Err, errClosed) {
		return fmt.Sprintf("dial %s on node %s: %v", Target, e.Node, e.Err)
	}
	return e.Err.Error()
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
	// guard contains a panic of a dial, which net/http runs on its own
	// goroutine: the dial fails instead. Nil until New sets it.
	guard *panics.Guard

	mu     sync.Mutex
	nodes  map[string]*nodeTransport // by node id
	conns  map[*trackedConn]struct{}
	health map[nodeSession]time.Time // when the last dial failed; absent after a success
	closed bool
	now    func() time.Time
}

// nodeSession is a node id and one of its tunnel sessions.
type nodeSession struct{ node, session string }

// nodeTransport is the transport of one node's tunnel session.
type nodeTransport struct {
	session string
	tr      *http.Transport
}

func newTransports(fleet Fleet) *transports {
	return &transports{fleet: fleet, nodes: map[string]*nodeTransport{}, conns: map[*trackedConn]struct{}{},
		health: map[nodeSession]time.Time{}, now: time.Now}
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
	nt := &nodeTransport{session: session, tr: t.newTransport(node, session)}
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
	for k := range t.health {
		if s, ok := live[k.node]; !ok || s != k.session {
			delete(t.health, k)
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
func (t *transports) newTransport(node, session string) *http.Transport {
	return &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (c net.Conn, err error) {
			defer t.guard.Recover("dial", func(e *panics.Error) { c, err = nil, &dialError{Node: node, Err: e} })
			return t.dial(ctx, node, session)
		},
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}
}

// dial opens a tunnel conn to node's lifecycle server and tracks it. It
// records the outcome for failing: a dial ended by its context (the
// caller left, or its deadline passed) says nothing about the node.
func (t *transports) dial(ctx context.Context, node, session string) (net.Conn, error) {
	c, err := t.fleet.DialTarget(ctx, node, Target)
	key := nodeSession{node, session}
	if err != nil {
		if ctx.Err() == nil {
			t.mu.Lock()
			t.health[key] = t.now()
			t.mu.Unlock()
		}
		return nil, &dialError{Node: node, Err: err}
	}
	tc := &trackedConn{Conn: c, t: t}
	t.mu.Lock()
	delete(t.health, key)
	if t.closed {
		t.mu.Unlock()
		c.Close()
		return nil, &dialError{Node: node, Err: errClosed}
	}
	t.conns[tc] = struct{}{}
	t.mu.Unlock()
	return tc, nil
}

// failing reports whether the last dial to n's lifecycle server in n's
// tunnel session failed less than failingFor ago.
func (t *transports) failing(n protocol.NodeInfo) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.health[nodeSession{n.ID, n.SessionID}]
	return ok && t.now().Sub(at) < failingFor
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

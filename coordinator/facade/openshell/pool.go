package openshell

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/protocol/openshell"
)

// maxGatewayRecv bounds one message the facade accepts from a gateway, in
// bytes. The gateway encodes without a limit; a full ListSandboxes page of
// 1000 sandboxes with their specs can pass grpc's 4 MiB default.
const maxGatewayRecv = 64 << 20

// pruneEvery is how often, at most, conns of nodes that left or changed
// session are closed.
const pruneEvery = time.Second

// failingFor is how long a node whose gateway could not be dialed counts as
// failing (placement passes it over) unless a dial in the same session
// succeeds first.
const failingFor = 30 * time.Second

// errPoolClosed is returned for calls that race the facade's shutdown.
var errPoolClosed = errors.New("openshell facade: shutting down")

// pool holds one *grpc.ClientConn per node, whose dialer opens a tunnel dial
// stream to the node's "openshell" target. A conn belongs to one tunnel
// session: when the node reconnects (new session id) or leaves, the conn is
// closed and the next call builds a new one. Safe for concurrent use.
type pool struct {
	fleet Fleet
	// guard contains a panic of a dial, which grpc runs on its own
	// goroutine: the dial fails instead. Nil until Server.New sets it.
	guard *panics.Guard

	mu        sync.Mutex
	conns     map[string]*nodeConn      // by node id
	health    map[nodeSession]time.Time // when the last dial failed; absent after a success
	lastPrune time.Time
	closed    bool
	now       func() time.Time
}

// nodeSession is a node id and one of its tunnel sessions.
type nodeSession struct{ node, session string }

// nodeConn is the conn of one node's session.
type nodeConn struct {
	session string
	cc      *grpc.ClientConn
}

func newPool(f Fleet) *pool {
	return &pool{fleet: f, conns: make(map[string]*nodeConn), health: make(map[nodeSession]time.Time), now: time.Now}
}

// dialed records the outcome of a dial to node's gateway in session. A
// dial ended by its own context's cancellation (a conn closing) says
// nothing about the node.
func (p *pool) dialed(node, session string, err error) {
	if err != nil && errors.Is(err, context.Canceled) {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.health[nodeSession{node, session}] = p.now()
	} else {
		delete(p.health, nodeSession{node, session})
	}
}

// failing reports whether the last dial to n's gateway in n's session
// failed less than failingFor ago.
func (p *pool) failing(n protocol.NodeInfo) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.health[nodeSession{n.ID, n.SessionID}]
	return ok && p.now().Sub(at) < failingFor
}

// get returns the conn for n's session, building it on first use. n comes
// from a snapshot of the fleet that may be older than the conn cached for
// the node; when the sessions differ, the fleet is asked which one is
// current, so a stale snapshot never closes a fresh conn.
func (p *pool) get(n protocol.NodeInfo) (*grpc.ClientConn, error) {
	p.mu.Lock()
	c, ok := p.conns[n.ID]
	if ok && c.session == n.SessionID && !p.closed {
		p.mu.Unlock()
		return c.cc, nil
	}
	p.mu.Unlock()
	if ok {
		for _, cur := range p.fleet.Nodes(protocol.Selector{}) {
			if cur.ID == n.ID {
				n.SessionID = cur.SessionID
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errPoolClosed
	}
	if c, ok := p.conns[n.ID]; ok {
		if c.session == n.SessionID {
			return c.cc, nil
		}
		// The node reconnected: the old conn's streams died with the
		// old session.
		c.cc.Close()
		delete(p.conns, n.ID)
	}
	cc, err := p.dial(n.ID, n.SessionID)
	if err != nil {
		return nil, err
	}
	p.conns[n.ID] = &nodeConn{session: n.SessionID, cc: cc}
	return cc, nil
}

// unreachable reports whether n's gateway certainly cannot be reached now:
// n's conn is connected, or connects (waiting at most as long as ctx),
// or it fails to (the dial or the HTTP/2 handshake failed). When it
// reports true, no call on the conn can have reached the gateway: grpc
// sends calls only over a connected transport. A conn that is still
// connecting when ctx ends is not reported.
func (p *pool) unreachable(ctx context.Context, n protocol.NodeInfo) bool {
	cc, err := p.get(n)
	if err != nil {
		return false // the call itself reports it
	}
	for {
		st := cc.GetState()
		switch st {
		case connectivity.Ready:
			return false
		case connectivity.TransientFailure:
			return true
		case connectivity.Shutdown:
			return false // closed under us (shutdown, reconnect): let the call say so
		case connectivity.Idle:
			cc.Connect()
		}
		if !cc.WaitForStateChange(ctx, st) {
			return false
		}
	}
}

// dial builds the conn of node id's session (grpc connects on first use).
// Every dial's outcome is recorded (dialed).
func (p *pool) dial(id, session string) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///"+id,
		grpc.WithTransportCredentials(insecure.NewCredentials()), // the tunnel is the transport security
		grpc.WithContextDialer(func(ctx context.Context, _ string) (c net.Conn, err error) {
			defer p.guard.Recover("dial", func(e *panics.Error) { c, err = nil, e })
			c, err = p.fleet.DialTarget(ctx, id, protocol.TargetOpenShell)
			p.dialed(id, session, err)
			return c, err
		}),
		grpc.WithNoProxy(),
		grpc.WithDefaultCallOptions(
			grpc.ForceCodecV2(rawCodec{}),
			grpc.MaxCallSendMsgSize(openshell.MaxMessageSize),
			grpc.MaxCallRecvMsgSize(maxGatewayRecv),
		),
		// A gateway that restarts is back within seconds: do not let grpc's
		// default backoff (up to 120 s) fail calls long after that. No
		// keepalive parameters: the tunnel has its own keepalive, and pings
		// of our own could earn a GOAWAY too_many_pings (DESIGN §6).
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 3 * time.Second},
			MinConnectTimeout: 20 * time.Second,
		}),
	)
}

// prune closes the conns of nodes not in live (the connected nodes) or whose
// session changed, at most once per pruneEvery.
func (p *pool) prune(live []protocol.NodeInfo) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || now.Sub(p.lastPrune) < pruneEvery || len(p.conns) == 0 && len(p.health) == 0 {
		return
	}
	p.lastPrune = now
	sessions := make(map[string]string, len(live))
	for _, n := range live {
		sessions[n.ID] = n.SessionID
	}
	for id, c := range p.conns {
		if s, ok := sessions[id]; !ok || s != c.session {
			c.cc.Close()
			delete(p.conns, id)
		}
	}
	for k := range p.health {
		if s, ok := sessions[k.node]; !ok || s != k.session {
			delete(p.health, k)
		}
	}
}

// close closes every conn; later gets fail with errPoolClosed.
func (p *pool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for id, c := range p.conns {
		c.cc.Close()
		delete(p.conns, id)
	}
}

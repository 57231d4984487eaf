package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/protocol"
)

// Errors of DialTarget and Inventory, wrapped with the node and target they
// concern.
var (
	// ErrUnknownNode: no session for the node on this coordinator.
	ErrUnknownNode = errors.New("node is not connected")
	// ErrUnknownTarget: the node's agent is not configured for the target
	// (it is not in its Hello.Targets, or the agent refused it).
	ErrUnknownTarget = errors.New("target is not configured on the node")
)

// dialAnswerTimeout bounds the wait for the agent's answer to a dial
// stream (FrameDialOK or an error) when ctx has no earlier deadline. The
// agent's own dial timeout is 10 s.
const dialAnswerTimeout = 15 * time.Second

// drainAfterClose bounds how long a closed dial conn keeps reading (and
// discarding) what the target still sends, so the agent's copy never
// blocks on a full yamux window of a stream nobody reads.
const drainAfterClose = 5 * time.Second

// DialTarget opens a dial stream (protocol.KindDial) to target on node and
// returns it as a net.Conn that carries the target connection's raw bytes.
// Only targets the agent listed in its Hello are asked for, and the agent
// checks its own allow-list again: a caller can never make an agent dial an
// address. ctx bounds the stream open and the agent's dial, not the conn's
// life.
//
// Errors name the node and target; they wrap ErrUnknownNode,
// ErrUnknownTarget, or carry the agent's protocol.ErrorInfo
// (protocol.CodeDialFailed, CodeBusy) for a failed dial.
func (c *Coordinator) DialTarget(ctx context.Context, nodeID, target string) (net.Conn, error) {
	if err := protocol.ValidTargetName(target); err != nil {
		return nil, fmt.Errorf("dial %s on node %s: %w", target, nodeID, err)
	}
	n, err := c.node(nodeID)
	if err != nil {
		if owner, info := c.remoteRecord(nodeID); owner != "" {
			return c.dialRemote(ctx, nodeID, target, owner, info.Targets)
		}
		return nil, fmt.Errorf("dial %s on node %s: %w", target, nodeID, err)
	}
	if !slices.Contains(n.hello.Targets, target) {
		return nil, fmt.Errorf("dial %s on node %s: %w (it serves: %s)", target, nodeID, ErrUnknownTarget, targetList(n.hello.Targets))
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, dialAnswerTimeout)
		defer cancel()
	}
	st, err := n.sess.Open(ctx, protocol.KindDial, protocol.DialParams{Target: target})
	if err != nil {
		return nil, fmt.Errorf("dial %s on node %s: open stream: %w", target, nodeID, err)
	}
	c.m.streamsOpened.WithLabelValues(protocol.KindDial.String()).Inc()
	st.SetWriteDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { st.SetReadDeadline(time.Now()) })
	f, err := protocol.NewFrameReader(st).Next()
	if !stop() {
		err = errors.Join(err, ctx.Err())
	}
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("dial %s on node %s: no answer from the agent: %w", target, nodeID, err)
	}
	switch f.Type {
	case protocol.FrameDialOK:
		st.SetReadDeadline(time.Time{})
		return &dialConn{Stream: st, node: nodeID, target: target}, nil
	case protocol.FrameError:
		st.Close()
		var ei protocol.ErrorInfo
		if err := protocol.DecodeJSON(f.Payload, &ei); err != nil {
			return nil, fmt.Errorf("dial %s on node %s: %w", target, nodeID, err)
		}
		if ei.Code == protocol.CodeUnknownTarget {
			return nil, fmt.Errorf("dial %s on node %s: %w: %s", target, nodeID, ErrUnknownTarget, ei.Message)
		}
		return nil, fmt.Errorf("dial %s on node %s: %w", target, nodeID, &ei)
	default:
		st.Close()
		return nil, fmt.Errorf("dial %s on node %s: %w: %s frame", target, nodeID, protocol.ErrUnexpected, f.Type)
	}
}

func targetList(ts []string) string {
	if len(ts) == 0 {
		return "no targets"
	}
	return strings.Join(ts, ", ")
}

// node returns the registered session of id.
func (c *Coordinator) node(id string) (*node, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.nodes[id]
	if !ok {
		return nil, fmt.Errorf("%w to coordinator %s", ErrUnknownNode, c.cfg.ID)
	}
	return n, nil
}

// dialConn is a dial stream seen as a net.Conn. Close is a full close: the
// yamux stream is half-closed (FIN) and what the agent still sends is read
// and dropped for up to drainAfterClose, since yamux v0.1.2 has no stream
// reset and an unread stream would stall the agent's copy.
type dialConn struct {
	*yamux.Stream
	node, target string
	once         sync.Once
}

func (d *dialConn) Close() error {
	var err error
	d.once.Do(func() {
		err = d.Stream.Close()
		d.Stream.SetReadDeadline(time.Now().Add(drainAfterClose))
		go io.Copy(io.Discard, d.Stream)
	})
	return err
}

// CloseWrite half-closes: the agent half-closes its target connection.
func (d *dialConn) CloseWrite() error { return d.Stream.Close() }

// Node and Target say where the conn goes, for logs.
func (d *dialConn) Node() string   { return d.node }
func (d *dialConn) Target() string { return d.target }

// inventoryTimeout bounds one inventory stream when ctx has no deadline.
const inventoryTimeout = 2 * time.Minute

package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator/sshgate"
	"github.com/tetherfleet/tether/natspipe"
	"github.com/tetherfleet/tether/protocol"
)

// Dials across coordinators (the facades and anything else calling
// DialTarget). A dial for a node another coordinator holds goes to that
// owner's node subject "dial" as a natspipe request (body: dialRequest);
// the owner dials the target through its tunnel, answers with the pipe's
// open message (or a micro error naming what failed) and splices the
// pipe to the dial stream until either side ends. The identity the facade
// authenticated was authorized here; node subjects are open to
// coordinators only, so the owner takes the dial as asked.

// dialRequest is the body of a forwarded dial.
type dialRequest struct {
	Target string `json:"target"`
}

// dialRemote opens target on node id through coordinator owner.
func (c *Coordinator) dialRemote(ctx context.Context, id, target, owner string, targets []string) (net.Conn, error) {
	if !slices.Contains(targets, target) {
		return nil, fmt.Errorf("dial %s on node %s: %w (it serves: %s)", target, id, ErrUnknownTarget, targetList(targets))
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, dialAnswerTimeout)
		defer cancel()
	}
	body, _ := json.Marshal(dialRequest{Target: target})
	h := nats.Header{HeaderForwardedBy: []string{c.cfg.ID}}
	c.m.forwarded.Inc()
	p, err := natspipe.Dial(ctx, c.cfg.NATS, nodeSubject(id, "dial"), h, body, c.cfg.Pipe)
	if err != nil {
		var rej *natspipe.RejectedError
		if errors.As(err, &rej) {
			var ei protocol.ErrorInfo
			if json.Unmarshal(rej.Msg.Data, &ei) == nil && ei.Code != "" {
				if ei.Code == protocol.CodeUnknownTarget {
					return nil, fmt.Errorf("dial %s on node %s via coordinator %s: %w: %s", target, id, owner, ErrUnknownTarget, ei.Message)
				}
				if ei.Code == "unknown_node" {
					return nil, fmt.Errorf("dial %s on node %s via coordinator %s: %w: %s", target, id, owner, ErrUnknownNode, ei.Message)
				}
				return nil, fmt.Errorf("dial %s on node %s via coordinator %s: %w", target, id, owner, &ei)
			}
			return nil, fmt.Errorf("dial %s on node %s via coordinator %s: refused: %s", target, id, owner, rej.Msg.Header.Get(micro.ErrorHeader))
		}
		return nil, fmt.Errorf("dial %s on node %s via coordinator %s: %w", target, id, owner, err)
	}
	return &pipeConn{Pipe: p, node: id, target: target}, nil
}

// serveDial answers a forwarded dial (dispatch, on the dispatcher's
// goroutine): the agent's dial runs in a goroutine counted in connWG, so
// that closing the sessions in the drain ends it.
func (c *Coordinator) serveDial(m *nats.Msg, nodeID string) {
	if m.Reply == "" {
		return
	}
	var r dialRequest
	if err := json.Unmarshal(m.Data, &r); err != nil {
		c.rejectDial(m, protocol.CodeBadRequest, fmt.Sprintf("coordinator %s: dial request: %v", c.cfg.ID, err))
		return
	}
	c.serveForwardedConn(m, "dial "+r.Target+" on node "+nodeID, func(ctx context.Context) (net.Conn, error) {
		return c.DialTarget(ctx, nodeID, r.Target)
	})
}

// serveForwardedConn answers a forwarded dial or ssh open (m, on the
// dispatcher's goroutine) for a node held here: open runs in a goroutine
// counted in connWG, so that closing the sessions in the drain ends it,
// within dialAnswerTimeout; its failure is the rejection (rejectDial, with
// the agent's or this coordinator's code), its conn is spliced onto the
// pipe the requester opened on m's reply subject.
func (c *Coordinator) serveForwardedConn(m *nats.Msg, what string, open func(ctx context.Context) (net.Conn, error)) {
	life, ok := c.enter(&c.connWG)
	if !ok {
		c.rejectDial(m, protocol.CodeShutdown, fmt.Sprintf("coordinator %s is shutting down", c.cfg.ID))
		return
	}
	go func() {
		defer c.connWG.Done()
		ctx, cancel := context.WithTimeout(life, dialAnswerTimeout)
		conn, err := open(ctx)
		cancel()
		if err != nil {
			code := protocol.CodeDialFailed
			var ei *protocol.ErrorInfo
			switch {
			case errors.Is(err, ErrUnknownTarget):
				code = protocol.CodeUnknownTarget
			case errors.Is(err, ErrUnknownNode):
				code = "unknown_node"
			case errors.As(err, &ei):
				code = ei.Code
			}
			c.rejectDial(m, code, err.Error())
			return
		}
		p, err := natspipe.Accept(c.cfg.NATS, m.Reply, c.cfg.Pipe)
		if err != nil {
			conn.Close()
			c.log.Warn("accept a forwarded connection's pipe", "what", what, "err", err)
			return
		}
		splice(conn, p)
	}()
}

// rejectDial answers a forwarded dial with a micro error whose body is an
// ErrorInfo.
func (c *Coordinator) rejectDial(m *nats.Msg, code, msg string) {
	body, _ := json.Marshal(protocol.ErrorInfo{Code: code, Message: msg})
	if err := c.cfg.NATS.PublishMsg(&nats.Msg{Subject: m.Reply, Data: body, Header: nats.Header{
		micro.ErrorHeader: []string{msg}, micro.ErrorCodeHeader: []string{"502"},
	}}); err != nil {
		c.log.Debug("reject forwarded dial", "err", err)
	}
}

// splice copies both ways between conn and p until both directions ended
// (a half-close is passed on) or either failed (then both are closed).
func splice(conn net.Conn, p *natspipe.Pipe) {
	var once sync.Once
	closeBoth := func() { once.Do(func() { conn.Close(); p.Close() }) }
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := io.Copy(p, conn); err != nil {
			closeBoth()
			return
		}
		p.CloseWrite()
	}()
	if _, err := io.Copy(conn, p); err != nil {
		closeBoth()
	} else if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	<-done
	closeBoth()
}

// pipeConn is a pipe to another coordinator's dial stream seen as a
// net.Conn. A pipe has no deadlines of its own: a deadline that passes
// closes the conn (os.ErrDeadlineExceeded), which is what the facades use
// deadlines for; the zero time clears it.
type pipeConn struct {
	*natspipe.Pipe
	node, target string
	mu           sync.Mutex
	timer        *time.Timer
}

var _ net.Conn = (*pipeConn)(nil)

func (p *pipeConn) LocalAddr() net.Addr  { return pipeAddr("coordinator") }
func (p *pipeConn) RemoteAddr() net.Addr { return pipeAddr(p.node + "/" + p.target) }
func (p *pipeConn) SetReadDeadline(t time.Time) error {
	return p.SetDeadline(t)
}
func (p *pipeConn) SetWriteDeadline(t time.Time) error { return p.SetDeadline(t) }
func (p *pipeConn) SetDeadline(t time.Time) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	if !t.IsZero() {
		p.timer = time.AfterFunc(time.Until(t), func() { p.Pipe.CloseWithError(errDeadline) })
	}
	return nil
}

// Node and Target say where the conn goes, for logs.
func (p *pipeConn) Node() string   { return p.node }
func (p *pipeConn) Target() string { return p.target }

var errDeadline = fmt.Errorf("coordinator: pipe conn deadline passed: %w", os.ErrDeadlineExceeded)

type pipeAddr string

func (a pipeAddr) Network() string { return "natspipe" }
func (a pipeAddr) String() string  { return string(a) }

// SSH across coordinators: the jump host on one coordinator reaches a node
// another holds the way a dial does, through a pipe to the owner's node
// subject "ssh" (body: sshForward), which opens the ssh stream itself, so
// that the agent's channel events, which arrive on the owner's control
// stream, find the session's record (the caller's identity) there.

// sshForward is the body of a forwarded ssh open.
type sshForward struct {
	Params protocol.SSHParams `json:"params"`
	// Source is the jump host's client (sshgate.SourceOf), for the
	// owner's audit of the node's channel events; an owner that predates
	// it ignores it.
	Source string `json:"source,omitempty"`
}

// sshRemote opens the ssh stream to node id through coordinator owner.
func (c *Coordinator) sshRemote(ctx context.Context, id string, params *protocol.SSHParams, owner string) (net.Conn, error) {
	body, err := json.Marshal(sshForward{Params: *params, Source: sshgate.SourceOf(ctx)})
	if err != nil {
		return nil, fmt.Errorf("open ssh stream to node %s via coordinator %s: %w", id, owner, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, dialAnswerTimeout)
		defer cancel()
	}
	c.m.forwarded.Inc()
	p, err := natspipe.Dial(ctx, c.cfg.NATS, nodeSubject(id, "ssh"), nats.Header{HeaderForwardedBy: []string{c.cfg.ID}}, body, c.cfg.Pipe)
	if err != nil {
		var rej *natspipe.RejectedError
		if errors.As(err, &rej) {
			var ei protocol.ErrorInfo
			if json.Unmarshal(rej.Msg.Data, &ei) == nil && ei.Code != "" {
				return nil, fmt.Errorf("open ssh stream to node %s via coordinator %s: %w", id, owner, &ei)
			}
		}
		return nil, fmt.Errorf("open ssh stream to node %s via coordinator %s: %w", id, owner, err)
	}
	return &pipeConn{Pipe: p, node: id, target: "ssh"}, nil
}

// serveSSH answers a forwarded ssh open (dispatch) as serveDial answers a
// dial.
func (c *Coordinator) serveSSH(m *nats.Msg, nodeID string) {
	if m.Reply == "" {
		return
	}
	var r sshForward
	if err := json.Unmarshal(m.Data, &r); err != nil {
		c.rejectDial(m, protocol.CodeBadRequest, fmt.Sprintf("coordinator %s: ssh request: %v", c.cfg.ID, err))
		return
	}
	c.serveForwardedConn(m, "ssh to node "+nodeID, func(ctx context.Context) (net.Conn, error) {
		return c.openSSH(ctx, nodeID, &r.Params, &sshSession{identity: r.Params.Identity, source: protocol.ClipUTF8(r.Source, 64), forwarded: true})
	})
}

package openshell

import (
	"context"
	"errors"
	"io"
	"sync"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/protocol/openshell"
)

// maxParallel bounds the nodes one call asks at once when it fans out.
const maxParallel = 32

// call is one call through the facade.
type call struct {
	s      *Server
	ss     grpc.ServerStream
	ctx    context.Context // the caller's: its deadline and cancellation reach the gateway
	method string          // full method path
	md     metadata.MD     // the caller's metadata, tether-* keys included
	out    metadata.MD     // what goes to the gateway (cleanMD)
	// who is the caller, identified false when it has no identity
	// (authz.go).
	who        policy.Identity
	identified bool
	// source is the TCP peer (grpc peer.FromContext), for the audit.
	source string
	// amu guards note, what the call's audit event learns (audit.go).
	amu  sync.Mutex
	note auditNote
}

// answer is one gateway's answer to a unary call.
type answer struct {
	node     protocol.NodeInfo
	resp     *frame
	hdr, trl metadata.MD
	err      error // the gateway's status, verbatim, or UNAVAILABLE naming the node
}

// errTooBig is the status of a message the gateway would refuse.
func errTooBig(n int) error {
	return status.Errorf(codes.ResourceExhausted,
		"tether: message of %d bytes is over the OpenShell gateway's limit of %d bytes per message", n, openshell.MaxMessageSize)
}

// recvFirst reads the caller's first message.
func (c *call) recvFirst() (*frame, error) {
	f := new(frame)
	if err := c.ss.RecvMsg(f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, status.Errorf(codes.InvalidArgument, "tether: %s: the caller sent no request message", c.method)
		}
		return nil, err
	}
	if len(f.b) > openshell.MaxMessageSize {
		return nil, errTooBig(len(f.b))
	}
	return f, nil
}

// invoke sends req as the unary method to n's gateway, with the caller's
// metadata, deadline and cancellation.
func (c *call) invoke(n protocol.NodeInfo, method string, req *frame) answer {
	a := answer{node: n}
	if a.err = c.reach(n); a.err != nil {
		return a
	}
	cc, err := c.s.pool.get(n)
	if err != nil {
		a.err = status.Errorf(codes.Unavailable, "tether: node %s: %v", n.ID, err)
		return a
	}
	resp := new(frame)
	ctx := metadata.NewOutgoingContext(c.ctx, c.out)
	if err := cc.Invoke(ctx, method, req, resp, grpc.Header(&a.hdr), grpc.Trailer(&a.trl)); err != nil {
		a.err = err
		return a
	}
	a.resp = resp
	return a
}

// invokeAll sends req as method to every node of nodes, at most maxParallel
// at once, and returns the answers in the order of nodes.
func (c *call) invokeAll(nodes []protocol.NodeInfo, method string, req *frame) []answer {
	out := make([]answer, len(nodes))
	var g errgroup.Group
	g.SetLimit(maxParallel)
	for i, n := range nodes {
		g.Go(func() error {
			defer c.s.guard.Recover("call on a node", func(e *panics.Error) { out[i] = answer{node: n, err: internal(e)} })
			out[i] = c.invoke(n, method, req)
			return nil
		})
	}
	g.Wait()
	return out
}

// reply sends a unary answer to the caller as the gateway gave it: its
// header and trailer metadata, then its message or its status.
func (c *call) reply(a answer) error {
	if h := cleanMD(a.hdr); len(h) > 0 {
		if err := c.ss.SendHeader(h); err != nil {
			return err
		}
	}
	if t := cleanMD(a.trl); len(t) > 0 {
		c.ss.SetTrailer(t)
	}
	if a.err != nil {
		return a.err
	}
	return c.ss.SendMsg(a.resp)
}

// relayAbort is the cause with which the caller-to-gateway half of a relay
// ends the whole call.
type relayAbort struct{ err error }

func (r relayAbort) Error() string { return r.err.Error() }

// relay opens the call's method as a stream to n's gateway and relays
// messages both ways until the gateway ends it: first (if not nil), then
// every message the caller sends, go to the gateway, one by one, and the
// caller's half-close becomes the gateway's; the gateway's header metadata,
// messages, trailer metadata and status come back verbatim. It serves every
// kind of method: unary, client, server and bidi streaming.
//
// The caller-to-gateway half runs in a goroutine the Server tracks. It may
// outlive relay while blocked reading the caller: grpc ends that read when
// the handler returns and the stream closes.
func (c *call) relay(n protocol.NodeInfo, first *frame) error {
	if err := c.reach(n); err != nil {
		return err
	}
	cc, err := c.s.pool.get(n)
	if err != nil {
		return status.Errorf(codes.Unavailable, "tether: node %s: %v", n.ID, err)
	}
	ctx, cancel := context.WithCancelCause(metadata.NewOutgoingContext(c.ctx, c.out))
	defer cancel(nil)
	cs, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, c.method)
	if err != nil {
		return err
	}
	c.s.wg.Add(1)
	go func() {
		defer c.s.wg.Done()
		defer c.s.guard.Recover("relay to gateway", func(e *panics.Error) { cancel(relayAbort{internal(e)}) })
		c.toGateway(cs, first, cancel)
	}()
	// A nil header means the gateway answered trailers-only; so do we.
	if hdr, _ := cs.Header(); hdr != nil {
		if h := cleanMD(hdr); len(h) > 0 {
			if err := c.ss.SendHeader(h); err != nil {
				return err
			}
		}
	}
	for {
		f := new(frame)
		if err := cs.RecvMsg(f); err != nil {
			var abort relayAbort
			if errors.As(context.Cause(ctx), &abort) {
				return abort.err
			}
			if t := cleanMD(cs.Trailer()); len(t) > 0 {
				c.ss.SetTrailer(t)
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := c.ss.SendMsg(f); err != nil {
			return err // the caller is gone; the deferred cancel ends the gateway's stream
		}
	}
}

// toGateway is relay's caller-to-gateway half.
func (c *call) toGateway(cs grpc.ClientStream, first *frame, abort context.CancelCauseFunc) {
	if first != nil {
		if err := cs.SendMsg(first); err != nil {
			return // the stream ended; its status comes from RecvMsg
		}
	}
	for {
		f := new(frame)
		if err := c.ss.RecvMsg(f); err != nil {
			if errors.Is(err, io.EOF) {
				cs.CloseSend()
			}
			return // otherwise the caller is gone, which cancels the stream
		}
		if len(f.b) > openshell.MaxMessageSize {
			abort(relayAbort{errTooBig(len(f.b))})
			return
		}
		if err := cs.SendMsg(f); err != nil {
			return
		}
	}
}

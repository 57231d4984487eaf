package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/yamux"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/gateway"
	"github.com/tetherfleet/tether/protocol"
)

// sandboxOpTimeout bounds one sandbox operation on a gateway. It is below
// the coordinator's own bound (a minute), so that the coordinator hears
// the gateway's error rather than its own timeout.
const sandboxOpTimeout = 45 * time.Second

// serveSandboxOp serves the sandbox stream st (protocol.SandboxOpParams):
// it runs one operation (delete) on a sandbox of the node's gateway of the
// params' provider, with the agent's own gateway credentials, and answers
// with one FrameSandboxOp, or a FrameError: CodeBadRequest for invalid
// params, CodeUnknownTarget when the node has no gateway of that provider,
// CodeDialFailed when the gateway cannot be reached, CodeInternal with the
// gateway's error verbatim otherwise. A sandbox the gateway does not know
// is answered with SandboxOpResult.NotFound: it is gone.
//
// A FrameCancel, the stream's end or the session's end stops the operation
// (the gateway may still have done it). It returns when the answer is
// written; st is closed.
func (a *Agent) serveSandboxOp(ctx context.Context, st *yamux.Stream, h protocol.Header, gw *gatewayClients) {
	defer st.Close()
	defer a.guard.Recover("sandbox stream", a.answerPanic(st, nil))
	log := a.log.With("stream", st.StreamID())
	var p protocol.SandboxOpParams
	if err := h.DecodeParams(&p); err != nil {
		a.refuse(st, protocol.CodeBadRequest, fmt.Sprintf("node %s: %v", a.cfg.NodeID, err))
		return
	}
	if err := p.Validate(); err != nil {
		a.refuse(st, protocol.CodeBadRequest, fmt.Sprintf("node %s: %v", a.cfg.NodeID, err))
		return
	}
	ctx, cancel := context.WithTimeout(ctx, sandboxOpTimeout)
	defer cancel()
	stopWatch := a.watchCancel(st, cancel, log)
	defer stopWatch()

	var res protocol.SandboxOpResult
	var err error
	var addr, what string
	switch p.Provider {
	case protocol.ProviderOpenShell:
		what = fmt.Sprintf("%s sandbox %q in workspace %q", p.Provider, p.Name, p.Workspace)
		if a.cfg.OpenShell != nil {
			addr = a.cfg.OpenShell.Addr
			var c *gateway.OpenShell
			if c, err = gw.openShell(); err == nil {
				res.Deleted, err = c.Delete(ctx, p.Workspace, p.Name)
			}
		}
	case protocol.ProviderOpenSandbox:
		what = fmt.Sprintf("%s sandbox %s", p.Provider, p.ID)
		if a.cfg.OpenSandbox != nil {
			addr = a.cfg.OpenSandbox.Addr
			var c *gateway.OpenSandbox
			if c, err = gw.openSandbox(); err == nil {
				err = c.Delete(ctx, p.ID)
				res.Deleted = err == nil
			}
		}
	}
	log = log.With("op", p.Op, "provider", p.Provider, "id", p.ID, "workspace", p.Workspace, "name", p.Name)
	switch {
	case addr == "":
		log.Warn("sandbox op refused: no gateway of that provider")
		a.refuse(st, protocol.CodeUnknownTarget, fmt.Sprintf("node %s has no %s gateway", a.cfg.NodeID, p.Provider))
		return
	case errors.Is(err, gateway.ErrNotFound):
		res = protocol.SandboxOpResult{NotFound: true}
	case ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded):
		log.Info("sandbox op stopped: the coordinator cancelled or the session ended", "err", err)
		return
	case unreachable(err):
		log.Warn("sandbox op: gateway unreachable", "err", err)
		a.refuse(st, protocol.CodeDialFailed, fmt.Sprintf("node %s: %s %s: gateway at %s unreachable: %v", a.cfg.NodeID, p.Op, what, addr, err))
		return
	case err != nil:
		log.Warn("sandbox op failed", "err", err)
		a.refuse(st, protocol.CodeInternal, fmt.Sprintf("node %s: %s %s: %v", a.cfg.NodeID, p.Op, what, err))
		return
	}
	log.Info("sandbox op done", "deleted", res.Deleted, "not_found", res.NotFound)
	st.SetWriteDeadline(time.Now().Add(a.cfg.Tunnel.WriteTimeout))
	if err := protocol.WriteJSONFrame(st, protocol.FrameSandboxOp, &res); err != nil {
		log.Warn("sandbox op: write result", "err", err)
	}
}

// unreachable reports whether err says a gateway could not be reached:
// gRPC UNAVAILABLE, or an HTTP request whose connection failed.
func unreachable(err error) bool {
	if err == nil {
		return false
	}
	if s, ok := status.FromError(err); ok && s.Code() == codes.Unavailable {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

package openshell

import (
	"context"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// Auditor records audit events; *coordinator/audit.Recorder is one. Record
// must not block (the recorder queues).
type Auditor interface {
	Record(ev *protocol.AuditEvent)
}

// Audit (Config.Audit). Every call the facade answers is one event: the
// caller's identity, the operation (the sandbox operation the facade
// decided, sandboxes.list or sandboxes.reap on one sandbox or
// sandboxes.lease for a create under another's run, else forward to target
// openshell), the method's name, the nodes whose gateway it reached, the
// sandbox (WORKSPACE/NAME or id) when the call named one, the result and
// the duration. A call that policy refused is recorded by the
// Authorizer's Observe (it sees the refusal), so the facade does not add a
// second event; a call refused before policy (no valid token, a foreign
// :authority) is recorded here as refused. Source is the TCP peer
// (peerAddr), never x-forwarded-for or other metadata a caller writes.
// Never in an event: metadata (tokens), messages, the gateway's error text
// (only its code).

// auditNote is what a call learns for its event as it goes; a fan-out
// writes it from several goroutines (mu).
type auditNote struct {
	nodes   []string
	op      policy.Operation // the sandbox operation decided; zero: forward
	sandbox string
	refused bool   // policy refused a decision: Observe recorded it
	reason  string // a refusal before policy: "unauthenticated", "throttled", "host"
}

func (c *call) noteNode(id string) {
	c.amu.Lock()
	if !slices.Contains(c.note.nodes, id) {
		c.note.nodes = append(c.note.nodes, id)
	}
	c.amu.Unlock()
}

func (c *call) noteDecision(op policy.Operation, err error) {
	c.amu.Lock()
	if op != policy.OpForward {
		c.note.op = op
	}
	if err != nil {
		c.note.refused = true
	}
	c.amu.Unlock()
}

func (c *call) noteSandbox(s string) {
	c.amu.Lock()
	c.note.sandbox = s
	c.amu.Unlock()
}

// audit records the event of call c, answered with err after it began at
// start.
func (s *Server) audit(c *call, start time.Time, err error) {
	if s.cfg.Audit == nil {
		return
	}
	c.amu.Lock()
	n := c.note
	n.nodes = slices.Clone(n.nodes)
	c.amu.Unlock()
	code := status.Code(err)
	if n.refused && (code == codes.PermissionDenied || code == codes.Unauthenticated) {
		return // the Authorizer's Observe recorded the refusal
	}
	ev := &protocol.AuditEvent{
		Operation:  policy.OpForward.String(),
		Target:     protocol.TargetOpenShell,
		Facade:     protocol.TargetOpenShell,
		Method:     methodLabel(c.method),
		Source:     c.source,
		Sandbox:    protocol.ClipUTF8(n.sandbox, protocol.MaxAuditErrorLen),
		DurationMS: float64(time.Since(start).Microseconds()) / 1000,
	}
	if n.op != 0 {
		ev.Operation, ev.Target = n.op.String(), ""
	}
	if c.identified {
		ev.Identity, ev.IdentityKey, ev.Account = c.who.String(), c.who.Key, c.who.Account
	}
	slices.Sort(n.nodes)
	if len(n.nodes) > protocol.MaxAuditNodes {
		ev.NodesTotal = len(n.nodes)
		n.nodes = n.nodes[:protocol.MaxAuditNodes]
	}
	ev.Nodes = n.nodes
	switch {
	case err == nil:
		ev.Result = protocol.AuditOK
	case n.reason != "":
		ev.Result, ev.Reason = protocol.AuditRefused, n.reason
	case len(n.nodes) > 0:
		ev.Result = protocol.AuditFailed // a gateway answered it, or the way to one broke
	default:
		ev.Result = protocol.AuditError
	}
	if err != nil {
		ev.ErrorCode = code.String()
	}
	s.cfg.Audit.Record(ev)
}

// peerAddr is the TCP peer of the call of ctx as gRPC's transport saw
// it ("IP:PORT"; peer.FromContext), "" when unknown. Never metadata: a
// caller can write any address there.
func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

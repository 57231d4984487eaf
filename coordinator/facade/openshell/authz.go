package openshell

import (
	"context"
	"errors"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/coordinator/facade/hostcheck"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// Authorization (Config.Authorizer). Every call is attributed to an
// identity: cert:CN for a verified client certificate, token:NAME for a
// tether-token (Config.TokenName), on a facade that checks neither
// Config.Local of the uid owning the caller's socket (peeruid; unknown, or
// a call whose metadata carries a header proxies add, hostcheck.Proxied:
// unidentified). Then:
//   - every call a node's gateway serves needs forward to target openshell
//     on that node; a call that fans out asks only the nodes the caller
//     may reach;
//   - a call on one sandbox (get, stop, start, exec, watch) needs it to be
//     the caller's own (ledger.Ledger.OwnerOf: its run's owner, else its
//     creator) or sandboxes.list with scope any; a delete needs it to be
//     the caller's own or sandboxes.reap with scope any; a sandbox the
//     ledger does not know has no known owner;
//   - a create under a run (metadata tether-run) someone else owns needs
//     sandboxes.lease with scope any; the sandbox records the caller as
//     its creator;
//   - a list shows the caller's own sandboxes, or every one with
//     sandboxes.list scope any.

// ownership is what authorization needs of the ledger beyond Ledger;
// *ledger.Ledger has it. Without it every sandbox's owner is unknown.
type ownership interface {
	OwnerOf(r ledger.Record) string
	RunOwner(run string) (owner string, claimed bool)
}

// identify names the caller of a call that passed authorize.
func (s *Server) identify(ctx context.Context, md metadata.MD) (policy.Identity, bool) {
	p, _ := peer.FromContext(ctx)
	if p != nil {
		if ti, ok := tlsInfo(p.AuthInfo); ok && len(ti.State.VerifiedChains) > 0 && len(ti.State.VerifiedChains[0]) > 0 {
			if cn := ti.State.VerifiedChains[0][0].Subject.CommonName; cn != "" {
				return policy.Identity{Kind: policy.KindCert, Name: cn}, true
			}
		}
	}
	if s.cfg.CheckToken != nil {
		if v := md.Get(MetaToken); len(v) == 1 && v[0] != "" && s.cfg.CheckToken(v[0]) {
			name := "facade"
			if s.cfg.TokenName != nil {
				name = s.cfg.TokenName(v[0])
			}
			return policy.Identity{Kind: policy.KindToken, Name: name}, true
		}
		return policy.Identity{}, false
	}
	if s.cfg.Local == nil || p == nil {
		return policy.Identity{}, false
	}
	if hd := hostcheck.Proxied(md); hd != "" {
		// A gRPC proxy on this host (Envoy, ...) connects over loopback
		// for every caller.
		s.log.Debug("caller unidentified: a proxy forwarded its call, so its socket's uid is the proxy's", "remote", p.Addr.String(), "metadata", strings.ToLower(hd))
		return policy.Identity{}, false
	}
	uid, err := peerUID(p.AuthInfo)
	if err != nil {
		s.log.Debug("caller unidentified: its uid is unknown", "remote", p.Addr.String(), "err", err)
		return policy.Identity{}, false
	}
	id := s.cfg.Local(uid)
	return id, id.Kind.Valid()
}

// decide asks policy for the call's caller; a refusal is PERMISSION_DENIED
// (UNAUTHENTICATED without an identity) with the policy's message.
func (c *call) decide(op policy.Operation, node policy.Node, obj policy.Object) error {
	_, err := c.s.cfg.Authorizer.DecideAs(c.who, c.identified, c.source, op, node, obj)
	c.noteDecision(op, err)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, caller.ErrUnidentified):
		return status.Error(codes.Unauthenticated, "tether: "+err.Error())
	}
	return status.Error(codes.PermissionDenied, "tether: "+err.Error())
}

// reach checks that the caller may reach n's gateway.
func (c *call) reach(n protocol.NodeInfo) error {
	err := c.decide(policy.OpForward, policy.Node{ID: n.ID, Labels: n.Labels}, policy.Object{Target: protocol.TargetOpenShell})
	if err == nil {
		c.noteNode(n.ID)
	}
	return err
}

// reachable returns the nodes of nodes whose gateway the caller may reach.
func (c *call) reachable(nodes []protocol.NodeInfo) []protocol.NodeInfo {
	if c.s.cfg.Authorizer.Policy == nil {
		return nodes
	}
	out := make([]protocol.NodeInfo, 0, len(nodes))
	for _, n := range nodes {
		if _, err := c.s.cfg.Authorizer.Policy.Policy().Decide(c.who, policy.OpForward, policy.Node{ID: n.ID, Labels: n.Labels}, policy.Object{Target: protocol.TargetOpenShell}); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// gatewayNodes is Server.gatewayNodes limited to what the caller may
// reach. When nodes have a gateway but the caller may reach none of them,
// the error is the refusal for the first (PERMISSION_DENIED naming the
// rule missing), not an empty list: "no gateway" is UNAVAILABLE, which
// clients (NeMo Gym) retry, and retrying cannot help a caller policy
// keeps out.
func (c *call) gatewayNodes(sel protocol.Selector) ([]protocol.NodeInfo, error) {
	all := c.s.gatewayNodes(sel)
	nodes := c.reachable(all)
	if len(nodes) == 0 && len(all) > 0 {
		return nil, c.reach(all[0])
	}
	return nodes, nil
}

// notReachable is the status of a call routed to node when node is not
// among the nodes the caller may reach: the refusal (PERMISSION_DENIED)
// when node is connected with a gateway, else otherwise (the node is
// gone: UNAVAILABLE, or the caller's own mistake).
func (c *call) notReachable(node string, otherwise error) error {
	if n, ok := findNode(c.s.gatewayNodes(protocol.Selector{}), node); ok {
		if err := c.reach(n); err != nil {
			return err
		}
	}
	return otherwise
}

// ownerOf returns the owner of sandbox r, "" when unknown.
func (s *Server) ownerOf(r ledger.Record) string {
	if o, ok := s.cfg.Ledger.(ownership); ok {
		return o.OwnerOf(r)
	}
	return ""
}

// mayUse checks that the caller may act on the sandbox r (ok: the ledger
// knows it) with op: sandboxes.list (reach it) or sandboxes.reap (delete
// it), on its owner.
func (c *call) mayUse(op policy.Operation, r ledger.Record, ok bool) error {
	owner := ""
	if ok {
		owner = c.s.ownerOf(r)
	}
	return c.decide(op, policy.Node{}, policy.Object{Owner: owner})
}

// mayCreateIn checks that the caller may add a sandbox to run: its own,
// one nobody claimed, or another's with sandboxes.lease scope any.
func (c *call) mayCreateIn(run string) error {
	o, ok := c.s.cfg.Ledger.(ownership)
	if run == "" || !ok {
		return nil
	}
	owner, claimed := o.RunOwner(run)
	if !claimed || owner == c.who.String() {
		return nil
	}
	return c.decide(policy.OpSandboxesLease, policy.Node{}, policy.Object{Owner: owner})
}

// visible reports whether a listed sandbox is shown to the caller: every
// one with sandboxes.list scope any, else its own.
func (c *call) listFilter() func(id string) bool {
	if c.s.cfg.Authorizer.Policy == nil {
		return nil
	}
	if _, err := c.s.cfg.Authorizer.Policy.Policy().Decide(c.who, policy.OpSandboxesList, policy.Node{}, policy.Object{}); err == nil {
		return nil
	}
	self := c.who.String()
	return func(id string) bool {
		r, ok := c.s.recordByID(id)
		return ok && c.s.ownerOf(r) == self
	}
}

package opensandbox

import (
	"errors"
	"net/http"
	"slices"

	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/coordinator/facade/hostcheck"
	"github.com/tetherfleet/tether/coordinator/facade/peeruid"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// Authorization (Config.Authorizer), as the OpenShell facade does it.
// Every request is attributed to an identity: cert:CN for a verified
// client certificate, token:NAME for a Tether-Token (Config.TokenName),
// on a facade that checks neither Config.Local of the uid owning the
// caller's socket (peeruid; unknown, or a request carrying a header
// proxies add, hostcheck.Proxied: unidentified). Then:
//   - a request a node serves needs forward to target opensandbox on that
//     node; a create placed by load or selector goes only to nodes the
//     caller may reach, and a list asks only those;
//   - a request on one sandbox needs it to be the caller's own (its run's
//     owner, else its creator: ledger.Ledger.OwnerOf) or, for a DELETE,
//     sandboxes.reap with scope any, for anything else sandboxes.list with
//     scope any; a sandbox the ledger does not know has no known owner;
//   - a create under a run (Tether-Run) someone else owns needs
//     sandboxes.lease with scope any; the record names the caller as its
//     creator;
//   - a list shows the caller's own sandboxes, or every one with
//     sandboxes.list scope any.

// CodeForbidden (403): policy refuses the caller the request; the message
// names the identity, the operation and the rule missing.
const CodeForbidden = "TETHER::FORBIDDEN"

// ownership is what authorization needs of the ledger beyond Ledger;
// *ledger.Ledger has it. Without it every sandbox's owner is unknown.
type ownership interface {
	OwnerOf(r ledger.Record) string
	RunOwner(run string) (owner string, claimed bool)
}

// identify names the caller of a request that passed authenticated.
func (f *Facade) identify(r *http.Request) (policy.Identity, bool) {
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
		if cn := r.TLS.VerifiedChains[0][0].Subject.CommonName; cn != "" {
			return policy.Identity{Kind: policy.KindCert, Name: cn}, true
		}
	}
	if f.cfg.CheckToken != nil {
		if tok := r.Header.Get(HeaderToken); tok != "" && f.cfg.CheckToken(tok) {
			name := "facade"
			if f.cfg.TokenName != nil {
				name = f.cfg.TokenName(tok)
			}
			return policy.Identity{Kind: policy.KindToken, Name: name}, true
		}
		return policy.Identity{}, false
	}
	if f.cfg.Local == nil {
		return policy.Identity{}, false
	}
	if hd := hostcheck.Proxied(r.Header); hd != "" {
		// A proxy on this host connects over loopback for every caller.
		f.log.Debug("caller unidentified: a proxy forwarded its request, so its socket's uid is the proxy's", "remote", r.RemoteAddr, "header", hd)
		return policy.Identity{}, false
	}
	uid, err := peeruid.FromContext(r.Context())
	if err != nil {
		f.log.Debug("caller unidentified: its uid is unknown", "remote", r.RemoteAddr, "err", err)
		return policy.Identity{}, false
	}
	id := f.cfg.Local(uid)
	return id, id.Kind.Valid()
}

// decide asks policy for the request's caller.
func (f *Facade) decide(st *reqState, op policy.Operation, node policy.Node, obj policy.Object) error {
	_, err := f.cfg.Authorizer.DecideAs(st.who, st.identified, st.source, op, node, obj)
	st.note.decision(op, err)
	if err == nil && node.ID != "" {
		st.note.node(node.ID)
	}
	return err
}

// writeRefusal answers a refusal of decide: 401 without an identity, else
// 403 with the policy's message.
func writeRefusal(w http.ResponseWriter, err error) {
	if errors.Is(err, caller.ErrUnidentified) {
		writeError(w, http.StatusUnauthorized, CodeUnauthenticated, err.Error())
		return
	}
	writeError(w, http.StatusForbidden, CodeForbidden, err.Error())
}

// reach checks that the caller may reach n's lifecycle server.
func (f *Facade) reach(st *reqState, n protocol.NodeInfo) error {
	return f.decide(st, policy.OpForward, policy.Node{ID: n.ID, Labels: n.Labels}, policy.Object{Target: Target})
}

// reachable returns the nodes of nodes the caller may reach (a new slice
// when it leaves some out).
func (f *Facade) reachable(st *reqState, nodes []protocol.NodeInfo) []protocol.NodeInfo {
	p := f.cfg.Authorizer.Policy
	if p == nil {
		return nodes
	}
	return slices.DeleteFunc(slices.Clone(nodes), func(n protocol.NodeInfo) bool {
		_, err := p.Policy().Decide(st.who, policy.OpForward, policy.Node{ID: n.ID, Labels: n.Labels}, policy.Object{Target: Target})
		return err != nil
	})
}

// ownerOf returns the owner of sandbox r, "" when unknown.
func (f *Facade) ownerOf(r ledger.Record) string {
	if o, ok := f.cfg.Ledger.(ownership); ok {
		return o.OwnerOf(r)
	}
	return ""
}

// mayUse checks that the caller may act on the sandbox r (known: the
// ledger has it) with op (sandboxes.list, or sandboxes.reap for a delete)
// on its owner.
func (f *Facade) mayUse(st *reqState, op policy.Operation, r ledger.Record, known bool) error {
	owner := ""
	if known {
		owner = f.ownerOf(r)
	}
	return f.decide(st, op, policy.Node{}, policy.Object{Owner: owner})
}

// mayCreateIn checks that the caller may add a sandbox to run: its own,
// one nobody claimed, or another's with sandboxes.lease scope any.
func (f *Facade) mayCreateIn(st *reqState, run string) error {
	o, ok := f.cfg.Ledger.(ownership)
	if run == "" || !ok {
		return nil
	}
	owner, claimed := o.RunOwner(run)
	if !claimed || owner == st.who.String() {
		return nil
	}
	return f.decide(st, policy.OpSandboxesLease, policy.Node{}, policy.Object{Owner: owner})
}

// listFilter returns which listed sandboxes (by id) the caller sees, nil
// for all of them (no policy, or sandboxes.list scope any).
func (f *Facade) listFilter(st *reqState) func(id string) bool {
	p := f.cfg.Authorizer.Policy
	if p == nil {
		return nil
	}
	if _, err := p.Policy().Decide(st.who, policy.OpSandboxesList, policy.Node{}, policy.Object{}); err == nil {
		return nil
	}
	self := st.who.String()
	return func(id string) bool {
		r, ok := f.cfg.Ledger.ByID(protocol.ProviderOpenSandbox, id)
		return ok && f.ownerOf(r) == self
	}
}

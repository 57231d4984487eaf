// Package caller carries the identity of a NATS API request's sender from
// the coordinator's request guard to the handlers, its own and those of the
// packages that add endpoints to its micro service (coordinator/ledger,
// coordinator/sandboxes), which cannot import package coordinator.
//
// The identity comes from what the NATS server stamped on the request
// (natsauth.Verifier.Identify reads Nats-Request-Info), never from a header
// or field the client wrote.
package caller

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// Request is a micro.Request whose sender the guard identified.
type Request struct {
	micro.Request
	// Identity is the sender, as the NATS server proved it.
	Identity policy.Identity
}

// Of returns the identity the guard attached to req, and false when req
// carries none (the coordinator runs without Config.Identify: tests of
// parts that do not authorize).
func Of(req micro.Request) (policy.Identity, bool) {
	if r, ok := req.(*Request); ok {
		return r.Identity, true
	}
	return policy.Identity{}, false
}

// Authorizer decides NATS API requests by policy. Every handler that acts
// for a caller asks it before it acts; the zero value allows everything,
// which only tests of parts that do not authorize use (the tether binary
// always sets Policy).
type Authorizer struct {
	// Policy is the policy in force (reloaded on SIGHUP). Nil allows
	// everything.
	Policy *policy.Store
	// Observe, if set, sees every decision Authorize makes, allowed or
	// refused, in the goroutine that asked (the audit stream hooks in
	// here). It must not block.
	Observe func(Decision)
}

// Decision is one request's authorization, as Authorize made it: who
// asked, to do what, where, and the answer.
type Decision struct {
	// Identity is the caller; Identified is false when the request
	// carried none (Err is then 401).
	Identity   policy.Identity
	Identified bool
	Op         policy.Operation
	// Nodes are the ids of the nodes decided on, in order; empty for an
	// operation not on a node.
	Nodes  []string
	Object policy.Object
	// Grants are the grants, one per node (one when Nodes is empty), when
	// the request was allowed.
	Grants []policy.Grant
	// Err is the API error the request was refused with, nil when allowed.
	Err *protocol.APIError
}

// Authorize is the check a handler makes before it acts for req's sender:
// one request from its rate budget (Allow), then Decide for each node
// (none for an operation not on a node: nodes empty). Any refusal refuses
// the whole request, with the first refusal's status and message and the
// ids of every other node refused (at most maxNamed named). It returns one
// grant per node (one when nodes is empty) and tells Observe.
func (a Authorizer) Authorize(req micro.Request, op policy.Operation, nodes []policy.Node, obj policy.Object) ([]policy.Grant, *protocol.APIError) {
	d := Decision{Op: op, Object: obj}
	d.Identity, d.Identified = Of(req)
	for _, n := range nodes {
		d.Nodes = append(d.Nodes, n.ID)
	}
	d.Grants, d.Err = a.authorize(req, op, nodes, obj)
	if a.Observe != nil {
		a.Observe(d)
	}
	return d.Grants, d.Err
}

// maxNamed bounds the refused nodes a refusal names besides the first.
const maxNamed = 8

func (a Authorizer) authorize(req micro.Request, op policy.Operation, nodes []policy.Node, obj policy.Object) ([]policy.Grant, *protocol.APIError) {
	if e := a.Allow(req, op); e != nil {
		return nil, e
	}
	if len(nodes) == 0 {
		g, e := a.Decide(req, op, policy.Node{}, obj)
		if e != nil {
			return nil, e
		}
		return []policy.Grant{g}, nil
	}
	grants := make([]policy.Grant, len(nodes))
	var first *protocol.APIError
	var others []string
	nothers := 0
	for i, n := range nodes {
		g, e := a.Decide(req, op, n, obj)
		switch {
		case e == nil:
			grants[i] = g
		case first == nil:
			first = e
		default:
			if nothers++; len(others) < maxNamed {
				others = append(others, n.ID)
			}
		}
	}
	if first == nil {
		return grants, nil
	}
	if nothers > 0 {
		more := ""
		if nothers > len(others) {
			more = fmt.Sprintf(" and %d more", nothers-len(others))
		}
		first = protocol.NewAPIError(first.Status, first.Code, "%s; refused on %d of %d nodes: also on %s%s",
			first.Message, nothers+1, len(nodes), strings.Join(others, ", "), more)
	}
	return nil, first
}

// Decide says whether the sender of req may do op on node to obj: the
// policy's Grant (RunAs is the local user to run as), or the API error to
// answer with: 401 unauthenticated when req carries no identity, 403
// forbidden when no rule allows it, 400 invalid_request when the request
// cannot be decided (the refusal names the identity, the operation, the
// node and object, and the rule missing).
func (a Authorizer) Decide(req micro.Request, op policy.Operation, node policy.Node, obj policy.Object) (policy.Grant, *protocol.APIError) {
	if a.Policy == nil {
		return policy.Grant{}, nil
	}
	id, ok := Of(req)
	if !ok {
		return policy.Grant{}, protocol.NewAPIError(401, protocol.ErrCodeUnauthenticated, "%s: the request carries no identity", op)
	}
	g, err := a.Policy.Decide(id, op, node, obj)
	if err != nil {
		return policy.Grant{}, RefusalError(err)
	}
	return g, nil
}

// Acquire counts one running job of req's sender (policy limits
// max_concurrent_jobs): a release function to call once the job ends, or
// 429 rate_limited. With no Policy it counts nothing.
func (a Authorizer) Acquire(req micro.Request, op policy.Operation) (release func(), _ *protocol.APIError) {
	if a.Policy == nil {
		return func() {}, nil
	}
	id, ok := Of(req)
	if !ok {
		return nil, protocol.NewAPIError(401, protocol.ErrCodeUnauthenticated, "%s: the request carries no identity", op)
	}
	release, err := a.Policy.Acquire(id, op)
	if err != nil {
		return nil, RefusalError(err)
	}
	return release, nil
}

// Owner is the string recorded as the owner of what req creates (a job, a
// run): the sender's Identity.String, or "" when req carries none.
func Owner(req micro.Request) string {
	if id, ok := Of(req); ok {
		return id.String()
	}
	return ""
}

// Allow takes one request from the sender's requests-per-second budget
// (policy limits): nil, or 429 rate_limited.
func (a Authorizer) Allow(req micro.Request, op policy.Operation) *protocol.APIError {
	if a.Policy == nil {
		return nil
	}
	id, ok := Of(req)
	if !ok {
		return protocol.NewAPIError(401, protocol.ErrCodeUnauthenticated, "%s: the request carries no identity", op)
	}
	if err := a.Policy.Allow(id, op); err != nil {
		return RefusalError(err)
	}
	return nil
}

// RefusalError is the API error for a policy refusal (or any other error
// of the policy package): 429 rate_limited for the limits, 400
// invalid_request for a request policy cannot decide, else 403 forbidden,
// with the refusal's own message.
func RefusalError(err error) *protocol.APIError {
	var r *policy.Refusal
	if errors.As(err, &r) {
		switch r.Reason {
		case policy.ReasonRateLimit, policy.ReasonJobLimit:
			return protocol.NewAPIError(429, protocol.ErrCodeRateLimited, "%s", r.Error())
		case policy.ReasonBadRequest:
			return protocol.NewAPIError(400, protocol.ErrCodeInvalid, "%s", r.Error())
		}
	}
	return protocol.NewAPIError(403, protocol.ErrCodeForbidden, "%v", err)
}

// Filter decides a listing of nodes: one request from the rate budget,
// then op on each node, without counting the refusals (a listing leaves
// out what the caller may not see; it is not refused). It returns the
// indexes of the nodes allowed, in order, or the API error when the
// caller may see nothing because no policy entry names it (403, so that
// a caller missing from the policy learns why its listing is empty), or
// for 401 and 429. Observe sees one Decision naming the nodes allowed.
func (a Authorizer) Filter(req micro.Request, op policy.Operation, nodes []policy.Node, obj policy.Object) ([]int, *protocol.APIError) {
	d := Decision{Op: op, Object: obj}
	d.Identity, d.Identified = Of(req)
	idx, err := a.filter(req, op, nodes, obj)
	if err == nil {
		for _, i := range idx {
			d.Nodes = append(d.Nodes, nodes[i].ID)
		}
	}
	d.Err = err
	if a.Observe != nil {
		a.Observe(d)
	}
	return idx, err
}

func (a Authorizer) filter(req micro.Request, op policy.Operation, nodes []policy.Node, obj policy.Object) ([]int, *protocol.APIError) {
	if e := a.Allow(req, op); e != nil {
		return nil, e
	}
	out := make([]int, 0, len(nodes))
	if a.Policy == nil {
		for i := range nodes {
			out = append(out, i)
		}
		return out, nil
	}
	id, _ := Of(req) // Allow refused a request without one
	p := a.Policy.Policy()
	for i, n := range nodes {
		_, err := p.Decide(id, op, n, obj)
		if err == nil {
			out = append(out, i)
			continue
		}
		if r := (*policy.Refusal)(nil); errors.As(err, &r) && r.Reason == policy.ReasonNoIdentity {
			_, err = a.Policy.Decide(id, op, n, obj) // counted once
			return nil, RefusalError(err)
		}
	}
	return out, nil
}

// Scope decides a listing of jobs or runs: op on the caller's own must be
// granted (else the refusal), and any reports whether op is granted on
// everyone's too (scope: any), asked without counting a refusal. node is
// the node listed on, or zero for an operation not on a node. With no
// Policy, any is true. Observe sees one Decision.
func (a Authorizer) Scope(req micro.Request, op policy.Operation, node policy.Node) (any bool, _ *protocol.APIError) {
	d := Decision{Op: op, Object: policy.Object{Owner: Owner(req)}}
	d.Identity, d.Identified = Of(req)
	if node.ID != "" {
		d.Nodes = []string{node.ID}
	}
	var g policy.Grant
	if d.Err = a.Allow(req, op); d.Err == nil {
		g, d.Err = a.Decide(req, op, node, d.Object)
	}
	if d.Err == nil {
		d.Grants = []policy.Grant{g}
		any = a.Policy == nil
		if !any {
			_, err := a.Policy.Policy().Decide(d.Identity, op, node, policy.Object{})
			any = err == nil
		}
	}
	if a.Observe != nil {
		a.Observe(d)
	}
	return any, d.Err
}

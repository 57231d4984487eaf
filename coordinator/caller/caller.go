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
	"slices"
	"sync"

	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// Request is a micro.Request whose sender the guard identified.
type Request struct {
	micro.Request
	// Identity is the sender, as the NATS server proved it.
	Identity policy.Identity

	mu    sync.Mutex
	rules []string // Grant.Rule of each grant Decide made for it, deduplicated
}

// Rules returns the policy rules that allowed req (Grant.Rule of every
// grant Authorizer.Decide made for it, in order, each once), for the audit
// log; nil when req carries no identity or nothing was decided.
func Rules(req micro.Request) []string {
	r, ok := req.(*Request)
	if !ok {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.rules)
}

func (r *Request) noteRule(rule string) {
	if rule == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !slices.Contains(r.rules, rule) && len(r.rules) < maxRules {
		r.rules = append(r.rules, rule)
	}
}

// maxRules bounds the rules a request remembers (a fan-out decides once
// per node, mostly by the same rule).
const maxRules = 8

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
	// Observe, if set, is called with every decision Decide and Allow make
	// (nothing is decided while Policy is nil), on the deciding goroutine,
	// before they return. It must not block: the coordinator's audit hook
	// records refusals with it.
	Observe func(Decision)
}

// Decision is one answer of Authorizer.Decide or Allow, as Observe sees it.
type Decision struct {
	// Request is the request decided on.
	Request micro.Request
	// Identity is its sender; Identified is false when it carries none
	// (Err is then 401 unauthenticated).
	Identity   policy.Identity
	Identified bool
	// Op, Node and Object are what was asked (Node and Object are zero for
	// Allow).
	Op     policy.Operation
	Node   policy.Node
	Object policy.Object
	// Grant is what allowed it, when Err is nil.
	Grant policy.Grant
	// Err is the refusal's API error; nil when allowed.
	Err *protocol.APIError
	// Refusal is the policy's refusal behind Err (nil for a 401).
	Refusal *policy.Refusal
}

func (a Authorizer) observe(d Decision) {
	if a.Observe != nil {
		a.Observe(d)
	}
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
		e := protocol.NewAPIError(401, protocol.ErrCodeUnauthenticated, "%s: the request carries no identity", op)
		a.observe(Decision{Request: req, Op: op, Node: node, Object: obj, Err: e})
		return policy.Grant{}, e
	}
	g, err := a.Policy.Decide(id, op, node, obj)
	if err != nil {
		e := RefusalError(err)
		var r *policy.Refusal
		errors.As(err, &r)
		a.observe(Decision{Request: req, Identity: id, Identified: true, Op: op, Node: node, Object: obj, Err: e, Refusal: r})
		return policy.Grant{}, e
	}
	req.(*Request).noteRule(g.Rule())
	a.observe(Decision{Request: req, Identity: id, Identified: true, Op: op, Node: node, Object: obj, Grant: g})
	return g, nil
}

// Allow takes one request from the sender's requests-per-second budget
// (policy limits): nil, or 429 rate_limited.
func (a Authorizer) Allow(req micro.Request, op policy.Operation) *protocol.APIError {
	if a.Policy == nil {
		return nil
	}
	id, ok := Of(req)
	if !ok {
		e := protocol.NewAPIError(401, protocol.ErrCodeUnauthenticated, "%s: the request carries no identity", op)
		a.observe(Decision{Request: req, Op: op, Err: e})
		return e
	}
	if err := a.Policy.Allow(id, op); err != nil {
		e := RefusalError(err)
		var r *policy.Refusal
		errors.As(err, &r)
		a.observe(Decision{Request: req, Identity: id, Identified: true, Op: op, Err: e, Refusal: r})
		return e
	}
	a.observe(Decision{Request: req, Identity: id, Identified: true, Op: op})
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

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
	"slices"
	"strings"
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
	// Source is the caller's address for the audit log
	// (protocol.AuditEvent.Source) as DecideAs was given it: a facade
	// call's TCP peer, "IP:PORT". Empty for a NATS request (its event takes
	// the address from what the NATS server stamped on Request).
	Source string
}

func (a Authorizer) observe(d Decision) {
	if a.Observe != nil {
		a.Observe(d)
	}
}

// maxNamed bounds the refused nodes a refusal names besides the first.
const maxNamed = 8

// Authorize is the check a handler makes before it acts for req's sender:
// one request from its rate budget (Allow), then Decide for each node
// (once, on no node, for an operation not on a node: nodes empty). Any
// refusal refuses the whole request, with the first refusal's status and
// message and the ids of the other nodes refused (at most maxNamed
// named). It returns one grant per node (one when nodes is empty). Observe
// sees each Allow and Decide.
func (a Authorizer) Authorize(req micro.Request, op policy.Operation, nodes []policy.Node, obj policy.Object) ([]policy.Grant, *protocol.APIError) {
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

// Acquire counts one running job of req's sender (policy limits
// max_concurrent_jobs): a release function to call once the job ends, or
// 429 rate_limited. With no Policy it counts nothing.
func (a Authorizer) Acquire(req micro.Request, op policy.Operation) (release func(), _ *protocol.APIError) {
	if a.Policy == nil {
		return func() {}, nil
	}
	id, ok := Of(req)
	if !ok {
		return nil, noIdentity(op)
	}
	release, err := a.Policy.Acquire(id, op)
	if err != nil {
		return nil, RefusalError(err)
	}
	return release, nil
}

// noIdentity is the 401 for a request of op without an identity.
func noIdentity(op policy.Operation) *protocol.APIError {
	return protocol.NewAPIError(401, protocol.ErrCodeUnauthenticated, "%s: the request carries no identity", op)
}

// identify returns req's sender, or the 401 to answer with, observed as
// req's decision on op (at node, to obj).
func (a Authorizer) identify(req micro.Request, op policy.Operation, node policy.Node, obj policy.Object) (policy.Identity, *protocol.APIError) {
	id, ok := Of(req)
	if !ok {
		e := noIdentity(op)
		a.observe(Decision{Request: req, Op: op, Node: node, Object: obj, Err: e})
		return policy.Identity{}, e
	}
	return id, nil
}

// refused observes the policy's error err about id's op as req's decision
// and returns the API error to answer with (RefusalError).
func (a Authorizer) refused(req micro.Request, id policy.Identity, op policy.Operation, node policy.Node, obj policy.Object, err error) *protocol.APIError {
	e := RefusalError(err)
	var r *policy.Refusal
	errors.As(err, &r)
	a.observe(Decision{Request: req, Identity: id, Identified: true, Op: op, Node: node, Object: obj, Err: e, Refusal: r})
	return e
}

// Owner is the string recorded as the owner of what req creates (a job, a
// run): the sender's Identity.String, or "" when req carries none.
func Owner(req micro.Request) string {
	if id, ok := Of(req); ok {
		return id.String()
	}
	return ""
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
	id, e := a.identify(req, op, node, obj)
	if e != nil {
		return policy.Grant{}, e
	}
	g, err := a.Policy.Decide(id, op, node, obj)
	if err != nil {
		return policy.Grant{}, a.refused(req, id, op, node, obj, err)
	}
	req.(*Request).noteRule(g.Rule())
	a.observe(Decision{Request: req, Identity: id, Identified: true, Op: op, Node: node, Object: obj, Grant: g})
	return g, nil
}

// Holds says whether the sender of req holds op at all (policy.Holds: some
// rule of its grants op, on any node or object): nil, or the API error to
// answer with (401 without an identity, 403 forbidden naming the identity
// and the operation, and no node or object). Observe sees a refusal, as a
// decision on no node. It takes nothing from the rate budget: ask Allow
// first.
func (a Authorizer) Holds(req micro.Request, op policy.Operation) *protocol.APIError {
	if a.Policy == nil {
		return nil
	}
	id, e := a.identify(req, op, policy.Node{}, policy.Object{})
	if e != nil {
		return e
	}
	if err := a.Policy.Holds(id, op); err != nil {
		return a.refused(req, id, op, policy.Node{}, policy.Object{}, err)
	}
	return nil
}

// Allow takes one request from the sender's requests-per-second budget
// (policy limits): nil, or 429 rate_limited.
func (a Authorizer) Allow(req micro.Request, op policy.Operation) *protocol.APIError {
	if a.Policy == nil {
		return nil
	}
	id, e := a.identify(req, op, policy.Node{}, policy.Object{})
	if e != nil {
		return e
	}
	if err := a.Policy.Allow(id, op); err != nil {
		return a.refused(req, id, op, policy.Node{}, policy.Object{}, err)
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

// Filter decides a listing of nodes: one request from the rate budget
// (Allow), then op on each node, without counting or observing the
// refusals (a listing leaves out what the caller may not see; it is not
// refused). It returns the indexes of the nodes allowed, in order, or the
// API error for 401 and 429, and 403 when no policy entry names the
// caller (so that it learns why its listing would be empty; that refusal
// is decided through Decide).
func (a Authorizer) Filter(req micro.Request, op policy.Operation, nodes []policy.Node, obj policy.Object) ([]int, *protocol.APIError) {
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
			// Refused through Holds, whose message names no node: a
			// caller the policy does not know learns nothing of the
			// fleet. Counted and observed once.
			return nil, a.Holds(req, op)
		}
	}
	return out, nil
}

// Scope decides a listing of jobs or runs: op on the caller's own must be
// granted (Allow, then Decide with the caller as owner; else the refusal),
// and any reports whether op is granted on everyone's too (scope: any),
// asked without counting or observing a refusal. node is the node listed
// on, or zero for an operation not on a node. With no Policy, any is true.
func (a Authorizer) Scope(req micro.Request, op policy.Operation, node policy.Node) (any bool, _ *protocol.APIError) {
	if e := a.Allow(req, op); e != nil {
		return false, e
	}
	if _, e := a.Decide(req, op, node, policy.Object{Owner: Owner(req)}); e != nil {
		return false, e
	}
	if a.Policy == nil {
		return true, nil
	}
	id, _ := Of(req) // Decide refused a request without one
	_, err := a.Policy.Policy().Decide(id, op, node, policy.Object{})
	return err == nil, nil
}

// ErrUnidentified is DecideAs's error for a caller with no identity while
// a policy is in force.
var ErrUnidentified = errors.New("the call carries no identity (no verified client certificate or named token)")

// DecideAs is Decide for a caller that is not a NATS request (a facade
// call, identified by its client certificate or token): the policy's
// Grant, or the error to refuse with: ErrUnidentified when identified is
// false, else the policy's *policy.Refusal (naming the identity, the
// operation and the rule missing). A nil Policy allows everything.
// Observe sees the decision, with a nil Request and source, the call's
// TCP peer as the facade's listener saw it ("IP:PORT"; never an address
// the caller wrote in a header), as its Source.
func (a Authorizer) DecideAs(id policy.Identity, identified bool, source string, op policy.Operation, node policy.Node, obj policy.Object) (policy.Grant, error) {
	if a.Policy == nil {
		return policy.Grant{}, nil
	}
	if !identified {
		e := protocol.NewAPIError(401, protocol.ErrCodeUnauthenticated, "%s: %v", op, ErrUnidentified)
		a.observe(Decision{Op: op, Node: node, Object: obj, Err: e, Source: source})
		return policy.Grant{}, fmt.Errorf("%s: %w", op, ErrUnidentified)
	}
	g, err := a.Policy.Decide(id, op, node, obj)
	d := Decision{Identity: id, Identified: true, Op: op, Node: node, Object: obj, Grant: g, Source: source}
	if err != nil {
		d.Err = RefusalError(err)
		errors.As(err, &d.Refusal)
	}
	a.observe(d)
	return g, err
}

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

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
	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/policy"
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

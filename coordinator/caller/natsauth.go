package caller

import (
	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/natsauth"
	"github.com/tetherfleet/tether/policy"
)

// FromNATS adapts a natsauth.Verifier to the coordinator's Config.Identify:
// the identity the NATS server stamped on a request (natsauth.Identity),
// as policy names it (Kind policy.KindNATS, the JWT's name, the user's
// public key, the account's name).
func FromNATS(v *natsauth.Verifier) func(nats.Header) (policy.Identity, error) {
	return func(h nats.Header) (policy.Identity, error) {
		id, err := v.Identify(h)
		if err != nil {
			return policy.Identity{}, err
		}
		return policy.Identity{Kind: policy.KindNATS, Name: id.Name, Key: id.Key, Account: id.Account}, nil
	}
}

package natsauth_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/natsauth"
	"github.com/tetherfleet/tether/natsauth/natsauthtest"
)

// Coordinator credentials of the layout pass its check; those minted from
// another layout are refused, naming both TETHER accounts and the layout's
// directory.
func TestCheckCoordinatorCreds(t *testing.T) {
	a, b := natsauthtest.NewLayout(t), natsauthtest.NewLayout(t)
	own := natsauthtest.CoordinatorCreds(t, a, "c1")
	if err := a.CheckCoordinatorCreds(own); err != nil {
		t.Fatalf("own credentials: %v", err)
	}
	other := natsauthtest.CoordinatorCreds(t, b, "c2")
	err := a.CheckCoordinatorCreds(other)
	if !errors.Is(err, natsauth.ErrOtherLayout) {
		t.Fatalf("credentials of another layout: %v, want ErrOtherLayout", err)
	}
	for _, want := range []string{a.Dir(), a.AccountKey(natsauth.AccountTether), b.AccountKey(natsauth.AccountTether), "share one layout"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

// A client user of the layout given as a coordinator's is refused as
// client credentials (not as another layout's, which would send the
// operator copying nats-auth over a correct layout), and the error names
// the command that makes coordinator credentials.
func TestCheckCoordinatorCredsClient(t *testing.T) {
	a := natsauthtest.NewLayout(t)
	err := a.CheckCoordinatorCreds(natsauthtest.ClientCreds(t, a, "bob"))
	if !errors.Is(err, natsauth.ErrClientCreds) {
		t.Fatalf("client credentials as coordinator's: %v, want ErrClientCreds", err)
	}
	if errors.Is(err, natsauth.ErrOtherLayout) {
		t.Errorf("client credentials of the layout itself: %v, also ErrOtherLayout", err)
	}
	for _, want := range []string{"client credentials", "tether nats coordinator-creds", `"bob"`, natsauth.AccountClients} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	// The verifier of an nsc-managed fleet (--nats-operator-jwt) knows the
	// client accounts too.
	v, err := natsauth.NewVerifier(a.OperatorJWT(), a.AccountJWT(natsauth.AccountClients))
	if err != nil {
		t.Fatal(err)
	}
	if err := v.CheckNotClient(natsauthtest.ClientCreds(t, a, "carol")); !errors.Is(err, natsauth.ErrClientCreds) || !strings.Contains(err.Error(), "tether nats coordinator-creds") {
		t.Errorf("verifier, client credentials: %v, want ErrClientCreds naming the command", err)
	}
	if err := v.CheckNotClient(natsauthtest.CoordinatorCreds(t, a, "c1")); err != nil {
		t.Errorf("verifier, coordinator credentials: %v", err)
	}
}

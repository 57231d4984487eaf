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
	// A client user is not in TETHER either.
	if err := a.CheckCoordinatorCreds(natsauthtest.ClientCreds(t, a, "bob")); !errors.Is(err, natsauth.ErrOtherLayout) {
		t.Errorf("client credentials as coordinator's: %v, want ErrOtherLayout", err)
	}
}

package cli

import (
	"reflect"
	"strings"
	"testing"

	"github.com/tetherfleet/tether/policy"
)

// TestDevLocalNamesOnlyItsOwnUIDTheDevUser: under tether dev the loopback
// facades' caller is the dev user only when its socket is the dev
// process's uid's; any other local user is token:loopback-uid-N, which a
// policy grants by that name (and the dev policy does not).
func TestDevLocalNamesOnlyItsOwnUIDTheDevUser(t *testing.T) {
	dev := policy.Identity{Kind: policy.KindNATS, Name: "alice"}
	local := devLocal(dev, 1000)
	if got := local(1000); !reflect.DeepEqual(got, dev) {
		t.Errorf("own uid: %v, want %v", got, dev)
	}
	other := local(1001)
	if other.String() != "token:loopback-uid-1001" {
		t.Errorf("another uid: %v, want token:loopback-uid-1001", other)
	}
	if got := loopbackIdentity(0).String(); got != "token:loopback-uid-0" {
		t.Errorf("coordinator's loopback caller of uid 0: %s", got)
	}
	yaml := "version: 1\nidentities:\n  " + other.String() + ":\n    rules:\n      - operations: [sandboxes.list]\n"
	p, err := policy.Parse("p.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("a policy naming %s: %v", other, err)
	}
	if _, err := p.Decide(other, policy.OpSandboxesList, policy.Node{}, policy.Object{Owner: other.String()}); err != nil {
		t.Errorf("the policy's grant to %s: %v", other, err)
	}
	devPol, err := devPolicy("nats:alice", "alice")
	if err != nil {
		t.Fatal(err)
	}
	dp, err := policy.Parse("dev.yaml", devPol)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dp.Decide(other, policy.OpForward, policy.Node{ID: "n1"}, policy.Object{Target: "opensandbox"}); err == nil || !strings.Contains(err.Error(), "token:loopback-uid-1001") {
		t.Errorf("the dev policy and another local user: %v, want a refusal naming it", err)
	}
}

// TestFacadeTokenNamesLeaveLocalUsersAlone: a facade token may not be
// named like a local user's identity.
func TestFacadeTokenNamesLeaveLocalUsersAlone(t *testing.T) {
	_, err := parseFacadeTokens("tokens", []byte("loopback-uid-0 0123456789abcdef0123\n"))
	if err == nil || !strings.Contains(err.Error(), "tokens:1") || !strings.Contains(err.Error(), "local users'") {
		t.Errorf("token named loopback-uid-0: %v", err)
	}
}

package natsauth

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/protocol"
)

// A revocation recorded by another process (another Load of the same
// directory, as `tether nats user revoke` does while the coordinator runs)
// reaches the running layout by ReloadRevocations, and the server by
// UpdateServer: the user is cut off and refused, others are not.
func TestReloadRevocationsFromAnotherLoad(t *testing.T) {
	l := testLayout(t, Config{})
	s := startServer(t, l)
	coord, _ := connect(t, s, mintCoordinator(t, l, "c1"))
	reqs := responder(t, coord, protocol.SubjectNodes)
	alice, bob := mintClient(t, l, "alice"), mintClient(t, l, "bob")
	closed := make(chan struct{})
	ncA, _ := connect(t, s, alice, nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if _, err := ncA.Request(protocol.SubjectNodes, nil, wait); err != nil {
		t.Fatal(err)
	}
	aliceHdr := next(t, reqs).Header

	if changed, err := l.ReloadRevocations(); err != nil || changed {
		t.Fatalf("reload with nothing new: %v, %v", changed, err)
	}
	other, err := Load(l.Dir(), Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Revoke(alice.PublicKey()); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Verifier().Identify(aliceHdr); err != nil {
		t.Fatalf("before the reload the running layout knows of no revocation: %v", err)
	}
	changed, err := l.ReloadRevocations()
	if err != nil || !changed {
		t.Fatalf("reload: %v, %v; want a change", changed, err)
	}
	if _, err := l.Verifier().Identify(aliceHdr); !errors.Is(err, ErrRevoked) {
		t.Errorf("Identify after the reload: %v, want %v", err, ErrRevoked)
	}
	if err := l.UpdateServer(s); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
	case <-timeAfter(wait):
		t.Fatal("the server kept the revoked user's connection")
	}
	if _, _, err := dial(s, alice); err == nil {
		t.Error("the revoked user connected again")
	}
	if _, _, err := dial(s, bob); err != nil {
		t.Errorf("bob after alice's revocation: %v", err)
	}
	if changed, err := l.ReloadRevocations(); err != nil || changed {
		t.Errorf("a second reload: %v, %v; want no change", changed, err)
	}
}

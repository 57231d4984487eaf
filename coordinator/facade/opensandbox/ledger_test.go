package opensandbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/tetherfleet/tether/coordinator/facade/opensandbox"
	"github.com/tetherfleet/tether/coordinator/internal/natstest"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/protocol/opensandbox/opensandboxtest"
)

// The real ledger is what the facade consumes.
var _ opensandbox.Ledger = (*ledger.Ledger)(nil)

// TestWithRealLedger runs NeMo Gym's OpenSandbox lifecycle through the
// facade with the JetStream ledger behind it: the create is recorded
// (managed, owner, expiry, attribution from metadata) and counts for
// placement, a renewal moves the expiry, the delete ends deleted.
func TestWithRealLedger(t *testing.T) {
	ns := natstest.Run(t)
	nc := ns.Coordinator(t)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	led, err := ledger.Open(ctx, ledger.Config{NATS: nc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { led.Close() })
	if err := led.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	e := newFacadeEnv(t, func(c *opensandbox.Config) { c.Ledger = led })
	e.startNode(t, "n1", nil, opensandboxtest.Config{})
	e.startNode(t, "n2", nil, opensandboxtest.Config{})

	id := e.create(t, map[string]string{opensandbox.HeaderRun: "run-123", opensandbox.HeaderNode: "n2"}, nemoGymMetadata)
	rec := waitRecord(t, led, id, func(r ledger.Record) bool { return r.State == ledger.StateLive })
	if rec.Node != "n2" || !rec.Managed || rec.Owner != "run-123" || rec.Run != "run-123" || rec.Team != "gym_team" || rec.ExpiresAt.IsZero() {
		t.Fatalf("record %+v", rec)
	}
	if n := led.LiveOn("n2"); n != 1 {
		t.Errorf("LiveOn(n2) = %d, want 1", n)
	}
	// Placement sees it: the next create goes to n1.
	id1 := e.create(t, nil, nil)
	if r := waitRecord(t, led, id1, func(ledger.Record) bool { return true }); r.Node != "n1" {
		t.Errorf("second sandbox placed on %s, want the less loaded n1", r.Node)
	}

	at := time.Now().Add(3 * time.Hour).UTC().Truncate(time.Second)
	if code, _, body := e.do(t, "POST", "/v1/sandboxes/"+id+"/renew-expiration", nil, `{"expiresAt":"`+at.Format(time.RFC3339)+`"}`); code != 200 {
		t.Fatalf("renew: %d %s", code, body)
	}
	waitRecord(t, led, id, func(r ledger.Record) bool { return r.ExpiresAt.Equal(at) })

	if code, _, body := e.do(t, "DELETE", "/v1/sandboxes/"+id, nil, ""); code != 204 {
		t.Fatalf("delete: %d %s", code, body)
	}
	waitRecord(t, led, id, func(r ledger.Record) bool { return r.State == ledger.StateDeleted })
}

// waitRecord polls the ledger until id's record satisfies ok (the ledger
// applies its own writes through a KV watch).
func waitRecord(t *testing.T, led *ledger.Ledger, id string, ok func(ledger.Record) bool) ledger.Record {
	t.Helper()
	deadline := time.Now().Add(defaultTestTimeout)
	for {
		r, found := led.ByID(protocol.ProviderOpenSandbox, id)
		if found && ok(r) {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("ledger record of %s: %+v (found %v), never as wanted", id, r, found)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

package openshell_test

import (
	"fmt"
	"testing"
	"time"

	facade "github.com/tetherfleet/tether/coordinator/facade/openshell"
	"github.com/tetherfleet/tether/coordinator/internal/natstest"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/protocol"
	osh "github.com/tetherfleet/tether/protocol/openshell"
)

// The real ledger is what the facade consumes.
var _ facade.Ledger = (*ledger.Ledger)(nil)

// TestWithRealLedger runs a NeMo Gym lifecycle through the facade with the
// JetStream ledger behind it: the create is recorded (managed, owner, TTL,
// attribution from labels), the exec is routed by the ledger, the delete
// marks the record deleting.
func TestWithRealLedger(t *testing.T) {
	ns := natstest.Run(t)
	nc := ns.Coordinator(t)
	led, err := ledger.Open(testCtx(t), ledger.Config{NATS: nc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { led.Close() })
	if err := led.WaitReady(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, envConfig{nodes: []string{"node-a", "node-b"}, cfg: func(c *facade.Config) { c.Ledger = led }})
	ctx := testCtx(t, facade.MetaRun, "run-42", facade.MetaTTL, "600")
	sb, err := e.create(ctx, &osh.CreateSandboxRequest{Spec: spec(), Name: "ng-real",
		Labels: map[string]string{"nemo-gym.sandbox": "1", "team": "gym"}})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.GetMetadata().GetId()
	node := e.nodeOf(sb)
	var r ledger.Record
	checkFor(t, defaultTestTimeout, func() error {
		var ok bool
		if r, ok = led.ByID(protocol.ProviderOpenShell, id); !ok {
			return fmt.Errorf("sandbox %s not in the ledger", id)
		}
		return nil
	})
	if r.Node != node || r.Name != "ng-real" || r.Workspace != "default" || !r.Managed || r.Owner != "run-42" ||
		r.TTL != 10*time.Minute || r.Team != "gym" || r.State != ledger.StateLive {
		t.Fatalf("record %+v (gateway on %s)", r, node)
	}
	if n := led.LiveOn(node); n != 1 {
		t.Fatalf("LiveOn(%s) = %d", node, n)
	}
	if _, err := execStream(ctx, e.cc, &osh.ExecSandboxRequest{SandboxId: id, Command: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	if deleted, err := e.del(ctx, "", "ng-real"); err != nil || !deleted {
		t.Fatalf("delete: %v, %v", deleted, err)
	}
	checkFor(t, defaultTestTimeout, func() error {
		if r, _ := led.ByID(protocol.ProviderOpenShell, id); r.State != ledger.StateDeleting {
			return fmt.Errorf("state %q, want deleting", r.State)
		}
		return nil
	})
}

package coordinator

import (
	"strings"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// A node whose fleet record was removed less than nodeMovingGrace ago is
// between coordinators: a request for it is 503 (retry), not 404; one
// never registered, or gone for longer, is 404 unknown_node.
func TestNotConnectedWhileMoving(t *testing.T) {
	c := &Coordinator{cfg: Config{ID: "c0"}, fl: &fleetState{recs: map[string]fleetRec{}, left: map[string]time.Time{}}}
	if e := c.notConnected("n1"); e.Status != 404 {
		t.Fatalf("never registered: %+v, want 404", e)
	}
	c.fl.recs["n2"] = fleetRec{info: protocol.NodeInfo{ID: "n2", Coordinator: "c1"}}
	if e := c.notConnected("n2"); e.Status != 503 || !strings.Contains(e.Message, `node "n2" is registered to coordinator c1 but not connected to coordinator c0`) {
		t.Errorf("registered elsewhere: %+v, want 503 naming the holder", e)
	}
	c.fl.recs["n4"] = fleetRec{info: protocol.NodeInfo{ID: "n4", Coordinator: "c0"}}
	if e := c.notConnected("n4"); e.Status != 503 || !strings.Contains(e.Message, `node "n4" is registered to coordinator c0, which holds no tunnel of it`) {
		t.Errorf("a lagging record naming this coordinator: %+v, want 503 saying so", e)
	}
	c.fl.noteLeft("n1")
	c.fl.left["n1"] = time.Now().Add(-12 * time.Second)
	// A dead agent is not said to be moving: how long it has been gone
	// lets the caller tell a move (seconds) from a node that is down.
	if e := c.notConnected("n1"); e.Status != 503 || !strings.Contains(e.Message, `node "n1" left the fleet 12s ago and has not come back to any coordinator`) {
		t.Errorf("record removed 12 s ago: %+v, want 503 saying when it left", e)
	}
	c.fl.left["n1"] = time.Now().Add(-nodeMovingGrace)
	if e := c.notConnected("n1"); e.Status != 404 {
		t.Errorf("record removed a grace ago: %+v, want 404", e)
	}
	// The memory of departures stays bounded.
	for i := range 2000 {
		c.fl.left[string(rune('a'+i%26))+time.Duration(i).String()] = time.Now().Add(-2 * nodeMovingGrace)
	}
	c.fl.noteLeft("n3")
	if len(c.fl.left) > 1024 {
		t.Errorf("%d departures remembered after a prune", len(c.fl.left))
	}
}

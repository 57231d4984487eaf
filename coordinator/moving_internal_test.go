package coordinator

import (
	"testing"
	"time"
)

// A node whose fleet record was removed less than nodeMovingGrace ago is
// between coordinators: a request for it is 503 (retry), not 404; one
// never registered, or gone for longer, is 404 unknown_node.
func TestNotConnectedWhileMoving(t *testing.T) {
	c := &Coordinator{cfg: Config{ID: "c0"}, fl: &fleetState{recs: map[string]fleetRec{}, left: map[string]time.Time{}}}
	if e := c.notConnected("n1"); e.Status != 404 {
		t.Fatalf("never registered: %+v, want 404", e)
	}
	c.fl.recs["n2"] = fleetRec{}
	if e := c.notConnected("n2"); e.Status != 503 {
		t.Errorf("registered elsewhere: %+v, want 503", e)
	}
	c.fl.noteLeft("n1")
	if e := c.notConnected("n1"); e.Status != 503 {
		t.Errorf("record removed just now: %+v, want 503", e)
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

package openshell

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// TestFailingWindow: a node is failing for failingFor after a failed dial
// in its session, and healthy again after a successful one or in a new
// session.
func TestFailingWindow(t *testing.T) {
	p := newPool(nil)
	now := time.Unix(1000, 0)
	p.now = func() time.Time { return now }
	n := protocol.NodeInfo{ID: "node-f", SessionID: "s1"}
	if p.failing(n) {
		t.Fatal("failing before any dial")
	}
	p.dialed("node-f", "s1", errors.New("connection refused"))
	if !p.failing(n) {
		t.Fatal("not failing after a failed dial")
	}
	if p.failing(protocol.NodeInfo{ID: "node-f", SessionID: "s2"}) {
		t.Fatal("a new session inherits the old one's failure")
	}
	now = now.Add(failingFor)
	if p.failing(n) {
		t.Fatalf("still failing %v after the failed dial", failingFor)
	}
	p.dialed("node-f", "s1", errors.New("connection refused"))
	p.dialed("node-f", "s1", nil)
	if p.failing(n) {
		t.Fatal("failing after a successful dial")
	}
	p.dialed("node-f", "s1", errors.Join(errors.New("dial"), context.Canceled))
	if p.failing(n) {
		t.Fatal("a cancelled dial marked the node failing")
	}
}

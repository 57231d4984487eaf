package opensandbox

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

// refusingFleet fails every dial with err.
type refusingFleet struct{ err error }

func (refusingFleet) Nodes(protocol.Selector) []protocol.NodeInfo { return nil }
func (f refusingFleet) DialTarget(context.Context, string, string) (net.Conn, error) {
	return nil, f.err
}

// TestFailingWindow: a node is failing for failingFor after a failed dial
// in its session, not in another session, and not after a dial its
// caller's context ended.
func TestFailingWindow(t *testing.T) {
	fleet := &refusingFleet{err: errors.New("dial opensandbox on node n1: connection refused")}
	tr := newTransports(fleet)
	now := time.Unix(1000, 0)
	tr.now = func() time.Time { return now }
	n := protocol.NodeInfo{ID: "n1", SessionID: "s1"}
	if _, err := tr.dial(context.Background(), "n1", "s1"); err == nil || err.Error() != fleet.err.Error() {
		t.Fatalf("dial: %v", err)
	}
	if !tr.failing(n) {
		t.Fatal("not failing after a failed dial")
	}
	if tr.failing(protocol.NodeInfo{ID: "n1", SessionID: "s2"}) {
		t.Fatal("a new session inherits the old one's failure")
	}
	now = now.Add(failingFor)
	if tr.failing(n) {
		t.Fatalf("still failing %v after the failed dial", failingFor)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	tr.dial(ctx, "n1", "s1")
	if tr.failing(n) {
		t.Fatal("a dial whose caller left marked the node failing")
	}
}

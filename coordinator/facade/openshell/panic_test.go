package openshell_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"

	facade "github.com/tetherfleet/tether/coordinator/facade/openshell"
	"github.com/tetherfleet/tether/protocol"
	osh "github.com/tetherfleet/tether/protocol/openshell"
)

// panickyFleet panics in Nodes or DialTarget while armed.
type panickyFleet struct {
	facade.Fleet
	nodes, dial atomic.Bool
}

func (f *panickyFleet) Nodes(sel protocol.Selector) []protocol.NodeInfo {
	if f.nodes.Load() {
		panic("injected panic in Nodes")
	}
	return f.Fleet.Nodes(sel)
}

func (f *panickyFleet) DialTarget(ctx context.Context, node, target string) (net.Conn, error) {
	if f.dial.Load() {
		panic("injected panic in DialTarget")
	}
	return f.Fleet.DialTarget(ctx, node, target)
}

// A panic in a call's handler costs that call INTERNAL, and one in a dial
// (which grpc runs on its own goroutine) fails the call; the facade counts
// both in tether_panics_total and keeps serving.
func TestPanicInCallIsInternal(t *testing.T) {
	var pf *panickyFleet
	e := newEnv(t, envConfig{cfg: func(c *facade.Config) {
		pf = &panickyFleet{Fleet: c.Fleet}
		c.Fleet = pf
	}})
	ctx := testCtx(t)

	pf.nodes.Store(true)
	_, err := e.list(ctx, &osh.ListSandboxesRequest{})
	wantCode(t, "list with a panicking fleet", err, codes.Internal, "injected panic in Nodes")
	pf.nodes.Store(false)

	pf.dial.Store(true)
	_, err = e.list(ctx, &osh.ListSandboxesRequest{})
	if err == nil || !strings.Contains(err.Error(), "injected panic in DialTarget") {
		t.Errorf("list with a panicking dial: %v, want the dial's internal error", err)
	}
	pf.dial.Store(false)

	const want = `
# HELP tether_panics_total Panics contained in a per-connection, per-stream or per-request goroutine, by component. Each one failed one caller with an internal error; the daemon kept serving.
# TYPE tether_panics_total counter
tether_panics_total{component="facade_openshell"} 2
`
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(want), "tether_panics_total"); err != nil {
		t.Error(err)
	}
	// The node's conn redials after its backoff; then calls go through.
	checkFor(t, 20*time.Second, func() error {
		_, err := e.list(ctx, &osh.ListSandboxesRequest{})
		return err
	})
}

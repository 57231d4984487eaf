package opensandbox_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tetherfleet/tether/coordinator/facade/opensandbox"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/protocol/opensandbox/opensandboxtest"
)

// panickyFleet panics in Nodes or DialTarget while armed.
type panickyFleet struct {
	opensandbox.Fleet
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

// A panic in a request's handler answers that request 500
// TETHER::INTERNAL, and one in a dial (which net/http runs on its own
// goroutine) fails the request as a node failure; the facade counts both
// and keeps serving.
func TestPanicInRequestIs500(t *testing.T) {
	var pf *panickyFleet
	e := newFacadeEnv(t, func(c *opensandbox.Config) {
		pf = &panickyFleet{Fleet: c.Fleet}
		c.Fleet = pf
	})
	e.startNode(t, "n1", nil, opensandboxtest.Config{})

	pf.nodes.Store(true)
	status, _, body := e.do(t, http.MethodGet, "/v1/sandboxes", nil, "")
	if status != http.StatusInternalServerError || !strings.Contains(body, opensandbox.CodeInternal) {
		t.Errorf("list with a panicking fleet: %d %s, want 500 %s", status, body, opensandbox.CodeInternal)
	}
	pf.nodes.Store(false)

	pf.dial.Store(true)
	status, _, body = e.do(t, http.MethodGet, "/v1/sandboxes", nil, "")
	if status != http.StatusBadGateway || !strings.Contains(body, "injected panic in DialTarget") {
		t.Errorf("list with a panicking dial: %d %s, want 502 naming the dial's internal error", status, body)
	}
	pf.dial.Store(false)

	const want = `
# HELP tether_panics_total Panics contained in a per-connection, per-stream or per-request goroutine, by component. Each one failed one caller with an internal error; the daemon kept serving.
# TYPE tether_panics_total counter
tether_panics_total{component="facade_opensandbox"} 2
`
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(want), "tether_panics_total"); err != nil {
		t.Error(err)
	}
	if status, _, body := e.do(t, http.MethodGet, "/v1/sandboxes", nil, ""); status != http.StatusOK {
		t.Fatalf("list after the panics: %d %s", status, body)
	}
}

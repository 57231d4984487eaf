package ledger_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/tetherfleet/tether/coordinator/internal/natstest"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// defaultTestTimeout bounds every wait in these tests.
const defaultTestTimeout = 10 * time.Second

// checkFor polls f until it returns nil, failing the test after d.
func checkFor(tb testing.TB, d time.Duration, f func() error) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("condition not met within %v: %v", d, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func testContext(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	tb.Cleanup(cancel)
	return ctx
}

// clock is a settable clock shared by a test's ledgers.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// env is an embedded NATS server and a clock; ledgers opened on it share
// their buckets.
type env struct {
	t     testing.TB
	srv   *natstest.Env
	clock *clock
}

func newEnv(tb testing.TB) *env {
	return &env{t: tb, srv: natstest.Run(tb), clock: newClock()}
}

func (e *env) conn() *nats.Conn {
	// The ledger's own account: it serves its endpoints and the tests
	// call them within it.
	return e.srv.Coordinator(e.t)
}

type testLedger struct {
	*ledger.Ledger
	reg *prometheus.Registry
	nc  *nats.Conn
}

// open opens a ready ledger on its own connection, closed at cleanup.
func (e *env) open(mutate ...func(*ledger.Config)) *testLedger {
	e.t.Helper()
	nc := e.conn()
	reg := prometheus.NewRegistry()
	cfg := ledger.Config{
		NATS:       nc,
		Now:        e.clock.Now,
		Registerer: reg,
		Logger:     slog.New(slog.NewTextHandler(e.t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	for _, m := range mutate {
		m(&cfg)
	}
	l, err := ledger.Open(testContext(e.t), cfg)
	if err != nil {
		e.t.Fatalf("open ledger: %v", err)
	}
	e.t.Cleanup(func() { l.Close() })
	if err := l.WaitReady(testContext(e.t)); err != nil {
		e.t.Fatal(err)
	}
	return &testLedger{l, reg, nc}
}

// fleet is a FleetView whose nodes are reachable unless marked down.
type fleet struct {
	mu   sync.Mutex
	down map[string]bool
}

func newFleet() *fleet { return &fleet{down: map[string]bool{}} }

func (f *fleet) Reachable(node string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.down[node]
}

func (f *fleet) set(node string, down bool) {
	f.mu.Lock()
	f.down[node] = down
	f.mu.Unlock()
}

// deleter is a Deleter that records calls; fn, if set, decides each
// result.
type deleter struct {
	mu    sync.Mutex
	calls []ledger.Key
	fn    func(ledger.Record) error
}

func (d *deleter) Delete(_ context.Context, r ledger.Record) error {
	d.mu.Lock()
	d.calls = append(d.calls, r.Key())
	fn := d.fn
	d.mu.Unlock()
	if fn != nil {
		return fn(r)
	}
	return nil
}

func (d *deleter) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.calls)
}

// sandboxes returns n OpenShell sandboxes of run on the gateway, with NeMo
// Gym's marker label.
func sandboxes(n int, run string) []protocol.Sandbox {
	out := make([]protocol.Sandbox, n)
	for i := range out {
		out[i] = protocol.Sandbox{
			Provider:  protocol.ProviderOpenShell,
			ID:        fmt.Sprintf("%s-%08d-0000-4000-8000-000000000000", run, i),
			Name:      fmt.Sprintf("sb-%s-%d", run, i),
			Workspace: "default",
			Labels:    map[string]string{"nemo-gym.sandbox": "1", "run": run, "sandbox-api": "openshell-grpc"},
			State:     "SANDBOX_PHASE_READY",
		}
	}
	return out
}

// complete is a gateway status list with every provider listed
// completely.
func complete() []protocol.GatewayStatus {
	return []protocol.GatewayStatus{
		{Target: "openshell", Provider: protocol.ProviderOpenShell, Complete: true},
		{Target: "opensandbox", Provider: protocol.ProviderOpenSandbox, Complete: true},
	}
}

// reconcile reconciles inv as listed right now.
func (l *testLedger) reconcile(tb testing.TB, node string, now time.Time, inv []protocol.Sandbox, gw []protocol.GatewayStatus) {
	tb.Helper()
	if err := l.ReconcileAt(testContext(tb), node, now, inv, gw); err != nil {
		tb.Fatalf("reconcile %s: %v", node, err)
	}
}

func (l *testLedger) mustGet(tb testing.TB, k ledger.Key) ledger.Record {
	tb.Helper()
	r, ok := l.ByID(k.Provider, k.ID)
	if !ok || r.Node != k.Node {
		tb.Fatalf("no record of %s", k)
	}
	return r
}

func osKey(node, id string) ledger.Key {
	return ledger.Key{Provider: protocol.ProviderOpenShell, Node: node, ID: id}
}

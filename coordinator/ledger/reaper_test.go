package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/gateway"
	"github.com/tetherfleet/tether/protocol"
)

// reaperEnv is a ledger with inventoried sandboxes, a reaper, its fake
// fleet and deleter.
type reaperEnv struct {
	*env
	l     *testLedger
	r     *ledger.Reaper
	fleet *fleet
	del   *deleter
}

func newReaperEnv(t *testing.T, mutate ...func(*ledger.ReaperConfig)) *reaperEnv {
	e := newEnv(t)
	re := &reaperEnv{env: e, l: e.open(), fleet: newFleet(), del: &deleter{}}
	re.r = re.newReaper(t, re.l, mutate...)
	return re
}

func (re *reaperEnv) newReaper(t *testing.T, l *testLedger, mutate ...func(*ledger.ReaperConfig)) *ledger.Reaper {
	cfg := ledger.ReaperConfig{Deleter: re.del, Fleet: re.fleet, Rate: 1000}
	for _, m := range mutate {
		m(&cfg)
	}
	r, err := ledger.NewReaper(l.Ledger, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (re *reaperEnv) pass(t *testing.T) ledger.Pass {
	t.Helper()
	p, err := re.r.ReapOnce(testContext(t))
	if err != nil {
		t.Fatalf("reap pass: %v", err)
	}
	return p
}

func states(l *testLedger, f ledger.Filter) map[ledger.State]int {
	out := map[ledger.State]int{}
	for _, r := range l.List(f) {
		out[r.State]++
	}
	return out
}

func TestReaperLeaseExpired(t *testing.T) {
	re := newReaperEnv(t)
	ctx := testContext(t)
	if _, err := re.l.OpenLease(ctx, "r1", "test", time.Minute); err != nil {
		t.Fatal(err)
	}
	events := subscribeEvents(t, re.l.nc)
	re.l.reconcile(t, "n1", re.clock.Now(), sandboxes(5, "r1"), complete())
	re.l.reconcile(t, "n2", re.clock.Now(), sandboxes(3, "other"), complete()) // no lease, within grace

	if p := re.pass(t); !p.Leader || p.Candidates != 0 || re.del.count() != 0 {
		t.Fatalf("pass with a live lease = %+v, %d deletes", p, re.del.count())
	}
	re.clock.Advance(61 * time.Second)
	if c := re.r.Plan(); len(c) != 5 || c[0].Reason != protocol.ReasonLeaseExpired || c[0].Blocked != "" {
		t.Fatalf("plan = %v", c)
	}
	p := re.pass(t)
	if p.Reaped != 5 || re.del.count() != 5 {
		t.Fatalf("pass = %+v, %d deletes; want 5 reaped", p, re.del.count())
	}
	if s := states(re.l, ledger.Filter{Run: "r1"}); s[ledger.StateDeleted] != 5 {
		t.Errorf("states of r1 = %v", s)
	}
	if s := states(re.l, ledger.Filter{Run: "other"}); s[ledger.StateLive] != 3 {
		t.Errorf("states of other = %v", s)
	}
	if got := metricValue(t, re.l, "tether_sandbox_reaps_total", "reason", protocol.ReasonLeaseExpired); got != 5 {
		t.Errorf("reaps{lease_expired} = %v", got)
	}
	ev := events.wait(t, protocol.EventReaped)
	if ev.Reason != protocol.ReasonLeaseExpired || ev.Sandbox.Run != "r1" || ev.Sandbox.State != protocol.SandboxDeleted {
		t.Errorf("reaped event = %+v", ev)
	}
	// Nothing left to do.
	if p := re.pass(t); p.Candidates != 0 {
		t.Errorf("second pass = %+v", p)
	}
}

// eventLog collects sandbox events.
type eventLog struct {
	mu  sync.Mutex
	evs []protocol.SandboxEvent
}

func subscribeEvents(t *testing.T, nc *nats.Conn) *eventLog {
	el := &eventLog{}
	sub, err := nc.Subscribe(protocol.SubjectSandboxEventPrefix+">", func(m *nats.Msg) {
		var ev protocol.SandboxEvent
		if err := json.Unmarshal(m.Data, &ev); err != nil || m.Subject != protocol.SubjectSandboxEventPrefix+ev.Event {
			t.Errorf("bad event on %s: %s (%v)", m.Subject, m.Data, err)
		}
		el.mu.Lock()
		el.evs = append(el.evs, ev)
		el.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	return el
}

func (el *eventLog) wait(t *testing.T, name string) protocol.SandboxEvent {
	t.Helper()
	var ev protocol.SandboxEvent
	checkFor(t, defaultTestTimeout, func() error {
		el.mu.Lock()
		defer el.mu.Unlock()
		for _, e := range el.evs {
			if e.Event == name {
				ev = e
				return nil
			}
		}
		return fmt.Errorf("no %s event among %d", name, len(el.evs))
	})
	return ev
}

func TestReaperRunClosedWakesRun(t *testing.T) {
	// A pass every hour: only the lease close can make it act in time.
	re := newReaperEnv(t, func(c *ledger.ReaperConfig) { c.Interval = time.Hour; c.LockTTL = 2 * time.Hour })
	ctx, cancel := context.WithCancel(testContext(t))
	if _, err := re.l.OpenLease(ctx, "r1", "test", time.Hour); err != nil {
		t.Fatal(err)
	}
	re.l.reconcile(t, "n1", re.clock.Now(), sandboxes(4, "r1"), complete())
	done := make(chan error, 1)
	go func() { done <- re.r.Run(ctx) }()
	checkFor(t, defaultTestTimeout, func() error {
		if !re.r.Leader() {
			return errors.New("reaper has not taken the lock")
		}
		return nil
	})
	if re.del.count() != 0 {
		t.Fatalf("%d deletes before the run closed", re.del.count())
	}
	// Close through another ledger, as another coordinator would.
	other := re.open()
	if _, err := other.CloseLease(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	checkFor(t, defaultTestTimeout, func() error {
		if s := states(re.l, ledger.Filter{Run: "r1"}); s[ledger.StateDeleted] != 4 {
			return fmt.Errorf("states %v", s)
		}
		return nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run = %v", err)
	}
	if got := metricValue(t, re.l, "tether_sandbox_reaps_total", "reason", protocol.ReasonRunClosed); got != 4 {
		t.Errorf("reaps{run_closed} = %v", got)
	}
	// Run released the lock: another reaper takes it at once.
	r2 := re.newReaper(t, other)
	if p, err := r2.ReapOnce(testContext(t)); err != nil || !p.Leader {
		t.Errorf("second reaper after release: %+v, %v", p, err)
	}
}

func TestReaperTTLAndExpiry(t *testing.T) {
	re := newReaperEnv(t)
	ctx := testContext(t)
	re.l.reconcile(t, "n1", re.clock.Now(), nil, complete())
	if _, err := re.l.OpenLease(ctx, "r1", "", time.Hour); err != nil {
		t.Fatal(err)
	}
	// Owned by a live lease, but its TTL passes first.
	if _, err := re.l.Register(ctx, ledger.Record{Provider: protocol.ProviderOpenShell, Node: "n1", ID: "ttl", Name: "ttl", Run: "r1", TTL: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	// OpenSandbox's own expiry, its timer dropped.
	if err := re.l.Created(ctx, ledger.Record{Provider: protocol.ProviderOpenSandbox, Node: "n1", ID: "osb", Run: "r1", ExpiresAt: re.clock.Now().Add(5 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
	re.clock.Advance(5*time.Minute + 30*time.Second) // within the expiry slack
	if p := re.pass(t); p.Candidates != 0 {
		t.Fatalf("pass before expiry = %+v", p)
	}
	re.clock.Advance(time.Minute)
	if p := re.pass(t); p.Reaped != 1 || re.l.mustGet(t, ledger.Key{Provider: protocol.ProviderOpenSandbox, Node: "n1", ID: "osb"}).State != ledger.StateDeleted {
		t.Fatalf("pass after expiry = %+v", p)
	}
	re.clock.Advance(4 * time.Minute)
	if p := re.pass(t); p.Reaped != 1 || re.l.mustGet(t, osKey("n1", "ttl")).State != ledger.StateDeleted {
		t.Fatalf("pass after TTL = %+v", p)
	}
	if got := metricValue(t, re.l, "tether_sandbox_reaps_total", "reason", protocol.ReasonTTLExpired); got != 2 {
		t.Errorf("reaps{ttl_expired} = %v", got)
	}
}

func TestReaperUnownedGrace(t *testing.T) {
	re := newReaperEnv(t)
	inv := sandboxes(2, "nolease")
	unmanaged := protocol.Sandbox{Provider: protocol.ProviderOpenShell, ID: "mine", Name: "mine", Workspace: "default", Labels: map[string]string{"team": "x"}}
	re.l.reconcile(t, "n1", re.clock.Now(), append(inv, unmanaged), complete())
	re.clock.Advance(59 * time.Minute)
	if c := re.r.Plan(); len(c) != 0 {
		t.Fatalf("plan within grace = %v", c)
	}
	re.clock.Advance(2 * time.Minute)
	re.l.reconcile(t, "n1", re.clock.Now(), append(inv, unmanaged), complete())
	p := re.pass(t)
	if p.Reaped != 2 {
		t.Fatalf("pass after grace = %+v", p)
	}
	if r := re.l.mustGet(t, osKey("n1", "mine")); r.State != ledger.StateLive {
		t.Errorf("an unmanaged sandbox was reaped: %+v", r)
	}
	if got := metricValue(t, re.l, "tether_sandbox_reaps_total", "reason", protocol.ReasonUnowned); got != 2 {
		t.Errorf("reaps{unowned} = %v", got)
	}
}

func TestReaperPartitionThenHeal(t *testing.T) {
	re := newReaperEnv(t)
	ctx := testContext(t)
	if _, err := re.l.OpenLease(ctx, "r1", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	inv := sandboxes(6, "r1")
	re.l.reconcile(t, "n1", re.clock.Now(), inv[:3], complete())
	re.l.reconcile(t, "n2", re.clock.Now(), inv[3:], complete())
	re.pass(t)

	// n2 is cut off while the run dies.
	re.fleet.set("n2", true)
	re.clock.Advance(2 * time.Minute)
	p := re.pass(t)
	if p.Reaped != 3 || p.Blocked != 3 {
		t.Fatalf("pass during the partition = %+v", p)
	}
	for _, c := range re.r.Plan() {
		if c.Record.Node != "n2" || c.Blocked != "node is unreachable" {
			t.Errorf("candidate %v", c)
		}
	}
	// The node is back, but no inventory since: still nothing deleted.
	re.fleet.set("n2", false)
	if p := re.pass(t); p.Reaped != 0 || p.Blocked != 3 {
		t.Fatalf("pass after reconnect, before an inventory = %+v", p)
	}
	if c := re.r.Plan(); len(c) != 3 || !strings.Contains(c[0].Blocked, "no inventory since") {
		t.Errorf("plan = %v", c)
	}
	// An incomplete inventory is not enough either.
	re.clock.Advance(time.Second)
	re.l.reconcile(t, "n2", re.clock.Now(), inv[3:4], []protocol.GatewayStatus{{Target: "openshell", Provider: protocol.ProviderOpenShell, Error: "page 2: unavailable"}})
	if c := re.r.Plan(); len(c) != 3 || !strings.Contains(c[0].Blocked, "incomplete") {
		t.Fatalf("plan after an incomplete inventory = %v", c)
	}
	if re.del.count() != 3 {
		t.Fatalf("%d deletes, want only n1's 3", re.del.count())
	}
	// A complete one heals it.
	re.clock.Advance(time.Second)
	re.l.reconcile(t, "n2", re.clock.Now(), inv[3:], complete())
	if p := re.pass(t); p.Reaped != 3 {
		t.Fatalf("pass after heal = %+v", p)
	}
	if s := states(re.l, ledger.Filter{}); s[ledger.StateDeleted] != 6 {
		t.Errorf("states = %v", s)
	}
}

func TestReaperNodeLost(t *testing.T) {
	re := newReaperEnv(t)
	events := subscribeEvents(t, re.l.nc)
	inv := sandboxes(3, "r1")
	re.l.reconcile(t, "n1", re.clock.Now(), inv, complete())
	re.fleet.set("n1", true)
	re.clock.Advance(4 * time.Minute)
	if p := re.pass(t); p.Lost != 0 {
		t.Fatalf("lost too early: %+v", p)
	}
	re.clock.Advance(2 * time.Minute)
	if p := re.pass(t); p.Lost != 3 {
		t.Fatalf("pass = %+v, want 3 lost", p)
	}
	events.wait(t, protocol.EventLost)
	if s := states(re.l, ledger.Filter{}); s[ledger.StateLost] != 3 {
		t.Fatalf("states = %v", s)
	}
	// Lost records are never reaped, even past grace, until the node is back.
	re.clock.Advance(2 * time.Hour)
	if p := re.pass(t); p.Reaped != 0 || p.Blocked != 3 {
		t.Fatalf("pass with lost records = %+v", p)
	}
	// Back: the inventory decides.
	re.fleet.set("n1", false)
	re.clock.Advance(time.Second)
	re.l.reconcile(t, "n1", re.clock.Now(), inv[:1], complete())
	if s := states(re.l, ledger.Filter{}); s[ledger.StateLive] != 1 || s[ledger.StateDeleted] != 2 {
		t.Errorf("states after the node returned = %v", s)
	}
}

func TestReaperRetriesThenLeaks(t *testing.T) {
	re := newReaperEnv(t, func(c *ledger.ReaperConfig) { c.MaxAttempts = 3; c.Backoff = time.Second })
	ctx := testContext(t)
	re.l.reconcile(t, "n1", re.clock.Now(), sandboxes(2, "r1"), complete())
	if _, err := re.l.CloseLease(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	gone := sandboxes(2, "r1")[1].ID
	re.del.fn = func(r ledger.Record) error {
		if r.ID == gone {
			return fmt.Errorf("delete %s: %w", r.ID, gateway.ErrNotFound)
		}
		return errors.New("gateway: unavailable")
	}
	p := re.pass(t)
	if p.Reaped != 1 || p.Failed != 1 {
		t.Fatalf("first pass = %+v", p)
	}
	if r := re.l.mustGet(t, osKey("n1", gone)); r.State != ledger.StateDeleted {
		t.Errorf("not-found sandbox: state %s, want deleted", r.State)
	}
	bad := osKey("n1", sandboxes(1, "r1")[0].ID)
	if r := re.l.mustGet(t, bad); r.State != ledger.StateDeleting || r.Attempts != 1 || r.LastError != "gateway: unavailable" {
		t.Errorf("failing sandbox = %+v", r)
	}
	// Backing off: the next pass right away does not retry.
	if p := re.pass(t); p.Failed != 0 || p.Blocked != 1 {
		t.Errorf("pass within backoff = %+v", p)
	}
	re.clock.Advance(time.Second + time.Millisecond)
	if p := re.pass(t); p.Failed != 1 {
		t.Errorf("second attempt = %+v", p)
	}
	re.clock.Advance(2*time.Second + time.Millisecond) // doubled
	if p := re.pass(t); p.Leaked != 1 {
		t.Errorf("third attempt = %+v", p)
	}
	if r := re.l.mustGet(t, bad); r.State != ledger.StateLeaked || r.Attempts != 3 {
		t.Errorf("after max attempts = %+v", r)
	}
	if got := metricValue(t, re.l, "tether_sandbox_reap_failures_total", "", ""); got != 3 {
		t.Errorf("reap failures = %v", got)
	}
	if got := metricValue(t, re.l, "tether_sandbox_leaked_total", "", ""); got != 1 {
		t.Errorf("leaked = %v", got)
	}
	re.clock.Advance(time.Hour)
	if p := re.pass(t); p.Candidates != 0 {
		t.Errorf("a leaked sandbox is still a candidate: %+v", p)
	}
}

func TestReaperDryRun(t *testing.T) {
	re := newReaperEnv(t, func(c *ledger.ReaperConfig) { c.DryRun = true })
	ctx := testContext(t)
	re.l.reconcile(t, "n1", re.clock.Now(), sandboxes(3, "r1"), complete())
	if _, err := re.l.CloseLease(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	before := re.l.List(ledger.Filter{})
	p := re.pass(t)
	if p.Candidates != 3 || p.Reaped != 0 || re.del.count() != 0 {
		t.Fatalf("dry-run pass = %+v, %d deletes", p, re.del.count())
	}
	plan := re.r.PlanRun("r1")
	if len(plan) != 3 || plan[0].Reason != protocol.ReasonRunClosed || plan[0].Blocked != "" {
		t.Errorf("plan = %v", plan)
	}
	if len(re.r.PlanRun("other")) != 0 {
		t.Error("PlanRun(other) is not empty")
	}
	after := re.l.List(ledger.Filter{})
	if !slices.EqualFunc(before, after, func(a, b ledger.Record) bool { return a.Revision == b.Revision }) {
		t.Error("a dry run changed records")
	}
}

func TestTwoReapersFencing(t *testing.T) {
	re := newReaperEnv(t, func(c *ledger.ReaperConfig) { c.BatchSize = 1; c.Concurrency = 1 })
	other := re.open()
	r2 := re.newReaper(t, other, func(c *ledger.ReaperConfig) { c.BatchSize = 1; c.Concurrency = 1 })
	ctx := testContext(t)
	re.l.reconcile(t, "n1", re.clock.Now(), sandboxes(4, "r1"), complete())
	checkFor(t, defaultTestTimeout, func() error {
		if other.LiveOn("n1") != 4 {
			return errors.New("second ledger not caught up")
		}
		return nil
	})
	if p := re.pass(t); !p.Leader {
		t.Fatalf("first reaper did not take the lock: %+v", p)
	}
	if p, err := r2.ReapOnce(ctx); err != nil || p.Leader {
		t.Fatalf("second reaper took a held lock: %+v, %v", p, err)
	}
	if _, err := re.l.CloseLease(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	checkFor(t, defaultTestTimeout, func() error {
		if _, ok := other.LeaseOf("r1"); !ok {
			return errors.New("second ledger has not seen the close")
		}
		return nil
	})
	// While the first reaper deletes its first sandbox, its lock expires
	// and the second reaper takes over and runs a pass of its own.
	var (
		mu      sync.Mutex
		by      = map[string][]string{}
		current = "r1"
		p2      ledger.Pass
		taken   atomic.Bool
	)
	re.del.fn = func(r ledger.Record) error {
		mu.Lock()
		who := current
		by[who] = append(by[who], r.ID)
		mu.Unlock()
		if who == "r1" && taken.CompareAndSwap(false, true) {
			re.clock.Advance(ledger.DefaultLockTTL + time.Second)
			mu.Lock()
			current = "r2"
			mu.Unlock()
			var err error
			if p2, err = r2.ReapOnce(ctx); err != nil {
				t.Errorf("second reaper: %v", err)
			}
			mu.Lock()
			current = "r1"
			mu.Unlock()
		}
		return nil
	}
	p1 := re.pass(t)
	if !p1.Fenced || !p2.Leader {
		t.Errorf("first reaper %+v, second %+v: want the first fenced and the second leading", p1, p2)
	}
	if len(by["r1"]) != 1 {
		t.Errorf("fenced reaper deleted %v, want only its first", by["r1"])
	}
	if s := states(re.l, ledger.Filter{}); s[ledger.StateDeleted] != 4 {
		checkFor(t, defaultTestTimeout, func() error {
			if s := states(re.l, ledger.Filter{}); s[ledger.StateDeleted] != 4 {
				return fmt.Errorf("states %v", s)
			}
			return nil
		})
	}
	// The first reaper is no longer the leader; its next pass does nothing.
	if p := re.pass(t); p.Leader {
		t.Errorf("fenced reaper leads again: %+v", p)
	}
}

func TestReaperPurgesAfterRetention(t *testing.T) {
	re := newReaperEnv(t)
	ctx := testContext(t)
	inv := sandboxes(3, "r1")
	re.l.reconcile(t, "n1", re.clock.Now(), inv, complete())
	if _, err := re.l.CloseLease(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	if _, err := re.l.OpenLease(ctx, "idle", "", time.Minute); err != nil {
		t.Fatal(err)
	}
	if p := re.pass(t); p.Reaped != 3 || p.Purged != 0 {
		t.Fatalf("first pass = %+v", p)
	}
	re.clock.Advance(ledger.DefaultRetention + time.Second)
	if p := re.pass(t); p.Purged != 3 {
		t.Fatalf("pass after the retention = %+v, want the 3 records purged", p)
	}
	checkFor(t, defaultTestTimeout, func() error {
		if n := re.l.Len(); n != 0 {
			return fmt.Errorf("%d records left", n)
		}
		return nil
	})
	// The closed lease and the expired one go a day after they ended.
	re.clock.Advance(ledger.DefaultLeaseRetention)
	if p := re.pass(t); p.Purged != 2 {
		t.Fatalf("pass after the lease retention = %+v, want 2 leases purged", p)
	}
	checkFor(t, defaultTestTimeout, func() error {
		if ls := re.l.Leases(); len(ls) != 0 {
			return fmt.Errorf("leases left: %v", ls)
		}
		return nil
	})
	// A sandbox of the purged run found later is unowned: reaped after
	// the grace period.
	re.l.reconcile(t, "n1", re.clock.Now(), inv[:1], complete())
	if c := re.r.Plan(); len(c) != 0 {
		t.Fatalf("plan within grace = %v", c)
	}
	re.clock.Advance(ledger.DefaultGrace + time.Second)
	if c := re.r.Plan(); len(c) != 1 || c[0].Reason != protocol.ReasonUnowned {
		t.Fatalf("plan after grace = %v", c)
	}
}

func TestReaperConfig(t *testing.T) {
	e := newEnv(t)
	l := e.open()
	if _, err := ledger.NewReaper(l.Ledger, ledger.ReaperConfig{}); err == nil || !strings.Contains(err.Error(), "deleter is required") || !strings.Contains(err.Error(), "fleet view is required") {
		t.Errorf("empty config: %v", err)
	}
	if _, err := ledger.NewReaper(l.Ledger, ledger.ReaperConfig{Deleter: &deleter{}, Fleet: newFleet(), Interval: time.Minute, LockTTL: time.Second}); err == nil {
		t.Error("a lock TTL under the interval was accepted")
	}
}

// sessionFleet is a fleet that also says when each node's session began.
type sessionFleet struct {
	*fleet
	mu    sync.Mutex
	since map[string]time.Time
}

func (f *sessionFleet) ConnectedSince(node string) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.since[node]
	return t, ok
}

func TestReaperWaitsForInventoryAfterReconnect(t *testing.T) {
	sf := &sessionFleet{fleet: newFleet(), since: map[string]time.Time{}}
	re := newReaperEnv(t, func(c *ledger.ReaperConfig) { c.Fleet = sf })
	re.l.reconcile(t, "n1", re.clock.Now(), sandboxes(2, "r1"), complete())
	if _, err := re.l.CloseLease(testContext(t), "r1"); err != nil {
		t.Fatal(err)
	}
	// The node flapped between two passes: the reaper never saw it down,
	// but its session is newer than its last inventory.
	re.clock.Advance(time.Second)
	sf.mu.Lock()
	sf.since["n1"] = re.clock.Now()
	sf.mu.Unlock()
	if c := re.r.Plan(); len(c) != 2 || c[0].Blocked != "no inventory since the node reconnected" {
		t.Fatalf("plan = %v", c)
	}
	if p := re.pass(t); p.Reaped != 0 {
		t.Fatalf("pass = %+v", p)
	}
	re.clock.Advance(time.Second)
	re.l.reconcile(t, "n1", re.clock.Now(), sandboxes(2, "r1"), complete())
	if p := re.pass(t); p.Reaped != 2 {
		t.Fatalf("pass after an inventory = %+v", p)
	}
}

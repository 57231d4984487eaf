package ledger_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/protocol"
)

func TestCreatedLookupsAndAttribution(t *testing.T) {
	e := newEnv(t)
	l := e.open()
	ctx := testContext(t)
	// Ids and nodes that are not valid KV tokens as they are.
	weird := ledger.Record{Provider: protocol.ProviderOpenSandbox, Node: "node.a", ID: "id with spaces/and.dots=",
		Labels: map[string]string{"nemo-gym.nvidia.com/run": "r1", "nemo-gym.nvidia.com/team": "t", "user": "bare-user", "workload": "  "}}
	if err := l.Created(ctx, weird); err != nil {
		t.Fatal(err)
	}
	os := ledger.Record{Provider: protocol.ProviderOpenShell, Node: "n1", ID: "uuid-1", Workspace: "default", Name: "sb1", TTL: time.Hour, Owner: "run-x"}
	if err := l.Created(ctx, os); err != nil {
		t.Fatal(err)
	}
	got, ok := l.ByID(protocol.ProviderOpenSandbox, weird.ID)
	if !ok {
		t.Fatal("ByID: not found")
	}
	if got.Run != "r1" || got.Team != "t" || got.User != "bare-user" || got.Workload != "" || !got.Managed ||
		got.State != ledger.StateLive || got.Source != ledger.SourceFacade || got.Revision == 0 {
		t.Errorf("record = %+v", got)
	}
	if r, ok := l.ByName(protocol.ProviderOpenShell, "default", "sb1"); !ok || r.ID != "uuid-1" || r.TTL != time.Hour || r.OwnerLease() != "run-x" {
		t.Errorf("ByName = %+v, %v", r, ok)
	}
	if n := l.LiveOn("n1"); n != 1 {
		t.Errorf("LiveOn(n1) = %d", n)
	}
	if rs := l.List(ledger.Filter{Run: "run-x"}); len(rs) != 1 || rs[0].ID != "uuid-1" {
		t.Errorf("List(run-x) = %v", rs)
	}
	if err := l.Deleting(ctx, os.Key()); err != nil {
		t.Fatal(err)
	}
	if n := l.LiveOn("n1"); n != 0 {
		t.Errorf("LiveOn(n1) after Deleting = %d", n)
	}
	if err := l.Deleted(ctx, os.Key()); err != nil {
		t.Fatal(err)
	}
	if r := l.mustGet(t, os.Key()); r.State != ledger.StateDeleted {
		t.Errorf("state = %s, want deleted", r.State)
	}
	// A fresh ledger loads the same records from the bucket.
	l2 := e.open()
	if diff := cmp.Diff(l.List(ledger.Filter{}), l2.List(ledger.Filter{})); diff != "" {
		t.Errorf("reloaded ledger differs (-first +second):\n%s", diff)
	}
	// Unknown keys are ignored; invalid ones refused.
	if err := l.Deleted(ctx, osKey("n1", "nope")); err != nil {
		t.Errorf("Deleted(unknown) = %v", err)
	}
	if err := l.Created(ctx, ledger.Record{Provider: "docker", Node: "n1", ID: "x"}); err == nil {
		t.Error("Created with an unknown provider succeeded")
	}
}

func TestReconcileConvergence(t *testing.T) {
	e := newEnv(t)
	l := e.open()
	ctx := testContext(t)
	inv := sandboxes(4, "r1")
	l.reconcile(t, "n1", e.clock.Now(), inv, complete())
	if rs := l.List(ledger.Filter{Node: "n1", State: "live"}); len(rs) != 4 {
		t.Fatalf("%d live records after the first inventory, want 4", len(rs))
	}
	r0 := l.mustGet(t, osKey("n1", inv[0].ID))
	if r0.Source != ledger.SourceInventory || !r0.Managed || r0.Run != "r1" || r0.Name != "sb-r1-0" {
		t.Errorf("record from inventory = %+v", r0)
	}
	// A facade sets Owner and TTL; inventories never overwrite them.
	if err := l.Created(ctx, ledger.Record{Provider: protocol.ProviderOpenShell, Node: "n1", ID: inv[1].ID, Owner: "lease-9", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}

	e.clock.Advance(time.Minute)
	listedAt := e.clock.Now()
	e.clock.Advance(time.Second)
	// Created by the facade after the listing started: the listing cannot
	// have it, and it must survive.
	late := ledger.Record{Provider: protocol.ProviderOpenShell, Node: "n1", ID: "late", Name: "late", Workspace: "default"}
	if err := l.Created(ctx, late); err != nil {
		t.Fatal(err)
	}
	next := append([]protocol.Sandbox{}, inv[1:]...) // inv[0] is gone
	next[0].Labels = map[string]string{"nemo-gym.sandbox": "1", "run": "r1", "extra": "x"}
	next[1].Deleting = true
	l.reconcile(t, "n1", listedAt, next, complete())

	for _, c := range []struct {
		id    string
		state ledger.State
	}{{inv[0].ID, ledger.StateDeleted}, {inv[1].ID, ledger.StateLive}, {inv[2].ID, ledger.StateDeleting}, {inv[3].ID, ledger.StateLive}, {"late", ledger.StateLive}} {
		if r := l.mustGet(t, osKey("n1", c.id)); r.State != c.state {
			t.Errorf("%s: state %s, want %s", c.id, r.State, c.state)
		}
	}
	r1 := l.mustGet(t, osKey("n1", inv[1].ID))
	if r1.Owner != "lease-9" || r1.TTL != time.Minute || r1.Labels["extra"] != "x" {
		t.Errorf("refreshed record lost facade fields or missed labels: %+v", r1)
	}
	if got := metricValue(t, l, "tether_ledger_disagreements_total", "kind", "gateway_missing"); got != 1 {
		t.Errorf("gateway_missing disagreements = %v, want 1", got)
	}

	// An incomplete listing of an empty gateway changes nothing it lacks.
	e.clock.Advance(time.Minute)
	l.reconcile(t, "n1", e.clock.Now(), nil, []protocol.GatewayStatus{{Target: "openshell", Provider: protocol.ProviderOpenShell, Complete: false, Error: "boom"}})
	if rs := l.List(ledger.Filter{Node: "n1", State: "live"}); len(rs) != 3 {
		t.Errorf("%d live records after an incomplete listing, want 3", len(rs))
	}
	// Nor does a complete listing of another provider.
	l.reconcile(t, "n1", e.clock.Now(), nil, []protocol.GatewayStatus{
		{Target: "openshell", Provider: protocol.ProviderOpenShell, Complete: false},
		{Target: "opensandbox", Provider: protocol.ProviderOpenSandbox, Complete: true}})
	if rs := l.List(ledger.Filter{Node: "n1", State: "live"}); len(rs) != 3 {
		t.Errorf("%d live records after another provider's listing, want 3", len(rs))
	}

	// The gateway lists a sandbox the ledger had deleted: it is live again.
	if err := l.Deleted(ctx, osKey("n1", inv[3].ID)); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second)
	l.reconcile(t, "n1", e.clock.Now(), next, complete())
	if r := l.mustGet(t, osKey("n1", inv[3].ID)); r.State != ledger.StateLive {
		t.Errorf("deleted record listed again: state %s, want live", r.State)
	}
	if got := metricValue(t, l, "tether_ledger_disagreements_total", "kind", "gateway_has_deleted"); got != 1 {
		t.Errorf("gateway_has_deleted disagreements = %v, want 1", got)
	}
	// "late" was not seen since an earlier listing: now it is deleted.
	if r := l.mustGet(t, osKey("n1", "late")); r.State != ledger.StateDeleted {
		t.Errorf("late: state %s, want deleted", r.State)
	}

	// An unchanged inventory writes nothing.
	rev := l.mustGet(t, osKey("n1", inv[1].ID)).Revision
	l.reconcile(t, "n1", e.clock.Now(), next, complete())
	if r := l.mustGet(t, osKey("n1", inv[1].ID)); r.Revision != rev {
		t.Errorf("unchanged inventory rewrote a record: revision %d -> %d", rev, r.Revision)
	}
}

// metricValue returns the value of the series of name with the label
// label=value (label "" for an unlabelled one) in l's registry.
func metricValue(tb testing.TB, l *testLedger, name, label, value string) float64 {
	tb.Helper()
	mfs, err := l.reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, lp := range m.GetLabel() {
				match = match || lp.GetName() == label && lp.GetValue() == value
			}
			if !match {
				continue
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	tb.Fatalf("no series %s{%s=%q}", name, label, value)
	return 0
}

func TestMetricsGauge(t *testing.T) {
	e := newEnv(t)
	l := e.open()
	l.reconcile(t, "n1", e.clock.Now(), sandboxes(2, "r1"), complete())
	if err := l.Deleted(testContext(t), osKey("n1", sandboxes(2, "r1")[0].ID)); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP tether_sandboxes Sandbox records in the ledger, by provider, node and state (every coordinator reports the whole shared ledger).
# TYPE tether_sandboxes gauge
tether_sandboxes{node="n1",provider="openshell",state="deleted"} 1
tether_sandboxes{node="n1",provider="openshell",state="deleting"} 0
tether_sandboxes{node="n1",provider="openshell",state="leaked"} 0
tether_sandboxes{node="n1",provider="openshell",state="live"} 1
tether_sandboxes{node="n1",provider="openshell",state="lost"} 0
`
	if err := testutil.GatherAndCompare(l.reg, strings.NewReader(want), "tether_sandboxes"); err != nil {
		t.Error(err)
	}
}

// tether_leases counts the leases by state, as the clock sees them at
// scrape time.
func TestMetricsLeases(t *testing.T) {
	e := newEnv(t)
	l := e.open()
	ctx := testContext(t)
	for _, run := range []string{"run-a", "run-b", "run-c"} {
		if _, err := l.OpenLease(ctx, run, "", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.CloseLease(ctx, "run-c"); err != nil {
		t.Fatal(err)
	}
	gauges := func() string {
		return fmt.Sprintf("open=%v expired=%v closed=%v", metricValue(t, l, "tether_leases", "state", "open"),
			metricValue(t, l, "tether_leases", "state", "expired"), metricValue(t, l, "tether_leases", "state", "closed"))
	}
	checkFor(t, defaultTestTimeout, func() error {
		if g := gauges(); g != "open=2 expired=0 closed=1" {
			return fmt.Errorf("%s, want open=2 expired=0 closed=1", g)
		}
		return nil
	})
	e.clock.Advance(30 * time.Second)
	if _, err := l.RenewLease(ctx, "run-a"); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(45 * time.Second) // run-b's minute is over, run-a's renewal is not
	checkFor(t, defaultTestTimeout, func() error {
		if g := gauges(); g != "open=1 expired=1 closed=1" {
			return fmt.Errorf("%s, want open=1 expired=1 closed=1", g)
		}
		return nil
	})
}

func TestTwoLedgersShareState(t *testing.T) {
	e := newEnv(t)
	a, b := e.open(), e.open()
	ctx := testContext(t)
	inv := sandboxes(20, "r1")
	a.reconcile(t, "n1", e.clock.Now(), inv, complete())
	checkFor(t, defaultTestTimeout, func() error {
		if n := b.LiveOn("n1"); n != 20 {
			return fmt.Errorf("b sees %d live records, want 20", n)
		}
		return nil
	})
	// Concurrent writers on both ledgers to the same records: CAS keeps
	// every change (Owner from a, ExpiresAt from b).
	exp := e.clock.Now().Add(time.Hour).Truncate(time.Millisecond)
	var wg sync.WaitGroup
	for i, s := range inv {
		k := osKey("n1", s.ID)
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := a.Created(ctx, ledger.Record{Provider: k.Provider, Node: k.Node, ID: k.ID, Owner: fmt.Sprintf("o%d", i)}); err != nil {
				t.Error(err)
			}
		}()
		go func() {
			defer wg.Done()
			if err := b.SetExpiry(ctx, k, exp); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	checkFor(t, defaultTestTimeout, func() error {
		for _, l := range []*testLedger{a, b} {
			for i, s := range inv {
				r, _ := l.ByID(protocol.ProviderOpenShell, s.ID)
				if r.Owner != fmt.Sprintf("o%d", i) || !r.ExpiresAt.Equal(exp) {
					return fmt.Errorf("record %d: owner %q expires %v", i, r.Owner, r.ExpiresAt)
				}
			}
		}
		return nil
	})
	if diff := cmp.Diff(a.List(ledger.Filter{}), b.List(ledger.Filter{})); diff != "" {
		t.Errorf("ledgers differ (-a +b):\n%s", diff)
	}
}

func TestLeases(t *testing.T) {
	e := newEnv(t)
	l := e.open()
	ctx := testContext(t)
	ls, err := l.OpenLease(ctx, "run-1", "host:42", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !ls.ExpiresAt.Equal(e.clock.Now().Add(30*time.Second)) || ls.Holder != "host:42" || ls.Closed {
		t.Errorf("opened lease = %+v", ls)
	}
	e.clock.Advance(20 * time.Second)
	if ls, err = l.RenewLease(ctx, "run-1"); err != nil || !ls.ExpiresAt.Equal(e.clock.Now().Add(30*time.Second)) {
		t.Errorf("renew = %+v, %v", ls, err)
	}
	if _, err := l.RenewLease(ctx, "run-2"); !errors.Is(err, ledger.ErrLeaseNotFound) {
		t.Errorf("renew of an unknown run: %v, want ErrLeaseNotFound", err)
	}
	if ls, err = l.CloseLease(ctx, "run-1"); err != nil || !ls.Closed {
		t.Errorf("close = %+v, %v", ls, err)
	}
	if _, err := l.RenewLease(ctx, "run-1"); !errors.Is(err, ledger.ErrLeaseClosed) {
		t.Errorf("renew of a closed run: %v, want ErrLeaseClosed", err)
	}
	if _, err := l.OpenLease(ctx, "run-1", "", 0); !errors.Is(err, ledger.ErrLeaseClosed) {
		t.Errorf("reopen of a closed run: %v, want ErrLeaseClosed", err)
	}
	if ls, err = l.CloseLease(ctx, "never.opened"); err != nil || !ls.Closed {
		t.Errorf("close of an unknown run = %+v, %v", ls, err)
	}
	for _, bad := range []string{"", "-x", "a/b", strings.Repeat("a", 129)} {
		if _, err := l.OpenLease(ctx, bad, "", 0); err == nil {
			t.Errorf("OpenLease(%q) succeeded", bad)
		}
	}
	if _, err := l.OpenLease(ctx, "run-3", "", time.Millisecond); err == nil {
		t.Error("OpenLease with a 1ms TTL succeeded")
	}
	// A long run id reaches NeMo Gym's labels cut to 63 characters: the
	// lease still owns them.
	long := strings.Repeat("r", 70)
	if _, err := l.OpenLease(ctx, long, "", 0); err != nil {
		t.Fatal(err)
	}
	if got, ok := l.LeaseOf(strings.Repeat("r", 63)); !ok || got.Run != long {
		t.Errorf("LeaseOf(label form) = %+v, %v", got, ok)
	}
	// Another ledger sees the leases.
	l2 := e.open()
	if diff := cmp.Diff(l.Leases(), l2.Leases()); diff != "" {
		t.Errorf("leases differ (-first +second):\n%s", diff)
	}
}

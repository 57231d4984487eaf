package ledger_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/protocol"
)

// Only NeMo Gym's sandboxes (marker label) and sandboxes with an owning
// run are managed; a plain user's sandbox created through a facade is
// recorded but never reaped as unowned (its TTL still applies).
func TestCreatedManagedOnlyWhenMarkedOrOwned(t *testing.T) {
	re := newReaperEnv(t)
	ctx := testContext(t)
	re.l.reconcile(t, "n1", re.clock.Now(), nil, complete())
	mk := func(id string, labels map[string]string, owner string, ttl time.Duration) ledger.Record {
		// The facades pass Managed true; the ledger decides.
		return ledger.Record{Provider: protocol.ProviderOpenSandbox, Node: "n1", ID: id, Labels: labels, Owner: owner, TTL: ttl,
			Managed: true, State: ledger.StateLive, Source: ledger.SourceFacade}
	}
	for _, r := range []ledger.Record{
		mk("plain", map[string]string{"app": "mine"}, "", 0),
		mk("plain-ttl", nil, "", 90*time.Minute),
		mk("marked", map[string]string{"nemo-gym.sandbox": "1"}, "", 0),
		mk("owned", nil, "run-o", 0),
		mk("run-label", map[string]string{"nemo-gym.nvidia.com/run": "run-l"}, "", 0),
	} {
		if err := re.l.Created(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := re.l.Register(ctx, ledger.Record{Provider: protocol.ProviderOpenSandbox, Node: "n1", ID: "registered"}); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"plain": false, "plain-ttl": false, "marked": true, "owned": true, "run-label": true, "registered": true}
	for id, managed := range want {
		if r := re.l.mustGet(t, ledger.Key{Provider: protocol.ProviderOpenSandbox, Node: "n1", ID: id}); r.Managed != managed {
			t.Errorf("%s: managed %v, want %v", id, r.Managed, managed)
		}
	}
	// A metadata update without the marker keeps a managed record managed.
	if err := re.l.Created(ctx, mk("marked", map[string]string{"x": "y"}, "", 0)); err != nil {
		t.Fatal(err)
	}
	if r := re.l.mustGet(t, ledger.Key{Provider: protocol.ProviderOpenSandbox, Node: "n1", ID: "marked"}); !r.Managed {
		t.Error("a managed record lost Managed on an update")
	}

	re.clock.Advance(2 * time.Hour)
	got := map[string]string{}
	for _, c := range re.r.Plan() {
		got[c.Record.ID] = c.Reason
	}
	wantReasons := map[string]string{
		"plain-ttl": protocol.ReasonTTLExpired, "marked": protocol.ReasonUnowned, "owned": protocol.ReasonUnowned,
		"run-label": protocol.ReasonUnowned, "registered": protocol.ReasonUnowned,
	}
	if fmt.Sprint(got) != fmt.Sprint(wantReasons) {
		t.Errorf("plan after the grace period = %v, want %v", got, wantReasons)
	}
}

// manyLabels returns n labels of about 80 bytes each, with NeMo Gym's
// marker and attribution among them.
func manyLabels(n int, run string) map[string]string {
	m := make(map[string]string, n+4)
	for k, v := range map[string]string{"nemo-gym.sandbox": "1", "nemo-gym.nvidia.com/run": run, "team": "gym-team", "zzz-user": "u"} {
		m[k] = v
	}
	// One shared value and no fmt: 200k Sprintf calls took 3-8 s under
	// -race on a loaded machine.
	v := strings.Repeat("v", 64)
	for i := range n {
		m["key-"+strconv.Itoa(10_000_000 + i)[1:]] = v // key-0000000, key-0000001, ...
	}
	return m
}

// The ledger stores a bounded copy of labels: a 200k-entry metadata map
// is recorded (it was refused as over 1 MiB), keeping the marker and the
// attribution, and marked truncated; an agent's truncation is kept.
func TestLabelsBounded(t *testing.T) {
	e := newEnv(t)
	l := e.open()
	huge := manyLabels(200_000, "run-big")
	huge["long"] = strings.Repeat("é", 400) // 800 bytes, clipped at a rune boundary
	// The write's deadline starts once the labels exist: bounding 200k
	// labels is the ledger's work, building them is not.
	ctx := testContext(t)
	k := ledger.Key{Provider: protocol.ProviderOpenSandbox, Node: "n1", ID: "big"}
	if err := l.Created(ctx, ledger.Record{Provider: k.Provider, Node: k.Node, ID: k.ID, Labels: huge}); err != nil {
		t.Fatalf("Created with 200k labels: %v", err)
	}
	r := l.mustGet(t, k)
	size := 0
	for k, v := range r.Labels {
		size += len(k) + len(v)
	}
	if !r.LabelsTruncated || len(r.Labels) > protocol.MaxRecordLabels || size > protocol.MaxRecordLabelBytes ||
		r.Labels["nemo-gym.sandbox"] != "1" || r.Labels["team"] != "gym-team" || r.Run != "run-big" || r.Team != "gym-team" || !r.Managed ||
		r.Labels["key-0000000"] == "" || r.Labels["zzz-user"] != "" {
		t.Errorf("bounded record: truncated %v, %d labels, %d bytes, run %q, team %q, managed %v", r.LabelsTruncated, len(r.Labels), size, r.Run, r.Team, r.Managed)
	}
	if v, ok := r.Labels["long"]; ok && (len(v) > protocol.MaxLabelValueLen || !strings.HasPrefix(huge["long"], v) || len(v)%2 != 0) {
		t.Errorf("long value clipped to %d bytes", len(v))
	}

	// Inventory: 10,000 labels are bounded too; small ones stay verbatim;
	// an agent's cut is kept.
	inv := []protocol.Sandbox{
		{Provider: protocol.ProviderOpenShell, ID: "tenk", Name: "tenk", Workspace: "default", Labels: manyLabels(10_000, "run-10k")},
		{Provider: protocol.ProviderOpenShell, ID: "small", Name: "small", Workspace: "default", Labels: map[string]string{"a": "b"}},
		{Provider: protocol.ProviderOpenShell, ID: "agentcut", Name: "agentcut", Workspace: "default", Labels: map[string]string{"a": "b"}, LabelsTruncated: true},
	}
	l.reconcile(t, "n2", e.clock.Now(), inv, complete())
	if r := l.mustGet(t, osKey("n2", "tenk")); !r.LabelsTruncated || len(r.Labels) != protocol.MaxRecordLabels || r.Run != "run-10k" {
		t.Errorf("tenk: truncated %v, %d labels, run %q", r.LabelsTruncated, len(r.Labels), r.Run)
	}
	if r := l.mustGet(t, osKey("n2", "small")); r.LabelsTruncated || len(r.Labels) != 1 {
		t.Errorf("small: %+v", r)
	}
	if r := l.mustGet(t, osKey("n2", "agentcut")); !r.LabelsTruncated {
		t.Errorf("agentcut: LabelsTruncated lost")
	}
	// A second identical inventory changes nothing (the bounded copy is
	// stable).
	before := l.mustGet(t, osKey("n2", "tenk")).Revision
	e.clock.Advance(time.Second)
	l.reconcile(t, "n2", e.clock.Now(), inv, complete())
	if after := l.mustGet(t, osKey("n2", "tenk")).Revision; after != before {
		t.Errorf("an unchanged inventory rewrote the record (revision %d -> %d)", before, after)
	}
}

// A list page of records with many labels ends before the reply passes
// the server's max payload, and paging still visits every record.
func TestListPagesFitMaxPayload(t *testing.T) {
	re := newReaperEnv(t)
	svc, err := micro.AddService(re.l.nc, micro.Config{Name: protocol.ServiceName, Version: "0.1.0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Stop() })
	if err := re.l.AddEndpoints(svc, re.r); err != nil {
		t.Fatal(err)
	}
	if err := re.l.nc.Flush(); err != nil { // subscriptions first, then requests
		t.Fatal(err)
	}
	c := apiClient{t, re.conn()}
	inv := sandboxes(300, "fat")
	for i := range inv {
		inv[i].Labels = manyLabels(100, "fat")
	}
	re.l.reconcile(t, "n1", re.clock.Now(), inv, complete())
	seen := map[string]bool{}
	after := ""
	pages := 0
	for ; ; pages++ {
		var page protocol.SandboxesListResponse
		if e := c.call(protocol.SubjectSandboxesList, protocol.SandboxesListRequest{After: after}, &page); e != nil {
			t.Fatalf("page %d: %v", pages, e)
		}
		for _, s := range page.Sandboxes {
			if seen[s.ID] {
				t.Fatalf("%s listed twice", s.ID)
			}
			seen[s.ID] = true
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	if len(seen) != 300 || pages == 0 {
		t.Errorf("listed %d records in %d pages, want 300 in more than one", len(seen), pages+1)
	}
	// A reap reply leaves out what does not fit, and says how many.
	var rr protocol.ReapResponse
	if e := c.call(protocol.SubjectSandboxesReap, protocol.ReapRequest{Run: "fat", DryRun: true}, &rr); e != nil || rr.Omitted == 0 || len(rr.Candidates)+rr.Omitted != 300 {
		t.Errorf("reap dry run of 300 large records: %d candidates, %d omitted, %v", len(rr.Candidates), rr.Omitted, e)
	}
}

// A record on a node that never had an inventory becomes lost once
// LostAfter passed since it was first seen, even if it is registered
// again meanwhile.
func TestRegisteredOnNeverSeenNodeBecomesLost(t *testing.T) {
	re := newReaperEnv(t)
	ctx := testContext(t)
	re.fleet.set("nosuch", true)
	reg := ledger.Record{Provider: protocol.ProviderOpenShell, Node: "nosuch", ID: "x", Name: "x", Workspace: "default"}
	if _, err := re.l.Register(ctx, reg); err != nil {
		t.Fatal(err)
	}
	re.clock.Advance(4 * time.Minute)
	if _, err := re.l.Register(ctx, reg); err != nil { // a client retrying
		t.Fatal(err)
	}
	if p := re.pass(t); p.Lost != 0 {
		t.Fatalf("lost too early: %+v", p)
	}
	re.clock.Advance(2 * time.Minute)
	if p := re.pass(t); p.Lost != 1 {
		t.Fatalf("pass = %+v, want the record lost", p)
	}
	if r := re.l.mustGet(t, osKey("nosuch", "x")); r.State != ledger.StateLost {
		t.Errorf("state = %s, want lost", r.State)
	}
}

// apiEnv is a reaper env serving the API with a known-node hook.
func apiEnv(t *testing.T, opts ...ledger.EndpointOption) (*reaperEnv, apiClient) {
	re := newReaperEnv(t)
	svc, err := micro.AddService(re.l.nc, micro.Config{Name: protocol.ServiceName, Version: "0.1.0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Stop() })
	if err := re.l.AddEndpoints(svc, re.r, opts...); err != nil {
		t.Fatal(err)
	}
	// The endpoints' subscriptions reach the server before any request
	// from the client's own connection.
	if err := re.l.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return re, apiClient{t, re.conn()}
}

// Register refuses a node that is not connected and was never
// inventoried.
func TestRegisterUnknownNode(t *testing.T) {
	re, c := apiEnv(t, ledger.WithKnownNode(func(n string) bool { return n == "up" }))
	re.l.reconcile(t, "was-up", re.clock.Now(), nil, complete())
	req := func(node string) protocol.SandboxRegisterRequest {
		return protocol.SandboxRegisterRequest{Provider: protocol.ProviderOpenShell, Node: node, ID: "id-" + node, Name: "sb", Workspace: "default"}
	}
	var info protocol.SandboxInfo
	if e := c.call(protocol.SubjectSandboxesRegister, req("nosuch"), &info); e == nil || e.Status != 404 || e.Code != protocol.ErrCodeUnknownNode || !strings.Contains(e.Message, "nosuch") {
		t.Errorf("register on nosuch: %v, want 404 unknown_node", e)
	}
	if len(re.l.List(ledger.Filter{Node: "nosuch"})) != 0 {
		t.Error("a refused registration left a record")
	}
	for _, n := range []string{"up", "was-up"} {
		if e := c.call(protocol.SubjectSandboxesRegister, req(n), &info); e != nil || info.Node != n {
			t.Errorf("register on %s: %+v, %v", n, info, e)
		}
	}
}

// A dry run of reaping a run previews the real reap: with the run's lease
// live, each of its sandboxes is a candidate (run_closed), blocked where
// its node is unreachable, and nothing changes.
func TestReapDryRunPreviewsClose(t *testing.T) {
	re, c := apiEnv(t)
	ctx := testContext(t)
	if _, err := re.l.OpenLease(ctx, "r1", "", time.Hour); err != nil {
		t.Fatal(err)
	}
	inv := sandboxes(4, "r1")
	re.l.reconcile(t, "n1", re.clock.Now(), inv[:3], complete())
	re.l.reconcile(t, "n2", re.clock.Now(), inv[3:], complete())
	// A run id too long for a label: NeMo Gym labels its sandboxes with
	// the sanitised form.
	long := "run-" + strings.Repeat("x", 70)
	if _, err := re.l.OpenLease(ctx, long, "", time.Hour); err != nil {
		t.Fatal(err)
	}
	longInv := sandboxes(1, "lr")
	longInv[0].Labels["run"] = long[:63]
	re.l.reconcile(t, "n3", re.clock.Now(), longInv, complete())
	re.fleet.set("n2", true)
	before := re.l.List(ledger.Filter{})

	var rr protocol.ReapResponse
	if e := c.call(protocol.SubjectSandboxesReap, protocol.ReapRequest{Run: "r1", DryRun: true}, &rr); e != nil {
		t.Fatal(e)
	}
	blocked := 0
	for _, cd := range rr.Candidates {
		if cd.Reason != protocol.ReasonRunClosed {
			t.Errorf("candidate %s: reason %s", cd.Sandbox.ID, cd.Reason)
		}
		if cd.Blocked != "" {
			blocked++
			if cd.Sandbox.Node != "n2" || cd.Blocked != "node is unreachable" {
				t.Errorf("candidate %s on %s blocked: %s", cd.Sandbox.ID, cd.Sandbox.Node, cd.Blocked)
			}
		}
	}
	if !rr.DryRun || rr.Queued || len(rr.Candidates) != 4 || blocked != 1 {
		t.Errorf("dry run = %+v; want 4 candidates, 1 blocked", rr)
	}
	if e := c.call(protocol.SubjectSandboxesReap, protocol.ReapRequest{Run: long, DryRun: true}, &rr); e != nil || len(rr.Candidates) != 1 || rr.Candidates[0].Reason != protocol.ReasonRunClosed {
		t.Errorf("dry run of the long run = %+v, %v; want its one sandbox", rr, e)
	}
	if ls, ok := re.l.LeaseOf("r1"); !ok || ls.Closed {
		t.Errorf("the dry run closed the lease: %+v", ls)
	}
	after := re.l.List(ledger.Filter{})
	for i := range before {
		if before[i].Revision != after[i].Revision {
			t.Errorf("the dry run changed %s", before[i].Key())
		}
	}
	if p := re.pass(t); p.Reaped != 0 {
		t.Errorf("pass after the dry run = %+v", p)
	}
	// The real reap lists the same.
	var real protocol.ReapResponse
	if e := c.call(protocol.SubjectSandboxesReap, protocol.ReapRequest{Run: long}, &real); e != nil || len(real.Candidates) != 1 {
		t.Errorf("reap of the long run = %+v, %v", real, e)
	}
}

// Reaping a run with no lease and no sandboxes is 404 and burns nothing;
// a closed run's lease_closed says what to do.
func TestReapUnknownRun(t *testing.T) {
	re, c := apiEnv(t)
	for _, dry := range []bool{false, true} {
		var rr protocol.ReapResponse
		e := c.call(protocol.SubjectSandboxesReap, protocol.ReapRequest{Run: "nonexist", DryRun: dry}, &rr)
		if e == nil || e.Status != 404 || e.Code != protocol.ErrCodeNotFound || e.Message != "run nonexist has no lease and no sandboxes" {
			t.Errorf("reap nonexist (dry run %v): %+v, %v; want 404 not_found", dry, rr, e)
		}
	}
	if len(re.l.Leases()) != 0 {
		t.Errorf("leases after reaping an unknown run: %+v", re.l.Leases())
	}
	var ls protocol.LeaseInfo
	if e := c.call(protocol.SubjectLeaseOpen, protocol.LeaseOpenRequest{Run: "nonexist"}, &ls); e != nil || ls.Closed {
		t.Fatalf("open after the refused reap: %+v, %v", ls, e)
	}
	// A run with a lease but no sandboxes is reaped (closed).
	var rr protocol.ReapResponse
	if e := c.call(protocol.SubjectSandboxesReap, protocol.ReapRequest{Run: "nonexist"}, &rr); e != nil || !rr.Queued {
		t.Fatalf("reap of a leased run: %+v, %v", rr, e)
	}
	e := c.call(protocol.SubjectLeaseOpen, protocol.LeaseOpenRequest{Run: "nonexist"}, &ls)
	if e == nil || e.Code != protocol.ErrCodeLeaseClosed || e.Message != "run nonexist was closed; its sandboxes are reaped — start a new run with a new run id" {
		t.Errorf("open after reap: %v", e)
	}
	// A run with records but no lease is reaped too.
	re.l.reconcile(t, "n1", re.clock.Now(), sandboxes(2, "nolease"), complete())
	if e := c.call(protocol.SubjectSandboxesReap, protocol.ReapRequest{Run: "nolease"}, &rr); e != nil || len(rr.Candidates) != 2 {
		t.Errorf("reap of a run with records only: %+v, %v", rr, e)
	}
}

// A live lease has one holder: a second one would close the run under the
// first. The same holder may reopen it, and anyone once it expired.
func TestLeaseHeldByAnother(t *testing.T) {
	re, c := apiEnv(t)
	var ls protocol.LeaseInfo
	if e := c.call(protocol.SubjectLeaseOpen, protocol.LeaseOpenRequest{Run: "shared", TTLMS: 10000, Holder: "alice"}, &ls); e != nil {
		t.Fatal(e)
	}
	e := c.call(protocol.SubjectLeaseOpen, protocol.LeaseOpenRequest{Run: "shared", TTLMS: 10000, Holder: "bob"}, &ls)
	if e == nil || e.Status != 409 || e.Code != protocol.ErrCodeLeaseHeld || !strings.Contains(e.Message, `"alice"`) {
		t.Fatalf("second holder: %+v, %v; want 409 lease_held naming alice", ls, e)
	}
	if e := c.call(protocol.SubjectLeaseOpen, protocol.LeaseOpenRequest{Run: "shared", TTLMS: 10000, Holder: "alice"}, &ls); e != nil || ls.Holder != "alice" {
		t.Fatalf("the same holder again: %+v, %v", ls, e)
	}
	re.clock.Advance(11 * time.Second)
	if e := c.call(protocol.SubjectLeaseOpen, protocol.LeaseOpenRequest{Run: "shared", TTLMS: 10000, Holder: "bob"}, &ls); e != nil || ls.Holder != "bob" {
		t.Fatalf("another holder after expiry: %+v, %v", ls, e)
	}
}

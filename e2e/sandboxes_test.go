//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/protocol/opensandbox"
	"github.com/tetherfleet/tether/protocol/openshell"
)

// The chaos tests of issue 4, with real processes: a coordinator, agents,
// and per node one fakegateways process (a fake OpenShell gateway and a fake
// OpenSandbox server). Processes die by SIGKILL, gateways and agents hang
// by SIGSTOP; what must hold is checked on the fake gateways themselves
// (nothing leaked, nothing wrongly deleted) and on the ledger (one record
// per sandbox, matching the gateways).

// KV buckets of the ledger that the tests read (documented in
// protocol.LeaseInfo and coordinator/ledger).
const (
	leasesBucket    = "tether_leases"
	inventoryBucket = "tether_inventory"
)

// Attribution keys NeMo Gym sets (wire-facts §4.2).
const (
	openShellMarker = "nemo-gym.sandbox"
	openShellRunKey = "run"
	openSandboxRun  = "nemo-gym.nvidia.com/run"
)

var (
	fakeGWOnce sync.Once
	fakeGWBin  string
	fakeGWErr  error
)

// fakeGatewaysBinary builds ./fakegateways (with -race and the e2e tag)
// once per test run, next to the tether binary.
func fakeGatewaysBinary(t *testing.T) string {
	t.Helper()
	fakeGWOnce.Do(func() {
		fakeGWBin = filepath.Join(filepath.Dir(*tetherBin), "fakegateways")
		out, err := exec.Command("go", "build", "-race", "-tags", "e2e", "-o", fakeGWBin, "./fakegateways").CombinedOutput()
		if err != nil {
			fakeGWErr = fmt.Errorf("build fakegateways: %v: %s", err, out)
		}
	})
	if fakeGWErr != nil {
		t.Fatal(fakeGWErr)
	}
	return fakeGWBin
}

// nodeGateways is one node's fakegateways process (and, once startNode
// started it, the node's agent).
type nodeGateways struct {
	node        string
	proc        *proc
	agent       *proc
	OpenShell   string `json:"openshell"`   // host:port of the fake OpenShell gateway
	OpenSandbox string `json:"opensandbox"` // host:port of the fake OpenSandbox server
	osh         *grpc.ClientConn
}

// startGateways starts node's fake gateways with the fakegateways flags
// args and waits for the line with their addresses.
func startGateways(t *testing.T, node string, args ...string) *nodeGateways {
	t.Helper()
	g := &nodeGateways{node: node, proc: startBin(t, fakeGatewaysBinary(t), "gateways-"+node, args...)}
	checkFor(t, 30*time.Second, func() error {
		select {
		case <-g.proc.done:
			t.Fatalf("fakegateways of %s exited before printing its addresses: %v", node, g.proc.err)
		default:
		}
		b, _ := os.ReadFile(g.proc.log)
		for _, line := range strings.Split(string(b), "\n") {
			if json.Unmarshal([]byte(line), g) == nil && g.OpenShell != "" && g.OpenSandbox != "" {
				return nil
			}
		}
		return fmt.Errorf("fakegateways of %s printed no addresses yet", node)
	})
	cc, err := grpc.NewClient(g.OpenShell, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	g.osh = cc
	return g
}

// gatewaySandbox is one sandbox as a fake gateway lists it.
type gatewaySandbox struct {
	Node, Provider, ID, Name, Run, State string
}

func (s gatewaySandbox) String() string {
	if s.Name != "" {
		return fmt.Sprintf("%s %s %s (id %s, run %s, %s)", s.Node, s.Provider, s.Name, s.ID, s.Run, s.State)
	}
	return fmt.Sprintf("%s %s %s (run %s, %s)", s.Node, s.Provider, s.ID, s.Run, s.State)
}

// list asks the fake gateways themselves (not Tether) what they hold: the
// OpenShell gateway's default workspace, deleting ones included, and every
// OpenSandbox sandbox.
func (g *nodeGateways) list(ctx context.Context) ([]gatewaySandbox, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var out []gatewaySandbox
	var resp openshell.ListSandboxesResponse
	if err := g.osh.Invoke(ctx, openshell.MethodListSandboxes, &openshell.ListSandboxesRequest{Limit: 1000}, &resp); err != nil {
		return nil, fmt.Errorf("list %s's OpenShell gateway: %w", g.node, err)
	}
	for _, sb := range resp.GetSandboxes() {
		md := sb.GetMetadata()
		out = append(out, gatewaySandbox{Node: g.node, Provider: protocol.ProviderOpenShell, ID: md.GetId(), Name: md.GetName(),
			Run: md.GetLabels()[openShellRunKey], State: sb.GetStatus().GetPhase().String()})
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+g.OpenSandbox+"/v1/sandboxes?pageSize=200", nil)
	hresp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("list %s's OpenSandbox server: %w", g.node, err)
	}
	defer hresp.Body.Close()
	var list opensandbox.ListSandboxesResponse
	if err := json.NewDecoder(hresp.Body).Decode(&list); err != nil || hresp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("list %s's OpenSandbox server: status %d, %v", g.node, hresp.StatusCode, err)
	}
	if list.Pagination.HasNextPage {
		return nil, fmt.Errorf("%s's OpenSandbox server holds %d sandboxes, more than one page", g.node, list.Pagination.TotalItems)
	}
	for _, sb := range list.Items {
		out = append(out, gatewaySandbox{Node: g.node, Provider: protocol.ProviderOpenSandbox, ID: sb.ID,
			Run: sb.Metadata[openSandboxRun], State: sb.Status.State})
	}
	return out, nil
}

// reapRun ends run with `tether sandboxes reap --run` and waits until none
// of its sandboxes is left on gws; a leak fails the test, listing it.
func reapRun(ctx context.Context, t *testing.T, f *sandboxFleet, run string, gws ...*nodeGateways) {
	t.Helper()
	if out, errOut, code := runCLI(t, f.natsURL, "", "sandboxes", "reap", "--run", run); code != 0 {
		t.Fatalf("tether sandboxes reap --run %s: code %d, stdout %q, stderr %q", run, code, out, errOut)
	}
	checkFor(t, 20*time.Second, func() error {
		left, err := onGateways(ctx, run, gws...)
		if err != nil {
			return err
		}
		if len(left) > 0 {
			return fmt.Errorf("%d sandboxes of closed run %s leaked: %v", len(left), run, left)
		}
		return nil
	})
}

// onGateways lists every node's gateways, keeping the sandboxes of run
// ("" for all).
func onGateways(ctx context.Context, run string, gws ...*nodeGateways) ([]gatewaySandbox, error) {
	var out []gatewaySandbox
	for _, g := range gws {
		sbs, err := g.list(ctx)
		if err != nil {
			return nil, err
		}
		for _, s := range sbs {
			if run == "" || s.Run == run {
				out = append(out, s)
			}
		}
	}
	return out, nil
}

// sandboxFleet is a coordinator with both facades on free loopback ports,
// inventories every second, and agents whose nodes each have their own
// fakegateways process.
type sandboxFleet struct {
	*fleet
	openShellFacade, openSandboxFacade string
	facade                             *grpc.ClientConn // to the OpenShell facade
	js                                 jetstream.JetStream
}

func startSandboxFleet(t *testing.T) *sandboxFleet {
	t.Helper()
	f := &fleet{dataDir: t.TempDir()}
	f.tokenFile = filepath.Join(t.TempDir(), "token")
	os.WriteFile(f.tokenFile, []byte("e2e-secret-token\n"), 0o600)
	f.tunnelAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	f.httpAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	natsAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	f.natsURL = "nats://" + natsAddr
	sf := &sandboxFleet{fleet: f,
		openShellFacade:   fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		openSandboxFacade: fmt.Sprintf("127.0.0.1:%d", freePort(t)),
	}
	// A fixed --id: a restarted coordinator takes the reaper lock its
	// killed predecessor held at once, instead of waiting out its TTL.
	f.coordArgs = []string{"coordinator", "--id", "e2e-chaos", "--data-dir", f.dataDir, "--listen", f.tunnelAddr, "--policy", e2ePolicy(t),
		"--http-addr", f.httpAddr, "--nats-listen", natsAddr, "--allow-shared-token", "--token-file", f.tokenFile, "--heartbeat", heartbeat,
		"--openshell-listen", sf.openShellFacade, "--opensandbox-listen", sf.openSandboxFacade,
		"--inventory-interval", "1s"}
	f.coord = start(t, "coordinator", f.coordArgs...)
	f.waitReady(t)
	f.nc = f.connect(t)
	f.cl = client.New(f.nc)
	// The ledger's buckets are the coordinators' own: reading them takes
	// coordinator credentials.
	coordCreds, err := f.layout(t).MintCoordinator("e2e-inspector")
	if err != nil {
		t.Fatal(err)
	}
	jsNC, err := nats.Connect(f.natsURL, append(coordCreds.Options(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(jsNC.Close)
	if sf.js, err = jetstream.New(jsNC); err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(sf.openShellFacade, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	sf.facade = cc
	return sf
}

// startNode starts node's fake gateways (with the fakegateways flags
// gwArgs) and its agent pointed at them.
func (f *sandboxFleet) startNode(t *testing.T, node string, gwArgs ...string) *nodeGateways {
	t.Helper()
	g := startGateways(t, node, gwArgs...)
	g.agent = f.startAgentBin(t, *tetherBin, node, "role=sandboxes", f.tokenFile, "--openshell", g.OpenShell, "--opensandbox", g.OpenSandbox)
	return g
}

// waitGatewayNodes waits until exactly nodes are connected, each offering
// both gateway targets, and each has reported a complete inventory since
// it connected (before that the reaper leaves a node alone).
func (f *sandboxFleet) waitGatewayNodes(t *testing.T, nodes ...string) {
	t.Helper()
	checkFor(t, defaultTestTimeout, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		got, err := f.cl.Nodes(ctx, "")
		if err != nil {
			return err
		}
		var ids []string
		for _, n := range got {
			ids = append(ids, n.ID)
			if !slices.Contains(n.Targets, protocol.ProviderOpenShell) || !slices.Contains(n.Targets, protocol.ProviderOpenSandbox) {
				return fmt.Errorf("node %s offers targets %v, want openshell and opensandbox", n.ID, n.Targets)
			}
			st, err := f.inventoryStatus(ctx, n.ID)
			if err != nil {
				return err
			}
			if st.ListedAt.Before(n.ConnectedAt) || !st.complete() {
				return fmt.Errorf("node %s: no complete inventory since it connected at %v (last: %+v)", n.ID, n.ConnectedAt, st)
			}
		}
		if strings.Join(ids, ",") != strings.Join(nodes, ",") {
			return fmt.Errorf("nodes %v, want %v", ids, nodes)
		}
		return nil
	})
}

// inventoryStatus is a node's last inventory as the ledger keeps it in
// the bucket tether_inventory.
type inventoryStatus struct {
	Node     string    `json:"node"`
	ListedAt time.Time `json:"listed_at"`
	Gateways []struct {
		Target   string `json:"target"`
		Complete bool   `json:"complete"`
		Error    string `json:"error"`
	} `json:"gateways"`
}

func (s *inventoryStatus) complete() bool {
	for _, g := range s.Gateways {
		if !g.Complete {
			return false
		}
	}
	return len(s.Gateways) > 0
}

func (f *sandboxFleet) inventoryStatus(ctx context.Context, node string) (*inventoryStatus, error) {
	kv, err := f.js.KeyValue(ctx, inventoryBucket)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", inventoryBucket, err)
	}
	e, err := kv.Get(ctx, node)
	if err != nil {
		return nil, fmt.Errorf("inventory status of %s: %w", node, err)
	}
	var st inventoryStatus
	if err := json.Unmarshal(e.Value(), &st); err != nil {
		return nil, fmt.Errorf("inventory status of %s: %q: %w", node, e.Value(), err)
	}
	return &st, nil
}

// lease reads run's lease from the bucket tether_leases (without renewing
// it, as tether.v1.lease.renew would).
func (f *sandboxFleet) lease(ctx context.Context, run string) (*protocol.LeaseInfo, error) {
	kv, err := f.js.KeyValue(ctx, leasesBucket)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", leasesBucket, err)
	}
	e, err := kv.Get(ctx, run)
	if err != nil {
		return nil, fmt.Errorf("lease of run %s: %w", run, err)
	}
	var li protocol.LeaseInfo
	if err := json.Unmarshal(e.Value(), &li); err != nil {
		return nil, fmt.Errorf("lease of run %s: %q: %w", run, e.Value(), err)
	}
	return &li, nil
}

// createOpenShell creates an OpenShell sandbox through the facade on node,
// labelled as NeMo Gym labels them, for run.
func (f *sandboxFleet) createOpenShell(ctx context.Context, node, name, run string) (*openshell.Sandbox, error) {
	req := &openshell.CreateSandboxRequest{
		Name: name, Spec: &openshell.SandboxSpec{Environment: map[string]string{}},
		Labels: map[string]string{openShellMarker: "1", openShellRunKey: run, "tether.node": node},
	}
	var resp openshell.SandboxResponse
	if err := f.facade.Invoke(ctx, openshell.MethodCreateSandbox, req, &resp); err != nil {
		return nil, fmt.Errorf("create OpenShell sandbox %s on %s through the facade: %w", name, node, err)
	}
	return resp.GetSandbox(), nil
}

// createOpenSandbox creates an OpenSandbox sandbox through the facade on
// node with NeMo Gym's run metadata, and returns its id.
func (f *sandboxFleet) createOpenSandbox(ctx context.Context, node, run string) (string, error) {
	body, _ := json.Marshal(map[string]any{
		"image": map[string]string{"uri": "python:3.12"}, "entrypoint": []string{"tail", "-f", "/dev/null"},
		"timeout": 600, "resourceLimits": map[string]string{"cpu": "1"},
		"metadata": map[string]string{openSandboxRun: run},
	})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+f.openSandboxFacade+"/v1/sandboxes", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Tether-Node", node)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("create OpenSandbox sandbox on %s through the facade: %w", node, err)
	}
	defer resp.Body.Close()
	var out opensandbox.CreateSandboxResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusAccepted || out.ID == "" {
		return "", fmt.Errorf("create OpenSandbox sandbox on %s through the facade: status %d, id %q, %v", node, resp.StatusCode, out.ID, err)
	}
	return out.ID, nil
}

// records lists the ledger's records of run, every state.
func (f *sandboxFleet) records(run string) ([]protocol.SandboxInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return f.cl.Sandboxes(ctx, protocol.SandboxesListRequest{Run: run})
}

// ledgerMatches reports how the ledger's records of run disagree with
// what the gateways hold of it: every sandbox on a gateway has exactly one
// record, live, on its node, with its name; no other record is live or
// deleting.
func ledgerMatches(recs []protocol.SandboxInfo, onGW []gatewaySandbox) error {
	var errs []error
	byID := map[[2]string][]protocol.SandboxInfo{}
	for _, r := range recs {
		byID[[2]string{r.Provider, r.ID}] = append(byID[[2]string{r.Provider, r.ID}], r)
	}
	held := map[[2]string]bool{}
	for _, s := range onGW {
		k := [2]string{s.Provider, s.ID}
		held[k] = true
		rs := byID[k]
		switch {
		case len(rs) == 0:
			errs = append(errs, fmt.Errorf("no ledger record of %v", s))
		case len(rs) > 1:
			errs = append(errs, fmt.Errorf("%d ledger records of %v: %+v", len(rs), s, rs))
		case rs[0].State != protocol.SandboxLive || rs[0].Node != s.Node || rs[0].Name != s.Name:
			errs = append(errs, fmt.Errorf("ledger record of %v is %s on %s named %q, want live on %s named %q",
				s, rs[0].State, rs[0].Node, rs[0].Name, s.Node, s.Name))
		}
	}
	for _, r := range recs {
		if !held[[2]string{r.Provider, r.ID}] && (r.State == protocol.SandboxLive || r.State == protocol.SandboxDeleting) {
			errs = append(errs, fmt.Errorf("ledger record %s %s %s %s is %s but no gateway holds it", r.Node, r.Provider, r.ID, r.Name, r.State))
		}
	}
	return errors.Join(errs...)
}

// sleepers lists the live processes whose command line is exactly
// "sleep arg" (run-lease's own command line holds the same words).
func sleepers(arg string) []int {
	var pids []int
	for _, pid := range processesWith("sleep", arg) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && string(b) == "sleep\x00"+arg+"\x00" {
			pids = append(pids, pid)
		}
	}
	return pids
}

// made is a sandbox a test created.
type made struct{ node, provider, id, name string }

// TestChaosLeaseHolderKilled: `tether run-lease` holds run R's lease while
// 50 sandboxes of R live on two nodes, through both facades and both
// providers; run-lease is killed with SIGKILL. Every one of them must be
// gone from the gateways within the lease TTL + 10 s of the kill, the
// command run-lease ran must die with it, and another run's sandboxes must
// be untouched.
func TestChaosLeaseHolderKilled(t *testing.T) {
	f := startSandboxFleet(t)
	gws := []*nodeGateways{f.startNode(t, "chaos-a"), f.startNode(t, "chaos-b")}
	nodes := []string{"chaos-a", "chaos-b"}
	f.waitGatewayNodes(t, nodes...)
	ctx := context.Background()

	const run, otherRun = "chaos-dies", "chaos-lives"
	const ttl = 3 * time.Second
	marker := strconv.Itoa(3_000_000 + os.Getpid()) // sleep's argument: finds the child among all processes
	holder := start(t, "run-lease", "run-lease", "--run", run, "--ttl", ttl.String(), "--nats-url", f.natsURL, "--nats-creds", f.credsFile(t), "--", "sleep", marker)
	checkFor(t, 30*time.Second, func() error {
		li, err := f.lease(ctx, run)
		if err != nil {
			return err
		}
		if li.Closed || !li.ExpiresAt.After(time.Now()) || li.TTLMS != ttl.Milliseconds() {
			return fmt.Errorf("lease of %s not open with TTL %v: %+v", run, ttl, li)
		}
		return nil
	})
	checkFor(t, 10*time.Second, func() error {
		if p := sleepers(marker); len(p) != 1 {
			return fmt.Errorf("run-lease's command: %d processes sleep %s, want 1", len(p), marker)
		}
		return nil
	})
	if _, err := f.cl.OpenLease(ctx, otherRun, 10*time.Minute, "e2e"); err != nil {
		t.Fatal(err)
	}

	// 50 creates, 8 at a time: 26 OpenShell and 24 OpenSandbox, half on
	// each node.
	began := time.Now()
	var mu sync.Mutex
	var created []made
	var errs []error
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			node := nodes[i%2]
			m := made{node: node}
			var err error
			if i%4 < 2 {
				m.provider, m.name = protocol.ProviderOpenShell, fmt.Sprintf("ng-chaos-%02d", i)
				var sb *openshell.Sandbox
				if sb, err = f.createOpenShell(cctx, node, m.name, run); err == nil {
					m.id = sb.GetMetadata().GetId()
				}
			} else {
				m.provider = protocol.ProviderOpenSandbox
				m.id, err = f.createOpenSandbox(cctx, node, run)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			created = append(created, m)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Logf("50 sandboxes created through the facades in %v", time.Since(began).Round(time.Millisecond))
	var kept []made
	for _, node := range nodes {
		sb, err := f.createOpenShell(ctx, node, "ng-keep-"+node, otherRun)
		if err != nil {
			t.Fatal(err)
		}
		id, err := f.createOpenSandbox(ctx, node, otherRun)
		if err != nil {
			t.Fatal(err)
		}
		kept = append(kept, made{node, protocol.ProviderOpenShell, sb.GetMetadata().GetId(), sb.GetMetadata().GetName()},
			made{node, protocol.ProviderOpenSandbox, id, ""})
	}
	onGW, err := onGateways(ctx, run, gws...)
	if err != nil {
		t.Fatal(err)
	}
	if len(onGW) != 50 {
		t.Fatalf("the gateways hold %d sandboxes of run %s after 50 creates, want 50", len(onGW), run)
	}
	recs, err := f.records(run)
	if err != nil {
		t.Fatal(err)
	}
	if err := ledgerMatches(recs, onGW); err != nil {
		t.Fatalf("before the kill, the ledger disagrees with the gateways:\n%v", err)
	}

	holder.cmd.Process.Kill()
	<-holder.done
	killed := time.Now()

	checkFor(t, 5*time.Second, func() error {
		if p := sleepers(marker); len(p) > 0 {
			return fmt.Errorf("run-lease was killed but its command (sleep %s, pids %v) lives on", marker, p)
		}
		return nil
	})

	deadline := ttl + 10*time.Second
	for {
		left, err := onGateways(ctx, run, gws...)
		if err != nil {
			t.Fatal(err)
		}
		if len(left) == 0 {
			break
		}
		if time.Since(killed) > deadline {
			var lines []string
			for _, s := range left {
				lines = append(lines, s.String())
			}
			t.Fatalf("%d of run %s's 50 sandboxes leaked: still on the gateways %v after its lease holder was killed (lease TTL %v):\n%s",
				len(left), run, deadline, ttl, strings.Join(lines, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("all 50 sandboxes of the killed run gone from the gateways %v after the kill (lease TTL %v)", time.Since(killed).Round(time.Millisecond), ttl)

	others, err := onGateways(ctx, otherRun, gws...)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kept {
		if !slices.ContainsFunc(others, func(s gatewaySandbox) bool { return s.Provider == k.provider && s.ID == k.id }) {
			t.Errorf("run %s's %s sandbox %s %s on %s was wrongly deleted (its lease is open)", otherRun, k.provider, k.id, k.name, k.node)
		}
	}
	checkFor(t, 10*time.Second, func() error {
		recs, err := f.records(run)
		if err != nil {
			return err
		}
		var bad []string
		for _, r := range recs {
			if r.State != protocol.SandboxDeleted {
				bad = append(bad, fmt.Sprintf("%s %s %s %s", r.Node, r.Provider, r.ID, r.State))
			}
		}
		if len(recs) != 50 || len(bad) > 0 {
			return fmt.Errorf("ledger: %d records of run %s, want 50 all deleted; not deleted: %v", len(recs), run, bad)
		}
		return nil
	})
}

// TestChaosCoordinatorKilledMidCreate: the coordinator is killed with
// SIGKILL while an OpenShell create it forwarded has committed on the
// gateway but not answered (the gateway answers creates 3 s late), so the
// facade never recorded it. After a restart on the same data directory and
// ports the ledger must hold exactly one live record of that sandbox,
// matching the gateway, and agree with every gateway; closing the run must
// leave nothing behind.
func TestChaosCoordinatorKilledMidCreate(t *testing.T) {
	f := startSandboxFleet(t)
	slow := f.startNode(t, "chaos-a", "--create-delay", "3s")
	other := f.startNode(t, "chaos-b")
	gws := []*nodeGateways{slow, other}
	f.waitGatewayNodes(t, "chaos-a", "chaos-b")
	ctx := context.Background()

	const run = "chaos-mid"
	if _, err := f.cl.OpenLease(ctx, run, 10*time.Minute, "e2e"); err != nil {
		t.Fatal(err)
	}
	// Sandboxes the facade did record, on the other node.
	if _, err := f.createOpenShell(ctx, "chaos-b", "ng-before", run); err != nil {
		t.Fatal(err)
	}
	if _, err := f.createOpenSandbox(ctx, "chaos-b", run); err != nil {
		t.Fatal(err)
	}

	const name = "ng-mid-create"
	answered := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_, err := f.createOpenShell(cctx, "chaos-a", name, run)
		answered <- err
	}()
	// Kill the coordinator once the gateway has committed the create,
	// while it holds the answer back.
	var committed gatewaySandbox
	checkFor(t, 10*time.Second, func() error {
		sbs, err := slow.list(ctx)
		if err != nil {
			return err
		}
		for _, s := range sbs {
			if s.Name == name {
				committed = s
				return nil
			}
		}
		return fmt.Errorf("chaos-a's gateway has not committed %s yet", name)
	})
	select {
	case err := <-answered:
		t.Fatalf("the create answered (err %v) before the coordinator was killed: --create-delay did not hold it back", err)
	default:
	}
	f.coord.cmd.Process.Kill()
	<-f.coord.done
	killed := time.Now()
	if err := <-answered; err == nil {
		t.Fatal("the create through the facade succeeded although its coordinator was killed mid-call")
	}

	f.coord = start(t, "coordinator-restarted", f.coordArgs...)
	f.waitReady(t)
	f.waitGatewayNodes(t, "chaos-a", "chaos-b")
	var recs []protocol.SandboxInfo
	checkFor(t, 20*time.Second, func() error {
		onGW, err := onGateways(ctx, run, gws...)
		if err != nil {
			return err
		}
		if len(onGW) != 3 {
			return fmt.Errorf("the gateways hold %d sandboxes of run %s, want 3: %v", len(onGW), run, onGW)
		}
		if recs, err = f.records(run); err != nil {
			return err
		}
		return ledgerMatches(recs, onGW)
	})
	for _, r := range recs {
		if r.ID == committed.ID {
			t.Logf("the ledger matched the gateways %v after the kill; the sandbox created mid-kill was recorded by %s", time.Since(killed).Round(time.Millisecond), r.Source)
		}
	}

	// The CLI shows the same: one live record of the sandbox, with the
	// gateway's id.
	out, errOut, code := runCLI(t, f.natsURL, "", "sandboxes", "--run", run, "--json")
	var listed protocol.SandboxesListResponse
	if code != 0 || json.Unmarshal([]byte(out), &listed) != nil {
		t.Fatalf("tether sandboxes --run %s --json: code %d, stdout %q, stderr %q", run, code, out, errOut)
	}
	var mine []protocol.SandboxInfo
	for _, r := range listed.Sandboxes {
		if r.Name == name || r.ID == committed.ID {
			mine = append(mine, r)
		}
	}
	if len(mine) != 1 || mine[0].ID != committed.ID || mine[0].Name != name || mine[0].Node != "chaos-a" || mine[0].State != protocol.SandboxLive {
		t.Fatalf("tether sandboxes shows %d records of the sandbox created mid-kill (%v): %+v; want one, live, on chaos-a, id %s",
			len(mine), committed, mine, committed.ID)
	}

	// NeMo Gym's recovery from a lost create answer (get by name, after
	// ALREADY_EXISTS) finds it through the restarted facade.
	var got openshell.SandboxResponse
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := f.facade.Invoke(gctx, openshell.MethodGetSandbox, &openshell.GetSandboxRequest{Name: name}, &got); err != nil || got.GetSandbox().GetMetadata().GetId() != committed.ID {
		t.Fatalf("GetSandbox %s through the restarted facade: id %q, err %v; want id %s", name, got.GetSandbox().GetMetadata().GetId(), err, committed.ID)
	}

	// Nothing leaks: closing the run reaps all three.
	reapRun(ctx, t, f, run, gws...)
}

// TestChaosGatewayStopped: a node's gateways hang (SIGSTOP) for a few
// seconds, then the OpenShell gateway restarts (SIGHUP: connections and
// in-flight calls cut, sandboxes kept) as it resumes. While it hangs no
// record may change state; afterwards each sandbox, those the facades
// created and one created on the gateway directly, has exactly one live
// record; and the run's close still reaps every one.
func TestChaosGatewayStopped(t *testing.T) {
	f := startSandboxFleet(t)
	g := f.startNode(t, "chaos-a")
	f.waitGatewayNodes(t, "chaos-a")
	ctx := context.Background()

	const run = "chaos-gw"
	if _, err := f.cl.OpenLease(ctx, run, 10*time.Minute, "e2e"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := f.createOpenShell(ctx, "chaos-a", fmt.Sprintf("ng-gw-%d", i), run); err != nil {
			t.Fatal(err)
		}
		if _, err := f.createOpenSandbox(ctx, "chaos-a", run); err != nil {
			t.Fatal(err)
		}
	}
	// One behind the facades' back, as NeMo Gym talking to the gateway
	// directly would make it: only the inventory can record it.
	var resp openshell.SandboxResponse
	if err := g.osh.Invoke(ctx, openshell.MethodCreateSandbox, &openshell.CreateSandboxRequest{
		Name: "ng-gw-direct", Spec: &openshell.SandboxSpec{},
		Labels: map[string]string{openShellMarker: "1", openShellRunKey: run},
	}, &resp); err != nil {
		t.Fatal(err)
	}
	converged := func() error {
		onGW, err := onGateways(ctx, run, g)
		if err != nil {
			return err
		}
		if len(onGW) != 7 {
			return fmt.Errorf("the gateways hold %d sandboxes of run %s, want 7", len(onGW), run)
		}
		recs, err := f.records(run)
		if err != nil {
			return err
		}
		if len(recs) != 7 {
			return fmt.Errorf("ledger: %d records of run %s, want 7 (one per sandbox): %+v", len(recs), run, recs)
		}
		return ledgerMatches(recs, onGW)
	}
	checkFor(t, 20*time.Second, converged)

	// Watch every inventory status from here on.
	kv, err := f.js.KeyValue(ctx, inventoryBucket)
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, "chaos-a", jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	pid := g.proc.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) }) // before its proc's cleanup stops it
	stopped := time.Now()
	// While the gateways hang (several inventory intervals), every record
	// stays as it was: a listing that cannot finish proves nothing gone.
	// This must show that nothing happens, so it waits a fixed while.
	for time.Since(stopped) < 3*time.Second {
		recs, err := f.records(run)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.State != protocol.SandboxLive {
				t.Fatalf("while chaos-a's gateways were stopped, the ledger record of %s %s %s went %s (nothing can be known gone)",
					r.Provider, r.ID, r.Name, r.State)
			}
		}
		if len(recs) != 7 {
			t.Fatalf("while chaos-a's gateways were stopped, the ledger went to %d records of run %s, want 7", len(recs), run)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Restart the OpenShell gateway as it resumes: SIGHUP is delivered
	// once SIGCONT lets the process run.
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()

	// Wait for a complete inventory listed after the resume, then the
	// ledger must match the gateways, one record each.
	incomplete := 0
	deadline := time.After(20 * time.Second)
	for done := false; !done; {
		select {
		case e := <-w.Updates():
			if e == nil {
				continue
			}
			var st inventoryStatus
			if err := json.Unmarshal(e.Value(), &st); err != nil {
				t.Fatalf("inventory status %q: %v", e.Value(), err)
			}
			if !st.complete() {
				incomplete++
				t.Logf("incomplete inventory of chaos-a listed at %v: %+v", st.ListedAt.Format(time.RFC3339Nano), st.Gateways)
			} else if st.ListedAt.After(resumed) {
				done = true
			}
		case <-deadline:
			t.Fatal("no complete inventory of chaos-a within 20 s after its gateways resumed")
		}
	}
	t.Logf("complete inventory %v after the resume (%d incomplete ones meanwhile)", time.Since(resumed).Round(time.Millisecond), incomplete)
	if err := converged(); err != nil {
		t.Fatalf("after chaos-a's gateways resumed and restarted, the ledger disagrees with them:\n%v", err)
	}

	reapRun(ctx, t, f, run, g)
}

// TestChaosAgentPartitioned: a node's agent hangs (SIGSTOP: its tunnel
// stays open but silent, as behind a partition) and the coordinator drops
// it; meanwhile the run owning sandboxes on both nodes is closed. The
// other node's sandboxes are reaped at once; the partitioned node's must
// stay on its gateways (the reaper cannot know them), and must be reaped
// once the agent resumes and reconnects.
func TestChaosAgentPartitioned(t *testing.T) {
	f := startSandboxFleet(t)
	cut, other := f.startNode(t, "chaos-a"), f.startNode(t, "chaos-b")
	f.waitGatewayNodes(t, "chaos-a", "chaos-b")
	ctx := context.Background()

	const run = "chaos-part"
	if _, err := f.cl.OpenLease(ctx, run, 10*time.Minute, "e2e"); err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"chaos-a", "chaos-b"} {
		for i := range 2 {
			if _, err := f.createOpenShell(ctx, node, fmt.Sprintf("ng-part-%s-%d", node, i), run); err != nil {
				t.Fatal(err)
			}
			if _, err := f.createOpenSandbox(ctx, node, run); err != nil {
				t.Fatal(err)
			}
		}
	}
	before, err := onGateways(ctx, run, cut)
	if err != nil {
		t.Fatal(err)
	}
	if len(before) != 4 {
		t.Fatalf("chaos-a's gateways hold %d sandboxes of run %s, want 4", len(before), run)
	}

	pid := cut.agent.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) }) // before its proc's cleanup stops it
	// The coordinator drops an agent once nothing arrived from it for
	// three heartbeat intervals (3 × heartbeat).
	checkFor(t, 30*time.Second, func() error {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		nodes, err := f.cl.Nodes(cctx, "")
		if err != nil {
			return err
		}
		if len(nodes) != 1 || nodes[0].ID != "chaos-b" {
			return fmt.Errorf("nodes %+v, want only chaos-b while chaos-a's agent is stopped", nodes)
		}
		return nil
	})
	if _, err := f.cl.CloseLease(ctx, run); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 10*time.Second, func() error {
		left, err := onGateways(ctx, run, other)
		if err != nil {
			return err
		}
		if len(left) > 0 {
			return fmt.Errorf("%d sandboxes of closed run %s left on the reachable node: %v", len(left), run, left)
		}
		return nil
	})
	// Several reaper passes and inventory intervals later, the partitioned
	// node's sandboxes must all still be there. This must show that
	// nothing happens, so it waits a fixed while.
	partitioned := time.Now()
	for time.Since(partitioned) < 2*time.Second {
		now, err := onGateways(ctx, run, cut)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range before {
			if !slices.ContainsFunc(now, func(n gatewaySandbox) bool { return n.Provider == s.Provider && n.ID == s.ID }) {
				t.Fatalf("%v was deleted while its node was partitioned (the reaper must wait for the node)", s)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	recs, err := f.records(run)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Node == "chaos-a" && r.State == protocol.SandboxDeleted {
			t.Errorf("during the partition the ledger marked %s %s %s deleted, but it is still on chaos-a's gateway", r.Provider, r.ID, r.Name)
		}
	}

	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	healed := time.Now()
	checkFor(t, 30*time.Second, func() error {
		left, err := onGateways(ctx, run, cut)
		if err != nil {
			return err
		}
		if len(left) > 0 {
			return fmt.Errorf("%d sandboxes of closed run %s leaked on chaos-a after it healed: %v", len(left), run, left)
		}
		return nil
	})
	t.Logf("chaos-a's sandboxes reaped %v after its agent resumed", time.Since(healed).Round(time.Millisecond))
	checkFor(t, 10*time.Second, func() error {
		recs, err := f.records(run)
		if err != nil {
			return err
		}
		var bad []string
		for _, r := range recs {
			if r.State != protocol.SandboxDeleted {
				bad = append(bad, fmt.Sprintf("%s %s %s %s", r.Node, r.Provider, r.ID, r.State))
			}
		}
		if len(recs) != 8 || len(bad) > 0 {
			return fmt.Errorf("ledger: %d records of run %s, want 8 all deleted; not deleted: %v", len(recs), run, bad)
		}
		return nil
	})
}

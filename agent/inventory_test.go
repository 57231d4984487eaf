package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tetherfleet/tether/gateway"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/protocol/opensandbox"
	"github.com/tetherfleet/tether/protocol/opensandbox/opensandboxtest"
	"github.com/tetherfleet/tether/protocol/openshell"
	"github.com/tetherfleet/tether/protocol/openshell/openshelltest"
	"github.com/tetherfleet/tether/tunnel/tunneltest"
)

// startOpenShell starts a fake OpenShell gateway closed at the test's end.
func startOpenShell(t *testing.T, opts openshelltest.Options) (*openshelltest.Gateway, string) {
	t.Helper()
	g := openshelltest.New(opts)
	addr, err := g.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	return g, addr
}

// createOpenShell creates sandbox name in workspace ws of g.
func createOpenShell(t *testing.T, g *openshelltest.Gateway, ws, name string, labels map[string]string) {
	t.Helper()
	if _, err := g.Create(&openshell.CreateSandboxRequest{Workspace: ws, Name: name, Labels: labels, Spec: &openshell.SandboxSpec{}}); err != nil {
		t.Fatal(err)
	}
}

// createOpenSandbox creates a sandbox on s over its REST API and returns
// its id.
func createOpenSandbox(t *testing.T, s *opensandboxtest.Server, apiKey string, md map[string]string) string {
	t.Helper()
	body, _ := json.Marshal(opensandbox.CreateSandboxRequest{
		Image: &opensandbox.ImageSpec{URI: "python:3.12"}, Entrypoint: []string{"tail", "-f", "/dev/null"}, Metadata: md,
	})
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/v1/sandboxes", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(opensandbox.HeaderAPIKey, apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out opensandbox.CreateSandboxResponse
	if resp.StatusCode != http.StatusAccepted || json.NewDecoder(resp.Body).Decode(&out) != nil {
		t.Fatalf("create OpenSandbox sandbox: HTTP %d", resp.StatusCode)
	}
	return out.ID
}

// inventoryAnswer is what an inventory stream carried.
type inventoryAnswer struct {
	pages    []protocol.InventoryPage
	end      *protocol.InventoryEnd
	errInfo  *protocol.ErrorInfo
	sawEOF   bool // the stream ended without an end frame
	frameMax int  // largest frame payload
}

// byTarget returns the sandboxes of target, in the order sent.
func (r *inventoryAnswer) byTarget(target string) []protocol.Sandbox {
	var out []protocol.Sandbox
	for _, p := range r.pages {
		if p.Target == target {
			out = append(out, p.Sandboxes...)
		}
	}
	return out
}

// readInventory reads an inventory stream's frames to its end.
func readInventory(t *testing.T, e *execStream) *inventoryAnswer {
	t.Helper()
	r := &inventoryAnswer{}
	for {
		f, err := e.fr.Next()
		if err != nil {
			if r.end == nil && r.errInfo == nil {
				r.sawEOF = true
			}
			return r
		}
		if r.end != nil || r.errInfo != nil {
			t.Fatalf("%s frame after the final frame", f.Type)
		}
		r.frameMax = max(r.frameMax, len(f.Payload))
		switch f.Type {
		case protocol.FrameInventory:
			var p protocol.InventoryPage
			if err := protocol.DecodeJSON(f.Payload, &p); err != nil {
				t.Fatal(err)
			}
			r.pages = append(r.pages, p)
		case protocol.FrameInventoryEnd:
			r.end = &protocol.InventoryEnd{}
			if err := protocol.DecodeJSON(f.Payload, r.end); err != nil {
				t.Fatal(err)
			}
		case protocol.FrameError:
			r.errInfo = &protocol.ErrorInfo{}
			if err := protocol.DecodeJSON(f.Payload, r.errInfo); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("unexpected %s frame on an inventory stream", f.Type)
		}
	}
}

func TestInventoryListsBothGateways(t *testing.T) {
	t.Parallel()
	shell, shellAddr := startOpenShell(t, openshelltest.Options{Token: "shell-token"})
	shell.AddWorkspace("team-a")
	shell.AddWorkspace("elsewhere")
	createOpenShell(t, shell, "default", "sb-1", map[string]string{"nemo-gym.sandbox": "1", "run": "r1"})
	createOpenShell(t, shell, "default", "sb-2", nil)
	createOpenShell(t, shell, "team-a", "sb-1", map[string]string{"team": "a"})
	createOpenShell(t, shell, "elsewhere", "hidden", nil) // not a configured workspace
	osb := opensandboxtest.Start(t, opensandboxtest.Config{APIKey: "sandbox-key"})
	id1 := createOpenSandbox(t, osb, "sandbox-key", map[string]string{"nemo-gym.nvidia.com/run": "r1"})
	id2 := createOpenSandbox(t, osb, "sandbox-key", nil)

	h := newHarness(t, func(c *Config) {
		c.OpenShell = &OpenShellTarget{Addr: shellAddr, Token: "shell-token", Workspaces: []string{"default", "team-a"}}
		c.OpenSandbox = &OpenSandboxTarget{Addr: osb.Host(), APIKey: "sandbox-key"}
		c.Targets = map[string]string{"web": "127.0.0.1:80"} // not a gateway: not listed
	})
	// Twice: the second inventory reuses the session's clients.
	for range 2 {
		r := readInventory(t, h.open(t, protocol.KindInventory, protocol.InventoryParams{}))
		if r.end == nil {
			t.Fatalf("no end frame: error %+v, EOF %v", r.errInfo, r.sawEOF)
		}
		wantEnd := &protocol.InventoryEnd{Gateways: []protocol.GatewayStatus{
			{Target: "openshell", Provider: "openshell", Complete: true, Count: 3},
			{Target: "opensandbox", Provider: "opensandbox", Complete: true, Count: 2},
		}}
		if diff := cmp.Diff(wantEnd, r.end); diff != "" {
			t.Errorf("end (-want +got):\n%s", diff)
		}
		var wantShell []protocol.Sandbox
		for _, ws := range []string{"default", "team-a"} {
			for _, sb := range shell.Sandboxes(ws) {
				wantShell = append(wantShell, gateway.OpenShellSandbox(sb, ws))
			}
		}
		if diff := cmp.Diff(wantShell, r.byTarget("openshell")); diff != "" {
			t.Errorf("openshell sandboxes (-want +got):\n%s", diff)
		}
		var wantSandbox []protocol.Sandbox
		for _, id := range []string{id1, id2} {
			sb, _ := osb.Sandbox(id)
			wantSandbox = append(wantSandbox, gateway.OpenSandboxSandbox(sb))
		}
		got := r.byTarget("opensandbox")
		slices.SortFunc(got, func(a, b protocol.Sandbox) int {
			return slices.Index([]string{id1, id2}, a.ID) - slices.Index([]string{id1, id2}, b.ID)
		})
		if diff := cmp.Diff(wantSandbox, got); diff != "" {
			t.Errorf("opensandbox sandboxes (-want +got):\n%s", diff)
		}
	}
	if n := shell.Calls(openshell.MethodListSandboxes); n != 4 {
		t.Errorf("ListSandboxes called %d times, want 4 (2 workspaces, 2 inventories)", n)
	}
	if got := testutil.ToFloat64(h.a.m.listings.WithLabelValues("openshell", listingComplete)); got != 2 {
		t.Errorf("complete openshell listings = %v, want 2", got)
	}
}

// A gateway that fails is reported incomplete with its error; the other is
// listed all the same.
func TestInventoryGatewayFailure(t *testing.T) {
	t.Parallel()
	_, shellAddr := startOpenShell(t, openshelltest.Options{Token: "right-token"})
	osb := opensandboxtest.Start(t, opensandboxtest.Config{})
	id := createOpenSandbox(t, osb, "", nil)
	h := newHarness(t, func(c *Config) {
		c.OpenShell = &OpenShellTarget{Addr: shellAddr, Token: "wrong-token"}
		c.OpenSandbox = &OpenSandboxTarget{Addr: osb.Host()}
	})
	r := readInventory(t, h.open(t, protocol.KindInventory, protocol.InventoryParams{}))
	if r.end == nil || len(r.end.Gateways) != 2 {
		t.Fatalf("end %+v, error %+v", r.end, r.errInfo)
	}
	shellStatus, sandboxStatus := r.end.Gateways[0], r.end.Gateways[1]
	if shellStatus.Complete || shellStatus.Count != 0 || !strings.Contains(shellStatus.Error, "target openshell at "+shellAddr+": list: ") ||
		!strings.Contains(shellStatus.Error, "Unauthenticated") {
		t.Errorf("openshell status %+v, want incomplete with the gateway's Unauthenticated error", shellStatus)
	}
	if strings.Contains(shellStatus.Error, "token") && strings.Contains(shellStatus.Error, "wrong-token") {
		t.Errorf("status shows the token: %q", shellStatus.Error)
	}
	if !sandboxStatus.Complete || sandboxStatus.Count != 1 || len(r.byTarget("opensandbox")) != 1 || r.byTarget("opensandbox")[0].ID != id {
		t.Errorf("opensandbox status %+v, sandboxes %+v; want the one sandbox, complete", sandboxStatus, r.byTarget("opensandbox"))
	}
	if got := testutil.ToFloat64(h.a.m.listings.WithLabelValues("openshell", listingIncomplete)); got != 1 {
		t.Errorf("incomplete openshell listings = %v, want 1", got)
	}
}

// An unreachable gateway is reported incomplete; with no gateway at all the
// end frame lists none.
func TestInventoryUnreachableAndNoGateways(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	h := newHarness(t, func(c *Config) { c.OpenSandbox = &OpenSandboxTarget{Addr: closed} })
	r := readInventory(t, h.open(t, protocol.KindInventory, protocol.InventoryParams{}))
	if r.end == nil || len(r.end.Gateways) != 1 || r.end.Gateways[0].Complete || !strings.Contains(r.end.Gateways[0].Error, "connection refused") {
		t.Errorf("end %+v; want opensandbox incomplete, connection refused", r.end)
	}

	h = newHarness(t, nil)
	r = readInventory(t, h.open(t, protocol.KindInventory, protocol.InventoryParams{}))
	if diff := cmp.Diff(&protocol.InventoryEnd{Gateways: []protocol.GatewayStatus{}}, r.end); diff != "" || len(r.pages) != 0 {
		t.Errorf("no gateways: %d pages, end (-want +got):\n%s", len(r.pages), diff)
	}
}

// stuckOpenSandbox is a fake OpenSandbox server whose list requests hang
// until the client gives up; started reports each one.
func stuckOpenSandbox(t *testing.T) (*opensandboxtest.Server, chan struct{}) {
	started := make(chan struct{}, 8)
	s := opensandboxtest.Start(t, opensandboxtest.Config{Intercept: func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodGet {
			return false
		}
		started <- struct{}{}
		<-r.Context().Done()
		return true
	}})
	return s, started
}

// A listing past InventoryTimeout is reported incomplete, naming the bound,
// and the other gateway's listing within it is complete.
func TestInventoryTimeout(t *testing.T) {
	t.Parallel()
	osb, _ := stuckOpenSandbox(t)
	shell, shellAddr := startOpenShell(t, openshelltest.Options{})
	createOpenShell(t, shell, "default", "quick", nil)
	// The bound also holds the quick listing (a gRPC connection and a
	// call): it must outlast a starved machine (300 ms did not, at load 30
	// with -cpu 1). The stuck one waits it out, in parallel with the rest.
	const timeout = 5 * time.Second
	h := newHarness(t, func(c *Config) {
		c.OpenShell = &OpenShellTarget{Addr: shellAddr}
		c.OpenSandbox = &OpenSandboxTarget{Addr: osb.Host()}
		c.InventoryTimeout = timeout
	})
	r := readInventory(t, h.open(t, protocol.KindInventory, protocol.InventoryParams{}))
	if r.end == nil || len(r.end.Gateways) != 2 {
		t.Fatalf("end %+v, error %+v", r.end, r.errInfo)
	}
	if g := r.end.Gateways[0]; !g.Complete || g.Count != 1 {
		t.Errorf("openshell status %+v, want complete with 1", g)
	}
	g := r.end.Gateways[1]
	if want := fmt.Sprintf("target opensandbox at %s: listing did not finish within %v", osb.Host(), timeout); g.Complete || !strings.Contains(g.Error, want) {
		t.Errorf("opensandbox status %+v, want incomplete: %s", g, want)
	}
}

// FrameCancel, or the coordinator closing the stream, stops a listing: the
// stream ends without an end frame and the gateway request is abandoned.
func TestInventoryCancel(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"cancel frame", "stream closed"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			osb, started := stuckOpenSandbox(t)
			h := newHarness(t, func(c *Config) { c.OpenSandbox = &OpenSandboxTarget{Addr: osb.Host()} })
			e := h.open(t, protocol.KindInventory, protocol.InventoryParams{})
			recv(t, started, "the listing to start")
			if how == "cancel frame" {
				e.send(t, protocol.FrameCancel, nil)
				if r := readInventory(t, e); !r.sawEOF || len(r.pages) != 0 {
					t.Errorf("after cancel: %+v, want EOF and nothing else", r)
				}
			}
			e.st.Close()
			// The handler returned: the harness's cleanup and goleak check
			// that nothing is left running.
			waitFor(t, testWait, "the stream to be served", func() bool { return h.client.NumStreams() == 0 })
		})
	}
}

// Pages stay under the frame limit: at most 500 sandboxes and under
// MaxFrameSize each; a sandbox too large for any frame is sent with its
// labels cut (attribution and marker kept) and marked, unless it is too
// large even so: then it is left out and named.
func TestInventoryPages(t *testing.T) {
	t.Parallel()
	a, err := New(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	client, srv := tunneltest.Pair(t)
	var sbs []protocol.Sandbox
	for i := range 1201 {
		sbs = append(sbs, protocol.Sandbox{Provider: "openshell", ID: fmt.Sprintf("id-%d", i), Name: fmt.Sprintf("sb-%d", i)})
	}
	big := strings.Repeat("x", 300<<10)
	for i := range 7 {
		sbs = append(sbs, protocol.Sandbox{Provider: "openshell", ID: fmt.Sprintf("big-%d", i), Labels: map[string]string{"k": big}})
	}
	sbs = append(sbs, protocol.Sandbox{Provider: "openshell", ID: "huge", Labels: map[string]string{"k": strings.Repeat("y", protocol.MaxFrameSize)}})
	// 200k metadata entries (a 12.9 MB OpenSandbox create), attribution
	// among them.
	many := map[string]string{"nemo-gym.sandbox": "1", "nemo-gym.nvidia.com/run": "run-9", "team": "t", "zz-user": "u"}
	for i := range 200_000 {
		many[fmt.Sprintf("k%06d", i)] = strings.Repeat("v", 40)
	}
	sbs = append(sbs, protocol.Sandbox{Provider: "opensandbox", ID: "many", Labels: many})
	sbs = append(sbs, protocol.Sandbox{Provider: "openshell", ID: "hugename", Name: strings.Repeat("n", protocol.MaxFrameSize)})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type result struct {
		sent    int
		skipped []string
		err     error
	}
	done := make(chan result, 1)
	go func() {
		st, _, err := client.Accept(ctx)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer st.Close()
		sent, skipped, err := a.sendInventoryPages(st, "openshell", sbs)
		done <- result{sent, skipped, err}
	}()
	st, err := srv.Open(ctx, protocol.KindInventory, protocol.InventoryParams{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r := readInventory(t, &execStream{st: st, fr: protocol.NewFrameReader(st)})
	res := recv(t, done, "the pages to be sent")
	if res.err != nil || res.sent != 1210 || !slices.Equal(res.skipped, []string{"hugename"}) {
		t.Errorf("sent %d, skipped %v, err %v; want 1210 sent, hugename skipped", res.sent, res.skipped, res.err)
	}
	var sizes []int
	var ids []string
	cut := map[string]protocol.Sandbox{}
	for _, p := range r.pages {
		sizes = append(sizes, len(p.Sandboxes))
		for _, sb := range p.Sandboxes {
			ids = append(ids, sb.ID)
			if sb.LabelsTruncated {
				cut[sb.ID] = sb
			}
		}
	}
	if diff := cmp.Diff([]int{500, 500, 204, 3, 3}, sizes); diff != "" {
		t.Errorf("page sizes (-want +got):\n%s", diff)
	}
	if len(ids) != 1210 || ids[0] != "id-0" || ids[1209] != "many" {
		t.Errorf("sent %d sandboxes, first %q, last %q", len(ids), ids[0], ids[len(ids)-1])
	}
	if len(cut) != 2 || len(cut["huge"].Labels["k"]) != protocol.MaxLabelValueLen {
		t.Errorf("sandboxes sent with labels cut: %v; want huge (value clipped) and many", slices.Sorted(maps.Keys(cut)))
	}
	m := cut["many"].Labels
	if len(m) != protocol.MaxRecordLabels || m["nemo-gym.sandbox"] != "1" || m["nemo-gym.nvidia.com/run"] != "run-9" || m["team"] != "t" || m["k000000"] == "" || m["zz-user"] != "" {
		t.Errorf("labels of many: %d, want %d with the marker, run, team and the first others in key order", len(m), protocol.MaxRecordLabels)
	}
	if r.frameMax > protocol.MaxFrameSize {
		t.Errorf("largest frame %d bytes, over MaxFrameSize", r.frameMax)
	}
}

package opensandbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/tetherfleet/tether/coordinator/facade/opensandbox"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/protocol"
	osb "github.com/tetherfleet/tether/protocol/opensandbox"
	"github.com/tetherfleet/tether/protocol/opensandbox/opensandboxtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// defaultTestTimeout bounds every wait of a test.
const defaultTestTimeout = 20 * time.Second

// fakeFleet maps node ids to loopback addresses; DialTarget is a TCP dial.
type fakeFleet struct {
	mu    sync.Mutex
	nodes map[string]fakeNode
	dials map[string]int
}

type fakeNode struct {
	info protocol.NodeInfo
	addr string // the lifecycle server's host:port
}

func newFakeFleet() *fakeFleet {
	return &fakeFleet{nodes: map[string]fakeNode{}, dials: map[string]int{}}
}

// add connects node id (session "s1") with the opensandbox target served
// at addr and labels.
func (f *fakeFleet) add(id, addr string, labels map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if labels == nil {
		labels = map[string]string{}
	}
	f.nodes[id] = fakeNode{
		info: protocol.NodeInfo{ID: id, Labels: labels, SessionID: "s1", Targets: []string{"openshell", opensandbox.Target}},
		addr: addr,
	}
}

// setSession changes node id's session id (a reconnect).
func (f *fakeFleet) setSession(id, session string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.nodes[id]
	n.info.SessionID = session
	f.nodes[id] = n
}

// setTargets replaces node id's targets.
func (f *fakeFleet) setTargets(id string, targets ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.nodes[id]
	n.info.Targets = targets
	f.nodes[id] = n
}

func (f *fakeFleet) remove(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.nodes, id)
}

func (f *fakeFleet) dialCount(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dials[id]
}

func (f *fakeFleet) Nodes(sel protocol.Selector) []protocol.NodeInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []protocol.NodeInfo
	for _, n := range f.nodes {
		if sel.Matches(n.info.Labels) {
			info := n.info
			info.Targets = slices.Clone(info.Targets)
			out = append(out, info)
		}
	}
	return out
}

func (f *fakeFleet) DialTarget(ctx context.Context, node, target string) (net.Conn, error) {
	f.mu.Lock()
	n, ok := f.nodes[node]
	f.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("dial %s on node %s: node is not connected", target, node)
	}
	if !slices.Contains(n.info.Targets, target) {
		return nil, fmt.Errorf("dial %s on node %s: target is not configured on the node", target, node)
	}
	f.mu.Lock()
	f.dials[node]++
	f.mu.Unlock()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", n.addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s on node %s: %w", target, node, err)
	}
	return c, nil
}

// fakeLedger is an in-memory Ledger that records its calls.
type fakeLedger struct {
	mu    sync.Mutex
	recs  map[ledger.Key]ledger.Record
	calls []string // "created node/id", "deleting node/id", "deleted node/id"
	fail  error    // returned by writes when set
}

func newFakeLedger() *fakeLedger { return &fakeLedger{recs: map[ledger.Key]ledger.Record{}} }

func (l *fakeLedger) Created(_ context.Context, r ledger.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, "created "+r.Node+"/"+r.ID)
	if l.fail != nil {
		return l.fail
	}
	// Like the real ledger: a facade's record is managed and live, and
	// keeps what it is not given.
	cur, ok := l.recs[r.Key()]
	if ok {
		if r.Owner == "" {
			r.Owner = cur.Owner
		}
		if r.Labels == nil {
			r.Labels = cur.Labels
		}
		if r.ExpiresAt.IsZero() {
			r.ExpiresAt = cur.ExpiresAt
		}
	}
	r.Labels = maps.Clone(r.Labels)
	r.Managed, r.State = true, ledger.StateLive
	l.recs[r.Key()] = r
	return nil
}

func (l *fakeLedger) SetExpiry(_ context.Context, k ledger.Key, at time.Time) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, "expiry "+k.Node+"/"+k.ID+" "+at.UTC().Format(time.RFC3339))
	if l.fail != nil {
		return l.fail
	}
	if r, ok := l.recs[k]; ok {
		r.ExpiresAt = at
		l.recs[k] = r
	}
	return nil
}

func (l *fakeLedger) Deleting(_ context.Context, k ledger.Key) error {
	return l.setState(k, "deleting", ledger.StateDeleting)
}

func (l *fakeLedger) Deleted(_ context.Context, k ledger.Key) error {
	return l.setState(k, "deleted", ledger.StateDeleted)
}

func (l *fakeLedger) setState(k ledger.Key, call string, s ledger.State) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, call+" "+k.Node+"/"+k.ID)
	if l.fail != nil {
		return l.fail
	}
	if r, ok := l.recs[k]; ok {
		r.State = s
		l.recs[k] = r
	}
	return nil
}

func (l *fakeLedger) ByID(provider, id string) (ledger.Record, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.recs {
		if r.Provider == provider && r.ID == id {
			return r, true
		}
	}
	return ledger.Record{}, false
}

func (l *fakeLedger) List(f ledger.Filter) []ledger.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []ledger.Record
	for _, r := range l.recs {
		if (f.Provider == "" || r.Provider == f.Provider) && (f.State == "" || string(r.State) == f.State) &&
			(f.Node == "" || r.Node == f.Node) && (f.Run == "" || r.Run == f.Run) {
			out = append(out, r)
		}
	}
	return out
}

// RunClosed is false: the fake keeps no leases.
func (l *fakeLedger) RunClosed(string) bool { return false }

func (l *fakeLedger) LiveOn(node string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.recs {
		if r.Node == node && r.State == ledger.StateLive {
			n++
		}
	}
	return n
}

func (l *fakeLedger) put(r ledger.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs[r.Key()] = r
}

func (l *fakeLedger) record(node, id string) (ledger.Record, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.recs[ledger.Key{Provider: protocol.ProviderOpenSandbox, Node: node, ID: id}]
	return r, ok
}

func (l *fakeLedger) callLog() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.calls)
}

// facadeEnv is a facade served on loopback in front of a fake fleet.
type facadeEnv struct {
	fleet  *fakeFleet
	ledger *fakeLedger
	f      *opensandbox.Facade
	srv    *httptest.Server
	reg    *prometheus.Registry
	client *http.Client
	url    string // http://127.0.0.1:port
	host   string // 127.0.0.1:port
}

// newFacadeEnv starts a facade; mod may adjust its config.
func newFacadeEnv(t testing.TB, mod func(*opensandbox.Config)) *facadeEnv {
	t.Helper()
	e := &facadeEnv{fleet: newFakeFleet(), ledger: newFakeLedger(), reg: prometheus.NewRegistry()}
	cfg := opensandbox.Config{
		Fleet:      e.fleet,
		Ledger:     e.ledger,
		Logger:     slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
		Registerer: e.reg,
	}
	if mod != nil {
		mod(&cfg)
	}
	f, err := opensandbox.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e.f = f
	// Served as the coordinator serves it, limits included.
	e.srv = httptest.NewUnstartedServer(f)
	e.srv.Config = f.HTTPServer(nil)
	e.srv.Start()
	e.client = &http.Client{Transport: &http.Transport{}}
	t.Cleanup(func() {
		e.client.CloseIdleConnections()
		f.Close()
		e.srv.Close()
	})
	e.url = e.srv.URL
	e.host = strings.TrimPrefix(e.srv.URL, "http://")
	return e
}

// do sends a request to the facade and returns status, headers and body.
func (e *facadeEnv) do(t testing.TB, method, path string, hdr map[string]string, body string) (int, http.Header, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	var rd *strings.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	var req *http.Request
	var err error
	if rd != nil {
		req, err = http.NewRequestWithContext(ctx, method, e.url+path, rd)
	} else {
		req, err = http.NewRequestWithContext(ctx, method, e.url+path, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	if _, err := io.Copy(&b, resp.Body); err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp.StatusCode, resp.Header, b.String()
}

// startNode starts a fake lifecycle server (with execd) and connects it to
// the fleet as node id.
func (e *facadeEnv) startNode(t testing.TB, id string, labels map[string]string, cfg opensandboxtest.Config) *opensandboxtest.Server {
	t.Helper()
	s := opensandboxtest.Start(t, cfg)
	e.fleet.add(id, s.Host(), labels)
	return s
}

// createBody is a create request as NeMo Gym sends it (OSB-1), with
// metadata md.
func createBody(md map[string]string) string {
	b, err := json.Marshal(map[string]any{
		"image":          map[string]string{"uri": "python:3.12"},
		"entrypoint":     []string{"tail", "-f", "/dev/null"},
		"timeout":        600,
		"env":            map[string]string{"A": "1"},
		"metadata":       md,
		"resourceLimits": map[string]string{"cpu": "2", "memory": "4096Mi"},
		"extensions":     map[string]string{"imagePullPolicy": "IfNotPresent", "opensandbox.extensions.image-pull-policy": "IfNotPresent"},
		"secureAccess":   false,
	})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// create creates a sandbox through the facade and returns its id.
func (e *facadeEnv) create(t testing.TB, hdr map[string]string, md map[string]string) string {
	t.Helper()
	code, _, body := e.do(t, "POST", "/v1/sandboxes", hdr, createBody(md))
	if code != http.StatusAccepted {
		t.Fatalf("create: %d %s", code, body)
	}
	var cr osb.CreateSandboxResponse
	mustJSON(t, body, &cr)
	return cr.ID
}

// createDirect creates a sandbox on a node's fake, bypassing the facade.
func createDirect(t testing.TB, s *opensandboxtest.Server, md map[string]string) string {
	t.Helper()
	req, err := http.NewRequest("POST", s.URL+"/v1/sandboxes", strings.NewReader(createBody(md)))
	if err != nil {
		t.Fatal(err)
	}
	req.Close = true // no idle conn outlives the test
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var cr osb.CreateSandboxResponse
	if err := json.NewDecoder(resp.Body).Decode(&cr); err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("direct create: %d %v", resp.StatusCode, err)
	}
	return cr.ID
}

func mustJSON(t testing.TB, body string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("decode %q: %v", body, err)
	}
}

// requestsTo counts the requests node server s received for path.
func requestsTo(s *opensandboxtest.Server, method, path string) int {
	n := 0
	for _, r := range s.Requests() {
		if r.Method == method && r.Path == path {
			n++
		}
	}
	return n
}

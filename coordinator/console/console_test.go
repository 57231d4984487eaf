package console

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

// testPolicy: admin may read everything; alice her own jobs and runs on
// prod nodes; lister lists prod nodes only; nobody else is named.
const testPolicy = `version: 1
identities:
  token:admin:
    rules:
      - nodes: "*"
        operations: [nodes.list]
      - nodes: "*"
        operations: [job.status, job.logs]
        scope: any
      - operations: [sandboxes.list]
        scope: any
      - operations: [admin]
  token:alice:
    rules:
      - nodes: "env=prod"
        operations: [nodes.list, job.status, job.logs]
      - operations: [sandboxes.list]
  token:lister:
    rules:
      - nodes: "env=prod"
        operations: [nodes.list]
  token:statusonly:
    rules:
      - nodes: "*"
        operations: [job.status]
        scope: any
`

// tokens of the test: TOKEN -> name.
var testTokens = map[string]string{
	"admin-token-0123456789":  "admin",
	"alice-token-0123456789":  "alice",
	"lister-token-0123456789": "lister",
	"status-token-0123456789": "statusonly",
	"nobody-token-0123456789": "nobody", // a token the policy does not name
}

type fakeFleet struct {
	nodes []protocol.NodeInfo
	mu    sync.Mutex
	// out maps "node/id/stream" to the output so far; done marks jobs
	// exited.
	out   map[string]string
	done  map[string]bool
	reads int
}

func (f *fakeFleet) FleetNodes(sel protocol.Selector) []protocol.NodeInfo { return f.nodes }

func (f *fakeFleet) JobPolicyNodes(ids []string) []policy.Node {
	out := make([]policy.Node, len(ids))
	for i, id := range ids {
		out[i] = policy.Node{ID: id}
		for _, n := range f.nodes {
			if n.ID == id {
				out[i].Labels = n.Labels
			}
		}
	}
	return out
}

func (f *fakeFleet) JobOutput(ctx context.Context, node, id, stream string, offset, limit int64) ([]byte, protocol.JobOutputEnd, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	s, ok := f.out[node+"/"+id+"/"+stream]
	if !ok {
		return nil, protocol.JobOutputEnd{}, jobstore.ErrNoSuchJob
	}
	if offset > int64(len(s)) {
		offset = int64(len(s))
	}
	b := []byte(s[offset:])
	if int64(len(b)) > limit {
		b = b[:limit]
	}
	return b, protocol.JobOutputEnd{Total: int64(len(s)), EOF: f.done[node+"/"+id]}, nil
}

func (f *fakeFleet) append(key, text string) {
	f.mu.Lock()
	f.out[key] += text
	f.mu.Unlock()
}

type fakeJobs map[string]jobstore.Record

// jobStoreDown is a job id whose Get fails as an unavailable store does.
const jobStoreDown = "job-store-down"

func (j fakeJobs) List(ctx context.Context, f jobstore.Filter, keep func(*jobstore.Record) bool, limit int) ([]*jobstore.Job, error) {
	var out []*jobstore.Job
	for _, id := range sortedKeys(j) {
		rec := j[id]
		if f.Node != "" && !slices.Contains(rec.Nodes, f.Node) || f.State != "" && rec.State != f.State {
			continue
		}
		if keep == nil || keep(&rec) {
			out = append(out, &jobstore.Job{Record: rec})
		}
	}
	return out, nil
}

func (j fakeJobs) Get(ctx context.Context, id string) (*jobstore.Job, error) {
	if id == jobStoreDown {
		return nil, errors.New("jobstore: get " + id + ": the store is unavailable")
	}
	rec, ok := j[id]
	if !ok {
		return nil, jobstore.ErrNotFound
	}
	return &jobstore.Job{Record: rec}, nil
}

type fakeLedger struct {
	recs   []ledger.Record
	leases []ledger.Lease
}

func (l *fakeLedger) List(f ledger.Filter) []ledger.Record {
	var out []ledger.Record
	for _, r := range l.recs {
		if (f.Run == "" || r.Run == f.Run) && (f.Node == "" || r.Node == f.Node) && (f.OwnedBy == "" || l.OwnerOf(r) == f.OwnedBy) {
			out = append(out, r)
		}
	}
	return out
}
func (l *fakeLedger) Leases() []ledger.Lease { return l.leases }
func (l *fakeLedger) Ready() bool            { return true }
func (l *fakeLedger) OwnerOf(r ledger.Record) string {
	for _, ls := range l.leases {
		if ls.Run == r.OwnerLease() {
			return ls.OwnedBy
		}
	}
	return r.CreatedBy
}

type fakeAudit struct {
	mu       sync.Mutex
	events   []protocol.AuditEvent
	last     protocol.AuditQueryRequest
	recorded []protocol.AuditEvent // the console's own events
}

func (a *fakeAudit) Record(ev *protocol.AuditEvent) {
	a.mu.Lock()
	a.recorded = append(a.recorded, *ev)
	a.mu.Unlock()
}

// take returns and forgets the recorded events.
func (a *fakeAudit) take() []protocol.AuditEvent {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := a.recorded
	a.recorded = nil
	return out
}

func (a *fakeAudit) Query(ctx context.Context, q protocol.AuditQueryRequest, maxBytes int) (*protocol.AuditQueryResponse, error) {
	a.mu.Lock()
	a.last = q
	a.mu.Unlock()
	var out []protocol.AuditEvent
	for _, e := range a.events {
		if (q.Identity == "" || e.Identity == q.Identity) && (q.Node == "" || slices.Contains(e.Nodes, q.Node)) {
			out = append(out, e)
		}
	}
	return &protocol.AuditQueryResponse{Events: out}, nil
}

const xss = `<script>alert("x")</script>`

type env struct {
	h      *Handler
	fleet  *fakeFleet
	audit  *fakeAudit
	now    time.Time
	nowMu  sync.Mutex
	local  *policy.Identity // what Config.Local answers; nil: unidentified
	server *httptest.Server
}

// newEnv returns a console over fakes; opts adjust its Config before New.
func newEnv(t *testing.T, opts ...func(*Config)) *env {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(testPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	store, err := policy.NewStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{now: time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC)}
	e.fleet = &fakeFleet{
		nodes: []protocol.NodeInfo{
			{ID: "prod-1", Labels: map[string]string{"env": "prod", "note": xss}, Capacity: protocol.Capacity{CPUs: 8, MemoryBytes: 16 << 30}, RTTMicros: 1500, LastHeartbeat: time.Now()},
			{ID: "dev-1", Labels: map[string]string{"env": "dev"}, Capacity: protocol.Capacity{CPUs: 2}},
		},
		out: map[string]string{
			"prod-1/job-alice/stdout": "hello " + xss + "\n",
			"prod-1/job-alice/stderr": "",
			"dev-1/job-bob/stdout":    "bob's secret\n",
			"dev-1/job-bob/stderr":    "",
		},
		done: map[string]bool{},
	}
	jobs := fakeJobs{
		"job-alice": {ID: "job-alice", State: protocol.JobRunning, Owner: "token:alice", Nodes: []string{"prod-1"}, Detached: true, Command: "echo " + xss, SubmittedAt: time.Now()},
		"job-bob":   {ID: "job-bob", State: protocol.JobSucceeded, Owner: "nats:bob", Nodes: []string{"dev-1"}, Detached: true, Command: "bob-command", SubmittedAt: time.Now().Add(-time.Minute)},
	}
	led := &fakeLedger{
		recs: []ledger.Record{
			{Provider: "openshell", Node: "prod-1", ID: "sb-alice", Name: "a", Run: "run-alice", State: ledger.StateLive},
			{Provider: "openshell", Node: "dev-1", ID: "sb-bob", Name: "b", Run: "run-bob", State: ledger.StateDeleting, Attempts: 2, LastError: "gateway down"},
		},
		leases: []ledger.Lease{
			{Run: "run-alice", Holder: "gym-1", OwnedBy: "token:alice", ExpiresAt: time.Now().Add(time.Minute)},
			{Run: "run-bob", Holder: "gym-2", OwnedBy: "nats:bob", ExpiresAt: time.Now().Add(time.Minute)},
		},
	}
	e.audit = &fakeAudit{events: []protocol.AuditEvent{
		{Identity: "token:alice", Operation: "exec", Result: protocol.AuditOK, Nodes: []string{"prod-1"}},
		{Identity: "nats:bob", Operation: "exec", Result: protocol.AuditRefused, Nodes: []string{"dev-1"}, Error: xss, Source: "192.0.2.9:40100"},
	}}
	cfg := Config{
		Policy:  store,
		Fleet:   e.fleet,
		Jobs:    jobs,
		Ledger:  led,
		Audit:   e.audit,
		Auditor: e.audit,
		Tokens:  func(tok string) (string, bool) { n, ok := testTokens[tok]; return n, ok },
		Local: func(r *http.Request) (policy.Identity, bool) {
			if e.local == nil {
				return policy.Identity{}, false
			}
			return *e.local, true
		},
		now: func() time.Time { e.nowMu.Lock(); defer e.nowMu.Unlock(); return e.now },
	}
	for _, o := range opts {
		o(&cfg)
	}
	e.h, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.server = httptest.NewServer(e.h)
	t.Cleanup(e.server.Close)
	return e
}

// loopbackAddr is the RemoteAddr of the tests' requests: the console
// takes credentials only over TLS or loopback, and httptest.NewRequest's
// default (192.0.2.1, plain HTTP) is a remote caller in clear text.
const loopbackAddr = "127.0.0.1:40000"

// remoteAddr is a caller on another host.
const remoteAddr = "192.0.2.7:5000"

// loopbackHost is the Host of the tests' loopback requests, as a
// browser on the coordinator's host sends it.
const loopbackHost = "127.0.0.1:8081"

// localRequest is httptest.NewRequest from loopbackAddr to loopbackHost.
func localRequest(method, target string, body io.Reader) *http.Request {
	req := httptest.NewRequest(method, target, body)
	req.RemoteAddr = loopbackAddr
	req.Host = loopbackHost
	return req
}

// get requests path from loopback with the bearer token tok ("" for
// none) and returns the status and body.
func (e *env) get(t *testing.T, path, tok string) (int, string) {
	t.Helper()
	req := localRequest("GET", path, nil)
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

// getFrom is get from remote (host:port), over TLS when overTLS.
func (e *env) getFrom(t *testing.T, path, tok, remote string, overTLS bool) (int, string) {
	t.Helper()
	req := httptest.NewRequest("GET", path, nil)
	req.RemoteAddr = remote
	if overTLS {
		req.TLS = &tls.ConnectionState{HandshakeComplete: true}
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

var pages = []string{"/console/", "/console/nodes", "/console/jobs", "/console/jobs/job-alice", "/console/jobs/job-alice/output/prod-1/stdout?offset=0", "/console/sandboxes", "/console/audit"}

func TestUnauthenticatedCallersGet401(t *testing.T) {
	e := newEnv(t)
	for _, p := range pages {
		code, body := e.get(t, p, "")
		if code != http.StatusUnauthorized {
			t.Errorf("GET %s without credentials: %d, want 401", p, code)
		}
		if strings.Contains(body, "data-node") || strings.Contains(body, "hello") || strings.Contains(body, "env=prod") {
			t.Errorf("GET %s without credentials leaked fleet data: %s", p, body)
		}
		if !strings.Contains(body, `name="token"`) {
			t.Errorf("GET %s without credentials: no login form in %s", p, body)
		}
		// A wrong token is refused too, not treated as no token.
		if code, _ := e.get(t, p, "not-a-token-0123456789"); code != http.StatusUnauthorized {
			t.Errorf("GET %s with a bad token: %d, want 401", p, code)
		}
	}
}

func TestCallersWithoutGrantsGet403(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		tok, path string
		want      int
	}{
		{"nobody-token-0123456789", "/console/", http.StatusForbidden}, // identified, not in the policy
		{"nobody-token-0123456789", "/console/nodes", http.StatusForbidden},
		{"lister-token-0123456789", "/console/", http.StatusOK},
		{"nobody-token-0123456789", "/console/jobs", http.StatusForbidden},
		{"lister-token-0123456789", "/console/nodes", http.StatusOK},
		{"lister-token-0123456789", "/console/jobs", http.StatusForbidden},
		{"lister-token-0123456789", "/console/sandboxes", http.StatusForbidden},
		{"lister-token-0123456789", "/console/audit", http.StatusForbidden},
		{"alice-token-0123456789", "/console/audit", http.StatusForbidden}, // admin only
		{"admin-token-0123456789", "/console/audit", http.StatusOK},
		{"status-token-0123456789", "/console/jobs/job-alice/output/prod-1/stdout?offset=0", http.StatusForbidden}, // job.status without job.logs
	} {
		code, body := e.get(t, tc.path, tc.tok)
		if code != tc.want {
			t.Errorf("%s GET %s: %d, want %d: %s", testTokens[tc.tok], tc.path, code, tc.want, body)
		}
		if code == http.StatusForbidden && !strings.Contains(body, "token:"+testTokens[tc.tok]) {
			t.Errorf("%s GET %s: the refusal does not name the identity: %s", testTokens[tc.tok], tc.path, body)
		}
	}
}

func TestNodesShowOnlyWhatPolicyAllows(t *testing.T) {
	e := newEnv(t)
	_, body := e.get(t, "/console/nodes", "lister-token-0123456789")
	if !strings.Contains(body, `data-node="prod-1"`) || strings.Contains(body, "dev-1") {
		t.Errorf("lister (nodes.list on env=prod) should see prod-1 only:\n%s", body)
	}
	for _, want := range []string{"env=prod", "1.5ms", "16.0 GiB"} {
		if !strings.Contains(body, want) {
			t.Errorf("nodes page lacks %q:\n%s", want, body)
		}
	}
	_, body = e.get(t, "/console/nodes", "admin-token-0123456789")
	if !strings.Contains(body, `data-node="prod-1"`) || !strings.Contains(body, `data-node="dev-1"`) {
		t.Errorf("admin should see both nodes:\n%s", body)
	}
	// dev-1 has no RTT yet: the column says so.
	if !strings.Contains(body, `<td class="rtt">—</td>`) {
		t.Errorf("a node without an RTT should show —:\n%s", body)
	}
	if !strings.Contains(body, `<td class="stalls">`) {
		t.Errorf("no stalls column:\n%s", body)
	}
}

func TestValuesFromNodesAndJobsAreEscaped(t *testing.T) {
	e := newEnv(t)
	for _, p := range []string{"/console/nodes", "/console/jobs", "/console/jobs/job-alice", "/console/audit"} {
		_, body := e.get(t, p, "admin-token-0123456789")
		if strings.Contains(body, "<script>alert") {
			t.Errorf("%s renders a node's or job's <script> unescaped:\n%s", p, body)
		}
		if !strings.Contains(body, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;") {
			t.Errorf("%s does not show the escaped value:\n%s", p, body)
		}
	}
	// The raw output endpoint is text/plain and nosniff: a browser never
	// runs it as HTML.
	req := localRequest("GET", "/console/jobs/job-alice/output/prod-1/stdout?offset=0", nil)
	req.Header.Set("Authorization", "Bearer admin-token-0123456789")
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	if ct := rec.Header().Get("Content-Type"); ct != "text/plain; charset=utf-8" || rec.Header().Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("output endpoint: Content-Type %q, nosniff %q", ct, rec.Header().Get("X-Content-Type-Options"))
	}
	if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("no script-src 'self' in CSP %q", csp)
	}
}

func TestJobsFollowScope(t *testing.T) {
	e := newEnv(t)
	_, body := e.get(t, "/console/jobs", "alice-token-0123456789")
	if !strings.Contains(body, `data-job="job-alice"`) || strings.Contains(body, "job-bob") {
		t.Errorf("alice (scope own) should list her job only:\n%s", body)
	}
	if code, _ := e.get(t, "/console/jobs/job-bob", "alice-token-0123456789"); code != http.StatusNotFound {
		t.Errorf("alice GET bob's job: %d, want 404", code)
	}
	if code, body := e.get(t, "/console/jobs/job-bob/output/dev-1/stdout?offset=0", "alice-token-0123456789"); code != http.StatusNotFound || strings.Contains(body, "secret") {
		t.Errorf("alice GET bob's output: %d %q, want 404 without it", code, body)
	}
	code, body := e.get(t, "/console/jobs/job-alice", "alice-token-0123456789")
	if code != 200 || !strings.Contains(body, `id="out-prod-1-stdout"`) || !strings.Contains(body, "hello &lt;script&gt;") {
		t.Errorf("alice GET her job: %d:\n%s", code, body)
	}
	_, body = e.get(t, "/console/jobs", "admin-token-0123456789")
	if !strings.Contains(body, `data-job="job-alice"`) || !strings.Contains(body, `data-job="job-bob"`) {
		t.Errorf("admin (scope any) should list both jobs:\n%s", body)
	}
}

func TestOutputEndpoint(t *testing.T) {
	e := newEnv(t)
	get := func(q string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", e.server.URL+"/console/jobs/job-alice/output/prod-1/stdout?"+q, nil)
		req.Header.Set("Authorization", "Bearer alice-token-0123456789")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	first := "hello " + xss + "\n"
	total := strconv.Itoa(len(first))
	resp, body := get("offset=6")
	if resp.StatusCode != 200 || body != xss+"\n" || resp.Header.Get(HeaderOutputTotal) != total || resp.Header.Get(HeaderOutputEOF) != "false" {
		t.Errorf("offset 6: %d %q total %s eof %s", resp.StatusCode, body, resp.Header.Get(HeaderOutputTotal), resp.Header.Get(HeaderOutputEOF))
	}
	for _, bad := range []string{"offset=-1", "offset=x", "offset=0&wait=99", "offset=0&wait=1.5"} {
		if resp, _ := get(bad); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d, want 400", bad, resp.StatusCode)
		}
	}
	// A long poll at the end returns when output comes.
	go func() {
		time.Sleep(200 * time.Millisecond)
		e.fleet.append("prod-1/job-alice/stdout", "more\n")
	}()
	resp, body = get("offset=" + total + "&wait=10")
	if resp.StatusCode != 200 || body != "more\n" {
		t.Errorf("long poll: %d %q, want the new line", resp.StatusCode, body)
	}
	// Once the job exited and everything was read, EOF.
	e.fleet.mu.Lock()
	e.fleet.done["prod-1/job-alice"] = true
	e.fleet.mu.Unlock()
	resp, body = get("offset=" + strconv.Itoa(len(first)+len("more\n")) + "&wait=10")
	if resp.StatusCode != 200 || body != "" || resp.Header.Get(HeaderOutputEOF) != "true" {
		t.Errorf("at the end of an exited job: %d %q eof %s", resp.StatusCode, body, resp.Header.Get(HeaderOutputEOF))
	}
}

func TestSandboxesFollowScope(t *testing.T) {
	e := newEnv(t)
	_, body := e.get(t, "/console/sandboxes", "alice-token-0123456789")
	if !strings.Contains(body, "sb-alice") || strings.Contains(body, "sb-bob") || strings.Contains(body, "gym-2") {
		t.Errorf("alice (scope own) should see her run only:\n%s", body)
	}
	_, body = e.get(t, "/console/sandboxes", "admin-token-0123456789")
	for _, want := range []string{`data-run="run-alice"`, `data-run="run-bob"`, "gym-1", "gym-2", "gateway down"} {
		if !strings.Contains(body, want) {
			t.Errorf("admin's ledger page lacks %q:\n%s", want, body)
		}
	}
	// The reap in progress is listed under Reaps.
	if i := strings.Index(body, `id="reaps"`); i < 0 || !strings.Contains(body[i:], "sb-bob") {
		t.Errorf("the deleting sandbox is not under Reaps:\n%s", body)
	}
}

func TestAuditFilters(t *testing.T) {
	e := newEnv(t)
	_, body := e.get(t, "/console/audit?identity=nats:bob&node=dev-1&source=192.0.2.9", "admin-token-0123456789")
	e.audit.mu.Lock()
	q := e.audit.last
	e.audit.mu.Unlock()
	if q.Identity != "nats:bob" || q.Node != "dev-1" || q.Source != "192.0.2.9" {
		t.Errorf("query %+v, want identity nats:bob node dev-1 source 192.0.2.9", q)
	}
	// Where the call came from is shown (the event's source).
	if !strings.Contains(body, "<td>192.0.2.9:40100</td>") || !strings.Contains(body, `name="source" value="192.0.2.9"`) {
		t.Errorf("audit page lacks the event's source or the source filter:\n%s", body)
	}
	if strings.Contains(body, "<td>token:alice</td>") {
		t.Errorf("filtered page shows alice's event:\n%s", body)
	}
	if !strings.Contains(body, "<td>nats:bob</td>") {
		t.Errorf("filtered page lacks bob's event:\n%s", body)
	}
	if code, _ := e.get(t, "/console/audit?result="+url.QueryEscape("<bogus>"), "admin-token-0123456789"); code != http.StatusBadRequest {
		t.Errorf("a bad filter: %d, want 400", code)
	}
}

func TestLoopbackLocalUser(t *testing.T) {
	e := newEnv(t)
	if code, _ := e.get(t, "/console/nodes", ""); code != http.StatusUnauthorized {
		t.Fatalf("no local user: %d, want 401", code)
	}
	e.local = &policy.Identity{Kind: policy.KindToken, Name: "lister"}
	code, body := e.get(t, "/console/nodes", "")
	if code != 200 || !strings.Contains(body, "prod-1") || !strings.Contains(body, "token:lister") {
		t.Errorf("local user lister: %d:\n%s", code, body)
	}
}

// client returns an HTTP client that does not follow redirects.
func client() *http.Client {
	return &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func TestLoginExchange(t *testing.T) {
	e := newEnv(t)
	c := client()
	resp, err := c.Get(e.server.URL + "/console/login?token=alice-token-0123456789&next=" + url.QueryEscape("/console/jobs?node=prod-1"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/console/jobs?node=prod-1" {
		t.Fatalf("login: %d to %q, want 303 to the next page", resp.StatusCode, resp.Header.Get("Location"))
	}
	var ck *http.Cookie
	for _, k := range resp.Cookies() {
		if k.Name == cookieName {
			ck = k
		}
	}
	if ck == nil || !ck.HttpOnly || !ck.Secure || ck.SameSite != http.SameSiteStrictMode || ck.Path != Prefix {
		t.Fatalf("session cookie %+v: want HttpOnly, Secure, SameSite=Strict, Path %s", ck, Prefix)
	}
	if strings.Contains(ck.Value, "alice-token") {
		t.Fatalf("the cookie holds the token: %q", ck.Value)
	}
	withCookie := func(v string) int {
		req := localRequest("GET", "/console/jobs", nil)
		req.AddCookie(&http.Cookie{Name: cookieName, Value: v})
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, req)
		return rec.Code
	}
	if code := withCookie(ck.Value); code != 200 {
		t.Errorf("with the session cookie: %d, want 200", code)
	}
	// Another name under the same MAC, or a changed expiry, is refused.
	parts := strings.Split(ck.Value, ".")
	admin := base64.RawURLEncoding.EncodeToString([]byte("admin"))
	for _, forged := range []string{admin + "." + parts[1] + "." + parts[2] + "." + parts[3], parts[0] + "." + parts[1] + ".9999999999." + parts[3], ck.Value + "x", admin + "." + parts[1] + ".9999999999.", ""} {
		if code := withCookie(forged); code != http.StatusUnauthorized {
			t.Errorf("forged cookie %q: %d, want 401", forged, code)
		}
	}
	e.nowMu.Lock()
	e.now = e.now.Add(DefaultSessionTTL + time.Second)
	e.nowMu.Unlock()
	if code := withCookie(ck.Value); code != http.StatusUnauthorized {
		t.Errorf("expired cookie: %d, want 401", code)
	}
}

func TestLoginRefusals(t *testing.T) {
	e := newEnv(t)
	do := func(req *http.Request) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, req)
		return rec
	}
	// A bad token.
	req := httptest.NewRequest("GET", "/console/login?token=wrong-token-0123456789", nil)
	req.RemoteAddr = "127.0.0.1:5000"
	if rec := do(req); rec.Code != http.StatusUnauthorized || rec.Header().Get("Set-Cookie") != "" {
		t.Errorf("bad token: %d, cookie %q", rec.Code, rec.Header().Get("Set-Cookie"))
	}
	if evs := e.audit.take(); len(evs) != 1 || evs[0].Operation != opLogin || evs[0].Reason != "unauthenticated" {
		t.Errorf("a bad token's login recorded %+v, want one refused console.login", evs)
	}
	// A good token over plain HTTP from another host.
	req = httptest.NewRequest("GET", "/console/login?token=alice-token-0123456789", nil)
	req.RemoteAddr = "192.0.2.7:5000"
	if rec := do(req); rec.Code != http.StatusForbidden || rec.Header().Get("Set-Cookie") != "" {
		t.Errorf("clear text from afar: %d, cookie %q", rec.Code, rec.Header().Get("Set-Cookie"))
	}
	// A form posted from another site.
	req = httptest.NewRequest("POST", "/console/login", strings.NewReader("token=alice-token-0123456789"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://evil.example")
	req.RemoteAddr = "127.0.0.1:5000"
	if rec := do(req); rec.Code != http.StatusForbidden || rec.Header().Get("Set-Cookie") != "" {
		t.Errorf("cross-site post: %d, cookie %q", rec.Code, rec.Header().Get("Set-Cookie"))
	}
	// The same form from this origin.
	req = httptest.NewRequest("POST", "/console/login", strings.NewReader("token=alice-token-0123456789&next=//evil.example/x"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://"+req.Host)
	req.RemoteAddr = "127.0.0.1:5000"
	rec := do(req)
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Set-Cookie") == "" {
		t.Errorf("same-origin post: %d, cookie %q", rec.Code, rec.Header().Get("Set-Cookie"))
	}
	if loc := rec.Header().Get("Location"); loc != Prefix {
		t.Errorf("next=//evil.example/x redirected to %q, want %s (no open redirect)", loc, Prefix)
	}
}

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{
		"":                         Prefix,
		"/console/jobs?node=a":     "/console/jobs?node=a",
		"//evil.example/console/":  Prefix,
		"https://evil.example/":    Prefix,
		"/metrics":                 Prefix,
		"/console/\\evil":          Prefix,
		"javascript:alert(1)":      Prefix,
		"/console/../metrics":      Prefix, // the browser resolves it to /metrics
		"/console/%2e%2e/evil":     Prefix,
		"/console/jobs/../nodes":   "/console/jobs/../nodes",
		"/console":                 Prefix,
		"/console/jobs/x/output/y": "/console/jobs/x/output/y",
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestNewNeedsPolicyAndFleet(t *testing.T) {
	if _, err := New(Config{Fleet: &fakeFleet{}}); err == nil || !strings.Contains(err.Error(), "Policy") {
		t.Errorf("no policy: %v", err)
	}
	path := filepath.Join(t.TempDir(), "p.yaml")
	os.WriteFile(path, []byte(testPolicy), 0o600)
	store, err := policy.NewStore(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Policy: store}); err == nil || !strings.Contains(err.Error(), "Fleet") {
		t.Errorf("no fleet: %v", err)
	}
}

func TestReadsAreAudited(t *testing.T) {
	e := newEnv(t)
	type want struct{ identity, op, method, result, reason, job string }
	for _, tc := range []struct {
		path, tok string
		want      []want // nil: nothing recorded
	}{
		{"/console/nodes", "lister-token-0123456789", []want{{"token:lister", "nodes.list", "GET nodes", protocol.AuditOK, "", ""}}},
		{"/console/nodes", "", []want{{"", "nodes.list", "GET nodes", protocol.AuditRefused, "unauthenticated", ""}}},
		{"/console/jobs", "nobody-token-0123456789", []want{{"token:nobody", "job.status", "GET jobs", protocol.AuditRefused, "no_identity", ""}}},
		{"/console/audit", "alice-token-0123456789", []want{{"token:alice", "admin", "GET audit", protocol.AuditRefused, "no_rule", ""}}},
		{"/console/jobs/job-bob", "alice-token-0123456789", []want{{"token:alice", "job.status", "GET job", protocol.AuditRefused, "no_rule", "job-bob"}}},
		{"/console/jobs/job-alice", "alice-token-0123456789", []want{{"token:alice", "job.status", "GET job", protocol.AuditOK, "", "job-alice"}}},
		{"/console/jobs/job-alice/output/prod-1/stdout?offset=0", "alice-token-0123456789", []want{{"token:alice", "job.logs", "GET job output", protocol.AuditOK, "", "job-alice"}}},
		{"/console/jobs/job-alice/output/prod-1/stdout?offset=3", "alice-token-0123456789", nil}, // a continuation
		{"/console/jobs/job-bob/output/dev-1/stdout?offset=3", "alice-token-0123456789", []want{{"token:alice", "job.logs", "GET job output", protocol.AuditRefused, "no_rule", "job-bob"}}},
		{"/console/static/console.css", "", nil},
		{"/console/login", "", nil},
		// From another host over plain HTTP (remote below): a token in
		// clear text.
		{"/console/login?token=alice-token-0123456789&remote", "", []want{{"", "console.login", "GET login", protocol.AuditRefused, "clear_text", ""}}},
		{"/console/nodes?remote", "admin-token-0123456789", []want{{"", "nodes.list", "GET nodes", protocol.AuditRefused, "clear_text", ""}}},
	} {
		if strings.HasSuffix(tc.path, "remote") {
			e.getFrom(t, tc.path, tc.tok, remoteAddr, false)
		} else {
			e.get(t, tc.path, tc.tok)
		}
		got := e.audit.take()
		if len(got) != len(tc.want) {
			t.Errorf("GET %s as %q recorded %d events, want %d: %+v", tc.path, testTokens[tc.tok], len(got), len(tc.want), got)
			continue
		}
		for i, w := range tc.want {
			g := got[i]
			if g.Identity != w.identity || g.Operation != w.op || g.Method != w.method || g.Result != w.result || g.Reason != w.reason || g.JobID != w.job || g.Facade != Facade {
				t.Errorf("GET %s as %q: event %+v, want %+v", tc.path, testTokens[tc.tok], g, w)
			}
		}
	}
}

func TestStallsColumn(t *testing.T) {
	type withStalls struct {
		ID           string
		StreamStalls int64
		WindowStalls uint32
		stallsHidden int
	}
	if got := stallsOf(&withStalls{StreamStalls: 3, WindowStalls: 2, stallsHidden: 9}); got != "5" {
		t.Errorf("stallsOf = %q, want 5 (the exported Stall fields' sum)", got)
	}
	if got := stallsOf(struct{ ID string }{"n"}); got != "—" {
		t.Errorf("stallsOf a record without stalls = %q, want —", got)
	}
	if got := stallsOf(42); got != "—" {
		t.Errorf("stallsOf(42) = %q, want —", got)
	}
}

// TestCredentialRefusals: a cookie another process sealed, a bad bearer
// token next to a good cookie or a loopback identity (no fallback to the
// weaker credential), and alice's session on bob's job are all refused.
func TestCredentialRefusals(t *testing.T) {
	e, other := newEnv(t), newEnv(t)
	do := func(path, tok, cookie string, remote string) int {
		t.Helper()
		req := localRequest("GET", path, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		if cookie != "" {
			req.AddCookie(&http.Cookie{Name: cookieName, Value: cookie})
		}
		if remote != "" {
			req.RemoteAddr = remote
		}
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, req)
		return rec.Code
	}
	good := e.h.sealSession("admin")
	if code := do("/console/jobs", "", good, ""); code != 200 {
		t.Fatalf("this process's admin cookie: %d, want 200", code)
	}
	if code := do("/console/jobs", "", other.h.sealSession("admin"), ""); code != http.StatusUnauthorized {
		t.Errorf("a cookie another process sealed: %d, want 401", code)
	}
	if code := do("/console/jobs", "not-a-token-0123456789", good, ""); code != http.StatusUnauthorized {
		t.Errorf("a bad bearer token with a good cookie: %d, want 401", code)
	}
	e.local = &policy.Identity{Kind: policy.KindToken, Name: "admin"}
	if code := do("/console/jobs", "not-a-token-0123456789", "", "127.0.0.1:5000"); code != http.StatusUnauthorized {
		t.Errorf("a bad bearer token from a loopback local user: %d, want 401", code)
	}
	e.local = nil
	alice := e.h.sealSession("alice")
	if code := do("/console/jobs/job-bob", "", alice, ""); code != http.StatusNotFound {
		t.Errorf("alice's session on bob's job: %d, want 404", code)
	}
	if code := do("/console/jobs/job-bob/output/dev-1/stdout?offset=0", "", alice, ""); code != http.StatusNotFound {
		t.Errorf("alice's session on bob's output: %d, want 404", code)
	}
}

// A job store that cannot answer is said to be unavailable (503) on the
// job page and on its output, never "no job" (404): the job may exist.
func TestJobStoreDownIsNotNotFound(t *testing.T) {
	e := newEnv(t)
	for _, p := range []string{"/console/jobs/" + jobStoreDown, "/console/jobs/" + jobStoreDown + "/output/prod-1/stdout?offset=0"} {
		if code, body := e.get(t, p, "alice-token-0123456789"); code != http.StatusServiceUnavailable || !strings.Contains(body, "unavailable") {
			t.Errorf("GET %s with the store down: %d %q, want 503 naming it", p, code, body)
		}
	}
}

// TestClearTextCredentialsRefused: a bearer token or a session cookie
// from another host over plain HTTP is refused with 403 naming why (TLS or
// loopback), whether or not it is good, as the login exchange refuses a
// token; over TLS, or from loopback (IPv4 or IPv6), the same credential
// reads the page. A caller without credentials still gets the login form.
func TestClearTextCredentialsRefused(t *testing.T) {
	e := newEnv(t)
	const good = "admin-token-0123456789"
	for _, p := range pages {
		for _, tok := range []string{good, "not-a-token-0123456789"} {
			code, body := e.getFrom(t, p, tok, remoteAddr, false)
			if code != http.StatusForbidden || !strings.Contains(body, "neither TLS nor loopback") {
				t.Errorf("GET %s with bearer %q over plain HTTP from %s: %d, want 403 naming TLS or loopback:\n%s", p, tok, remoteAddr, code, body)
			}
			if strings.Contains(body, "data-node") || strings.Contains(body, "hello") {
				t.Errorf("GET %s over plain HTTP from afar leaked fleet data:\n%s", p, body)
			}
		}
		if code, _ := e.getFrom(t, p, good, remoteAddr, true); code != http.StatusOK {
			t.Errorf("GET %s with a good bearer over TLS from %s: %d, want 200", p, remoteAddr, code)
		}
		if code, _ := e.getFrom(t, p, good, "[::1]:5000", false); code != http.StatusOK {
			t.Errorf("GET %s with a good bearer from [::1]: %d, want 200", p, code)
		}
		if code, _ := e.getFrom(t, p, "", remoteAddr, false); code != http.StatusUnauthorized {
			t.Errorf("GET %s without credentials from afar: %d, want 401 (the login form)", p, code)
		}
	}
	// A session cookie is a credential too.
	req := httptest.NewRequest("GET", "/console/jobs", nil)
	req.RemoteAddr = remoteAddr
	req.AddCookie(&http.Cookie{Name: cookieName, Value: e.h.sealSession("admin")})
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "neither TLS nor loopback") {
		t.Errorf("a session cookie over plain HTTP from afar: %d, want 403:\n%s", rec.Code, rec.Body.String())
	}
}

// TestTLSServer: through a real TLS listener (httptest.NewTLSServer), a
// bearer token reads the page; the same handler behind a plain listener
// from loopback too (the connection, not the request, decides).
func TestTLSServer(t *testing.T) {
	e := newEnv(t)
	srv := httptest.NewTLSServer(e.h)
	defer srv.Close()
	for name, c := range map[string]struct {
		url    string
		client *http.Client
	}{"tls": {srv.URL, srv.Client()}, "loopback": {e.server.URL, http.DefaultClient}} {
		req, _ := http.NewRequest("GET", c.url+"/console/nodes", nil)
		req.Header.Set("Authorization", "Bearer admin-token-0123456789")
		resp, err := c.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %d, want 200", name, resp.StatusCode)
		}
	}
}

// TestNoNodeJobsAreTheSubmittersOnly: a job record with no nodes passes
// "job.status on every node" vacuously; it is shown only to its submitter
// and to an admin (jobstore.VisibleTo, shared with job.list), not to a
// caller with job.status scope any on every node.
func TestNoNodeJobsAreTheSubmittersOnly(t *testing.T) {
	e := newEnv(t)
	jobs := e.h.cfg.Jobs.(fakeJobs)
	jobs["job-nonode-bob"] = jobstore.Record{ID: "job-nonode-bob", State: protocol.JobFailed, Owner: "nats:bob", Command: "bob-nonode"}
	jobs["job-nonode-alice"] = jobstore.Record{ID: "job-nonode-alice", State: protocol.JobFailed, Owner: "token:alice", Command: "alice-nonode"}
	for _, tc := range []struct {
		tok       string
		see, hide []string
	}{
		{"alice-token-0123456789", []string{"job-nonode-alice"}, []string{"job-nonode-bob"}},
		{"status-token-0123456789", nil, []string{"job-nonode-alice", "job-nonode-bob"}},
		{"admin-token-0123456789", []string{"job-nonode-alice", "job-nonode-bob"}, nil},
	} {
		_, list := e.get(t, "/console/jobs", tc.tok)
		for _, id := range tc.see {
			if !strings.Contains(list, `data-job="`+id+`"`) {
				t.Errorf("%s: the jobs page lacks %s", testTokens[tc.tok], id)
			}
			if code, _ := e.get(t, "/console/jobs/"+id, tc.tok); code != http.StatusOK {
				t.Errorf("%s GET %s: %d, want 200", testTokens[tc.tok], id, code)
			}
		}
		for _, id := range tc.hide {
			if strings.Contains(list, id) {
				t.Errorf("%s: the jobs page shows %s:\n%s", testTokens[tc.tok], id, list)
			}
			if code, _ := e.get(t, "/console/jobs/"+id, tc.tok); code != http.StatusNotFound {
				t.Errorf("%s GET %s: %d, want 404", testTokens[tc.tok], id, code)
			}
		}
	}
}

// Logout ends the session on the server: a copy of the cookie taken before
// it is refused afterwards, not only dropped by the browser that logged out.
func TestLogoutRevokesSession(t *testing.T) {
	e := newEnv(t)
	v := e.h.sealSession("alice")
	with := func(path string) *httptest.ResponseRecorder {
		req := localRequest("GET", path, nil)
		req.AddCookie(&http.Cookie{Name: cookieName, Value: v})
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, req)
		return rec
	}
	if rec := with("/console/jobs"); rec.Code != 200 {
		t.Fatalf("before logout: %d, want 200", rec.Code)
	}
	if rec := with("/console/logout"); rec.Code != http.StatusSeeOther {
		t.Fatalf("logout: %d, want 303", rec.Code)
	}
	if rec := with("/console/jobs"); rec.Code != http.StatusUnauthorized {
		t.Errorf("the copied cookie after logout: %d, want 401", rec.Code)
	}
	// Other sessions of the same token live on.
	e.nowMu.Lock()
	e.now = e.now.Add(time.Second)
	e.nowMu.Unlock()
	v = e.h.sealSession("alice")
	if rec := with("/console/jobs"); rec.Code != 200 {
		t.Errorf("a later session of the same token: %d, want 200", rec.Code)
	}
}

// A forged or stale session cookie is refused (401), as a wrong bearer
// token is, not ignored in favour of the loopback local user.
func TestBadCookieNoLoopbackFallback(t *testing.T) {
	e := newEnv(t)
	e.local = &policy.Identity{Kind: policy.KindToken, Name: "lister"}
	parts := strings.Split(e.h.sealSession("alice"), ".")
	req := localRequest("GET", "/console/nodes", nil)
	req.AddCookie(&http.Cookie{Name: cookieName, Value: base64.RawURLEncoding.EncodeToString([]byte("admin")) + "." + parts[1] + "." + parts[2] + "." + parts[3]})
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	if rec.Code != http.StatusUnauthorized || strings.Contains(rec.Body.String(), "token:lister") {
		t.Errorf("forged cookie on loopback: %d, want 401 without the loopback user:\n%s", rec.Code, rec.Body.String())
	}
}

// The audit event of a clear-text refusal names where the credential came
// from and whose it was (token name, never the token), so the operator
// knows which token to replace; an unknown token is said to be unknown.
func TestClearTextAuditNamesSourceAndCredential(t *testing.T) {
	e := newEnv(t)
	check := func(what string, wants ...string) {
		t.Helper()
		got := e.audit.take()
		if len(got) != 1 || got[0].Reason != reasonClearText {
			t.Fatalf("%s: events %+v, want one clear_text refusal", what, got)
		}
		for _, w := range append(wants, remoteAddr) {
			if !strings.Contains(got[0].Error, w) {
				t.Errorf("%s: event error %q does not name %q", what, got[0].Error, w)
			}
		}
		if strings.Contains(got[0].Error, "-token-0123456789") {
			t.Errorf("%s: event error %q holds the token", what, got[0].Error)
		}
	}
	e.getFrom(t, "/console/nodes", "admin-token-0123456789", remoteAddr, false)
	check("bearer", "token:admin")
	e.getFrom(t, "/console/login?token=alice-token-0123456789", "", remoteAddr, false)
	check("login", "token:alice")
	e.getFrom(t, "/console/nodes", "wrong-token-0123456789", remoteAddr, false)
	check("unknown bearer", "not a console token")
	req := localRequest("GET", "/console/nodes", nil)
	req.RemoteAddr = remoteAddr
	req.AddCookie(&http.Cookie{Name: cookieName, Value: e.h.sealSession("alice")})
	e.h.ServeHTTP(httptest.NewRecorder(), req)
	check("cookie", "token:alice", "session cookie")
}

// An Authorization header that is no bearer token with a value (empty,
// Basic, two of them) is refused (401) as a wrong token is, not ignored
// in favour of the loopback local user.
func TestMalformedAuthorizationNoLoopbackFallback(t *testing.T) {
	e := newEnv(t)
	e.local = &policy.Identity{Kind: policy.KindToken, Name: "lister"}
	for name, values := range map[string][]string{
		"empty bearer": {"Bearer "},
		"basic":        {"Basic YWxpY2U6c2VjcmV0"},
		"no scheme":    {"admin-token-0123456789"},
		"two headers":  {"Bearer admin-token-0123456789", "Bearer other"},
	} {
		req := localRequest("GET", "/console/nodes", nil)
		for _, v := range values {
			req.Header.Add("Authorization", v)
		}
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, req)
		if rec.Code != http.StatusUnauthorized || strings.Contains(rec.Body.String(), "token:lister") {
			t.Errorf("%s on loopback: %d, want 401 without the loopback user:\n%s", name, rec.Code, rec.Body.String())
		}
	}
}

// A logged-out cookie respelled (the last base64 character's unused bits
// changed, which a lenient decoder ignores) is still refused: each MAC
// has one spelling (review: 4 spellings passed, one was revoked).
func TestLogoutRevokesEverySpelling(t *testing.T) {
	e := newEnv(t)
	v := e.h.sealSession("alice")
	get := func(path, cookie string) int {
		req := localRequest("GET", path, nil)
		req.AddCookie(&http.Cookie{Name: cookieName, Value: cookie})
		rec := httptest.NewRecorder()
		e.h.ServeHTTP(rec, req)
		return rec.Code
	}
	if code := get("/console/logout", v); code != http.StatusSeeOther {
		t.Fatalf("logout: %d, want 303", code)
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	last := strings.IndexByte(alphabet, v[len(v)-1])
	for k := 1; k < 4; k++ {
		respelled := v[:len(v)-1] + string(alphabet[last^k])
		if code := get("/console/jobs", respelled); code != http.StatusUnauthorized {
			t.Errorf("logged-out cookie respelled %q: %d, want 401", respelled[len(respelled)-4:], code)
		}
	}
}

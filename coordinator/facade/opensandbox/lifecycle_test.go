package opensandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tetherfleet/tether/coordinator/facade/opensandbox"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/protocol"
	osb "github.com/tetherfleet/tether/protocol/opensandbox"
	"github.com/tetherfleet/tether/protocol/opensandbox/opensandboxtest"
)

// nemoGymMetadata is OSB-1's metadata.
var nemoGymMetadata = map[string]string{
	"nemo-gym.nvidia.com/team":     "gym_team",
	"nemo-gym.nvidia.com/user":     "alice",
	"nemo-gym.nvidia.com/workload": "swe-gym",
	"nemo-gym.nvidia.com/run":      "run-123",
	"purpose":                      "test",
}

// OSB-1: the create body reaches the node byte for byte, the 202 comes
// back with the Location pointing at the facade, and the ledger records a
// managed sandbox owned by the Tether-Run header's run.
func TestOSB1Create(t *testing.T) {
	e := newFacadeEnv(t, nil)
	var mu sync.Mutex
	var gotBody []byte
	node := e.startNode(t, "n1", nil, opensandboxtest.Config{
		APIKey: "key-1",
		Intercept: func(w http.ResponseWriter, r *http.Request) bool {
			if r.Method == "POST" && r.URL.Path == "/v1/sandboxes" {
				b, _ := io.ReadAll(r.Body)
				mu.Lock()
				gotBody = b
				mu.Unlock()
				r.Body = io.NopCloser(bytes.NewReader(b))
			}
			return false
		},
	})
	sent := createBody(nemoGymMetadata)
	code, hdr, body := e.do(t, "POST", "/v1/sandboxes", map[string]string{
		osb.HeaderAPIKey:       "key-1",
		opensandbox.HeaderRun:  "run-123",
		opensandbox.HeaderNode: "n1",
	}, sent)
	if code != http.StatusAccepted {
		t.Fatalf("create: %d %s", code, body)
	}
	mu.Lock()
	if string(gotBody) != sent {
		t.Errorf("body at the node:\n%s\nwant verbatim:\n%s", gotBody, sent)
	}
	mu.Unlock()
	var cr osb.CreateSandboxResponse
	mustJSON(t, body, &cr)
	if cr.Status.State != osb.StatePending || cr.ExpiresAt.IsZero() || cr.CreatedAt.IsZero() {
		t.Errorf("create response %+v", cr)
	}
	if want := "http://" + e.host + "/v1/sandboxes/" + cr.ID; hdr.Get("Location") != want {
		t.Errorf("Location = %q, want %q", hdr.Get("Location"), want)
	}
	rec, ok := e.ledger.record("n1", cr.ID)
	if !ok {
		t.Fatalf("no ledger record; calls %v", e.ledger.callLog())
	}
	if !rec.Managed || rec.Owner != "run-123" || rec.State != ledger.StateLive || !rec.ExpiresAt.Equal(cr.ExpiresAt) || !cmp.Equal(rec.Labels, nemoGymMetadata) {
		t.Errorf("ledger record %+v", rec)
	}
	if _, ok := node.Sandbox(cr.ID); !ok {
		t.Error("sandbox not on node n1")
	}
	for _, r := range node.Requests() {
		if _, ok := r.Header["Tether-Run"]; ok {
			t.Error("Tether-Run reached the node")
		}
	}
}

// A ledger that fails never fails the caller's create.
func TestCreateSurvivesLedgerFailure(t *testing.T) {
	e := newFacadeEnv(t, nil)
	e.startNode(t, "n1", nil, opensandboxtest.Config{})
	e.ledger.fail = errors.New("kv down")
	e.create(t, nil, nil)
	if got := metricValue(t, e, "tether_opensandbox_facade_ledger_errors_total"); got != 1 {
		t.Errorf("ledger errors = %v, want 1", got)
	}
}

// OSB-2, OSB-3, OSB-4 through the facade over two nodes.
func TestOSB2to4List(t *testing.T) {
	e := newFacadeEnv(t, nil)
	a := e.startNode(t, "n1", nil, opensandboxtest.Config{APIKey: "k"})
	b := e.startNode(t, "n2", nil, opensandboxtest.Config{APIKey: "k"})
	hdr := map[string]string{osb.HeaderAPIKey: "k"}
	e.create(t, map[string]string{osb.HeaderAPIKey: "k", opensandbox.HeaderNode: "n1"}, nemoGymMetadata)
	e.create(t, map[string]string{osb.HeaderAPIKey: "k", opensandbox.HeaderNode: "n2"}, nemoGymMetadata)
	e.create(t, map[string]string{osb.HeaderAPIKey: "k", opensandbox.HeaderNode: "n2"}, map[string]string{"nemo-gym.nvidia.com/run": "run-9"})

	// OSB-2: the metadata filter reaches every node as the caller encoded it.
	query := "metadata=nemo-gym.nvidia.com%2Frun%3Drun-123&page=1&pageSize=200"
	code, _, body := e.do(t, "GET", "/v1/sandboxes?"+query, hdr, "")
	if code != http.StatusOK {
		t.Fatalf("list: %d %s", code, body)
	}
	var lr osb.ListSandboxesResponse
	mustJSON(t, body, &lr)
	if len(lr.Items) != 2 || lr.Pagination != (osb.Pagination{Page: 1, PageSize: 200, TotalItems: 2, TotalPages: 1}) {
		t.Errorf("list = %d items, %+v", len(lr.Items), lr.Pagination)
	}
	for _, s := range []*opensandboxtest.Server{a, b} {
		var saw bool
		for _, r := range s.Requests() {
			if r.Method == "GET" && r.Path == "/v1/sandboxes" {
				saw = true
				if want := "metadata=nemo-gym.nvidia.com%2Frun%3Drun-123&page=1&pageSize=200"; r.RawQuery != want {
					t.Errorf("node query %q, want %q", r.RawQuery, want)
				}
				if r.Header.Get(osb.HeaderAPIKey) != "k" {
					t.Error("API key not passed to the node's list")
				}
			}
		}
		if !saw {
			t.Error("a node was not asked")
		}
	}

	// OSB-3: the node's 400 comes back verbatim.
	code, _, body = e.do(t, "GET", "/v1/sandboxes?metadata=a%3D1%26broken", hdr, "")
	if c, _ := decodeError(t, body); code != http.StatusBadRequest || c != osb.CodeInvalidMetadataFormat {
		t.Errorf("OSB-3: %d %s", code, body)
	}
	// So does a 401 for a missing key.
	code, _, body = e.do(t, "GET", "/v1/sandboxes", nil, "")
	if c, _ := decodeError(t, body); code != http.StatusUnauthorized || c != osb.CodeMissingAPIKey {
		t.Errorf("no key: %d %s", code, body)
	}

	// OSB-4: FastAPI's 422.
	for _, q := range []string{"pageSize=201", "page=0"} {
		code, _, body = e.do(t, "GET", "/sandboxes?"+q, hdr, "")
		var v osb.ValidationErrorBody
		mustJSON(t, body, &v)
		if code != http.StatusUnprocessableEntity || len(v.Detail) != 1 || v.Detail[0].Loc[0] != "query" {
			t.Errorf("OSB-4 %s: %d %s", q, code, body)
		}
	}
}

// List merge and paging over two nodes, with more than one node page.
func TestListMergesAndPages(t *testing.T) {
	e := newFacadeEnv(t, nil)
	a := e.startNode(t, "n1", nil, opensandboxtest.Config{})
	b := e.startNode(t, "n2", nil, opensandboxtest.Config{})
	want := map[string]bool{}
	for range 203 {
		want[createDirect(t, a, nil)] = true
	}
	for range 4 {
		want[createDirect(t, b, map[string]string{"x": "y"})] = true
	}
	var all []osb.Sandbox
	for page := 1; ; page++ {
		code, _, body := e.do(t, "GET", "/v1/sandboxes?pageSize=50&page="+itoa(page), nil, "")
		if code != http.StatusOK {
			t.Fatalf("page %d: %d %s", page, code, body)
		}
		var lr osb.ListSandboxesResponse
		mustJSON(t, body, &lr)
		wantPg := osb.Pagination{Page: page, PageSize: 50, TotalItems: 207, TotalPages: 5, HasNextPage: page < 5}
		if lr.Pagination != wantPg {
			t.Fatalf("page %d pagination %+v, want %+v", page, lr.Pagination, wantPg)
		}
		all = append(all, lr.Items...)
		if !lr.Pagination.HasNextPage {
			break
		}
	}
	if len(all) != len(want) {
		t.Fatalf("listed %d sandboxes, want %d", len(all), len(want))
	}
	for i, sb := range all {
		if !want[sb.ID] {
			t.Errorf("unexpected sandbox %s", sb.ID)
		}
		delete(want, sb.ID)
		if i > 0 {
			p := all[i-1]
			if sb.CreatedAt.Before(p.CreatedAt) || sb.CreatedAt.Equal(p.CreatedAt) && sb.ID < p.ID {
				t.Errorf("items %d and %d out of order", i-1, i)
			}
		}
	}
	// Node n1 holds 203: it was read in two pages of 200 per list.
	var pages []string
	for _, r := range a.Requests() {
		if r.Path == "/v1/sandboxes" && r.Method == "GET" {
			pages = append(pages, r.RawQuery)
		}
	}
	if len(pages) != 10 || pages[0] != "page=1&pageSize=200" || pages[1] != "page=2&pageSize=200" {
		t.Errorf("node n1 list requests %q", pages)
	}

	// A page past the end is empty, with the totals.
	code, _, body := e.do(t, "GET", "/sandboxes?pageSize=200&page=9&state=Running", nil, "")
	if code != http.StatusOK || !strings.Contains(body, `"items":[]`) || !strings.Contains(body, `"totalItems":207`) {
		t.Errorf("page 9: %d %s", code, body)
	}
}

// OSB-5 and deletes: unknown ids get the server's exact 404; deletes of
// known ones mark the ledger deleting, then deleted.
func TestOSB5Delete(t *testing.T) {
	e := newFacadeEnv(t, nil)
	e.startNode(t, "n1", nil, opensandboxtest.Config{})
	e.startNode(t, "n2", nil, opensandboxtest.Config{})

	code, _, body := e.do(t, "DELETE", "/v1/sandboxes/sb-x", nil, "")
	if code != http.StatusNotFound || body != `{"code":"KUBERNETES::SANDBOX_NOT_FOUND","message":"Sandbox 'sb-x' not found"}` {
		t.Errorf("OSB-5: %d %s", code, body)
	}

	id := e.create(t, map[string]string{opensandbox.HeaderNode: "n2"}, nil)
	code, _, body = e.do(t, "DELETE", "/sandboxes/"+id, nil, "")
	if code != http.StatusNoContent {
		t.Fatalf("delete: %d %s", code, body)
	}
	want := []string{"created n2/" + id, "deleting n2/" + id, "deleted n2/" + id}
	if diff := cmp.Diff(want, e.ledger.callLog()); diff != "" {
		t.Errorf("ledger calls (-want +got):\n%s", diff)
	}
	// Deleting again: the ledger still routes it (deleted records are
	// looked up again), every node says 404, so does the facade.
	code, _, body = e.do(t, "DELETE", "/v1/sandboxes/"+id, nil, "")
	if code != http.StatusNotFound || !strings.Contains(body, "not found") {
		t.Errorf("second delete: %d %s", code, body)
	}
}

// OSB-6, OSB-7 and §8.1: endpoints come back pointing at the facade, with
// or without use_server_proxy, through the Host the caller used or
// Config.ExternalHost.
func TestOSB6Endpoints(t *testing.T) {
	for _, external := range []string{"", "osb.example:8443"} {
		t.Run("external="+external, func(t *testing.T) {
			e := newFacadeEnv(t, func(c *opensandbox.Config) { c.ExternalHost = external })
			e.startNode(t, "n1", nil, opensandboxtest.Config{})
			id := e.create(t, nil, nil)
			host := e.host
			if external != "" {
				host = external
			}
			for _, q := range []string{"?use_server_proxy=true", "", "?use_server_proxy=false"} {
				for _, port := range []string{"44772", "18080"} {
					code, _, body := e.do(t, "GET", "/v1/sandboxes/"+id+"/endpoints/"+port+q, nil, "")
					want := `{"endpoint":"` + host + `/sandboxes/` + id + `/proxy/` + port + `"}`
					if code != http.StatusOK || body != want {
						t.Errorf("endpoint %s%s: %d %s, want %s", port, q, code, body, want)
					}
				}
			}
			code, _, body := e.do(t, "GET", "/v1/sandboxes/"+id+"/endpoints/44772?use_server_proxy=true&expires=1900000000", nil, "")
			if code != http.StatusBadRequest {
				t.Errorf("OSB-7: %d %s", code, body)
			}
		})
	}
}

// The endpoint's headers map is kept verbatim.
func TestEndpointHeadersKept(t *testing.T) {
	e := newFacadeEnv(t, nil)
	e.startNode(t, "n1", nil, opensandboxtest.Config{
		Intercept: func(w http.ResponseWriter, r *http.Request) bool {
			if !strings.Contains(r.URL.Path, "/endpoints/") {
				return false
			}
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"endpoint":"10.0.0.7:31000","headers":{"OpenSandbox-Ingress-To":"sb-1-44772"}}`))
			return true
		},
	})
	e.ledger.put(ledger.Record{Provider: protocol.ProviderOpenSandbox, Node: "n1", ID: "sb-1", State: ledger.StateLive})
	code, _, body := e.do(t, "GET", "/v1/sandboxes/sb-1/endpoints/44772", nil, "")
	want := `{"endpoint":"` + e.host + `/sandboxes/sb-1/proxy/44772","headers":{"OpenSandbox-Ingress-To":"sb-1-44772"}}`
	if code != 200 || body != want {
		t.Errorf("got %d %s, want %s", code, body, want)
	}
}

// OSB-8 and OSB-9: the node's validation answers pass through, and
// nothing is recorded.
func TestOSB8and9CreateRejected(t *testing.T) {
	e := newFacadeEnv(t, nil)
	e.startNode(t, "n1", nil, opensandboxtest.Config{})
	code, _, body := e.do(t, "POST", "/v1/sandboxes", nil, createBody(map[string]string{"opensandbox.io/x": "1"}))
	if c, _ := decodeError(t, body); code != http.StatusBadRequest || c != osb.CodeInvalidMetadataLabel {
		t.Errorf("OSB-8: %d %s", code, body)
	}
	bad := strings.Replace(createBody(nil), `"timeout":600`, `"timeout":30`, 1)
	code, _, body = e.do(t, "POST", "/v1/sandboxes", nil, bad)
	if code != http.StatusUnprocessableEntity || !strings.HasPrefix(body, `{"detail":[`) {
		t.Errorf("OSB-9: %d %s", code, body)
	}
	if calls := e.ledger.callLog(); len(calls) != 0 {
		t.Errorf("ledger calls %v, want none", calls)
	}
}

// Renew and GET record a new expiry in the ledger (§8.4).
func TestRenewRecordsExpiry(t *testing.T) {
	e := newFacadeEnv(t, nil)
	e.startNode(t, "n1", nil, opensandboxtest.Config{})
	id := e.create(t, nil, nil)
	at := time.Now().Add(2 * time.Hour).UTC().Truncate(time.Second)
	code, _, body := e.do(t, "POST", "/v1/sandboxes/"+id+"/renew-expiration", nil, `{"expiresAt":"`+at.Format(time.RFC3339)+`"}`)
	if code != http.StatusOK {
		t.Fatalf("renew: %d %s", code, body)
	}
	if rec, _ := e.ledger.record("n1", id); !rec.ExpiresAt.Equal(at) {
		t.Errorf("ledger expiry %v, want %v", rec.ExpiresAt, at)
	}
	// A GET that shows the same expiry writes nothing.
	n := len(e.ledger.callLog())
	if code, _, body := e.do(t, "GET", "/v1/sandboxes/"+id, nil, ""); code != 200 {
		t.Fatalf("get: %d %s", code, body)
	}
	if got := e.ledger.callLog(); len(got) != n {
		t.Errorf("GET wrote to the ledger: %v", got[n:])
	}
}

// OSB-10..13: the server proxy to execd, through the facade.
func TestOSB10to13ExecdThroughProxy(t *testing.T) {
	e := newFacadeEnv(t, nil)
	node := e.startNode(t, "n1", nil, opensandboxtest.Config{APIKey: "k"})
	id := e.create(t, map[string]string{osb.HeaderAPIKey: "k"}, nil)
	execd, _, _ := node.Execd(id)
	base := "/sandboxes/" + id + "/proxy/44772"
	hdr := map[string]string{osb.HeaderAPIKey: "k", "Authorization": "Bearer secret"}

	// OSB-12 and OSB-13.
	code, _, body := e.do(t, "POST", base+"/command", hdr, `{"command":"echo hi","timeout":180000}`)
	if code != 200 {
		t.Fatalf("command: %d %s", code, body)
	}
	evs := events(t, body)
	if len(evs) != 3 || evs[0].Type != osb.EventInit || evs[1].Type != osb.EventStdout || evs[1].Text != "hi" || evs[2].Type != osb.EventExecutionComplete {
		t.Errorf("OSB-12 events %+v", evs)
	}
	for _, r := range execd.Requests() {
		if r.Header.Get("Authorization") != "" || r.Header.Get(osb.HeaderAPIKey) != "" {
			t.Errorf("OSB-13: %s %s reached execd with credentials", r.Method, r.Path)
		}
		if r.Header.Get("X-Forwarded-Host") != e.host {
			t.Errorf("X-Forwarded-Host at execd %q, want the facade's %q", r.Header.Get("X-Forwarded-Host"), e.host)
		}
	}

	// OSB-11, streamed: the stdout event arrives while the command still
	// waits for a file the test creates only after reading it.
	flag := filepath.Join(execd.Dir(), "go-on")
	cmd := `echo hi; while [ ! -e ` + flag + ` ]; do sleep 0.02; done; exit 3`
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", e.url+"/v1"+base+"/command", strings.NewReader(`{"command":"`+strings.ReplaceAll(cmd, `"`, `\"`)+`","timeout":180000}`))
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Errorf("content type %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	var got []osb.CommandEvent
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var ev osb.CommandEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("event %q: %v", line, err)
		}
		got = append(got, ev)
		if ev.Type == osb.EventStdout {
			if err := os.WriteFile(flag, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(got) != 3 || got[1].Text != "hi" || got[2].Type != osb.EventError || got[2].Error == nil || got[2].Error.EValue != "3" {
		t.Errorf("OSB-11 events %+v", got)
	}

	// OSB-10: execd down → the node's 502 passes through.
	node.StopExecd(id)
	code, _, body = e.do(t, "POST", base+"/command", hdr, `{"command":"true"}`)
	if code != http.StatusBadGateway {
		t.Errorf("OSB-10: %d %s", code, body)
	}
}

// events parses a bare-JSON event stream.
func events(t testing.TB, body string) []osb.CommandEvent {
	t.Helper()
	var out []osb.CommandEvent
	for line := range strings.SplitSeq(body, "\n") {
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		var ev osb.CommandEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("event %q: %v", line, err)
		}
		out = append(out, ev)
	}
	return out
}

// metricValue returns the value of an unlabelled counter or gauge.
func metricValue(t testing.TB, e *facadeEnv, name string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		m := mf.GetMetric()[0]
		if c := m.GetCounter(); c != nil {
			return c.GetValue()
		}
		return m.GetGauge().GetValue()
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func itoa(n int) string { return strconv.Itoa(n) }

package opensandboxtest_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/gorilla/websocket"

	"github.com/tetherfleet/tether/protocol/opensandbox"
	"github.com/tetherfleet/tether/protocol/opensandbox/opensandboxtest"
)

// The lifecycle tests replay wire-facts §5.2 (OSB-n) against the fake
// server.

const apiKey = "secret-key"

var keyHdr = map[string]string{opensandbox.HeaderAPIKey: apiKey}

// clock is a settable test clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// nemoGymCreate is OSB-1's body.
func nemoGymCreate() map[string]any {
	return map[string]any{
		"image":      map[string]any{"uri": "python:3.12"},
		"entrypoint": []string{"tail", "-f", "/dev/null"},
		"timeout":    600,
		"env":        map[string]string{"A": "1"},
		"metadata": map[string]string{
			"nemo-gym.nvidia.com/team": "gym_team", "nemo-gym.nvidia.com/user": "alice",
			"nemo-gym.nvidia.com/workload": "swe-gym", "nemo-gym.nvidia.com/run": "run-123", "purpose": "test",
		},
		"resourceLimits": map[string]string{"cpu": "2", "memory": "4096Mi"},
		"extensions":     map[string]string{"imagePullPolicy": "IfNotPresent", "opensandbox.extensions.image-pull-policy": "IfNotPresent"},
		"secureAccess":   false,
	}
}

func create(t *testing.T, s *opensandboxtest.Server, body map[string]any) opensandbox.CreateSandboxResponse {
	t.Helper()
	status, b, _ := call(t, http.MethodPost, s.URL+"/v1/sandboxes", body, keyHdr)
	if status != http.StatusAccepted {
		t.Fatalf("create = %d %s", status, b)
	}
	var resp opensandbox.CreateSandboxResponse
	mustJSON(t, b, &resp)
	return resp
}

func TestCreateGetDelete(t *testing.T) {
	clk := &clock{now: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	s := opensandboxtest.Start(t, opensandboxtest.Config{APIKey: apiKey, Now: clk.Now})
	// OSB-1.
	status, b, hdr := call(t, http.MethodPost, s.URL+"/v1/sandboxes", nemoGymCreate(), keyHdr)
	if status != http.StatusAccepted {
		t.Fatalf("create = %d %s", status, b)
	}
	var created opensandbox.CreateSandboxResponse
	mustJSON(t, b, &created)
	if _, err := uuid.Parse(created.ID); err != nil {
		t.Errorf("id %q: %v", created.ID, err)
	}
	if created.Status.State != opensandbox.StatePending || created.Metadata["nemo-gym.nvidia.com/run"] != "run-123" ||
		!created.CreatedAt.Equal(clk.Now()) || !created.ExpiresAt.Equal(clk.Now().Add(600*time.Second)) ||
		!cmp.Equal(created.Entrypoint, []string{"tail", "-f", "/dev/null"}) {
		t.Errorf("create response %+v", created)
	}
	if loc, want := hdr.Get("Location"), s.URL+"/v1/sandboxes/"+created.ID; loc != want {
		t.Errorf("Location %q, want %q", loc, want)
	}
	if hdr.Get(opensandbox.HeaderRequestID) == "" {
		t.Error("no X-Request-ID")
	}
	// Then Running, at the root and under /v1.
	for _, prefix := range []string{"", "/v1"} {
		status, b, _ = call(t, http.MethodGet, s.URL+prefix+"/sandboxes/"+created.ID, nil, keyHdr)
		var got opensandbox.Sandbox
		mustJSON(t, b, &got)
		if status != http.StatusOK || got.Status.State != opensandbox.StateRunning || got.Image.URI != "python:3.12" || got.Metadata["purpose"] != "test" {
			t.Errorf("GET%s = %d %+v", prefix, status, got)
		}
	}
	// Delete: 204, then gone; OSB-5.
	if status, b, _ = call(t, http.MethodDelete, s.URL+"/v1/sandboxes/"+created.ID, nil, keyHdr); status != http.StatusNoContent || len(b) != 0 {
		t.Fatalf("DELETE = %d %q", status, b)
	}
	for _, id := range []string{created.ID, "sb-x"} {
		status, b, _ = call(t, http.MethodDelete, s.URL+"/v1/sandboxes/"+id, nil, keyHdr)
		if want := fmt.Sprintf(`{"code":"KUBERNETES::SANDBOX_NOT_FOUND","message":"Sandbox '%s' not found"}`, id); status != http.StatusNotFound || string(b) != want {
			t.Errorf("DELETE %s = %d %s, want 404 %s", id, status, b, want)
		}
	}
	if status, _, _ = call(t, http.MethodGet, s.URL+"/v1/sandboxes/"+created.ID, nil, keyHdr); status != http.StatusNotFound {
		t.Errorf("GET after delete = %d", status)
	}
}

func TestCreateValidation(t *testing.T) {
	s := opensandboxtest.Start(t, opensandboxtest.Config{})
	// OSB-9: 422 with FastAPI's body.
	body := nemoGymCreate()
	body["timeout"] = 30
	status, b, _ := call(t, http.MethodPost, s.URL+"/v1/sandboxes", body, nil)
	var v opensandbox.ValidationErrorBody
	mustJSON(t, b, &v)
	if status != http.StatusUnprocessableEntity || len(v.Detail) != 1 || !cmp.Equal(v.Detail[0].Loc, []any{"body", "timeout"}) {
		t.Errorf("timeout 30 = %d %s", status, b)
	}
	// OSB-8 and other label violations: 400.
	for _, md := range []map[string]string{{"opensandbox.io/x": "1"}, {"workload": "configs/x.yaml"}} {
		body = nemoGymCreate()
		body["metadata"] = md
		status, b, _ = call(t, http.MethodPost, s.URL+"/v1/sandboxes", body, nil)
		var e opensandbox.ErrorBody
		mustJSON(t, b, &e)
		if status != http.StatusBadRequest || e.Code != opensandbox.CodeInvalidMetadataLabel {
			t.Errorf("metadata %v = %d %s", md, status, b)
		}
	}
	// No image and no snapshot; bad JSON.
	for _, bad := range []any{map[string]any{"entrypoint": []string{"x"}}, "{"} {
		if status, b, _ = call(t, http.MethodPost, s.URL+"/v1/sandboxes", bad, nil); status != http.StatusUnprocessableEntity {
			t.Errorf("create %v = %d %s", bad, status, b)
		}
	}
	// A null timeout never expires.
	body = nemoGymCreate()
	body["timeout"] = nil
	if got := create(t, s, body); !got.ExpiresAt.IsZero() {
		t.Errorf("expiresAt %v for a null timeout", got.ExpiresAt)
	}
}

func TestAuth(t *testing.T) {
	s := opensandboxtest.Start(t, opensandboxtest.Config{APIKey: apiKey})
	for _, tt := range []struct {
		hdr  map[string]string
		code string
	}{{nil, opensandbox.CodeMissingAPIKey}, {map[string]string{opensandbox.HeaderAPIKey: "wrong"}, opensandbox.CodeInvalidAPIKey}} {
		status, b, _ := call(t, http.MethodGet, s.URL+"/v1/sandboxes", nil, tt.hdr)
		var e opensandbox.ErrorBody
		mustJSON(t, b, &e)
		if status != http.StatusUnauthorized || e.Code != tt.code {
			t.Errorf("headers %v: %d %s", tt.hdr, status, b)
		}
	}
	if status, b, _ := call(t, http.MethodGet, s.URL+"/health", nil, nil); status != http.StatusOK || string(b) != `{"status":"healthy"}` {
		t.Errorf("/health = %d %s", status, b)
	}
	// The proxy route is exempt.
	sb := create(t, s, nemoGymCreate())
	if status, b, _ := call(t, http.MethodGet, s.URL+"/sandboxes/"+sb.ID+"/proxy/44772/ping", nil, nil); status != http.StatusOK {
		t.Errorf("proxied ping without a key = %d %s", status, b)
	}
}

func TestList(t *testing.T) {
	clk := &clock{now: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	s := opensandboxtest.Start(t, opensandboxtest.Config{Now: clk.Now})
	var ids []string
	for i := range 5 {
		body := nemoGymCreate()
		md := body["metadata"].(map[string]string)
		md["nemo-gym.nvidia.com/run"] = fmt.Sprintf("run-%d", i%2)
		ids = append(ids, create(t, s, body).ID)
		clk.Advance(time.Second)
	}
	s.SetState(ids[4], opensandbox.StatePaused, "")

	list := func(query string) (int, opensandbox.ListSandboxesResponse, []byte) {
		t.Helper()
		status, b, _ := call(t, http.MethodGet, s.URL+"/v1/sandboxes?"+query, nil, nil)
		var resp opensandbox.ListSandboxesResponse
		if status == http.StatusOK {
			mustJSON(t, b, &resp)
		}
		return status, resp, b
	}
	idsOf := func(resp opensandbox.ListSandboxesResponse) []string {
		var out []string
		for _, it := range resp.Items {
			out = append(out, it.ID)
		}
		return out
	}
	// OSB-2, with both encodings of '/'.
	for _, enc := range []string{url.QueryEscape("nemo-gym.nvidia.com/run=run-0"), "nemo-gym.nvidia.com/run%3Drun-0"} {
		status, resp, b := list("metadata=" + enc + "&page=1&pageSize=200")
		want := opensandbox.Pagination{Page: 1, PageSize: 200, TotalItems: 3, TotalPages: 1}
		if status != http.StatusOK || resp.Pagination != want || !cmp.Equal(idsOf(resp), []string{ids[0], ids[2], ids[4]}) {
			t.Errorf("OSB-2 %s: %d %s", enc, status, b)
		}
	}
	// Metadata filters AND; state filters OR.
	q := url.Values{"metadata": {"nemo-gym.nvidia.com/run=run-1&purpose=test"}, "state": {"Running", "Paused"}}
	if _, resp, _ := list(q.Encode()); !cmp.Equal(idsOf(resp), []string{ids[1], ids[3]}) {
		t.Errorf("AND filter: %v", idsOf(resp))
	}
	if _, resp, _ := list("state=Paused"); !cmp.Equal(idsOf(resp), []string{ids[4]}) {
		t.Errorf("state filter: %v", idsOf(resp))
	}
	// Paging.
	_, p2, _ := list("page=2&pageSize=2")
	if !cmp.Equal(idsOf(p2), ids[2:4]) || p2.Pagination != (opensandbox.Pagination{Page: 2, PageSize: 2, TotalItems: 5, TotalPages: 3, HasNextPage: true}) {
		t.Errorf("page 2: %v %+v", idsOf(p2), p2.Pagination)
	}
	if _, p9, _ := list("page=9&pageSize=2"); len(p9.Items) != 0 || p9.Items == nil || p9.Pagination.HasNextPage {
		t.Errorf("page 9: %+v", p9)
	}
	if _, def, _ := list(""); def.Pagination.PageSize != opensandbox.DefaultPageSize {
		t.Errorf("default page size %d", def.Pagination.PageSize)
	}
	// OSB-3.
	if status, _, b := list("metadata=a%3D1%26broken"); status != http.StatusBadRequest || !strings.Contains(string(b), `"code":"INVALID_METADATA_FORMAT"`) {
		t.Errorf("OSB-3: %d %s", status, b)
	}
	// OSB-4 and other query validation.
	for _, bad := range []string{"pageSize=201", "pageSize=0", "page=0", "page=x"} {
		if status, _, b := list(bad); status != http.StatusUnprocessableEntity || !strings.HasPrefix(string(b), `{"detail":[`) {
			t.Errorf("%s: %d %s", bad, status, b)
		}
	}
	if status, _, _ := list("pageSize=200"); status != http.StatusOK {
		t.Errorf("pageSize=200: %d", status)
	}
}

func TestExpiryAndRenew(t *testing.T) {
	clk := &clock{now: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	s := opensandboxtest.Start(t, opensandboxtest.Config{Now: clk.Now})
	body := nemoGymCreate()
	body["timeout"] = 60
	a, b := create(t, s, body), create(t, s, body)

	renewed := clk.Now().Add(120 * time.Second)
	status, raw, _ := call(t, http.MethodPost, s.URL+"/v1/sandboxes/"+a.ID+"/renew-expiration", opensandbox.RenewExpirationRequest{ExpiresAt: renewed}, nil)
	var rr opensandbox.RenewExpirationResponse
	mustJSON(t, raw, &rr)
	if status != http.StatusOK || !rr.ExpiresAt.Equal(renewed) {
		t.Fatalf("renew = %d %s", status, raw)
	}
	for _, at := range []time.Time{clk.Now().Add(-time.Second), clk.Now().Add(90 * time.Second)} {
		if status, raw, _ = call(t, http.MethodPost, s.URL+"/v1/sandboxes/"+a.ID+"/renew-expiration", opensandbox.RenewExpirationRequest{ExpiresAt: at}, nil); status != http.StatusBadRequest {
			t.Errorf("renew to %v = %d %s", at, status, raw)
		}
	}
	_, execdURL, _ := s.Execd(b.ID)
	clk.Advance(61 * time.Second)
	if status, _, _ = call(t, http.MethodGet, s.URL+"/v1/sandboxes/"+b.ID, nil, nil); status != http.StatusNotFound {
		t.Errorf("expired sandbox: GET = %d", status)
	}
	if _, err := http.Get(execdURL + "/ping"); err == nil {
		t.Error("an expired sandbox's execd still answers")
	}
	if status, _, _ = call(t, http.MethodGet, s.URL+"/v1/sandboxes/"+a.ID, nil, nil); status != http.StatusOK {
		t.Errorf("renewed sandbox: GET = %d", status)
	}

	keep := opensandboxtest.Start(t, opensandboxtest.Config{Now: clk.Now, KeepExpired: true})
	c := create(t, keep, body)
	clk.Advance(time.Hour)
	if status, _, _ = call(t, http.MethodGet, keep.URL+"/v1/sandboxes/"+c.ID, nil, nil); status != http.StatusOK {
		t.Errorf("KeepExpired: GET = %d", status)
	}
}

func TestMetadataPatchPauseResume(t *testing.T) {
	s := opensandboxtest.Start(t, opensandboxtest.Config{})
	sb := create(t, s, nemoGymCreate())
	status, raw, _ := call(t, http.MethodPatch, s.URL+"/v1/sandboxes/"+sb.ID+"/metadata", `{"purpose":null,"extra":"x"}`, nil)
	var got opensandbox.Sandbox
	mustJSON(t, raw, &got)
	if _, ok := got.Metadata["purpose"]; status != http.StatusOK || ok || got.Metadata["extra"] != "x" {
		t.Errorf("patch = %d %s", status, raw)
	}
	if status, _, _ = call(t, http.MethodPatch, s.URL+"/v1/sandboxes/"+sb.ID+"/metadata", `{"opensandbox.io/y":"1"}`, nil); status != http.StatusBadRequest {
		t.Errorf("reserved patch = %d", status)
	}
	if status, _, _ = call(t, http.MethodPost, s.URL+"/v1/sandboxes/"+sb.ID+"/pause", nil, nil); status != http.StatusAccepted {
		t.Errorf("pause = %d", status)
	}
	if v, _ := s.Sandbox(sb.ID); v.Status.State != opensandbox.StatePaused {
		t.Errorf("after pause: %s", v.Status.State)
	}
	if status, _, _ = call(t, http.MethodPut, s.URL+"/v1/sandboxes/"+sb.ID, nil, nil); status != http.StatusMethodNotAllowed {
		t.Errorf("PUT = %d", status)
	}
}

func TestEndpoints(t *testing.T) {
	s := opensandboxtest.Start(t, opensandboxtest.Config{})
	sb := create(t, s, nemoGymCreate())
	// OSB-6: built from the request's Host.
	status, raw, _ := call(t, http.MethodGet, s.URL+"/v1/sandboxes/"+sb.ID+"/endpoints/44772?use_server_proxy=true", nil, map[string]string{"Host": "osb:8080"})
	if want := `{"endpoint":"osb:8080/sandboxes/` + sb.ID + `/proxy/44772"}`; status != http.StatusOK || string(raw) != want {
		t.Errorf("OSB-6: %d %s, want %s", status, raw, want)
	}
	// Without the proxy: a direct address of the execd, which answers.
	status, raw, _ = call(t, http.MethodGet, s.URL+"/v1/sandboxes/"+sb.ID+"/endpoints/44772", nil, nil)
	var ep opensandbox.Endpoint
	mustJSON(t, raw, &ep)
	if status != http.StatusOK || strings.Contains(ep.Endpoint, "/") {
		t.Fatalf("direct endpoint: %d %s", status, raw)
	}
	if status, _, _ = call(t, http.MethodGet, "http://"+ep.Endpoint+"/ping", nil, nil); status != http.StatusOK {
		t.Errorf("direct ping = %d", status)
	}
	// OSB-7.
	if status, raw, _ = call(t, http.MethodGet, s.URL+"/v1/sandboxes/"+sb.ID+"/endpoints/44772?use_server_proxy=true&expires=1900000000", nil, nil); status != http.StatusBadRequest {
		t.Errorf("OSB-7: %d %s", status, raw)
	}
	if status, _, _ = call(t, http.MethodGet, s.URL+"/v1/sandboxes/nope/endpoints/44772", nil, nil); status != http.StatusNotFound {
		t.Errorf("unknown sandbox: %d", status)
	}
}

// commandEvents posts a command through the server proxy and reads the
// raw event stream.
func commandEvents(t *testing.T, base string, req opensandbox.CommandRequest, hdr map[string]string) (int, string, []opensandbox.CommandEvent) {
	t.Helper()
	status, raw, _ := call(t, http.MethodPost, base+"/command", req, hdr)
	if status != http.StatusOK {
		return status, string(raw), nil
	}
	var evs []opensandbox.CommandEvent
	r := opensandbox.NewCommandEventReader(bytes.NewReader(raw))
	for {
		ev, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	return status, string(raw), evs
}

func TestCommandThroughProxy(t *testing.T) {
	s := opensandboxtest.Start(t, opensandboxtest.Config{APIKey: apiKey})
	sb := create(t, s, nemoGymCreate())
	base := s.URL + "/sandboxes/" + sb.ID + "/proxy/44772"

	// OSB-11: bare JSON + blank line; init, stdout "hi", error "3".
	_, raw, evs := commandEvents(t, base, opensandbox.CommandRequest{Command: "sh -c 'echo hi; exit 3'", Timeout: 180000}, nil)
	sc := bufio.NewScanner(strings.NewReader(raw))
	for i := 0; sc.Scan(); i++ {
		if line := sc.Text(); (i%2 == 0) != strings.HasPrefix(line, `{"type":`) || i%2 == 1 && line != "" {
			t.Fatalf("line %d of the stream is %q:\n%s", i, line, raw)
		}
	}
	if len(evs) != 3 || evs[0].Type != opensandbox.EventInit || evs[0].Text == "" ||
		!cmp.Equal(evs[1], opensandbox.CommandEvent{Type: opensandbox.EventStdout, Text: "hi", Timestamp: evs[1].Timestamp}) ||
		evs[2].Type != opensandbox.EventError || !cmp.Equal(*evs[2].Error, opensandbox.CommandError{EName: "CommandExecError", EValue: "3", Traceback: []string{"exit status 3"}}) {
		t.Errorf("OSB-11 events: %s", raw)
	}
	// OSB-12, and line splitting (\n, \r\n, \r; a last line without a
	// terminator), stderr, cwd and env.
	_, raw, evs = commandEvents(t, base, opensandbox.CommandRequest{
		Command: `printf 'a\nb\r\nc\rd'; echo e >&2; echo "$V"; pwd`, Cwd: "/", Envs: map[string]string{"V": "env-v"},
	}, nil)
	var out, errs []string
	for _, ev := range evs {
		switch ev.Type {
		case opensandbox.EventStdout:
			out = append(out, ev.Text)
		case opensandbox.EventStderr:
			errs = append(errs, ev.Text)
		}
	}
	if last := evs[len(evs)-1]; last.Type != opensandbox.EventExecutionComplete || !cmp.Equal(out, []string{"a", "b", "c", "denv-v", "/"}) || !cmp.Equal(errs, []string{"e"}) {
		t.Errorf("OSB-12 events: %s", raw)
	}
	// A timeout kills the command.
	start := time.Now()
	_, raw, evs = commandEvents(t, base, opensandbox.CommandRequest{Command: "sleep 30", Timeout: 100}, nil)
	if last := evs[len(evs)-1]; last.Type != opensandbox.EventError || time.Since(start) > 5*time.Second {
		t.Errorf("timed-out command: %s", raw)
	}

	// OSB-13: credentials never reach execd.
	execd, _, _ := s.Execd(sb.ID)
	commandEvents(t, base, opensandbox.CommandRequest{Command: "true"}, map[string]string{"Authorization": "Bearer x", opensandbox.HeaderAPIKey: apiKey, "Cookie": "a=b"})
	for _, r := range execd.Requests() {
		for _, h := range []string{"Authorization", opensandbox.HeaderAPIKey, "Cookie"} {
			if r.Header.Get(h) != "" {
				t.Errorf("execd got %s on %s %s", h, r.Method, r.Path)
			}
		}
	}
	// OSB-10: execd down → 502.
	s.StopExecd(sb.ID)
	if status, raw, _ := commandEvents(t, base, opensandbox.CommandRequest{Command: "true"}, nil); status != http.StatusBadGateway {
		t.Errorf("OSB-10: %d %s", status, raw)
	}
	if status, _, _ := call(t, http.MethodGet, s.URL+"/sandboxes/"+sb.ID+"/proxy/18080/ping", nil, nil); status != http.StatusBadGateway {
		t.Errorf("port without a backend: %d", status)
	}
}

func TestPTYThroughProxy(t *testing.T) {
	s := opensandboxtest.Start(t, opensandboxtest.Config{})
	sb := create(t, s, nemoGymCreate())
	base := s.URL + "/v1/sandboxes/" + sb.ID + "/proxy/44772"
	id := createPTY(t, base, opensandbox.CreatePTYRequest{})
	hdr := http.Header{"Authorization": {"Bearer x"}, opensandbox.HeaderAPIKey: {apiKey}}
	first := dialPTY(t, base, id, "", hdr)
	first.connected(id, opensandbox.ModePTY)
	first.send([]byte("echo p''x\n"))
	first.until(opensandbox.ChannelStdout, "px\r\n")

	// PTY-8 via the proxy: accepted, then closed 1008.
	refused := dialPTY(t, base, id, "", nil)
	if ce := refused.closeCode(); ce.Code != websocket.ClosePolicyViolation || ce.Text != "" {
		t.Errorf("refused attach via the proxy: %v", ce)
	}
	// PTY-9 via the proxy: 4001 reaches the evicted client.
	second := dialPTY(t, base, id, "takeover=1", nil)
	m := second.read()
	if f, err := opensandbox.DecodeBinaryFrame(m.data); err != nil || f.Channel != opensandbox.ChannelReplay || !strings.Contains(string(f.Data), "px") {
		t.Fatalf("replay via the proxy: %+v %v", f, err)
	}
	second.connected(id, opensandbox.ModePTY)
	if ce := first.closeCode(); ce.Code != opensandbox.CloseTakenOver || ce.Text != opensandbox.ReasonTakenOver {
		t.Errorf("evicted via the proxy: %v", ce)
	}
	// Exit and close 1000 pass through.
	second.send([]byte("exit 3\n"))
	if code := second.exit(); code != 3 {
		t.Errorf("exit via the proxy: %d", code)
	}
	// Backend unreachable: 1011.
	s.StopExecd(sb.ID)
	gone := dialPTY(t, base, id, "", nil)
	if ce := gone.closeCode(); ce.Code != websocket.CloseInternalServerErr {
		t.Errorf("attach with execd down: %v", ce)
	}
}

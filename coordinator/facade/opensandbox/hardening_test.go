package opensandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/tetherfleet/tether/coordinator/facade/hostcheck"
	"github.com/tetherfleet/tether/coordinator/facade/opensandbox"
	"github.com/tetherfleet/tether/coordinator/ledger"
	"github.com/tetherfleet/tether/protocol"
	osb "github.com/tetherfleet/tether/protocol/opensandbox"
	"github.com/tetherfleet/tether/protocol/opensandbox/opensandboxtest"
)

// logBuffer collects log output for assertions; safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) lines(substr string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, ln := range strings.Split(l.b.String(), "\n") {
		if strings.Contains(ln, substr) {
			out = append(out, ln)
		}
	}
	return out
}

// capturedLogs makes the facade log to t and to the returned buffer.
func capturedLogs(t testing.TB, cfg *opensandbox.Config) *logBuffer {
	lb := &logBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), lb), &slog.HandlerOptions{Level: slog.LevelDebug}))
	return lb
}

// getWithHost sends GET path to the facade with Host host and extra
// headers, and returns status and body.
func (e *facadeEnv) getWithHost(t testing.TB, host, path string, hdr map[string]string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatalf("GET %s (Host %s): %v", path, host, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestRebindingHostMisdirected: a page that rebinds its own name to
// 127.0.0.1 reaches the loopback facade with that name in Host. The facade
// answers 421 Misdirected Request, naming the Host it refused, and
// forwards nothing; on dfbdcef it answered (and forwarded) everything.
func TestRebindingHostMisdirected(t *testing.T) {
	e := newFacadeEnv(t, nil)
	node := e.startNode(t, "n1", nil, opensandboxtest.Config{})
	id := e.create(t, nil, nil)
	_, port, _ := net.SplitHostPort(e.host)
	for _, path := range []string{"/health", "/v1/sandboxes", "/v1/sandboxes/" + id, "/sandboxes/" + id + "/proxy/44772/ping"} {
		before := len(node.Requests())
		code, body := e.getWithHost(t, "attacker.example:"+port, path, nil)
		wantError(t, "GET "+path+" with a rebinding Host", code, body, http.StatusMisdirectedRequest, "TETHER::MISDIRECTED_REQUEST",
			`"attacker.example:`+port+`"`, "localhost")
		if n := len(node.Requests()) - before; n != 0 {
			t.Errorf("GET %s with a rebinding Host reached the node (%d requests)", path, n)
		}
	}
}

// TestLoopbackHostsPass: Host names that only ever mean this machine
// pass, as NeMo Gym's clients send them (Host = the address they dialed,
// no Origin).
func TestLoopbackHostsPass(t *testing.T) {
	e := newFacadeEnv(t, nil)
	_, port, _ := net.SplitHostPort(e.host)
	for _, h := range []string{e.host, "localhost:" + port, "LocalHost:" + port, "localhost.:" + port, "localhost", "127.0.0.1", "127.1.2.3:" + port, "[::1]:" + port, "[::ffff:127.0.0.1]:" + port} {
		if code, body := e.getWithHost(t, h, "/health", nil); code != http.StatusOK {
			t.Errorf("GET /health with Host %q: %d %s, want 200", h, code, body)
		}
	}
	for _, h := range []string{"example.com:" + port, "localhost.example.com", "127.0.0.1.nip.io:" + port, "10.0.0.1:" + port, "[::2]:" + port, "0.0.0.0:" + port} {
		if code, body := e.getWithHost(t, h, "/health", nil); code != http.StatusMisdirectedRequest {
			t.Errorf("GET /health with Host %q: %d %s, want 421", h, code, body)
		}
	}
}

// TestCrossSiteOriginRefused: a page on another site opening a WebSocket
// to the loopback facade (its Host is right, its Origin is not) gets 403
// before anything reaches the node; so does any request that carries a
// foreign Origin. A page served from this machine passes, and so does a
// client that sends no Origin. On dfbdcef the upgrade went through.
func TestCrossSiteOriginRefused(t *testing.T) {
	p := newPTYEnv(t, nil)
	sid := p.createSession(t, `{"command":"cat"}`)
	u := "ws://" + p.host + p.base + "/pty/" + sid + "/ws"

	for _, origin := range []string{"https://attacker.example", "http://attacker.example:" + strings.Split(p.host, ":")[1], "null"} {
		conn, resp, err := websocket.DefaultDialer.Dial(u, http.Header{"Origin": {origin}})
		if err == nil {
			conn.Close()
			t.Fatalf("WebSocket upgrade with Origin %s went through", origin)
		}
		if resp == nil || resp.StatusCode != http.StatusForbidden {
			t.Fatalf("WebSocket upgrade with Origin %s: %v, %+v, want 403", origin, err, resp)
		}
		b, _ := io.ReadAll(resp.Body)
		wantError(t, "upgrade with Origin "+origin, resp.StatusCode, string(b), http.StatusForbidden, "TETHER::FORBIDDEN_ORIGIN", origin)
	}
	if n := requestsTo(p.node, "GET", p.base+"/pty/"+sid+"/ws"); n != 0 {
		t.Fatalf("refused upgrades reached the node %d times", n)
	}

	code, _, body := p.do(t, "POST", "/v1/sandboxes", map[string]string{"Origin": "https://attacker.example"}, createBody(nil))
	wantError(t, "create with a foreign Origin", code, body, http.StatusForbidden, "TETHER::FORBIDDEN_ORIGIN", "https://attacker.example")
	if n := requestsTo(p.node, "POST", "/v1/sandboxes"); n != 1 {
		t.Fatalf("node got %d creates, want only the harness's one", n)
	}

	for _, origin := range []string{"", "http://localhost:3000", "http://127.0.0.1:8888"} {
		var h http.Header
		if origin != "" {
			h = http.Header{"Origin": {origin}}
		}
		conn, resp, err := websocket.DefaultDialer.Dial(u+"?takeover=1", h)
		if err != nil {
			t.Fatalf("WebSocket upgrade with Origin %q: %v (%+v)", origin, err, resp)
		}
		conn.Close()
	}
}

// cuttingNode answers every request with an event-stream whose first
// event goes out, then drops the connection mid-body.
func cuttingNode(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	osb.WriteCommandEvent(w, osb.CommandEvent{Type: osb.EventInit, Text: "cmd-1"})
	http.NewResponseController(w).Flush()
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		conn.Close()
	}
}

// TestCutAnswerIsAnError: a node answer cut mid-body reaches the caller
// as a broken stream (it must not look whole), is counted as
// requests_total{status="cut"} rather than a 2xx, and is logged at warn
// level, once per burst, naming the route and the sandbox. On dfbdcef it
// was logged at debug and counted as a 200.
func TestCutAnswerIsAnError(t *testing.T) {
	var logs *logBuffer
	e := newFacadeEnv(t, func(c *opensandbox.Config) { logs = capturedLogs(t, c) })
	node := httptest.NewServer(http.HandlerFunc(cuttingNode))
	t.Cleanup(node.Close)
	e.fleet.add("n1", strings.TrimPrefix(node.URL, "http://"), nil)
	const id = "sb-cut"
	e.ledger.put(ledger.Record{Provider: protocol.ProviderOpenSandbox, Node: "n1", ID: id, State: ledger.StateLive})

	const n = 3
	for range n {
		req, err := http.NewRequest("POST", e.url+"/sandboxes/"+id+"/proxy/44772/command", strings.NewReader(`{"command":"true"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := e.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.ReadAll(bufio.NewReader(resp.Body))
		resp.Body.Close()
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("reading a cut answer: %v, want unexpected EOF", err)
		}
	}
	if got := requestsCount(t, e, "proxy", "cut"); got != n {
		t.Errorf(`requests_total{route="proxy",status="cut"} = %v, want %d`, got, n)
	}
	if got := requestsCount(t, e, "proxy", "2xx"); got != 0 {
		t.Errorf(`requests_total{route="proxy",status="2xx"} = %v, want 0: a cut answer is no success`, got)
	}
	warns := logs.lines("level=WARN")
	var cuts []string
	for _, w := range warns {
		if strings.Contains(w, "cut") {
			cuts = append(cuts, w)
		}
	}
	if len(cuts) != 1 {
		t.Fatalf("warn lines about the cut answers: %q, want exactly one (rate-limited)", cuts)
	}
	for _, want := range []string{"route=proxy", "sandbox=" + id, "node=n1"} {
		if !strings.Contains(cuts[0], want) {
			t.Errorf("warn line %q lacks %q", cuts[0], want)
		}
	}
}

// TestHTTPServerLimits: the server the coordinator runs the facade in
// bounds header reading, idle keep-alive connections and header size, and
// bounds neither a whole request nor a whole answer (which would cut long
// uploads, event streams and WebSockets). A header block over the limit
// is answered 431.
func TestHTTPServerLimits(t *testing.T) {
	e := newFacadeEnv(t, nil)
	srv := e.f.HTTPServer(nil)
	if srv.ReadHeaderTimeout != opensandbox.ReadHeaderTimeout || srv.IdleTimeout != opensandbox.IdleTimeout || srv.MaxHeaderBytes != opensandbox.MaxHeaderBytes {
		t.Errorf("HTTPServer limits: read header %v, idle %v, max header %d", srv.ReadHeaderTimeout, srv.IdleTimeout, srv.MaxHeaderBytes)
	}
	if srv.ReadTimeout != 0 || srv.WriteTimeout != 0 {
		t.Errorf("HTTPServer sets ReadTimeout %v, WriteTimeout %v: they would cut long streams", srv.ReadTimeout, srv.WriteTimeout)
	}
	if opensandbox.ReadHeaderTimeout <= 0 || opensandbox.IdleTimeout <= 0 || opensandbox.MaxHeaderBytes <= 0 {
		t.Error("a limit is off")
	}
	code, _ := e.getWithHost(t, e.host, "/health", map[string]string{"X-Filler": strings.Repeat("x", 2*opensandbox.MaxHeaderBytes)})
	if code != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("GET with %d bytes of headers: %d, want 431", 2*opensandbox.MaxHeaderBytes, code)
	}
}

// TestConfiguredHosts: names added to the policy (e.g. with
// --facade-allowed-hosts, or the external host) pass besides the loopback
// ones; a facade on a non-loopback address with no extra names accepts any
// Host but still refuses another site's Origin.
func TestConfiguredHosts(t *testing.T) {
	named, err := hostcheck.New(hostcheck.Config{Listen: "127.0.0.1:7082", Allowed: []string{"osb.example", "*.fleet.example"}, Hint: "add it with --facade-allowed-hosts"})
	if err != nil {
		t.Fatal(err)
	}
	e := newFacadeEnv(t, func(c *opensandbox.Config) { c.Hosts = named })
	for _, h := range []string{"osb.example:7082", "a.fleet.example", "localhost:7082", e.host} {
		if code, body := e.getWithHost(t, h, "/health", nil); code != http.StatusOK {
			t.Errorf("Host %s: %d %s, want 200", h, code, body)
		}
	}
	code, body := e.getWithHost(t, "other.example", "/health", nil)
	wantError(t, "Host other.example", code, body, http.StatusMisdirectedRequest, opensandbox.CodeMisdirected, `"other.example"`, "osb.example", "--facade-allowed-hosts")
	code, body = e.getWithHost(t, "osb.example", "/health", map[string]string{"Origin": "https://a.fleet.example"})
	if code != http.StatusOK {
		t.Errorf("Origin of a configured name: %d %s", code, body)
	}

	remote, err := hostcheck.New(hostcheck.Config{Listen: "10.0.0.5:7082"})
	if err != nil {
		t.Fatal(err)
	}
	r := newFacadeEnv(t, func(c *opensandbox.Config) { c.Hosts = remote })
	if code, body := r.getWithHost(t, "anything.example:7082", "/health", nil); code != http.StatusOK {
		t.Errorf("remote facade, any Host: %d %s", code, body)
	}
	if code, body := r.getWithHost(t, "osb.example", "/health", map[string]string{"Origin": "https://osb.example"}); code != http.StatusOK {
		t.Errorf("remote facade, same-origin page: %d %s", code, body)
	}
	code, body = r.getWithHost(t, "osb.example", "/health", map[string]string{"Origin": "https://attacker.example"})
	wantError(t, "remote facade, another site's Origin", code, body, http.StatusForbidden, opensandbox.CodeForbiddenOrigin, "https://attacker.example")
	if n := refusedCount(t, r, "origin"); n != 1 {
		t.Errorf("refused_total{reason=origin} = %v, want 1", n)
	}
}

// refusedCount returns tether_opensandbox_facade_refused_total{reason}.
func refusedCount(t testing.TB, e *facadeEnv, reason string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tether_opensandbox_facade_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no refused_total{reason=%q}", reason)
	return 0
}

package coordinator_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
	"github.com/tetherfleet/tether/tunnel/tunneltest"
)

// TestWebSocketAgentRunsJobs: an agent on the WebSocket transport is
// welcomed on the tunnel port, listed with its transport, and runs execs,
// next to one on raw TLS.
func TestWebSocketAgentRunsJobs(t *testing.T) {
	h := newHarness(t, nil)
	ws := h.dialAgent(t, agentOpts{id: "node-ws", ws: true, heartbeat: true})
	raw := h.dialAgent(t, agentOpts{id: "node-tls", heartbeat: true})
	if ws.reject != nil || raw.reject != nil {
		t.Fatalf("rejected: %v, %v", ws.reject, raw.reject)
	}
	got := map[string]string{}
	for _, n := range h.c.Nodes(protocol.Selector{}) {
		got[n.ID] = n.Transport
	}
	if got["node-ws"] != "wss" || got["node-tls"] != "tls" {
		t.Errorf("transports %v, want node-ws wss and node-tls tls", got)
	}
	r := h.exec(protocol.ExecRequest{Target: protocol.Target{Node: "node-ws"}, Argv: []string{"echo"}})
	if r.err != nil || r.result == nil || len(r.result.Results) != 1 || r.result.Results[0].ExitCode != 3 {
		t.Fatalf("exec over the WebSocket transport: %+v, %v", r.result, r.err)
	}
}

// dialALPN opens a TLS connection to the harness's tunnel port offering
// ALPN http/1.1, as a WebSocket client does, without a client certificate.
func (h *harness) dialALPN(t *testing.T) *tls.Conn {
	t.Helper()
	cfg := h.clientTLS.Clone()
	cfg.NextProtos = []string{tunnel.ALPNHTTP}
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	c, err := tunnel.DialTLS(ctx, h.addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*tls.Conn)
}

// TestWebSocketRefusals: on the tunnel port's HTTP side only GET
// tunnel.WebSocketPath upgrades, and only a WebSocket upgrade from a
// non-browser; plain HTTP (no TLS) gets nothing; text frames end the
// connection. Each refusal counts as an auth failure.
func TestWebSocketRefusals(t *testing.T) {
	h := newHarness(t, nil)
	failures := func() float64 { return h.metric("tether_coordinator_auth_failures_total", "reason", "protocol") }

	request := func(t *testing.T, req string) *http.Response {
		t.Helper()
		c := h.dialALPN(t)
		c.SetDeadline(time.Now().Add(defaultTestTimeout))
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	upgrade := "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
	for _, tc := range []struct {
		name, req string
		status    int
	}{
		{"other path", "GET /metrics HTTP/1.1\r\nHost: c\r\n" + upgrade + "\r\n", http.StatusNotFound},
		{"root", "GET / HTTP/1.1\r\nHost: c\r\n\r\n", http.StatusNotFound},
		{"POST", "POST " + tunnel.WebSocketPath + " HTTP/1.1\r\nHost: c\r\nContent-Length: 0\r\n\r\n", http.StatusNotFound},
		{"no upgrade", "GET " + tunnel.WebSocketPath + " HTTP/1.1\r\nHost: c\r\n\r\n", http.StatusBadRequest},
		{"browser origin", "GET " + tunnel.WebSocketPath + " HTTP/1.1\r\nHost: c\r\nOrigin: https://evil.example\r\n" + upgrade + "\r\n", http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := failures()
			if resp := request(t, tc.req); resp.StatusCode != tc.status {
				t.Fatalf("status %s, want %d", resp.Status, tc.status)
			}
			checkFor(t, defaultTestTimeout, func() error {
				if got := failures(); got != before+1 {
					return fmt.Errorf("auth_failures{protocol} = %v, want %v", got, before+1)
				}
				return nil
			})
		})
	}

	t.Run("plain HTTP", func(t *testing.T) {
		before := failures()
		c, err := net.DialTimeout("tcp", h.addr, defaultTestTimeout)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(defaultTestTimeout))
		io.WriteString(c, "GET "+tunnel.WebSocketPath+" HTTP/1.1\r\nHost: c\r\n"+upgrade+"\r\n")
		b, _ := io.ReadAll(c)
		if strings.Contains(string(b), "101") {
			t.Fatalf("plain HTTP got %q", b)
		}
		checkFor(t, defaultTestTimeout, func() error {
			if got := failures(); got != before+1 {
				return fmt.Errorf("auth_failures{protocol} = %v, want %v", got, before+1)
			}
			return nil
		})
	})

	t.Run("text frames", func(t *testing.T) {
		before := failures()
		cfg := h.clientTLS.Clone()
		cfg.NextProtos = []string{tunnel.ALPNHTTP}
		d := websocket.Dialer{TLSClientConfig: cfg, HandshakeTimeout: defaultTestTimeout}
		ws, _, err := d.Dial("wss://"+h.addr+tunnel.WebSocketPath, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ws.Close()
		ws.WriteMessage(websocket.TextMessage, []byte(`{"hello":"as text"}`))
		ws.SetReadDeadline(time.Now().Add(defaultTestTimeout))
		_, _, err = ws.ReadMessage()
		var ce *websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != websocket.CloseUnsupportedData {
			t.Fatalf("read after a text frame: %v, want close 1003", err)
		}
		checkFor(t, defaultTestTimeout, func() error {
			if got := failures(); got != before+1 {
				return fmt.Errorf("auth_failures{protocol} = %v, want %v", got, before+1)
			}
			return nil
		})
	})
	if n := h.c.Nodes(protocol.Selector{}); len(n) != 0 {
		t.Errorf("refused clients registered: %+v", n)
	}
}

// TestWebSocketHandshakeIsAdmitted: a connection waiting for its
// WebSocket upgrade holds its handshake place (internal/admission), so a
// source at its limit is refused until it goes, and one that never sends
// its request is cut at the handshake timeout.
func TestWebSocketHandshakeIsAdmitted(t *testing.T) {
	h := newHarness(t, func(c *coordinator.Config) {
		c.MaxHandshakesPerSource = 1
		c.HandshakeTimeout = 2 * time.Second
	})
	stalled := h.dialALPN(t) // TLS done, no HTTP request
	before := h.metric("tether_coordinator_auth_failures_total", "reason", "source_limit")
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	if c, err := tunnel.DialTLS(ctx, h.addr, h.clientTLS); err == nil {
		c.Close()
		t.Fatal("a second handshake from the source at its limit was admitted")
	}
	if got := h.metric("tether_coordinator_auth_failures_total", "reason", "source_limit"); got != before+1 {
		t.Errorf("auth_failures{source_limit} = %v, want %v", got, before+1)
	}
	// The stalled one is cut at the handshake timeout.
	stalled.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	if _, err := stalled.Read(make([]byte, 1)); err == nil {
		t.Fatal("the stalled connection got data")
	}
	checkFor(t, defaultTestTimeout, func() error {
		if got := h.metric("tether_coordinator_auth_failures_total", "reason", "timeout"); got < 1 {
			return fmt.Errorf("auth_failures{timeout} = %v", got)
		}
		return nil
	})
	// Then the source is admitted again.
	a := h.dialAgent(t, agentOpts{id: "after", ws: true})
	if a.reject != nil {
		t.Fatalf("rejected: %v", a.reject)
	}
}

// TestRealAgentOverWebSocket runs the agent package on the WebSocket
// transport: it enrolls over it (the certificate pinned from the same TLS
// handshake), then connects with its certificate over it, says so in its
// metric, and is listed as wss. Given a WebSocket path the coordinator
// does not serve first, it falls back to raw TLS.
func TestRealAgentOverWebSocket(t *testing.T) {
	ih := newIDHarness(t, false, nil)
	dataDir := t.TempDir()
	run := func(token string, transports []string, path string) (reg *prometheus.Registry, stop func()) {
		reg = prometheus.NewRegistry()
		a, err := agent.New(agent.Config{
			NodeID:        "ws-1",
			Coordinators:  []string{ih.addr},
			Transports:    transports,
			WebSocketPath: path,
			Token:         token,
			TLS:           ih.clientTLS,
			DataDir:       dataDir,
			Capacity:      &protocol.Capacity{CPUs: 1},
			Backoff:       tunnel.Backoff{Base: 10 * time.Millisecond, Max: 100 * time.Millisecond},
			Logger:        testLogger(t),
			Registerer:    reg,
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		return reg, func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("agent Run: %v", err)
			}
		}
	}
	connected := func(reg *prometheus.Registry, transport string) {
		t.Helper()
		checkFor(t, defaultTestTimeout, func() error {
			ns := ih.c.Nodes(protocol.Selector{})
			if len(ns) != 1 || ns[0].Transport != transport {
				return fmt.Errorf("nodes %+v, want ws-1 on %s", ns, transport)
			}
			mfs, err := reg.Gather()
			if err != nil {
				return err
			}
			for _, mf := range mfs {
				if mf.GetName() != "tether_agent_tunnel_transport" {
					continue
				}
				for _, m := range mf.GetMetric() {
					want := 0.0
					if m.GetLabel()[0].GetValue() == transport {
						want = 1
					}
					if m.GetGauge().GetValue() != want {
						return fmt.Errorf("tether_agent_tunnel_transport{%s} = %v, want %v", m.GetLabel()[0].GetValue(), m.GetGauge().GetValue(), want)
					}
				}
				return nil
			}
			return errors.New("no tether_agent_tunnel_transport")
		})
	}
	reg, stop := run(ih.token(t, 1, time.Hour, nil), []string{"wss"}, "")
	connected(reg, "wss")
	if got := ih.metric("tether_coordinator_enrollments_total", "result", "ok"); got != 1 {
		t.Errorf("enrollments{ok} = %v, want 1", got)
	}
	id, err := tunnel.LoadIdentity(filepath.Join(dataDir, agent.DefaultIdentityDirName))
	if err != nil || id.Pinned == nil {
		t.Fatalf("identity after enrolling over wss: %v (pinned CA %v)", err, id != nil && id.Pinned != nil)
	}
	stop()

	reg, stop = run("", []string{"wss", "tls"}, "/not-the-tunnel")
	defer stop()
	connected(reg, "tls")
}

// TestRealAgentThroughProxy runs the agent on the WebSocket transport
// through a CONNECT proxy (tunneltest.Proxy, with Basic auth) that cuts
// tunnels silent for 2.5 s: the session, kept busy by the agent's
// heartbeats (every second here) and WebSocket pings (configured to 500 ms,
// below the proxy's timeout, as an operator would), outlives more than two
// such periods without a job, runs jobs, and after the proxy kills it the
// agent comes back through the proxy.
func TestRealAgentThroughProxy(t *testing.T) {
	h := newHarness(t, nil)
	_, port, _ := net.SplitHostPort(h.addr)
	target := net.JoinHostPort("coord.test", port)
	proxy := tunneltest.StartProxy(t, tunneltest.ProxyConfig{
		IdleTimeout: 2500 * time.Millisecond, User: "node", Password: "pw",
		Resolve: map[string]string{target: h.addr},
	})
	pu, err := url.Parse(proxy.URL)
	if err != nil {
		t.Fatal(err)
	}
	cli := h.clientTLS.Clone()
	cli.ServerName = "127.0.0.1" // the test certificate's; the proxy knows the name
	a, err := agent.New(agent.Config{
		NodeID:        "behind-proxy",
		Coordinators:  []string{target},
		LookupHost:    func(context.Context, string) ([]string, error) { return nil, errors.New("no DNS for coord.test here") },
		Transports:    []string{"wss"},
		Proxy:         func(*url.URL) (*url.URL, error) { return pu, nil },
		WebSocketPing: 500 * time.Millisecond,
		Token:         testToken,
		SharedToken:   true,
		TLS:           cli,
		DataDir:       t.TempDir(),
		Capacity:      &protocol.Capacity{CPUs: 1},
		Backoff:       tunnel.Backoff{Base: 10 * time.Millisecond, Max: 100 * time.Millisecond},
		Logger:        testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent Run: %v", err)
		}
	}()
	session := func() string {
		t.Helper()
		var id string
		checkFor(t, defaultTestTimeout, func() error {
			ns := h.c.Nodes(protocol.Selector{})
			if len(ns) != 1 || ns[0].Transport != "wss" {
				return fmt.Errorf("nodes %+v, want behind-proxy on wss", ns)
			}
			id = ns[0].SessionID
			return nil
		})
		return id
	}
	first := session()
	time.Sleep(6 * time.Second) // more than two of the proxy's idle timeouts
	if got := session(); got != first {
		t.Fatalf("session %s after the idle period, want %s kept (proxy idle cuts: %d)", got, first, proxy.IdleCuts())
	}
	if n := proxy.IdleCuts(); n != 0 {
		t.Fatalf("proxy cut %d idle tunnels", n)
	}
	r := h.exec(protocol.ExecRequest{Target: protocol.Target{Node: "behind-proxy"}, Argv: []string{"true"}})
	if r.err != nil || r.result == nil || len(r.result.Results) != 1 || r.result.Results[0].ExitCode != 0 {
		t.Fatalf("exec through the proxy: %+v, %v", r.result, r.err)
	}
	if n := proxy.KillAll(); n != 1 {
		t.Fatalf("proxy relayed %d tunnels, want 1", n)
	}
	checkFor(t, defaultTestTimeout, func() error {
		if got := session(); got == first {
			return errors.New("still the first session")
		}
		return nil
	})
	if got := proxy.Targets(); len(got) != 2 || got[0] != target || got[1] != target {
		t.Errorf("proxy CONNECT targets %v, want %s twice", got, target)
	}
}

// TestWebSocketDialIsPaced: past its admission rate the coordinator answers
// a WebSocket dial, as a raw TLS one, with a busy refusal before TLS, which
// the dialer returns as a RetryAfterError (the Redialer honours it).
func TestWebSocketDialIsPaced(t *testing.T) {
	h := newHarness(t, func(c *coordinator.Config) {
		c.AdmitRate = 2 // a slot every 500 ms
		c.AdmitBurst = 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	d := tunnel.WebSocketDialer{TLS: h.clientTLS}
	first, err := d.Dial(ctx, h.addr)
	if err != nil {
		t.Fatalf("first dial: %v", err)
	}
	defer first.Close()
	_, err = d.Dial(ctx, h.addr)
	var ra *tunnel.RetryAfterError
	if !errors.As(err, &ra) || ra.After <= 0 || ra.After > 500*time.Millisecond {
		t.Fatalf("second dial at once: %v, want a busy refusal within 500ms", err)
	}
	if got := h.metric("tether_coordinator_handshakes_paced_total"); got != 1 {
		t.Errorf("handshakes_paced_total = %v, want 1", got)
	}
}

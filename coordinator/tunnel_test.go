package coordinator_test

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  coordinator.Config
		want []string // substrings of the error; none means valid
	}{
		{"empty", coordinator.Config{}, []string{"Token is required", "NATS connection is required", "Identify is required"}},
		{"negative", coordinator.Config{HeartbeatInterval: -1, MaxParallel: -2, CancelGrace: -3},
			[]string{"Token", "NATS", "HeartbeatInterval -1ns is negative", "MaxParallel -2 is negative", "CancelGrace -3ns is negative"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if err == nil {
				t.Fatal("Validate() = nil, want an error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %q, want it to mention %q", err, w)
				}
			}
			if _, err := coordinator.New(tt.cfg); err == nil {
				t.Error("New accepted an invalid config")
			}
		})
	}
	d := coordinator.DefaultConfig()
	if d.ID == "" || d.HeartbeatInterval != 5*time.Second || d.MaxParallel != 64 || d.Tunnel.KeepAliveInterval != 0 {
		t.Errorf("DefaultConfig() = %+v", d)
	}
	bad := coordinator.DefaultConfig()
	bad.Token, bad.NATS = "t", &nats.Conn{}
	bad.Identify = func(nats.Header) (policy.Identity, error) { return policy.Identity{}, nil }
	bad.Tunnel.KeepAliveInterval = 10 * time.Second // the derived IdleTimeout, 15s, is below twice that
	if _, err := coordinator.New(bad); err == nil || !strings.Contains(err.Error(), "IdleTimeout 15s is below twice KeepAliveInterval") {
		t.Errorf("New with pings every 10s and a 15s idle timeout = %v, want refused", err)
	}
}

func TestHelloWelcome(t *testing.T) {
	h := newHarness(t, nil)
	a := h.dialAgent(t, agentOpts{id: "node-a", labels: map[string]string{"role": "web"}, heartbeat: true})
	if a.reject != nil {
		t.Fatalf("rejected: %v", a.reject)
	}
	w := a.welcome
	if w.CoordinatorID != "coord-test" || w.HeartbeatIntervalMS != 1000 || w.SessionID == "" || w.Limits.MaxFrameSize != protocol.MaxFrameSize {
		t.Errorf("welcome = %+v", w)
	}
	nodes := h.c.Nodes(protocol.Selector{})
	if len(nodes) != 1 {
		t.Fatalf("Nodes() = %+v, want one", nodes)
	}
	n := nodes[0]
	if n.ID != "node-a" || n.SessionID != w.SessionID || n.Coordinator != "coord-test" || n.AgentVersion != "fake-1.0" ||
		n.Capacity.CPUs != 2 || n.ConnectedAt.IsZero() || n.RemoteAddr == "" {
		t.Errorf("node info = %+v", n)
	}
	if diff := cmp.Diff(map[string]string{"role": "web"}, n.Labels); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}
	if got := h.metric("tether_coordinator_agents_connected"); got != 1 {
		t.Errorf("agents_connected = %v, want 1", got)
	}
	if got := h.metric("tether_coordinator_streams_opened_total", "kind", "control"); got != 1 {
		t.Errorf("streams_opened{control} = %v, want 1", got)
	}

	a.close()
	checkFor(t, defaultTestTimeout, func() error {
		if n := len(h.c.Nodes(protocol.Selector{})); n != 0 {
			return fmt.Errorf("%d nodes still registered", n)
		}
		return nil
	})
	if got := h.metric("tether_coordinator_agents_connected"); got != 0 {
		t.Errorf("agents_connected after disconnect = %v, want 0", got)
	}
}

func TestHandshakeRefused(t *testing.T) {
	h := newHarness(t, nil)
	tests := []struct {
		name     string
		o        agentOpts
		wantCode string
	}{
		{"wrong token", agentOpts{id: "n1", token: "nope"}, protocol.CodeAuth},
		{"no token", agentOpts{id: "n2", token: "-"}, protocol.CodeAuth},
		{"version", agentOpts{id: "n3", version: protocol.Version + 1}, protocol.CodeVersion},
		{"bad node id", agentOpts{id: "not a node id!"}, protocol.CodeBadHello},
		{"bad label", agentOpts{id: "n5", labels: map[string]string{"-bad": "x"}}, protocol.CodeBadHello},
		{"exec first", agentOpts{id: "n6", firstKind: protocol.KindExec}, protocol.CodeBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := h.dialAgent(t, tt.o)
			if a.openErr != nil {
				a.waitClosed() // refused before the reject could be read
				return
			}
			if a.reject == nil {
				t.Fatalf("welcomed (%+v), want a reject", a.welcome)
			}
			if a.reject.Code != tt.wantCode {
				t.Errorf("reject = %+v, want code %s", a.reject, tt.wantCode)
			}
			if strings.Contains(a.reject.Message, testToken) {
				t.Errorf("reject message leaks the token: %q", a.reject.Message)
			}
			a.waitClosed()
		})
	}
	want := `
# HELP tether_coordinator_auth_failures_total Agent connections refused or cut before they registered, by reason.
# TYPE tether_coordinator_auth_failures_total counter
tether_coordinator_auth_failures_total{reason="bad_cert"} 0
tether_coordinator_auth_failures_total{reason="bad_hello"} 2
tether_coordinator_auth_failures_total{reason="bad_token"} 1
tether_coordinator_auth_failures_total{reason="cert_required"} 0
tether_coordinator_auth_failures_total{reason="duplicate"} 0
tether_coordinator_auth_failures_total{reason="expired_cert"} 0
tether_coordinator_auth_failures_total{reason="foreign_ca"} 0
tether_coordinator_auth_failures_total{reason="no_token"} 1
tether_coordinator_auth_failures_total{reason="overload"} 0
tether_coordinator_auth_failures_total{reason="protocol"} 1
tether_coordinator_auth_failures_total{reason="revoked"} 0
tether_coordinator_auth_failures_total{reason="source_limit"} 0
tether_coordinator_auth_failures_total{reason="timeout"} 0
tether_coordinator_auth_failures_total{reason="unknown_cert"} 0
tether_coordinator_auth_failures_total{reason="version"} 1
tether_coordinator_auth_failures_total{reason="wrong_node"} 0
`
	if err := testutil.GatherAndCompare(h.reg, strings.NewReader(want), "tether_coordinator_auth_failures_total"); err != nil {
		t.Error(err)
	}
	if n := h.c.Nodes(protocol.Selector{}); len(n) != 0 {
		t.Errorf("refused agents registered: %+v", n)
	}
}

func TestHandshakeTimeout(t *testing.T) {
	// The deadline also covers the fake agent's TLS handshake and control
	// stream, which took over 300 ms under -race on a loaded machine (the
	// coordinator then closed it before it reached "no Hello"); 2 s is
	// the generous bound of a step that takes milliseconds.
	h := newHarness(t, func(c *coordinator.Config) { c.HandshakeTimeout = 2 * time.Second })
	// A tunnel that never sends its Hello.
	a := h.dialAgent(t, agentOpts{id: "quiet", noHello: true})
	a.waitClosed()
	// A TCP connection that never starts TLS.
	raw, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	if n, err := raw.Read(make([]byte, 1)); err == nil || isTimeoutErr(err) {
		t.Fatalf("raw connection: read %d bytes, %v; want it closed by the coordinator", n, err)
	}
	checkFor(t, defaultTestTimeout, func() error {
		if got := h.metric("tether_coordinator_auth_failures_total", "reason", "timeout"); got != 2 {
			return fmt.Errorf("auth_failures{timeout} = %v, want 2", got)
		}
		return nil
	})
}

func TestDuplicateNodeFromAnotherAgentIsRefused(t *testing.T) {
	h := newHarness(t, nil)
	a1 := h.dialAgent(t, agentOpts{id: "node-a", heartbeat: true, instance: "one"})
	if a1.reject != nil {
		t.Fatal(a1.reject)
	}
	a2 := h.dialAgent(t, agentOpts{id: "node-a", heartbeat: true, instance: "two"})
	if a2.reject == nil || a2.reject.Code != protocol.CodeDuplicate || !strings.Contains(a2.reject.Message, "node-a") {
		t.Fatalf("second agent with the same node id: reject %+v, want %s naming the node", a2.reject, protocol.CodeDuplicate)
	}
	nodes := h.c.Nodes(protocol.Selector{})
	if len(nodes) != 1 || nodes[0].SessionID != a1.welcome.SessionID {
		t.Fatalf("Nodes() = %+v, want a1's session kept", nodes)
	}
	if got := h.metric("tether_coordinator_auth_failures_total", "reason", "duplicate"); got != 1 {
		t.Errorf("duplicate refusals = %v, want 1", got)
	}
}

func TestDuplicateNodeReplacesStaleSession(t *testing.T) {
	// 300 ms, not less: the tunnel's idle timeout is three intervals,
	// and at 50 ms a loaded machine closed a1 before its welcome was
	// read (CI: "read welcome: EOF").
	h := newHarness(t, func(c *coordinator.Config) { c.HeartbeatInterval = 300 * time.Millisecond })
	// a1 sends no heartbeats after its hello: once two intervals passed,
	// another agent process may take the node id over.
	a1 := h.dialAgent(t, agentOpts{id: "node-a", instance: "one"})
	if a1.reject != nil {
		t.Fatal(a1.reject)
	}
	time.Sleep(700 * time.Millisecond)
	a2 := h.dialAgent(t, agentOpts{id: "node-a", heartbeat: true, instance: "two"})
	if a2.reject != nil {
		t.Fatalf("takeover of a silent session refused: %v", a2.reject)
	}
	a1.waitClosed()
}

func TestDuplicateNodeReplaces(t *testing.T) {
	h := newHarness(t, nil)
	a1 := h.dialAgent(t, agentOpts{id: "node-a", heartbeat: true})
	a2 := h.dialAgent(t, agentOpts{id: "node-a", heartbeat: true})
	if a1.reject != nil || a2.reject != nil {
		t.Fatalf("rejected: %v %v", a1.reject, a2.reject)
	}
	a1.waitClosed() // the newer session wins
	nodes := h.c.Nodes(protocol.Selector{})
	if len(nodes) != 1 || nodes[0].SessionID != a2.welcome.SessionID {
		t.Fatalf("Nodes() = %+v, want only a2's session %s", nodes, a2.welcome.SessionID)
	}
	if got := h.metric("tether_coordinator_tunnel_reconnects_total"); got != 1 {
		t.Errorf("reconnects = %v, want 1", got)
	}
	if got := h.metric("tether_coordinator_agents_connected"); got != 1 {
		t.Errorf("agents_connected = %v, want 1", got)
	}

	// An agent that says it had a session before is a reconnect, even
	// after a clean disconnect; a fresh agent process (reconnects 0) is
	// not. The coordinator remembers nothing of nodes that left.
	a2.close()
	waitNoNodes := func() {
		t.Helper()
		checkFor(t, defaultTestTimeout, func() error {
			if n := len(h.c.Nodes(protocol.Selector{})); n != 0 {
				return fmt.Errorf("%d nodes registered", n)
			}
			return nil
		})
	}
	waitNoNodes()
	a3 := h.dialAgent(t, agentOpts{id: "node-a", reconnects: 1})
	if a3.reject != nil {
		t.Fatal(a3.reject)
	}
	if got := h.metric("tether_coordinator_tunnel_reconnects_total"); got != 2 {
		t.Errorf("reconnects = %v, want 2", got)
	}
	a3.close()
	waitNoNodes()
	a4 := h.dialAgent(t, agentOpts{id: "node-a"})
	if a4.reject != nil {
		t.Fatal(a4.reject)
	}
	if got := h.metric("tether_coordinator_tunnel_reconnects_total"); got != 2 {
		t.Errorf("reconnects after a fresh agent = %v, want 2", got)
	}
}

func TestHeartbeatTimeout(t *testing.T) {
	// Silence is judged on the whole session over 3 intervals: an agent
	// that only pings (no heartbeats) is kept, one that sends nothing at
	// all is dropped, and the log says why.
	// The window (3 s) leaves the pinging agent (every 200ms) a wide
	// margin on a loaded machine.
	var logs logBuffer
	h := newHarness(t, func(c *coordinator.Config) {
		c.HeartbeatInterval = time.Second
		c.Logger = testLoggerTo(t, &logs)
	})
	start := time.Now()
	beating := h.dialAgent(t, agentOpts{id: "beating", heartbeat: true})
	pinging := h.dialAgent(t, agentOpts{id: "pinging"})
	silent := h.dialAgent(t, agentOpts{id: "silent", silent: true})
	silent.waitClosed()
	if d := time.Since(start); d < 3*time.Second {
		t.Errorf("silent agent dropped after %v, before its 3s window", d)
	}
	checkFor(t, defaultTestTimeout, func() error {
		nodes := h.c.Nodes(protocol.Selector{})
		if len(nodes) != 2 || nodes[0].ID != "beating" || nodes[1].ID != "pinging" {
			return fmt.Errorf("nodes = %+v, want beating and pinging", nodes)
		}
		n := nodes[0]
		if n.RTTMicros != 1234 || !n.LastHeartbeat.After(n.ConnectedAt) {
			return errors.New("no heartbeat recorded yet")
		}
		if !strings.Contains(logs.String(), "nothing received from the peer for 3s") {
			return errors.New("the drop is not logged with its cause yet")
		}
		return nil
	})
	for _, a := range []*fakeAgent{beating, pinging} {
		select {
		case <-a.sess.Done():
			t.Fatalf("agent %s was dropped", a.o.id)
		default:
		}
	}
}

func isTimeoutErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// A registered agent costs the coordinator no goroutine of its own while
// idle (yamux's two are the session's): its heartbeats are read by a
// short-lived goroutine when they come (tunnel.Session.Watch), and still
// recorded, and a frame the control stream does not take still ends the
// session. Goroutines are told apart by their stacks: the per-connection
// goroutine starts in startConn.
func TestIdleAgentHoldsNoGoroutine(t *testing.T) {
	h := newHarness(t, func(c *coordinator.Config) { c.HeartbeatInterval = 200 * time.Millisecond })
	const n = 5
	agents := make([]*fakeAgent, n)
	for i := range agents {
		agents[i] = h.dialAgent(t, agentOpts{id: fmt.Sprintf("idle-%d", i), heartbeat: true})
	}
	checkFor(t, defaultTestTimeout, func() error {
		nodes := h.c.Nodes(protocol.Selector{})
		if len(nodes) != n {
			return fmt.Errorf("%d nodes registered, want %d", len(nodes), n)
		}
		for _, nd := range nodes {
			if nd.RTTMicros != 1234 || !nd.LastHeartbeat.After(nd.ConnectedAt) {
				return fmt.Errorf("node %s: no heartbeat recorded yet", nd.ID)
			}
		}
		if k := goroutinesIn("coordinator.(*Coordinator).startConn"); k > 0 {
			return fmt.Errorf("%d per-connection goroutines still running with %d idle agents", k, n)
		}
		return nil
	})
	// A frame the control stream does not take ends that session. (The
	// write may report "session shutdown": the coordinator can close the
	// session before yamux's send loop confirms the frame.)
	protocol.WriteJSONFrame(agents[0].ctrl, protocol.FrameExit, &protocol.ExitStatus{})
	agents[0].waitClosed()
	checkFor(t, defaultTestTimeout, func() error {
		if k := len(h.c.Nodes(protocol.Selector{})); k != n-1 {
			return fmt.Errorf("%d nodes registered after one was dropped, want %d", k, n-1)
		}
		return nil
	})
}

// goroutinesIn counts the goroutines with fn in their stacks.
func goroutinesIn(fn string) int {
	buf := make([]byte, 1<<20)
	for {
		k := runtime.Stack(buf, true)
		if k < len(buf) {
			buf = buf[:k]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, fn) {
			count++
		}
	}
	return count
}

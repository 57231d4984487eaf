package coordinator_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// TestExecAgentShutdownReachesClient: a real agent stopped gracefully
// (its Run's ctx ends, as on SIGTERM) while an exec runs on it ends the
// exec with the shutdown code and the README's words, and the client gets
// them: the agent delivers the exec's final frame before it closes its
// tunnel. Before, the agent closed the session at once and the client got
// "tunnel lost during exec: unexpected EOF".
func TestExecAgentShutdownReachesClient(t *testing.T) {
	h := newHarness(t, nil)
	ra := startRealAgent(t, h, nil)
	next := startSleeper(t, h)
	start := time.Now()
	ra.cancel() // the agent stops gracefully, as on SIGTERM
	r := nodeResult(t, next)
	if r.ErrorCode != protocol.ResultCodeShutdown || r.Error != "its agent shut down; job cancelled" {
		t.Fatalf("node result: error %q (code %q); want the agent's shutdown", r.Error, r.ErrorCode)
	}
	if d := time.Since(start); d > agent.DefaultKillGrace+3*time.Second {
		t.Errorf("result %v after the agent's stop; want it within the kill grace and a bit", d)
	}
	select {
	case err := <-ra.done:
		if err != nil {
			t.Errorf("agent Run: %v", err)
		}
		ra.done <- nil
	case <-time.After(defaultTestTimeout):
		t.Fatal("agent Run did not return")
	}
}

// TestExecAgentDeadLinkTunnelLost: an agent whose connection just dies
// (kill -9: the kernel closes its socket) still has its exec reported as a
// lost tunnel, promptly: the graceful shutdown's wait is the agent's own.
func TestExecAgentDeadLinkTunnelLost(t *testing.T) {
	h := newHarness(t, nil)
	var mu sync.Mutex
	var raws []net.Conn
	ra := startRealAgent(t, h, func(ctx context.Context, addr string) (net.Conn, error) {
		raw, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		raws = append(raws, raw)
		mu.Unlock()
		cfg := h.clientTLS.Clone()
		cfg.ServerName, _, _ = net.SplitHostPort(addr)
		tc := tls.Client(raw, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, err
		}
		return tc, nil
	})
	defer ra.cancel()
	next := startSleeper(t, h)
	start := time.Now()
	mu.Lock()
	for _, c := range raws {
		c.Close()
	}
	mu.Unlock()
	r := nodeResult(t, next)
	if !strings.HasPrefix(r.Error, "tunnel lost during exec") || r.ErrorCode != "" {
		t.Fatalf("node result: error %q (code %q); want a lost tunnel", r.Error, r.ErrorCode)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("result %v after the link died; want it promptly", d)
	}
}

// realAgent is an agent.Agent running against a harness.
type realAgent struct {
	cancel context.CancelFunc
	done   chan error // Run's error; the test puts back what it took
}

// startRealAgent runs a real agent n2 against h (dialing with dial when
// not nil) until the test ends, and waits for it to be connected.
func startRealAgent(t *testing.T, h *harness, dial func(context.Context, string) (net.Conn, error)) *realAgent {
	t.Helper()
	a, err := agent.New(agent.Config{
		NodeID:       "n2",
		Coordinators: []string{h.addr},
		Token:        testToken,
		SharedToken:  true,
		TLS:          h.clientTLS,
		Dial:         dial,
		DataDir:      t.TempDir(),
		Capacity:     &protocol.Capacity{CPUs: 1},
		Backoff:      tunnel.Backoff{Base: 10 * time.Millisecond, Max: 100 * time.Millisecond},
		Logger:       testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ra := &realAgent{cancel: cancel, done: make(chan error, 1)}
	go func() { ra.done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-ra.done
	})
	checkFor(t, defaultTestTimeout, func() error {
		if ns := h.c.Nodes(protocol.Selector{}); len(ns) != 1 {
			return fmt.Errorf("nodes %+v, want n2", ns)
		}
		return nil
	})
	return ra
}

// startSleeper starts a 60 s exec on n2 and returns once it runs; next
// gives the exec's further replies.
func startSleeper(t *testing.T, h *harness) (next func() *nats.Msg) {
	t.Helper()
	inbox := h.client.NewInbox()
	sub, err := h.client.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	body := mustJSON(t, protocol.ExecRequest{Target: protocol.Target{Node: "n2"}, Argv: []string{"sh", "-c", "echo up; exec sleep 60"}})
	if err := h.client.PublishRequest(protocol.SubjectExec, inbox, body); err != nil {
		t.Fatal(err)
	}
	next = func() *nats.Msg {
		t.Helper()
		m, err := sub.NextMsg(defaultTestTimeout)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if m := next(); m.Header.Get(protocol.HeaderType) != protocol.ReplyStdout || string(m.Data) != "up\n" {
		t.Fatalf("first reply %v %q, want stdout \"up\\n\"", m.Header, m.Data)
	}
	return next
}

// nodeResult reads replies up to the exec's result and returns its one
// node's.
func nodeResult(t *testing.T, next func() *nats.Msg) protocol.NodeResult {
	t.Helper()
	m := next()
	for m.Header.Get(protocol.HeaderType) == protocol.ReplyNodeResult {
		m = next()
	}
	if m.Header.Get(protocol.HeaderType) != protocol.ReplyResult {
		t.Fatalf("reply %v %q, want the result", m.Header, m.Data)
	}
	var res protocol.ExecResult
	if err := json.Unmarshal(m.Data, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Results) != 1 {
		t.Fatalf("result %+v, want one node", res)
	}
	return res.Results[0]
}

package coordinator_test

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// rawDirect is a client of the direct protocol written by hand, so that it
// can send what client.Client never would.
type rawDirect struct {
	t    *testing.T
	conn net.Conn
	sess *yamux.Session
	ctl  *yamux.Stream
}

// dialRaw connects to h's tunnel listener offering ALPN protocol alpn
// (none when empty) and starts a yamux client session on it.
func dialRaw(t *testing.T, h *harness, alpn string) *rawDirect {
	t.Helper()
	cfg := h.clientTLS.Clone()
	cfg.ServerName = "localhost"
	if alpn != "" {
		cfg.NextProtos = []string{alpn}
	}
	conn, err := tls.Dial("tcp", h.addr, cfg)
	if err != nil {
		t.Fatalf("dial %s: %v", h.addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	sess, err := yamux.Client(conn, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close() })
	return &rawDirect{t: t, conn: conn, sess: sess}
}

// control opens the session's control stream.
func (r *rawDirect) control() {
	r.t.Helper()
	st, err := r.sess.OpenStream()
	if err != nil {
		r.t.Fatal(err)
	}
	if err := protocol.WriteFrame(st, protocol.FrameDirectControl, nil); err != nil {
		r.t.Fatal(err)
	}
	r.ctl = st
}

// open opens a data stream whose first frame is t with payload, and
// returns the coordinator's answer (nil: open) and the stream.
func (r *rawDirect) open(t protocol.FrameType, payload []byte) (*protocol.APIError, *yamux.Stream) {
	r.t.Helper()
	st, err := r.sess.OpenStream()
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { st.Close() })
	if err := protocol.WriteFrame(st, t, payload); err != nil {
		r.t.Fatal(err)
	}
	f, err := protocol.NewFrameReader(st).Next()
	if err != nil {
		r.t.Fatalf("read the open answer: %v", err)
	}
	if f.Type != protocol.FrameDirectAnswer {
		r.t.Fatalf("answer is a %s frame, want %s", f.Type, protocol.FrameDirectAnswer)
	}
	var a protocol.DirectAnswer
	if err := json.Unmarshal(f.Payload, &a); err != nil {
		r.t.Fatal(err)
	}
	return a.Error, st
}

// ticket asks for a direct stream on nc and returns the reply, or the
// refusal.
func ticket(t *testing.T, nc *nats.Conn, node string, kind protocol.Kind, params any) (*protocol.DirectStreamReply, *protocol.APIError) {
	t.Helper()
	e, m := requestAs(t, nc, protocol.SubjectStream, protocol.StreamRequest{Node: node, Kind: kind.String(), Params: mustJSON(t, params), Direct: true})
	if e != nil {
		return nil, e
	}
	var rep protocol.DirectStreamReply
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		t.Fatalf("direct stream reply %q: %v", m.Data, err)
	}
	return &rep, nil
}

func openPayload(t *testing.T, v any) []byte { return mustJSON(t, v) }

// TestDirectTicketRefusals: a data stream opens only with a ticket the
// coordinator issued, once, before it expired, and the ticket names
// everything the stream is: missing, malformed, forged, replayed and
// expired tickets are refused with 401 bad_ticket, each counted by reason,
// and a ticket sent with a node or kind of the client's own is refused
// unspent; the redeemed one opens exactly the stream that was authorized.
func TestDirectTicketRefusals(t *testing.T) {
	h := newHarness(t, withDirect(nil))
	var hdrs headerLog
	h.dialAgent(t, agentOpts{id: "n1", heartbeat: true, header: hdrs.hook("n1")})
	h.dialAgent(t, agentOpts{id: "n2", heartbeat: true, header: hdrs.hook("n2")})
	rep, e := ticket(t, h.client, "n1", protocol.KindExec, protocol.ExecParams{Argv: []string{"granted"}})
	if e != nil {
		t.Fatalf("ticket refused: %v", e)
	}
	if rep.Addr != h.addr || rep.Pin == "" || rep.Coordinator != "coord-test" || rep.TTLMS != protocol.DefaultDirectTicketTTL.Milliseconds() {
		t.Fatalf("reply %+v; want this listener, a pin, this coordinator and the default TTL", rep)
	}
	r := dialRaw(t, h, protocol.ALPNClient)
	r.control()

	var forged [protocol.DirectTicketSize]byte
	rand.Read(forged[:])
	for _, tc := range []struct {
		name    string
		typ     protocol.FrameType
		payload []byte
		reason  string
		msg     string
	}{
		{"no ticket", protocol.FrameDirectOpen, []byte(`{}`), "bad_ticket", "ticket"},
		{"malformed", protocol.FrameDirectOpen, openPayload(t, protocol.DirectOpen{Ticket: "not-base64!"}), "bad_ticket", "base64url"},
		{"short", protocol.FrameDirectOpen, openPayload(t, protocol.DirectOpen{Ticket: protocol.FormatDirectTicket(forged)[:20]}), "bad_ticket", "want 32"},
		{"forged", protocol.FrameDirectOpen, openPayload(t, protocol.DirectOpen{Ticket: protocol.FormatDirectTicket(forged)}), "unknown_ticket", "unknown"},
		{"another node", protocol.FrameDirectOpen, []byte(`{"ticket":"` + rep.Ticket + `","node":"n2"}`), "bad_ticket", "node"},
		{"another kind", protocol.FrameDirectOpen, []byte(`{"ticket":"` + rep.Ticket + `","kind":"pty"}`), "bad_ticket", "kind"},
		{"not an open", protocol.FrameHello, []byte(`{}`), "bad_preamble", "want direct-open"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := h.metric("tether_coordinator_direct_refusals_total", "reason", tc.reason)
			e, _ := r.open(tc.typ, tc.payload)
			if e == nil || !strings.Contains(e.Message, tc.msg) {
				t.Fatalf("open answered %v; want a refusal naming %q", e, tc.msg)
			}
			if tc.reason != "bad_preamble" && (e.Status != 401 || e.Code != protocol.ErrCodeTicket) {
				t.Fatalf("refusal %v; want 401 %s", e, protocol.ErrCodeTicket)
			}
			if got := h.metric("tether_coordinator_direct_refusals_total", "reason", tc.reason); got != before+1 {
				t.Fatalf("refusals{reason=%s} = %v, want %v", tc.reason, got, before+1)
			}
		})
	}
	if n := len(hdrs.of("n1")) + len(hdrs.of("n2")); n != 0 {
		t.Fatalf("refused opens reached the agents: %d streams", n)
	}

	// The ticket itself, unspent by the refusals above: the stream that was
	// authorized, on n1, with its params.
	if e, _ := r.open(protocol.FrameDirectOpen, openPayload(t, protocol.DirectOpen{Ticket: rep.Ticket})); e != nil {
		t.Fatalf("redeem: %v", e)
	}
	checkFor(t, defaultTestTimeout, func() error {
		if len(hdrs.of("n1")) != 1 {
			return errors.New("no stream reached n1")
		}
		return nil
	})
	if hs := hdrs.of("n1"); hs[0].Kind != protocol.KindExec || !strings.Contains(string(hs[0].Params), `"argv":["granted"]`) || len(hdrs.of("n2")) != 0 {
		t.Fatalf("n1 got %s %s (n2 %d streams); want the authorized exec", hs[0].Kind, hs[0].Params, len(hdrs.of("n2")))
	}
	// Once only (on a new session: the refusals above used this one's
	// allowance).
	r = dialRaw(t, h, protocol.ALPNClient)
	r.control()
	if e, _ := r.open(protocol.FrameDirectOpen, openPayload(t, protocol.DirectOpen{Ticket: rep.Ticket})); e == nil || !strings.Contains(e.Message, "already redeemed") {
		t.Fatalf("replayed ticket answered %v; want refused as already redeemed", e)
	}
	if got := h.metric("tether_coordinator_direct_refusals_total", "reason", "reused_ticket"); got != 1 {
		t.Fatalf("refusals{reason=reused_ticket} = %v, want 1", got)
	}
	// Expired.
	rep2, e := ticket(t, h.client, "n1", protocol.KindExec, protocol.ExecParams{Argv: []string{"late"}})
	if e != nil {
		t.Fatal(e)
	}
	coordinator.ExpireDirectTicketsForTest(h.c)
	if e, _ := r.open(protocol.FrameDirectOpen, openPayload(t, protocol.DirectOpen{Ticket: rep2.Ticket})); e == nil || !strings.Contains(e.Message, "expired") {
		t.Fatalf("expired ticket answered %v; want refused as expired", e)
	}
	if got := h.metric("tether_coordinator_direct_refusals_total", "reason", "expired_ticket"); got != 1 {
		t.Fatalf("refusals{reason=expired_ticket} = %v, want 1", got)
	}
	if len(hdrs.of("n1")) != 1 {
		t.Fatalf("n1 got %d streams, want only the one authorized", len(hdrs.of("n1")))
	}
}

// TestDirectTicketFollowsPolicy: the direct path is authorized by the same
// policy as the relay: a caller without the rights gets no ticket (the
// relay's 403, naming what is missing), and a ticket's stream runs as the
// policy says (its run_as), whatever the client asked.
func TestDirectTicketFollowsPolicy(t *testing.T) {
	h, _ := newPolicyHarness(t, stagingPolicy, withDirect(nil))
	var hdrs headerLog
	h.dialAgent(t, agentOpts{id: "n-a", labels: map[string]string{"env": "staging"}, header: hdrs.hook("n-a")})
	h.dialAgent(t, agentOpts{id: "n-b", labels: map[string]string{"env": "prod"}, header: hdrs.hook("n-b")})
	for _, tc := range []struct {
		name   string
		node   string
		kind   protocol.Kind
		params any
		want   []string
	}{
		{"exec elsewhere", "n-b", protocol.KindExec, protocol.ExecParams{Argv: []string{"x"}}, []string{"nats:alice", "exec", "n-b"}},
		{"shell", "n-a", protocol.KindPTY, protocol.PTYParams{}, []string{"nats:alice", "shell"}},
		{"dial execd", "n-a", protocol.KindDial, protocol.DialParams{Target: "execd"}, []string{"nats:alice", "forward", `"execd"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, e := ticket(t, h.as("alice"), tc.node, tc.kind, tc.params)
			if rep != nil {
				t.Fatalf("got ticket %+v; want refused", rep)
			}
			wantRefused(t, tc.name, e, 403, protocol.ErrCodeForbidden, tc.want...)
		})
	}
	// Unknown to the policy: nothing at all.
	rep, e := ticket(t, h.as("mallory"), "n-a", protocol.KindExec, protocol.ExecParams{Argv: []string{"x"}})
	if rep != nil || e == nil || e.Status != 403 {
		t.Fatalf("mallory got %+v, %v; want 403", rep, e)
	}
	rep, e = ticket(t, h.as("alice"), "n-a", protocol.KindExec, protocol.ExecParams{Argv: []string{"id"}, User: "root"})
	if e != nil {
		t.Fatal(e)
	}
	r := dialRaw(t, h, protocol.ALPNClient)
	r.control()
	if e, _ := r.open(protocol.FrameDirectOpen, openPayload(t, protocol.DirectOpen{Ticket: rep.Ticket})); e != nil {
		t.Fatalf("redeem: %v", e)
	}
	checkFor(t, defaultTestTimeout, func() error {
		if len(hdrs.of("n-a")) != 1 {
			return errors.New("no stream reached n-a")
		}
		return nil
	})
	if u := userOf(t, hdrs.of("n-a")[0]); u != "deploy" || len(hdrs.of("n-b")) != 0 {
		t.Fatalf("the ticket's exec runs as %q; want the policy's deploy", u)
	}
}

// TestDirectListenerKeepsProtocolsApart: on the one tunnel port, a
// connection that negotiated the client protocol cannot speak the agent
// protocol (its hello is rejected, no node registers), one that did not
// cannot redeem tickets (it is refused as an agent, and the ticket stays
// unspent), and a coordinator without a direct listener closes client
// connections.
func TestDirectListenerKeepsProtocolsApart(t *testing.T) {
	h := newHarness(t, withDirect(nil))
	h.dialAgent(t, agentOpts{id: "n1", heartbeat: true})

	t.Run("agent hello on a client connection", func(t *testing.T) {
		before := h.metric("tether_coordinator_direct_refusals_total", "reason", "bad_preamble")
		r := dialRaw(t, h, protocol.ALPNClient)
		st, err := r.sess.OpenStream()
		if err != nil {
			t.Fatal(err)
		}
		hello := protocol.Hello{ProtocolVersion: protocol.Version, NodeID: "intruder", Token: testToken}
		if err := protocol.WriteJSONFrame(st, protocol.FrameHello, &hello); err != nil {
			t.Fatal(err)
		}
		f, err := protocol.NewFrameReader(st).Next()
		if err != nil || f.Type != protocol.FrameReject || !strings.Contains(string(f.Payload), protocol.ALPNClient) {
			t.Fatalf("answer %s %q, %v; want a reject naming the client protocol", f.Type, f.Payload, err)
		}
		if got := h.metric("tether_coordinator_direct_refusals_total", "reason", "bad_preamble"); got != before+1 {
			t.Fatalf("refusals{reason=bad_preamble} = %v, want %v", got, before+1)
		}
		for _, n := range h.c.Nodes(protocol.Selector{}) {
			if n.ID == "intruder" {
				t.Fatal("a client connection registered a node")
			}
		}
	})

	t.Run("ticket on an agent connection", func(t *testing.T) {
		rep, e := ticket(t, h.client, "n1", protocol.KindExec, protocol.ExecParams{Argv: []string{"x"}})
		if e != nil {
			t.Fatal(e)
		}
		for _, alpn := range []string{"", tunnel.ALPNTunnel} {
			r := dialRaw(t, h, alpn)
			st, err := r.sess.OpenStream()
			if err != nil {
				t.Fatal(err)
			}
			protocol.WriteFrame(st, protocol.FrameDirectControl, nil)
			protocol.WriteJSONFrame(st, protocol.FrameDirectOpen, &protocol.DirectOpen{Ticket: rep.Ticket})
			// The agent handshake refuses the first frame and closes the
			// connection.
			if _, err := io.Copy(io.Discard, st); err != nil && !errors.Is(err, yamux.ErrConnectionReset) && !errors.Is(err, io.EOF) {
				t.Logf("read after the refusal: %v", err)
			}
			checkFor(t, defaultTestTimeout, func() error {
				if !r.sess.IsClosed() {
					return fmt.Errorf("ALPN %q: the connection is still open", alpn)
				}
				return nil
			})
		}
		// Unspent: the client protocol still redeems it.
		r := dialRaw(t, h, protocol.ALPNClient)
		r.control()
		if e, _ := r.open(protocol.FrameDirectOpen, openPayload(t, protocol.DirectOpen{Ticket: rep.Ticket})); e != nil {
			t.Fatalf("the ticket, after the agent connections: %v", e)
		}
	})

	t.Run("refusals end the session", func(t *testing.T) {
		r := dialRaw(t, h, protocol.ALPNClient)
		r.control()
		for i := range 7 {
			if e, _ := r.open(protocol.FrameDirectOpen, []byte(`{}`)); e == nil {
				t.Fatalf("open %d without a ticket was not refused", i)
			}
		}
		// The eighth refusal closes the session at once: its answer, or
		// the close overtaking the client's own write or read of it
		// (yamux reports a write that its send loop finished as
		// "session shutdown" when the close is seen first).
		if st, err := r.sess.OpenStream(); err == nil {
			if err := protocol.WriteFrame(st, protocol.FrameDirectOpen, []byte(`{}`)); err == nil {
				if f, err := protocol.NewFrameReader(st).Next(); err == nil && f.Type != protocol.FrameDirectAnswer {
					t.Fatalf("the eighth open's answer is a %s frame, want %s", f.Type, protocol.FrameDirectAnswer)
				}
			}
			st.Close()
		}
		checkFor(t, defaultTestTimeout, func() error {
			if !r.sess.IsClosed() {
				return errors.New("the session is still open after 8 refused opens")
			}
			return nil
		})
	})

	t.Run("no ticket in time", func(t *testing.T) {
		quick := newHarness(t, withDirect(func(c *coordinator.Config) { c.HandshakeTimeout = 300 * time.Millisecond }))
		r := dialRaw(t, quick, protocol.ALPNClient)
		r.control()
		checkFor(t, defaultTestTimeout, func() error {
			if !r.sess.IsClosed() {
				return errors.New("a session that redeemed no ticket is still open")
			}
			return nil
		})
		checkFor(t, defaultTestTimeout, func() error {
			if got := quick.metric("tether_coordinator_direct_refusals_total", "reason", "no_redemption"); got != 1 {
				return fmt.Errorf("refusals{reason=no_redemption} = %v, want 1", got)
			}
			return nil
		})
		if got := quick.metric("tether_coordinator_direct_refusals_total", "reason", "bad_preamble"); got != 0 {
			t.Errorf("refusals{reason=bad_preamble} = %v for a well-formed session that redeemed nothing, want 0", got)
		}
	})

	// An idle connection (no control stream ever) is closed and counted
	// as idle, not as a malformed preamble: the two call for different
	// things of an operator (a slow or stuck client, a wrong one).
	t.Run("no control stream", func(t *testing.T) {
		quick := newHarness(t, withDirect(func(c *coordinator.Config) { c.HandshakeTimeout = 300 * time.Millisecond }))
		r := dialRaw(t, quick, protocol.ALPNClient)
		checkFor(t, defaultTestTimeout, func() error {
			if !r.sess.IsClosed() {
				return errors.New("a session that opened no control stream is still open")
			}
			return nil
		})
		checkFor(t, defaultTestTimeout, func() error {
			if got := quick.metric("tether_coordinator_direct_refusals_total", "reason", "no_control_stream"); got != 1 {
				return fmt.Errorf("refusals{reason=no_control_stream} = %v, want 1", got)
			}
			return nil
		})
		if got := quick.metric("tether_coordinator_direct_refusals_total", "reason", "bad_preamble"); got != 0 {
			t.Errorf("refusals{reason=bad_preamble} = %v for an idle connection, want 0", got)
		}
	})

	t.Run("direct off", func(t *testing.T) {
		off := newHarness(t, nil)
		off.dialAgent(t, agentOpts{id: "n1", heartbeat: true})
		r := dialRaw(t, off, protocol.ALPNClient)
		// The coordinator closes the connection, perhaps before this
		// reaches it.
		st, err := r.sess.OpenStream()
		if err == nil {
			protocol.WriteFrame(st, protocol.FrameDirectControl, nil)
			_, err = protocol.NewFrameReader(st).Next()
		}
		if err == nil {
			t.Fatal("a coordinator without a direct listener answered a client stream")
		}
		checkFor(t, defaultTestTimeout, func() error {
			if !r.sess.IsClosed() {
				return errors.New("the client connection is still open")
			}
			return nil
		})
		checkFor(t, defaultTestTimeout, func() error {
			if got := off.metric("tether_coordinator_direct_refusals_total", "reason", "direct_off"); got != 1 {
				return fmt.Errorf("refusals{reason=direct_off} = %v, want 1", got)
			}
			return nil
		})
		// And its stream requests for the direct path are told to relay.
		if _, e := ticket(t, off.client, "n1", protocol.KindExec, protocol.ExecParams{Argv: []string{"x"}}); e == nil || e.Code != protocol.ErrCodeDirectUnavailable || e.Status != 501 {
			t.Fatalf("direct request to a coordinator without the path: %v; want 501 %s", e, protocol.ErrCodeDirectUnavailable)
		}
	})
}

package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/internal/admission"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// dialFrom dials h's tunnel listener over TLS from localIP, as an agent's
// tunnel.DialTLS does (busy refusals come back as RetryAfterError).
func (h *harness) dialFrom(ctx context.Context, localIP string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(localIP)}}
	raw, err := d.DialContext(ctx, "tcp", h.addr)
	if err != nil {
		return nil, err
	}
	cfg := h.clientTLS.Clone()
	cfg.ServerName = "127.0.0.1"
	return tunnel.HandshakeTLS(ctx, raw, h.addr, cfg)
}

// Past its admission rate the coordinator answers a connection with a busy
// refusal naming the next free slot, before any TLS handshake, and counts
// it; the agent that comes back at its slot is handshaked.
func TestPacedAdmissionRefusesWithRetryAfter(t *testing.T) {
	h := newHarness(t, func(c *coordinator.Config) {
		c.AdmitRate = 2 // a slot every 500 ms
		c.AdmitBurst = 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	first, err := h.dialFrom(ctx, "127.0.4.1")
	if err != nil {
		t.Fatalf("first connection: %v", err)
	}
	defer first.Close()
	_, err = h.dialFrom(ctx, "127.0.4.2")
	var ra *tunnel.RetryAfterError
	if !errors.As(err, &ra) {
		t.Fatalf("second connection at once: %v, want a busy refusal", err)
	}
	if ra.After <= 0 || ra.After > 500*time.Millisecond || ra.Authenticated {
		t.Fatalf("busy refusal %+v: want a wait in (0, 500ms], unauthenticated", ra)
	}
	if got := h.metric("tether_coordinator_handshakes_paced_total"); got != 1 {
		t.Errorf("handshakes_paced_total = %v, want 1", got)
	}
	if got := h.metric("tether_coordinator_admit_rate_per_second"); got != 2 {
		t.Errorf("admit_rate_per_second = %v, want 2", got)
	}
	time.Sleep(ra.After)
	again, err := h.dialFrom(ctx, "127.0.4.2")
	if err != nil {
		t.Fatalf("back at its slot: %v", err)
	}
	again.Close()
}

// On shutdown the coordinator tells each agent that takes drains to move,
// staggered evenly over DrainSpread, then sends GoAway: the agent can open
// no new stream. An agent that did not list the feature gets no frame it
// cannot read.
func TestDrainStaggersAgentsThenGoesAway(t *testing.T) {
	h := newHarness(t, func(c *coordinator.Config) {
		c.DrainSpread = 2 * time.Second
	})
	var agents []*fakeAgent
	for _, id := range []string{"node-1", "node-2", "node-3", "node-4"} {
		agents = append(agents, h.dialAgent(t, agentOpts{id: id, features: []string{protocol.FeatureDrain}}))
	}
	old := h.dialAgent(t, agentOpts{id: "node-old"})
	checkFor(t, defaultTestTimeout, func() error {
		if n := len(h.c.Nodes(protocol.Selector{})); n != 5 {
			return errors.New("agents not all registered")
		}
		return nil
	})
	stopped := make(chan error, 1)
	go func() { stopped <- h.stop() }()
	var got []int64
	for _, a := range agents {
		a.ctrl.SetReadDeadline(time.Now().Add(defaultTestTimeout))
		f, err := protocol.NewFrameReader(a.ctrl).Next()
		if err != nil {
			t.Fatalf("agent %s: read drain: %v", a.o.id, err)
		}
		if f.Type != protocol.FrameDrain {
			t.Fatalf("agent %s: got %s, want drain", a.o.id, f.Type)
		}
		var d protocol.Drain
		if err := protocol.DecodeJSON(f.Payload, &d); err != nil {
			t.Fatal(err)
		}
		got = append(got, d.RetryAfterMS)
	}
	slices.Sort(got)
	if want := []int64{0, 500, 1000, 1500}; !slices.Equal(got, want) {
		t.Errorf("drain waits %v ms, want %v: spread evenly over 2 s", got, want)
	}
	for _, a := range agents {
		checkFor(t, defaultTestTimeout, func() error {
			st, err := a.sess.Open(context.Background(), protocol.KindControl, protocol.ControlParams{})
			if err == nil {
				st.Close()
				return errors.New("a stream opened after the drain")
			}
			return nil
		})
	}
	old.ctrl.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	if f, err := protocol.NewFrameReader(old.ctrl).Next(); err == nil {
		t.Errorf("agent without the drain feature got a %s frame", f.Type)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}

// A flood of TLS handshakes from a few sources, as fast as they go, cannot
// keep an agent of another source out of a paced coordinator: heavy
// sources may not take the lower half of the bucket, so the agent is
// handshaked at its first attempt, or at worst told a short wait.
func TestAgentRegistersDuringChurnFlood(t *testing.T) {
	h := newHarness(t, func(c *coordinator.Config) {
		c.AdmitRate = 20
		c.AdmitBurst = 8
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	const churners = 6
	for i := range churners {
		go func() {
			defer func() { done <- struct{}{} }()
			ip := net.IPv4(127, 0, 5, byte(1+i)).String()
			for ctx.Err() == nil {
				dctx, dcancel := context.WithTimeout(ctx, time.Second)
				if c, err := h.dialFrom(dctx, ip); err == nil {
					c.Close()
				}
				dcancel()
			}
		}()
	}
	defer func() {
		cancel()
		for range churners {
			<-done
		}
	}()
	checkFor(t, defaultTestTimeout, func() error {
		if h.metric("tether_coordinator_handshakes_paced_total") < 50 {
			return errors.New("the flood is not past the admission rate yet")
		}
		return nil
	})
	dctx, dcancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer dcancel()
	for attempt := 1; ; attempt++ {
		c, err := h.dialFrom(dctx, "127.0.5.200")
		if err == nil {
			c.Close()
			t.Logf("agent handshaked at attempt %d during the flood", attempt)
			return
		}
		var ra *tunnel.RetryAfterError
		if !errors.As(err, &ra) || attempt >= 3 {
			t.Fatalf("attempt %d during the flood: %v", attempt, err)
		}
		time.Sleep(ra.After)
	}
}

// prefillRegistry opens the fleet registry on cfg's NATS, puts n records
// of nodes held by the coordinator owner (as one killed without draining
// leaves them) and sets it as cfg.Fleet.
func prefillRegistry(t *testing.T, cfg *coordinator.Config, owner string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	kv, err := coordinator.OpenFleetBucket(ctx, cfg.NATS, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		id := fmt.Sprintf("held-%d", i)
		b, _ := json.Marshal(protocol.NodeInfo{ID: id, Coordinator: owner})
		if _, err := kv.Put(ctx, id, b); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Fleet = kv
}

// A coordinator restarted after a kill finds in the fleet registry the
// agents it held and spreads their return as a storm; the first agent
// back is admitted at once all the same. Records of another coordinator's
// nodes announce nothing: one agent reconnecting there is no storm.
func TestRestartAnnouncesTheAgentsItHeld(t *testing.T) {
	for _, tc := range []struct {
		owner string
		storm bool
	}{{"coord-test", true}, {"elsewhere", false}} {
		t.Run(tc.owner, func(t *testing.T) {
			h := newHarness(t, func(c *coordinator.Config) {
				prefillRegistry(t, c, tc.owner, 300) // more than the burst (16 at 160 a second)
				c.AdmitRate = 160
			})
			ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
			defer cancel()
			conn, err := h.dialFrom(ctx, "127.0.6.1")
			if err != nil {
				t.Fatalf("the first agent after the restart: %v, want admitted at once", err)
			}
			conn.Close()
			if got := coordinator.InStormForTest(h.c); got != tc.storm {
				t.Fatalf("storm in progress = %v after 300 records of %s, want %v", got, tc.owner, tc.storm)
			}
			if got := h.metric("tether_coordinator_handshakes_paced_total"); got != 0 {
				t.Errorf("handshakes_paced_total = %v, want 0", got)
			}
		})
	}
}

// By default a drain spreads more agents than the admission burst over at
// least the storm window, as a restart would: the peers they move to see
// no more than about 36% of them in one second.
func TestDrainSpreadsMoreThanABurstOverTheStormWindow(t *testing.T) {
	h := newHarness(t, func(c *coordinator.Config) {
		c.AdmitRate = 100 // 17 agents take 170 ms at the rate
		c.AdmitBurst = 16
	})
	const n = 17
	var agents []*fakeAgent
	for i := range n {
		// Fewer newcomers a second than the burst: no storm on the way in.
		time.Sleep(80 * time.Millisecond)
		agents = append(agents, h.dialAgent(t, agentOpts{id: fmt.Sprintf("node-%d", i),
			localIP: fmt.Sprintf("127.0.7.%d", 1+i), features: []string{protocol.FeatureDrain}}))
	}
	checkFor(t, defaultTestTimeout, func() error {
		if got := len(h.c.Nodes(protocol.Selector{})); got != n {
			return fmt.Errorf("%d of %d agents registered", got, n)
		}
		return nil
	})
	stopped := make(chan error, 1)
	go func() { stopped <- h.stop() }()
	var got []int64
	for _, a := range agents {
		a.ctrl.SetReadDeadline(time.Now().Add(defaultTestTimeout))
		f, err := protocol.NewFrameReader(a.ctrl).Next()
		if err != nil || f.Type != protocol.FrameDrain {
			t.Fatalf("agent %s: %v %v, want a drain", a.o.id, f.Type, err)
		}
		var d protocol.Drain
		if err := protocol.DecodeJSON(f.Payload, &d); err != nil {
			t.Fatal(err)
		}
		got = append(got, d.RetryAfterMS)
	}
	slices.Sort(got)
	for i, ms := range got {
		if want := (admission.StormWindow * time.Duration(i) / n).Milliseconds(); ms != want {
			t.Fatalf("drain waits %v ms, want %d agents spread evenly over the storm window %v", got, n, admission.StormWindow)
		}
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}

package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/protocol"
)

// An agent that reads a stream slower than the coordinator writes it makes
// the coordinator's stream run out of the agent's window: the node's
// listing shows the stalls and their time, and so do the coordinator's
// fleet-wide counters; once the agent caught up, nothing is queued. The
// agent's heartbeats' RTTs are samples of the RTT histogram.
func TestNodeFlowTelemetry(t *testing.T) {
	const holdOff = 30 * time.Millisecond
	h := newHarness(t, func(c *coordinator.Config) { c.HeartbeatInterval = 100 * time.Millisecond })
	release := make(chan struct{})
	read := make(chan error, 1)
	h.dialAgent(t, agentOpts{id: "slow", heartbeat: true, targets: []string{"execd"}, window: 256 << 10,
		stream: func(a *fakeAgent, st *yamux.Stream, hd protocol.Header) {
			defer st.Close()
			if hd.Kind != protocol.KindDial {
				return
			}
			protocol.WriteFrame(st, protocol.FrameDialOK, nil)
			select { // the agent's reader holds off
			case <-release:
			case <-a.ctx.Done():
				return
			}
			_, err := io.Copy(io.Discard, st)
			read <- err
		}})
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	conn, err := h.c.DialTarget(ctx, "slow", "execd")
	if err != nil {
		t.Fatal(err)
	}
	wrote := make(chan error, 1)
	go func() {
		_, err := conn.Write(make([]byte, 1<<20)) // four of the agent's windows
		conn.Close()
		wrote <- err
	}()
	node := func() protocol.NodeInfo {
		ns := h.c.Nodes(protocol.Selector{})
		if len(ns) != 1 {
			t.Fatalf("nodes = %+v, want the one agent", ns)
		}
		return ns[0]
	}
	checkFor(t, defaultTestTimeout, func() error {
		if n := node(); n.WindowStalls < 1 {
			return fmt.Errorf("node lists %d window stalls while its reader holds off", n.WindowStalls)
		}
		return nil
	})
	time.Sleep(holdOff) // the stall goes on
	if n := node(); n.WindowStallSeconds < holdOff.Seconds() {
		t.Errorf("stall in progress for %v: node lists %v s", holdOff, n.WindowStallSeconds)
	}
	close(release)
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if err := <-read; err != nil {
		t.Fatal(err)
	}
	checkFor(t, defaultTestTimeout, func() error {
		n := node()
		stalls := h.metric("tether_coordinator_tunnel_window_stalls_total")
		secs := h.metric("tether_coordinator_tunnel_window_stall_seconds_total")
		queued := h.metric("tether_coordinator_tunnel_send_queued_bytes")
		switch {
		case stalls != float64(n.WindowStalls) || stalls < 1:
			return fmt.Errorf("stalls: counter %v, node %d", stalls, n.WindowStalls)
		case secs < holdOff.Seconds() || math.Abs(secs-n.WindowStallSeconds) > 1e-6:
			return fmt.Errorf("stall seconds: counter %v, node %v, want at least %v and equal (every stall ended)", secs, n.WindowStallSeconds, holdOff.Seconds())
		case queued != 0 || n.SendQueuedBytes != 0:
			return fmt.Errorf("queued bytes while idle: gauge %v, node %d", queued, n.SendQueuedBytes)
		}
		return nil
	})

	// The agent's side, as its heartbeats report it (the fake's: 7
	// stalls for 1.5 ms, 12 bytes queued), once a heartbeat arrived: the
	// part above can take less than a heartbeat interval (CI: 0.16 s).
	checkFor(t, defaultTestTimeout, func() error {
		if n := node(); n.AgentWindowStalls != 7 || n.AgentWindowStallSeconds != 0.0015 || n.AgentSendQueuedBytes != 12 {
			return fmt.Errorf("agent's side: %d stalls for %v s, %d bytes queued; want the heartbeat's 7, 0.0015, 12",
				n.AgentWindowStalls, n.AgentWindowStallSeconds, n.AgentSendQueuedBytes)
		}
		return nil
	})

	// Heartbeats (the fake reports 1234 µs) are RTT samples.
	checkFor(t, defaultTestTimeout, func() error {
		if c := h.metric("tether_coordinator_tunnel_rtt_seconds"); c < 2 {
			return fmt.Errorf("%v RTT samples after heartbeats", c)
		}
		return nil
	})
	if sum, count := rttHistogram(t, h); math.Abs(sum/float64(count)-0.001234) > 1e-9 {
		t.Errorf("RTT histogram: %d samples summing to %v s, want 1.234 ms each", count, sum)
	}
}

// rttHistogram reads the sample sum and count of
// tether_coordinator_tunnel_rtt_seconds from one gathering.
func rttHistogram(t *testing.T, h *harness) (float64, uint64) {
	t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "tether_coordinator_tunnel_rtt_seconds" {
			hist := mf.GetMetric()[0].GetHistogram()
			return hist.GetSampleSum(), hist.GetSampleCount()
		}
	}
	t.Fatal(errors.New("tether_coordinator_tunnel_rtt_seconds not exported"))
	return 0, 0
}

package coordinator

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
	"github.com/tetherfleet/tether/tunnel/tunneltest"
)

// closeRecorder notes when the coordinator closes its end of a connection.
type closeRecorder struct {
	*tunneltest.FrozenConn
	once   sync.Once
	closed chan struct{}
	at     time.Time
}

func (c *closeRecorder) Close() error {
	c.once.Do(func() {
		c.at = time.Now()
		close(c.closed)
	})
	return c.FrozenConn.Close()
}

// With the default configuration the coordinator drops an agent that froze
// (TCP open, process stopped: nothing arrives, writes vanish into kernel
// buffers) within 15 s of the freeze, wherever the freeze falls between the
// agent's heartbeats, and keeps a live agent that only heartbeats. The
// connection runs through the coordinator's own per-connection path
// (startConn: handshake, registration, heartbeat reader) on the bubble's
// fake clock.
func TestDefaultConfigDropsFrozenAgentWithinBound(t *testing.T) {
	tunneltest.Synctest(t, func(t *testing.T) {
		const bound = 15 * time.Second
		cfg := DefaultConfig()
		cfg.ID = "coord-test"
		cfg.Token = "tok"
		cfg.NATS = &nats.Conn{} // not used: no Serve, only the agent connection path
		cfg.Identify = func(nats.Header) (policy.Identity, error) { return policy.Identity{}, nil }
		c, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		c.mu.Lock()
		c.started, c.life = true, ctx
		c.mu.Unlock()

		var worst time.Duration
		// Freeze at every phase of two heartbeat intervals.
		for offset := time.Duration(0); offset < 2*cfg.HeartbeatInterval; offset += 250 * time.Millisecond {
			a, s := net.Pipe()
			// The coordinator's end: Freeze stops the agent.
			rec := &closeRecorder{FrozenConn: tunneltest.NewFrozenConn(s), closed: make(chan struct{})}
			c.startConn(rec)

			// The agent's side, as the agent package runs it: pings on the
			// default tunnel config, a heartbeat every welcome interval.
			sess, err := tunnel.Client(a, tunnel.DefaultConfig())
			if err != nil {
				t.Fatal(err)
			}
			ctl, err := sess.Open(ctx, protocol.KindControl, protocol.ControlParams{})
			if err != nil {
				t.Fatal(err)
			}
			hello := protocol.Hello{ProtocolVersion: protocol.Version, Token: "tok", NodeID: "node-a", Instance: "i"}
			if err := protocol.WriteJSONFrame(ctl, protocol.FrameHello, &hello); err != nil {
				t.Fatal(err)
			}
			f, err := protocol.NewFrameReader(ctl).Next()
			if err != nil || f.Type != protocol.FrameWelcome {
				t.Fatalf("offset %v: got %v, %v; want a welcome", offset, f.Type, err)
			}
			var w protocol.Welcome
			protocol.DecodeJSON(f.Payload, &w)
			beatDone := make(chan struct{})
			go func() {
				defer close(beatDone)
				tk := time.NewTicker(w.HeartbeatInterval())
				defer tk.Stop()
				for {
					if protocol.WriteJSONFrame(ctl, protocol.FrameHeartbeat, &protocol.Heartbeat{}) != nil {
						return
					}
					select {
					case <-sess.Done():
						return
					case <-tk.C:
					}
				}
			}()

			// Alive for offset plus 20 s: more than the bound, so an agent
			// dropped although it heartbeats fails here.
			time.Sleep(offset + 20*time.Second)
			if len(c.Nodes(protocol.Selector{})) != 1 {
				t.Fatalf("offset %v: live agent not registered", offset)
			}
			rec.Freeze()
			frozeAt := time.Now()
			<-rec.closed
			d := rec.at.Sub(frozeAt)
			worst = max(worst, d)
			if d > bound {
				t.Errorf("frozen at %v past a heartbeat: dropped after %v, want at most %v", offset, d, bound)
			}
			sess.Close()
			<-beatDone
			c.connWG.Wait()
			if n := c.Nodes(protocol.Selector{}); len(n) != 0 {
				t.Fatalf("offset %v: frozen agent still registered: %+v", offset, n)
			}
		}
		t.Logf("worst detection delay %v (bound %v)", worst, bound)
	})
}

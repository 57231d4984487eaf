package tunnel_test

import (
	"net"
	"testing"
	"time"

	"github.com/tetherfleet/tether/tunnel"
	"github.com/tetherfleet/tether/tunnel/tunneltest"
)

// deadPeerBound is what the README promises: a dead peer is found within
// 15 s on every layer, with the default configuration.
const deadPeerBound = 15 * time.Second

// An agent's session (tunnel.DefaultConfig) finds a coordinator that froze
// (TCP open, process stopped: writes vanish into kernel buffers, nothing
// comes back) within deadPeerBound of the freeze, wherever in the keepalive
// cycle the freeze falls; and a live, idle peer is never dropped. Time is
// the bubble's fake clock.
func TestDefaultConfigFindsFrozenPeerWithinBound(t *testing.T) {
	tunneltest.Synctest(t, func(t *testing.T) {
		cfg := tunnel.DefaultConfig()
		// The coordinator's side: no pings of its own, answers the agent's.
		peerCfg := tunnel.DefaultConfig()
		peerCfg.KeepAliveInterval = 0
		var worst time.Duration
		// Freeze at every phase of two keepalive cycles, 250 ms apart.
		for offset := time.Duration(0); offset < 20*time.Second; offset += 250 * time.Millisecond {
			c, s := net.Pipe()
			fc := tunneltest.NewFrozenConn(c)
			client, err := tunnel.Client(fc, cfg)
			if err != nil {
				t.Fatal(err)
			}
			server, err := tunnel.Server(s, peerCfg)
			if err != nil {
				t.Fatal(err)
			}
			// Idle but alive for offset, up to 20 s: longer than the bound,
			// so a session that is dropped for silence alone fails here.
			time.Sleep(offset)
			select {
			case <-client.Done():
				t.Fatalf("offset %v: session with a live peer closed", offset)
			default:
			}
			fc.Freeze()
			frozeAt := time.Now()
			<-client.Done()
			d := time.Since(frozeAt)
			worst = max(worst, d)
			if d > deadPeerBound {
				t.Errorf("frozen at %v into the session: detected after %v, want at most %v", offset, d, deadPeerBound)
			}
			client.Close()
			server.Close()
		}
		t.Logf("worst detection delay %v (bound %v)", worst, deadPeerBound)
	})
}

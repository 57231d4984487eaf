package tunnel_test

import (
	"errors"
	"net"
	"strings"
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

// A session with IdleTimeout (the coordinator's side, which does not ping)
// stays open while its peer pings, however long nothing else happens, and
// closes within IdleTimeout of the peer's freeze, saying why.
func TestIdleTimeoutClosesSilentSession(t *testing.T) {
	tunneltest.Synctest(t, func(t *testing.T) {
		cfg := tunnel.DefaultConfig()
		cfg.KeepAliveInterval = 0
		cfg.IdleTimeout = deadPeerBound
		if got := cfg.DeadPeerBound(); got != deadPeerBound {
			t.Fatalf("DeadPeerBound() = %v, want IdleTimeout %v", got, deadPeerBound)
		}
		for offset := time.Duration(0); offset < 10*time.Second; offset += 500 * time.Millisecond {
			c, s := net.Pipe()
			fs := tunneltest.NewFrozenConn(s)
			pinger, err := tunnel.Client(c, tunnel.DefaultConfig())
			if err != nil {
				t.Fatal(err)
			}
			watcher, err := tunnel.Server(fs, cfg)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Minute + offset)
			if err := watcher.Err(); err != nil {
				t.Fatalf("offset %v: session with a pinging peer ended: %v", offset, err)
			}
			fs.Freeze()
			frozeAt := time.Now()
			<-watcher.Done()
			if d := time.Since(frozeAt); d > deadPeerBound {
				t.Errorf("offset %v: closed %v after the freeze, want at most %v", offset, d, deadPeerBound)
			}
			if err := watcher.Err(); !errors.Is(err, tunnel.ErrPeerSilent) {
				t.Errorf("Err() = %v, want ErrPeerSilent", err)
			}
			pinger.Close()
			watcher.Close()
		}
		// Closed by its owner: Err says closed, not silent.
		c, s := net.Pipe()
		a, _ := tunnel.Client(c, cfg)
		b, _ := tunnel.Server(s, cfg)
		b.Close()
		<-a.Done()
		if err := b.Err(); !errors.Is(err, net.ErrClosed) {
			t.Errorf("Err() after Close = %v, want net.ErrClosed", err)
		}
		a.Close()
	})
}

func TestDeadPeerBound(t *testing.T) {
	d := tunnel.DefaultConfig()
	if got := d.DeadPeerBound(); got > deadPeerBound {
		t.Errorf("DefaultConfig().DeadPeerBound() = %v, want at most %v", got, deadPeerBound)
	}
	both := tunnel.Config{KeepAliveInterval: 5 * time.Second, WriteTimeout: 10 * time.Second, IdleTimeout: 12 * time.Second}
	if got := both.DeadPeerBound(); got != 12*time.Second {
		t.Errorf("DeadPeerBound with both = %v, want the smaller, 12s", got)
	}
	if got := (&tunnel.Config{WriteTimeout: time.Second}).DeadPeerBound(); got != 0 {
		t.Errorf("DeadPeerBound with neither = %v, want 0", got)
	}
	bad := tunnel.DefaultConfig()
	bad.IdleTimeout = 6 * time.Second
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "IdleTimeout 6s is below twice KeepAliveInterval 5s") {
		t.Errorf("Validate() = %v, want IdleTimeout below twice the ping interval refused", err)
	}
}

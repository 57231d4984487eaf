package agent

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
	"github.com/tetherfleet/tether/tunnel/tunneltest"
)

// frozenCoordinator is the agent's end of a connection to a coordinator
// that can be frozen; it records when the agent closes it.
type frozenCoordinator struct {
	*tunneltest.FrozenConn
	once     sync.Once
	closed   chan struct{}
	closedAt time.Time
}

func (f *frozenCoordinator) Close() error {
	f.once.Do(func() {
		f.closedAt = time.Now()
		close(f.closed)
	})
	return f.FrozenConn.Close()
}

// serveFakeCoordinator welcomes the agent on sess and reads its heartbeats
// until the session ends.
func serveFakeCoordinator(t *testing.T, sess *tunnel.Session, interval time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, h, err := sess.Accept(ctx)
	if err != nil || h.Kind != protocol.KindControl {
		t.Errorf("fake coordinator: accept control stream: %v, %v", h.Kind, err)
		return
	}
	fr := protocol.NewFrameReader(st)
	if f, err := fr.Next(); err != nil || f.Type != protocol.FrameHello {
		t.Errorf("fake coordinator: hello: %v, %v", f.Type, err)
		return
	}
	if err := protocol.WriteJSONFrame(st, protocol.FrameWelcome, &protocol.Welcome{
		SessionID: "s", CoordinatorID: "c", HeartbeatIntervalMS: interval.Milliseconds(),
	}); err != nil {
		t.Errorf("fake coordinator: welcome: %v", err)
		return
	}
	for {
		if _, err := fr.Next(); err != nil {
			return
		}
	}
}

// With its default configuration the agent finds a coordinator that froze
// (TCP open, process stopped: the agent's writes vanish into kernel buffers,
// nothing comes back) within 15 s of the freeze, wherever the freeze falls
// in the keepalive and heartbeat cycles, and closes the session to redial.
// A live coordinator that only answers is never dropped. Time is the
// bubble's fake clock.
func TestAgentFindsFrozenCoordinatorWithinBound(t *testing.T) {
	tunneltest.Synctest(t, func(t *testing.T) {
		const bound = 15 * time.Second
		const heartbeat = 5 * time.Second // the coordinator's default
		var worst time.Duration
		for offset := time.Duration(0); offset < 20*time.Second; offset += 500 * time.Millisecond {
			cfg := testConfig(t)
			cfg.Tunnel = tunnel.Config{} // the default
			cfg.Logger = nil
			var mu sync.Mutex
			var conns []*frozenCoordinator
			var fakes sync.WaitGroup
			defer fakes.Wait()
			cfg.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
				mu.Lock()
				defer mu.Unlock()
				if len(conns) > 0 {
					return nil, errors.New("test: one connection only")
				}
				a, s := net.Pipe()
				fc := &frozenCoordinator{FrozenConn: tunneltest.NewFrozenConn(a), closed: make(chan struct{})}
				conns = append(conns, fc)
				peer := tunnel.DefaultConfig()
				peer.KeepAliveInterval = 0 // as the coordinator: answers pings, sends none
				srv, err := tunnel.Server(s, peer)
				if err != nil {
					return nil, err
				}
				fakes.Add(1)
				go func() {
					defer fakes.Done()
					defer srv.Close()
					serveFakeCoordinator(t, srv, heartbeat)
				}()
				return fc, nil
			}
			a, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			runDone := make(chan struct{})
			go func() {
				defer close(runDone)
				a.Run(ctx)
			}()
			// Connected and alive past the bound: the agent must not drop a
			// coordinator that is only quiet.
			time.Sleep(offset + 20*time.Second)
			mu.Lock()
			fc := conns[0]
			mu.Unlock()
			select {
			case <-fc.closed:
				t.Fatalf("offset %v: the agent closed a live session", offset)
			default:
			}
			fc.Freeze()
			frozeAt := time.Now()
			<-fc.closed
			d := fc.closedAt.Sub(frozeAt)
			worst = max(worst, d)
			if d > bound {
				t.Errorf("frozen %v into a cycle: the agent noticed after %v, want at most %v", offset, d, bound)
			}
			cancel()
			<-runDone
		}
		t.Logf("worst detection delay %v (bound %v)", worst, bound)
	})
}

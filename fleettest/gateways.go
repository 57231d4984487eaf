package fleettest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/sandboxes"
	"github.com/tetherfleet/tether/protocol/opensandbox/opensandboxtest"
	"github.com/tetherfleet/tether/protocol/openshell/openshelltest"
	"github.com/tetherfleet/tether/tunnel"
)

// GatewayOptions give every in-process agent its own fake sandbox gateways
// and run the coordinator's sandbox services (ledger, inventory loop,
// reaper, and both facades on loopback).
type GatewayOptions struct {
	// OpenShell configures each node's fake OpenShell gateway.
	OpenShell openshelltest.Options
	// OpenSandbox configures each node's fake OpenSandbox server.
	OpenSandbox opensandboxtest.Config
	// Sandboxes, if set, adjusts the sandbox services' config (reaper
	// intervals, TTLs) before they open. Defaults here: inventory every
	// second, reaper pass every 200 ms, backoff 100 ms.
	Sandboxes func(*sandboxes.Config)
}

// gatewayFleet is the Fleet's part for GatewayOptions.
type gatewayFleet struct {
	mu          sync.Mutex
	openShell   map[string]*openshelltest.Gateway
	openSandbox map[string]*opensandboxtest.Server
	cuts        map[string]*netCut
}

// OpenShell returns node's fake OpenShell gateway (nil without Gateways).
func (f *Fleet) OpenShell(node string) *openshelltest.Gateway {
	f.gw.mu.Lock()
	defer f.gw.mu.Unlock()
	return f.gw.openShell[node]
}

// OpenSandbox returns node's fake OpenSandbox server (nil without Gateways).
func (f *Fleet) OpenSandbox(node string) *opensandboxtest.Server {
	f.gw.mu.Lock()
	defer f.gw.mu.Unlock()
	return f.gw.openSandbox[node]
}

// openSandboxes starts coordinator ccfg.ID's sandbox services before the
// coordinator exists (their endpoints go into its config) and listens for
// both facades; the first coordinator's are Fleet.Sandboxes and its
// facades, every one's are in Fleet.SandboxServices and the facade lists.
func (f *Fleet) openSandboxes(tb testing.TB, nc *nats.Conn, ccfg *coordinator.Config) {
	tb.Helper()
	osh, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	osb, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	f.OpenShellFacades = append(f.OpenShellFacades, osh.Addr().String())
	f.OpenSandboxFacades = append(f.OpenSandboxFacades, osb.Addr().String())
	cfg := sandboxes.Config{
		NATS: nc, ID: ccfg.ID, Logger: ccfg.Logger,
		InventoryInterval: time.Second,
		OpenShell:         osh, OpenSandbox: osb,
	}
	cfg.Reaper.Interval = 200 * time.Millisecond
	cfg.Reaper.Backoff = 100 * time.Millisecond
	if f.opts.Gateways.Sandboxes != nil {
		f.opts.Gateways.Sandboxes(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	svc, err := sandboxes.Open(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	f.SandboxServices = append(f.SandboxServices, svc)
	if len(f.SandboxServices) == 1 {
		f.Sandboxes = svc
		f.OpenShellFacade, f.OpenSandboxFacade = f.OpenShellFacades[0], f.OpenSandboxFacades[0]
	}
	ccfg.Endpoints = svc.Endpoints
}

// attachSandboxes builds the reaper and facades of the last opened sandbox
// services on c and runs them until ctx ends.
func (f *Fleet) attachSandboxes(tb testing.TB, c *coordinator.Coordinator, ctx context.Context) {
	tb.Helper()
	svc := f.SandboxServices[len(f.SandboxServices)-1]
	if err := svc.Attach(c); err != nil {
		tb.Fatal(err)
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		if err := svc.Run(ctx); err != nil {
			f.opts.Logger.Error("sandbox services stopped", "err", err)
		}
	}()
}

// addGateways starts node's fake gateways and points its agent at them,
// behind a cut the test controls (Partition, Heal).
func (f *Fleet) addGateways(tb testing.TB, node string, cfg *agent.Config) {
	tb.Helper()
	g := openshelltest.New(f.opts.Gateways.OpenShell)
	addr, err := g.Start()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(g.Close)
	s := opensandboxtest.NewServer(f.opts.Gateways.OpenSandbox)
	tb.Cleanup(func() { s.Close() })
	cut := &netCut{conns: map[net.Conn]struct{}{}}
	f.gw.mu.Lock()
	if f.gw.openShell == nil {
		f.gw.openShell = map[string]*openshelltest.Gateway{}
		f.gw.openSandbox = map[string]*opensandboxtest.Server{}
		f.gw.cuts = map[string]*netCut{}
	}
	f.gw.openShell[node], f.gw.openSandbox[node], f.gw.cuts[node] = g, s, cut
	f.gw.mu.Unlock()
	cfg.OpenShell = &agent.OpenShellTarget{Addr: addr}
	cfg.OpenSandbox = &agent.OpenSandboxTarget{Addr: s.Host()}
	tlsCfg := cfg.TLS
	cfg.Dial = func(ctx context.Context, a string) (net.Conn, error) {
		if cut.isCut() {
			return nil, fmt.Errorf("fleettest: node %s is partitioned", node)
		}
		var d net.Dialer
		raw, err := d.DialContext(ctx, "tcp", a)
		if err != nil {
			return nil, err
		}
		c := cut.track(raw)
		if c == nil {
			raw.Close()
			return nil, fmt.Errorf("fleettest: node %s is partitioned", node)
		}
		return tlsClient(ctx, c, tlsCfg)
	}
}

// Partition cuts node's agent off the coordinator: its tunnel connection
// is closed and it cannot redial until Heal. Its gateways stay up.
func (f *Fleet) Partition(tb testing.TB, node string) {
	f.gw.mu.Lock()
	cut := f.gw.cuts[node]
	f.gw.mu.Unlock()
	if cut == nil {
		tb.Fatalf("fleettest: Partition %s: no such node with gateways", node)
	}
	cut.set(true)
}

// Heal lets node's agent reconnect.
func (f *Fleet) Heal(tb testing.TB, node string) {
	f.gw.mu.Lock()
	cut := f.gw.cuts[node]
	f.gw.mu.Unlock()
	if cut == nil {
		tb.Fatalf("fleettest: Heal %s: no such node with gateways", node)
	}
	cut.set(false)
}

// netCut is a switch on one agent's tunnel connections.
type netCut struct {
	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
}

func (n *netCut) isCut() bool { n.mu.Lock(); defer n.mu.Unlock(); return n.cut }

func (n *netCut) set(cut bool) {
	n.mu.Lock()
	n.cut = cut
	var conns []net.Conn
	if cut {
		for c := range n.conns {
			conns = append(conns, c)
		}
	}
	n.mu.Unlock()
	for _, c := range conns {
		c.Close() // takes n.mu to untrack itself
	}
}

// track registers c, or returns nil if the cut is on.
func (n *netCut) track(c net.Conn) net.Conn {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cut {
		return nil
	}
	tc := &trackedConn{Conn: c, n: n}
	n.conns[tc] = struct{}{}
	return tc
}

type trackedConn struct {
	net.Conn
	n    *netCut
	once sync.Once
}

func (t *trackedConn) Close() error {
	t.once.Do(func() {
		t.n.mu.Lock()
		delete(t.n.conns, t)
		t.n.mu.Unlock()
	})
	return t.Conn.Close()
}

// tlsClient runs the client side of the tunnel's TLS handshake on c.
func tlsClient(ctx context.Context, c net.Conn, cfg *tls.Config) (net.Conn, error) {
	if cfg == nil {
		c.Close()
		return nil, errors.New("fleettest: agent has no TLS config")
	}
	tc := tls.Client(tunnel.Cork(c), tunnel.TunedTLS(cfg))
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("fleettest: TLS handshake: %w", err)
	}
	return tc, nil
}

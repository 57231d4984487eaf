package agent

import (
	"context"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// A coordinator's drain moves the agent to its other coordinator at once
// (no backoff: the drain asks for none), while the exec in flight on the
// drained session runs to its end and reports its exit there.
func TestDrainMovesAgentWhileStreamsFinish(t *testing.T) {
	fcs := []*fakeCoordinator{startFakeCoordinator(t, "good-token"), startFakeCoordinator(t, "good-token")}
	cfg := testConfig(t)
	cfg.Coordinators = []string{fcs[0].addr, fcs[1].addr}
	cfg.TLS = fcs[0].clientTLS
	// Each fake has a CA of its own: trust each for its own address.
	cfg.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
		for _, fc := range fcs {
			if fc.addr == addr {
				return tunnel.DialTLS(ctx, addr, fc.clientTLS)
			}
		}
		return nil, net.ErrClosed
	}
	cfg.Token = "good-token"
	cfg.Backoff = tunnel.Backoff{Base: time.Hour, Max: time.Hour} // a backoff would stall the test
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := runAgent(t, a)
	defer stop()

	// Whichever coordinator the agent's seed picked first is drained.
	var first, other *fakeCoordinator
	var sess *tunnel.Session
	select {
	case sess = <-fcs[0].sessions:
		first, other = fcs[0], fcs[1]
	case sess = <-fcs[1].sessions:
		first, other = fcs[1], fcs[0]
	case <-time.After(testWait):
		t.Fatal("agent connected nowhere")
	}
	if h := recv(t, first.hellos, "hello"); !slices.Contains(h.Features, protocol.FeatureDrain) {
		t.Fatalf("hello features %v lack %s", h.Features, protocol.FeatureDrain)
	}
	ctl := recv(t, first.ctls, "control stream")
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	st, err := sess.Open(ctx, protocol.KindExec, protocol.ExecParams{Script: "sleep 1; echo finished"})
	if err != nil {
		t.Fatal(err)
	}
	e := &execStream{st: st, fr: protocol.NewFrameReader(st)}

	if err := protocol.WriteJSONFrame(ctl, protocol.FrameDrain, &protocol.Drain{RetryAfterMS: 0, Message: "test drain"}); err != nil {
		t.Fatal(err)
	}
	sess.GoAway()
	// The agent registers with the other coordinator while its exec on
	// the drained one still runs.
	recv(t, other.sessions, "session with the other coordinator")
	if sess.IsClosed() {
		t.Fatal("the drained session was closed; its streams must be let finish")
	}
	e.finish(t)
	if e.exit == nil || e.exit.ExitCode != 0 || !strings.Contains(e.stdout.String(), "finished") {
		t.Fatalf("exec on the drained session: exit %+v, stdout %q, error %+v", e.exit, e.stdout.String(), e.errInfo)
	}
}

// TestDrainStopsAgentOfSoleCoordinator: an agent whose coordinator is its
// only one (tether dev's) does not redial it when it drains the session:
// the exec in flight finishes and reports its exit, then, once the
// coordinator closed the session, Run returns nil, after one dial.
func TestDrainStopsAgentOfSoleCoordinator(t *testing.T) {
	fc := startFakeCoordinator(t, "good-token")
	var dials atomic.Int32
	cfg := testConfig(t)
	cfg.Coordinators = []string{fc.addr}
	cfg.TLS = fc.clientTLS
	cfg.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
		dials.Add(1)
		return tunnel.DialTLS(ctx, addr, fc.clientTLS)
	}
	cfg.Token = "good-token"
	cfg.SoleCoordinator = true
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	go func() { runDone <- a.Run(context.Background()) }()
	sess := recv(t, fc.sessions, "session")
	recv(t, fc.hellos, "hello")
	ctl := recv(t, fc.ctls, "control stream")
	before := dials.Load()
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	st, err := sess.Open(ctx, protocol.KindExec, protocol.ExecParams{Script: "sleep 0.5; echo finished"})
	if err != nil {
		t.Fatal(err)
	}
	e := &execStream{st: st, fr: protocol.NewFrameReader(st)}
	if err := protocol.WriteJSONFrame(ctl, protocol.FrameDrain, &protocol.Drain{RetryAfterMS: 0, Message: "coordinator dev is shutting down"}); err != nil {
		t.Fatal(err)
	}
	sess.GoAway()
	e.finish(t)
	if e.exit == nil || e.exit.ExitCode != 0 || !strings.Contains(e.stdout.String(), "finished") {
		t.Fatalf("exec on the drained session: exit %+v, stdout %q, error %+v", e.exit, e.stdout.String(), e.errInfo)
	}
	sess.Close()
	select {
	case err := <-runDone:
		if err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	case <-time.After(testWait):
		t.Fatal("the agent of a sole coordinator kept running after the drained session closed")
	}
	if n := dials.Load(); n != before {
		t.Errorf("%d dials after the drain, want none", n-before)
	}
}

// A coordinator name with several records: the agent resolves it with
// LookupHost and dials each address in turn, verifying the name.
func TestAgentTriesEveryRecordOfACoordinatorName(t *testing.T) {
	var mu sync.Mutex
	type dial struct{ addr, name string }
	var dials []dial
	seen := make(chan struct{})
	var once sync.Once
	cfg := testConfig(t)
	cfg.Coordinators = []string{"coordinators.test:7443"}
	cfg.LookupHost = func(ctx context.Context, host string) ([]string, error) {
		if host != "coordinators.test" {
			t.Errorf("looked up %q", host)
		}
		return []string{"192.0.2.1", "192.0.2.2", "2001:db8::3"}, nil
	}
	cfg.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
		mu.Lock()
		defer mu.Unlock()
		dials = append(dials, dial{addr, tunnel.ServerNameFrom(ctx)})
		if len(dials) == 3 {
			once.Do(func() { close(seen) })
		}
		return nil, net.ErrClosed
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := runAgent(t, a)
	recv(t, seen, "three dials")
	stop()
	mu.Lock()
	defer mu.Unlock()
	var addrs []string
	for _, d := range dials[:3] {
		addrs = append(addrs, d.addr)
		if d.name != "coordinators.test" {
			t.Errorf("dial of %s with server name %q, want coordinators.test", d.addr, d.name)
		}
	}
	slices.Sort(addrs)
	if want := []string{"192.0.2.1:7443", "192.0.2.2:7443", "[2001:db8::3]:7443"}; !slices.Equal(addrs, want) {
		t.Errorf("first three dials %v, want each record once", addrs)
	}
}

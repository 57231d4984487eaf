//go:build reconnectbench

package coordinator_test

// The reconnect storm benchmark (make bench-reconnect): a fleet of
// simulated agents — real TLS over loopback, real yamux sessions, the
// tunnel package's Redialer and the coordinator's accept path — loses its
// coordinator, which comes back on the same address after a downtime. It
// measures, for each arm, the time from the new coordinator's listen to
// the last agent registered, and the largest share of the fleet registered
// within any one second. The coordinators keep the fleet registry
// (Config.Fleet, as tether coordinator does), and the crash leaves its
// records behind, as kill -9 does (the instance's NATS connection closes
// before its tunnels are cut). The arms run in interleaved rounds in one
// process:
//
//   - baseline: as before pacing: the coordinator handshakes every
//     connection at once (AdmitRate -1), the agents back off exponentially
//     after every failure, refused dials included (RefusedMax -1);
//   - default: the default configuration: the coordinator admits at its
//     measured rate (AdmitRate 0), spreads the agents the registry says it
//     held over admission.StormWindow, and answers the rest with a
//     retry-after; the agents cap their backoff after refused dials
//     (RefusedMax default, 1 s);
//   - fixed (only with RECONNECT_FIXED_RATE set): as default, at that
//     AdmitRate and AdmitBurst 16.
//
// Each agent dials from its own loopback address (127.1.x.y), as agents
// on separate hosts do. Environment: RECONNECT_AGENTS (default 1000),
// RECONNECT_ROUNDS (per arm, default 3), RECONNECT_DOWNTIME (default 2s),
// RECONNECT_FIXED_RATE (adds the fixed arm). It reports each arm's medians
// and the medians of its per-round ratios to the baseline of the same
// round.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/coordinator/internal/natstest"
	"github.com/tetherfleet/tether/internal/admission"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// stormEnv is what every round shares: NATS, the PKI, the address.
type stormEnv struct {
	nc     *nats.Conn
	env    *natstest.Env
	srvTLS *tls.Config
	cliTLS *tls.Config
	addr   string

	// The agents' failed attempts in the current round, by kind, and an
	// example of the others.
	mu       sync.Mutex
	failures map[string]int
	example  string
}

func (e *stormEnv) countFailure(err error) {
	kind := "other"
	var ra *tunnel.RetryAfterError
	var mv *tunnel.MovedError
	switch {
	case err == nil:
		kind = "session ended"
	case errors.As(err, &ra):
		kind = "busy"
	case errors.As(err, &mv):
		kind = "drained"
	case errors.Is(err, syscall.ECONNREFUSED):
		kind = "refused"
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.failures == nil {
		e.failures = map[string]int{}
	}
	e.failures[kind]++
	if kind == "other" && e.example == "" {
		e.example = err.Error()
	}
}

// trackingListener remembers the connections it accepted, so that a
// crash can cut them all at once.
type trackingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

// cut closes every connection, then the listener (whose end starts the
// coordinator's drain, which must find no connection left to drain), then
// any connection accepted meanwhile.
func (l *trackingListener) cut() {
	closeAll := func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, c := range l.conns {
			c.Close()
		}
	}
	closeAll()
	l.Listener.Close()
	closeAll()
}

// runningCoordinator is one coordinator instance on env.addr.
type runningCoordinator struct {
	c      *coordinator.Coordinator
	nc     *nats.Conn // its own, closed first by crash
	reg    *prometheus.Registry
	ln     *trackingListener
	cancel context.CancelFunc
	done   chan error
	start  time.Time // when it listened
}

func (e *stormEnv) startCoordinator(tb testing.TB, admitRate float64, burst int) *runningCoordinator {
	tb.Helper()
	var ln net.Listener
	var err error
	// The old instance's port may take a moment to be free.
	for i := 0; i < 100; i++ {
		if ln, err = net.Listen("tcp", e.addr); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		tb.Fatal(err)
	}
	start := time.Now()
	cfg := coordinator.DefaultConfig()
	cfg.ID = "storm"
	cfg.Token = testToken
	nc := e.env.Coordinator(tb, nats.Name("storm"))
	kv, err := coordinator.OpenFleetBucket(context.Background(), nc, 1, nil)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.NATS = nc
	cfg.Fleet = kv
	cfg.Identify = caller.FromNATS(e.env.Layout.Verifier())
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	cfg.AdmitRate = admitRate
	cfg.AdmitBurst = burst
	cfg.MaxHandshakes = 4096
	cfg.HandshakeTimeout = 10 * time.Second
	c, err := coordinator.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tl := &trackingListener{Listener: ln}
	rc := &runningCoordinator{c: c, nc: nc, reg: reg, ln: tl, cancel: cancel, done: make(chan error, 1), start: start}
	go func() { rc.done <- c.Serve(ctx, tls.NewListener(tl, e.srvTLS)) }()
	return rc
}

// crash cuts every connection at once, as kill -9 does, and stops the
// instance. Its NATS connection goes first, so that, as after kill -9,
// its fleet registry records stay behind.
func (rc *runningCoordinator) crash(tb testing.TB) {
	rc.nc.Close()
	rc.ln.cut()
	rc.cancel()
	select {
	case <-rc.done:
	case <-time.After(time.Minute):
		tb.Fatal("coordinator did not stop")
	}
}

// waitAll waits until n nodes are registered and returns their
// registration times.
func (rc *runningCoordinator) waitAll(tb testing.TB, n int, limit time.Duration) []time.Time {
	tb.Helper()
	deadline := time.Now().Add(limit)
	for {
		nodes := rc.c.Nodes(protocol.Selector{})
		if len(nodes) >= n {
			ts := make([]time.Time, len(nodes))
			for i, ni := range nodes {
				ts[i] = ni.ConnectedAt
			}
			return ts
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%d of %d agents registered within %v", len(nodes), n, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// simAgent keeps a tunnel session like an agent's: Redialer, TLS from its
// own loopback address, the control stream's hello and welcome, yamux
// pings (which keep the coordinator's idle timer fed); it takes drains.
func (e *stormEnv) simAgent(ctx context.Context, id string, localIP net.IP, refusedMax time.Duration) {
	r := &tunnel.Redialer{
		Addrs:      []string{e.addr},
		Seed:       id,
		RefusedMax: refusedMax,
		OnRetry:    func(_ int, err error) { e.countFailure(err) },
		Dial: func(ctx context.Context, addr string) (net.Conn, error) {
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: localIP}}
			raw, err := d.DialContext(dctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			return tunnel.HandshakeTLS(dctx, raw, addr, e.cliTLS)
		},
	}
	r.Run(ctx, func(ctx context.Context, conn net.Conn, addr string) error {
		sess, err := tunnel.Client(conn, tunnel.DefaultConfig())
		if err != nil {
			return err
		}
		defer sess.Close()
		stop := context.AfterFunc(ctx, func() { sess.Close() })
		defer stop()
		hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		ctl, err := sess.Open(hctx, protocol.KindControl, protocol.ControlParams{})
		if err != nil {
			return err
		}
		hello := protocol.Hello{ProtocolVersion: protocol.Version, Token: testToken, NodeID: id,
			AgentVersion: "storm", Instance: id, Features: []string{protocol.FeatureDrain}}
		if err := protocol.WriteJSONFrame(ctl, protocol.FrameHello, &hello); err != nil {
			return err
		}
		fr := protocol.NewFrameReader(ctl)
		f, err := fr.Next()
		if err != nil {
			return err
		}
		if f.Type != protocol.FrameWelcome {
			return fmt.Errorf("got %s, want welcome", f.Type)
		}
		for {
			f, err := fr.Next()
			if err != nil {
				return nil // the session ended
			}
			if f.Type == protocol.FrameDrain {
				var d protocol.Drain
				protocol.DecodeJSON(f.Payload, &d)
				return tunnel.Moved(d.RetryAfter(), d.Coordinator)
			}
		}
	})
}

// stormResult is one round's outcome.
type stormResult struct {
	total    time.Duration // from listen to the last registration
	maxShare float64       // the largest share registered within one second
	failures map[string]int
	example  string
	refusals map[string]float64 // the new coordinator's, by reason
	hist     []int              // registrations by quarter second from the listen
}

// refusals returns the coordinator's non-zero refusal counts by reason
// (auth failures, and "paced").
func refusals(tb testing.TB, reg *prometheus.Registry) map[string]float64 {
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "tether_coordinator_auth_failures_total":
				if v := m.GetCounter().GetValue(); v > 0 {
					out[m.GetLabel()[0].GetValue()] = v
				}
			case "tether_coordinator_handshakes_paced_total":
				if v := m.GetCounter().GetValue(); v > 0 {
					out["paced"] = v
				}
			}
		}
	}
	return out
}

func measure(start time.Time, ts []time.Time) stormResult {
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	best, j := 0, 0
	for i := range ts {
		for ts[i].Sub(ts[j]) >= time.Second {
			j++
		}
		best = max(best, i-j+1)
	}
	// Registrations by quarter second from the listen.
	var hist []int
	for _, t := range ts {
		q := max(int(t.Sub(start)/(250*time.Millisecond)), 0)
		for len(hist) <= q {
			hist = append(hist, 0)
		}
		hist[q]++
	}
	return stormResult{total: ts[len(ts)-1].Sub(start), maxShare: float64(best) / float64(len(ts)), hist: hist}
}

// round starts n agents against a fresh coordinator, crashes it, brings
// it back after downtime and measures the storm.
// rate is the coordinator's AdmitRate; the agents cap their backoff after
// refused dials unless rate is negative (the baseline).
func (e *stormEnv) round(tb testing.TB, n int, rate float64, burst int, downtime time.Duration) stormResult {
	refusedMax := time.Duration(0)
	if rate < 0 {
		refusedMax = -1
	}
	first := e.startCoordinator(tb, rate, burst)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range n {
		ip := net.IPv4(127, 1, byte(i/250), byte(1+i%250))
		if i%250 == 0 && i > 0 {
			time.Sleep(50 * time.Millisecond) // a gentle start: the storm is the restart's
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.simAgent(ctx, fmt.Sprintf("storm-%d-%d", i>>8, i), ip, refusedMax)
		}()
	}
	first.waitAll(tb, n, 5*time.Minute)
	e.mu.Lock()
	e.failures, e.example = map[string]int{}, ""
	e.mu.Unlock()
	first.crash(tb)
	time.Sleep(downtime)
	second := e.startCoordinator(tb, rate, burst)
	ts := second.waitAll(tb, n, 5*time.Minute)
	res := measure(second.start, ts)
	e.mu.Lock()
	res.failures, res.example = e.failures, e.example
	e.mu.Unlock()
	res.refusals = refusals(tb, second.reg)
	cancel()
	wg.Wait()
	second.crash(tb)
	return res
}

func TestReconnectStorm(t *testing.T) {
	n := envInt("RECONNECT_AGENTS", 1000)
	rounds := envInt("RECONNECT_ROUNDS", 3)
	downtime := envDuration("RECONNECT_DOWNTIME", 2*time.Second)
	s := natstest.Run(t)
	pki, err := tunnel.EnsureDevPKI(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	srvTLS, err := tunnel.LoadServerTLS(pki.ServerCert, pki.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	cliTLS, err := tunnel.LoadClientTLS(pki.CACert)
	if err != nil {
		t.Fatal(err)
	}
	cliTLS.ServerName = "127.0.0.1"
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	probe.Close()
	e := &stormEnv{nc: s.Coordinator(t, nats.Name("storm")), env: s, srvTLS: srvTLS, cliTLS: cliTLS, addr: addr}
	slog.SetLogLoggerLevel(slog.LevelError)

	arms := []struct {
		name  string
		rate  float64
		burst int
	}{{"baseline", -1, 0}, {"default", 0, 0}}
	if v, err := strconv.ParseFloat(os.Getenv("RECONNECT_FIXED_RATE"), 64); err == nil && v > 0 {
		arms = append(arms, struct {
			name  string
			rate  float64
			burst int
		}{"fixed", v, 16})
	}
	t.Logf("measured handshake cost %v: the default arm admits at most %.0f handshakes a second (AdmitCPUShare %.2f), a storm over %v",
		admission.HandshakeCost(), admission.RateFor(coordinator.DefaultAdmitCPUShare), coordinator.DefaultAdmitCPUShare, admission.StormWindow)
	results := make([][]stormResult, len(arms))
	for r := range rounds {
		for i, a := range arms {
			res := e.round(t, n, a.rate, a.burst, downtime)
			results[i] = append(results[i], res)
			t.Logf("round %d %-8s: all %d back in %v, largest one-second share %.0f%%; by quarter second %v; agents' failed attempts %v; coordinator's refusals %v; e.g. %s",
				r, a.name, n, res.total.Round(time.Millisecond), 100*res.maxShare, res.hist, res.failures, res.refusals, res.example)
		}
	}
	median := func(v []float64) float64 {
		v = slices.Clone(v)
		slices.Sort(v)
		if len(v)%2 == 0 {
			return (v[len(v)/2-1] + v[len(v)/2]) / 2
		}
		return v[len(v)/2]
	}
	of := func(rs []stormResult, f func(stormResult) float64) []float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		return v
	}
	total := func(r stormResult) float64 { return r.total.Seconds() }
	share := func(r stormResult) float64 { return r.maxShare }
	t.Logf("medians of %d interleaved rounds, %d agents, %v downtime (ratios: median of the per-round ratios to that round's baseline):", rounds, n, downtime)
	for i, a := range arms {
		var rt, rs []float64
		for r := range rounds {
			rt = append(rt, results[i][r].total.Seconds()/results[0][r].total.Seconds())
			rs = append(rs, results[i][r].maxShare/results[0][r].maxShare)
		}
		t.Logf("  %-8s all back in %.2fs, largest one-second share %.0f%%; vs baseline: time %.2f×, share %.2f×",
			a.name, median(of(results[i], total)), 100*median(of(results[i], share)), median(rt), median(rs))
	}
}

package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tetherfleet/tether/internal/admission"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// Coordinator accepts agent tunnels, keeps the registry of connected nodes
// and serves the NATS API that runs jobs on them. Create it with New and run
// it with Serve. Its methods are safe for concurrent use.
type Coordinator struct {
	cfg Config
	log *slog.Logger
	// preauth is log, rate-limited per message: every line a peer can cause
	// before it proved the join token goes there (lograte.go).
	preauth *slog.Logger
	m       *metrics
	reg     prometheus.Registerer
	guard   *panics.Guard // contains per-caller panics (panic.go)
	// pipeToken is cfg.ID as one subject token: the coordinator part of
	// its pipe subjects (natsauth.PipeSubject).
	pipeToken string
	// testHook, set only by tests (export_test.go), is called at named
	// points in the goroutine that reaches them (Coordinator.hook).
	testHook atomic.Pointer[func(point string)]
	// onceBoundForTest, set only by tests (export_test.go), replaces
	// protocol.ExecOnceMaxTimeout as exec.once's whole-job bound when
	// positive, in nanoseconds.
	onceBoundForTest atomic.Int64
	// clientEndForTest, set only by tests (export_test.go), wraps the
	// client's end of every relay (the NATS pipe or the direct stream)
	// once it is open.
	clientEndForTest atomic.Pointer[func(clientEnd) clientEnd]

	// owners are the submitters of detached jobs (authz.go).
	owners jobOwners
	// ssh remembers who opened each SSH connection (ssh.go).
	ssh sshSessions
	// reports are the agents' job exit reports waiting to be settled
	// (jobexit.go).
	reports jobReports

	serving atomic.Bool // Serve is running and not yet draining
	// admit bounds the agent connections in their handshake
	// (internal/admission).
	admit *admission.Controller
	// pacer bounds the rate of TLS handshakes; nil when AdmitRate is
	// negative (admission.go).
	pacer *admission.Pacer
	pm    *pacingMetrics
	// limits are the Limits SetLimits put in force; nil: Config's
	// (limits.go). limitsMu orders concurrent SetLimits calls.
	limits   atomic.Pointer[Limits]
	limitsMu sync.Mutex

	// mu guards the fields below. It is never held while doing I/O.
	mu      sync.Mutex
	started bool            // Serve was called
	closing bool            // drain began: no new sessions or jobs
	life    context.Context // Serve's lifetime; parent of jobs and handshakes
	// requests is the context of request goroutines (enterRequest):
	// life, or less once a drain timed out (stopRequests).
	requests     context.Context
	stopRequests context.CancelFunc
	conns        map[*agentConn]struct{} // every live agent connection, registered or not
	nodes        map[string]*node        // registered sessions by node id
	jobs         runSet                  // running jobs by id and part node (runkey.go)
	// ending are the jobs that replied and whose final record is being
	// written, by id: closed once it is (durable.go).
	ending map[string]chan struct{}
	ends   endBatch       // end records waiting for their write (durable.go)
	connWG sync.WaitGroup // one per agent connection goroutine
	jobWG  sync.WaitGroup // one per running job goroutine
	relays relaySet       // running stream relays (relay.go)
	// direct holds the direct data path's tickets and client sessions
	// (direct.go); it has its own lock.
	direct directState
	// auditQueries counts the audit queries being read (audit.go).
	auditQueries int
	svc          micro.Service // set while serving
	// Sandbox inventories (sandboxes.go): node ids that just registered,
	// and Sync requests.
	nodeUps          chan string
	syncs            chan chan []protocol.SyncProblem
	inventoryRunning atomic.Bool // RunInventory is running
	// fl is the fleet registry state (fleet.go); nil without Config.Fleet.
	// Set by New, never changed after.
	fl *fleetState
	// holders caches job holders' liveness (holders.go).
	holders *holderState
	// ws is the HTTP server of WebSocket dials (websocket.go).
	ws *wsServer
}

// New checks cfg, fills its defaults and returns a Coordinator ready to Serve.
func New(cfg Config) (*Coordinator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if err := cfg.Tunnel.Validate(); err != nil {
		return nil, fmt.Errorf("coordinator config: Tunnel: %w", err)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "coordinator", "coordinator_id", cfg.ID)
	preauth := slog.New(newRateLimitedHandler(log.Handler(), preauthLogInterval, preauthLogBurst))
	if cfg.Tunnel.Logger == nil && cfg.Logger != nil {
		// yamux's messages, at debug level (the bridge adds its own
		// component); a session's peer may not have authenticated yet.
		cfg.Tunnel.Logger = slog.New(newRateLimitedHandler(cfg.Logger.Handler(), preauthLogInterval, preauthLogBurst))
	}
	reg := cfg.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if cfg.Tunnel.Flow == nil {
		// The agents' sessions add up their flow telemetry here
		// (tether_coordinator_tunnel_window_stalls_total and the like).
		cfg.Tunnel.Flow = new(tunnel.FlowCounters)
	}
	m, err := newMetrics(reg, cfg.Tunnel.Flow)
	if err != nil {
		return nil, err
	}
	pacer := newPacer(&cfg)
	pm, err := newPacingMetrics(reg, pacer)
	if err != nil {
		return nil, err
	}
	return &Coordinator{
		pacer:     pacer,
		pm:        pm,
		cfg:       cfg,
		log:       log,
		preauth:   preauth,
		pipeToken: subjectToken(cfg.ID),
		m:         m,
		reg:       reg,
		guard:     panics.New(reg, log.With("component", "coordinator", "coordinator_id", cfg.ID), "coordinator"),
		conns:     map[*agentConn]struct{}{},
		nodes:     map[string]*node{},
		ending:    map[string]chan struct{}{},

		admit:   admission.New(cfg.MaxHandshakes, cfg.MaxHandshakesPerSource),
		nodeUps: make(chan string, 1024),
		syncs:   make(chan chan []protocol.SyncProblem),
		fl:      newFleetState(cfg.Fleet),
		holders: newHolderState(),
		ws:      newWSServer(cfg.HandshakeTimeout, preauth),
	}, nil
}

// Serve accepts agent tunnels on ln and serves the NATS micro service until
// ctx is done, then drains. ln yields raw connections: the caller wraps it
// with tls.NewListener for TLS, and connections of type *tls.Conn get their
// handshake done here, bounded by Config.HandshakeTimeout. Serve closes ln.
//
// Draining, once ctx is done: stop accepting, send GoAway to every session,
// stop the micro service (new requests are refused with 503 unavailable),
// wait up to Config.DrainTimeout for jobs in flight, cancel the rest (each
// node gets Config.CancelGrace to report), close every session and wait for
// every goroutine Serve started. Serve returns nil after a drain caused by
// ctx, or an error if the service could not start or ln failed. It may be
// called once.
func (c *Coordinator) Serve(ctx context.Context, ln net.Listener) error {
	life, kill := context.WithCancel(context.WithoutCancel(ctx))
	defer kill()
	c.mu.Lock()
	if c.started {
		c.mu.Unlock()
		ln.Close()
		return errors.New("coordinator: Serve called twice")
	}
	c.started = true
	c.life = life
	var stopRequests context.CancelFunc
	c.requests, stopRequests = context.WithCancel(life)
	c.stopRequests = stopRequests
	c.mu.Unlock()

	svc, err := c.startService()
	if err != nil {
		ln.Close()
		c.mu.Lock()
		c.closing = true
		c.mu.Unlock()
		return err
	}
	c.mu.Lock()
	c.svc = svc
	c.mu.Unlock()
	// Ready should mean requests reach us: make sure the server has the
	// service's subscriptions. If NATS is down they are replayed on
	// reconnect, so this is not fatal.
	if err := c.cfg.NATS.FlushTimeout(c.cfg.HandshakeTimeout); err != nil {
		c.log.Warn("flush NATS subscriptions", "err", err)
	}
	if err := c.startFleet(life); err != nil {
		svc.Stop()
		ln.Close()
		c.mu.Lock()
		c.closing = true
		c.mu.Unlock()
		return err
	}
	c.startIdentityWatch()
	defer c.stopIdentityWatch()
	c.startReconcile(ctx) // durable.go
	c.serving.Store(true)
	c.log.Info("serving", "tunnel_addr", ln.Addr().String(), "version", c.cfg.Version)

	acceptErr := make(chan error, 1)
	go c.ws.run()
	go func() { acceptErr <- c.acceptLoop(life, ln) }()
	// Accepting and subscribed: READY=1 (notify.go).
	stopNotify := c.startNotify()

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-acceptErr:
		acceptErr <- serveErr // the drain below waits for it again
	}
	c.drain(ln, acceptErr, kill, stopNotify)
	if serveErr != nil {
		return fmt.Errorf("coordinator: accept agents on %s: %w", ln.Addr(), serveErr)
	}
	return nil
}

// drain shuts Serve down in the order documented on Serve; stopNotify
// (startNotify) says STOPPING=1 first.
func (c *Coordinator) drain(ln net.Listener, acceptDone <-chan error, kill context.CancelFunc, stopNotify func(string)) {
	c.serving.Store(false)
	c.mu.Lock()
	c.closing = true
	svc := c.svc
	sessions := make([]*node, 0, len(c.nodes))
	for _, n := range c.nodes {
		sessions = append(sessions, n)
	}
	jobs := c.jobs.len()
	c.mu.Unlock()
	stopNotify(fmt.Sprintf("draining: moving %d agents, %d jobs running", len(sessions), jobs))
	c.log.Info("draining", "agents", len(sessions))

	ln.Close()
	<-acceptDone
	c.ws.close(true)
	c.closeDirect()           // no more tickets; client sessions get GoAway
	c.drainSessions(sessions) // drain hints (staggered), then GoAway
	if err := svc.Stop(); err != nil {
		c.log.Warn("stop micro service", "err", err)
	}

	jobsDone := make(chan struct{})
	go func() {
		c.jobWG.Wait()
		c.relays.wait()
		close(jobsDone)
	}()
	t := time.NewTimer(c.cfg.DrainTimeout)
	select {
	case <-jobsDone:
		t.Stop()
	case <-t.C:
		c.mu.Lock()
		running := c.jobs.all()
		c.mu.Unlock()
		c.log.Warn("cancelling jobs still running after drain timeout", "jobs", len(running), "drain_timeout", c.cfg.DrainTimeout)
		for _, j := range running {
			j.cancel(c.shutdownCause())
		}
		c.stopRequests() // requests still waiting (enterRequest) end too
		c.relays.shutdownAll()
		// Each node reader gives up CancelGrace after its cancel, so this
		// wait is bounded.
		<-jobsDone
	}

	kill() // aborts handshakes in progress
	c.mu.Lock()
	conns := make([]*agentConn, 0, len(c.conns))
	for ac := range c.conns {
		conns = append(conns, ac)
	}
	c.mu.Unlock()
	for _, ac := range conns {
		ac.close()
	}
	c.connWG.Wait()
	c.stopFleet()
	c.log.Info("stopped")
}

// acceptLoop accepts agent connections until ln fails. It returns nil when
// ln was closed by the drain.
func (c *Coordinator) acceptLoop(ctx context.Context, ln net.Listener) error {
	var delay time.Duration
	for {
		conn, err := ln.Accept()
		if err != nil {
			c.mu.Lock()
			closing := c.closing
			c.mu.Unlock()
			if closing {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Out of file descriptors and the like: back off and retry,
			// as net/http does.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			c.preauth.Warn("accept agent connection", "err", err, "retry_in", delay)
			t := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			continue
		}
		delay = 0
		c.startConn(conn)
	}
}

// Ready reports whether the coordinator is serving (not draining) and its
// NATS connection is up.
func (c *Coordinator) Ready() bool {
	return c.serving.Load() && c.cfg.NATS.IsConnected()
}

// Nodes lists the registered nodes whose labels match sel, sorted by id. The
// zero Selector matches every node.
func (c *Coordinator) Nodes(sel protocol.Selector) []protocol.NodeInfo {
	c.mu.Lock()
	ns := make([]*node, 0, len(c.nodes))
	for _, n := range c.nodes {
		if sel.Matches(n.hello.Labels) {
			ns = append(ns, n)
		}
	}
	c.mu.Unlock()
	out := make([]protocol.NodeInfo, 0, len(ns))
	for _, n := range ns {
		out = append(out, n.info(c.cfg.ID))
	}
	slices.SortFunc(out, func(a, b protocol.NodeInfo) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// AdminHandler serves the admin endpoints: GET /metrics (g, or the
// coordinator's own registry when g is nil and the Registerer is also a
// Gatherer), /healthz (200 "ok" while the process is up) and /readyz (200
// "ready" when Ready, else 503).
func (c *Coordinator) AdminHandler(g prometheus.Gatherer) http.Handler {
	if g == nil {
		if rg, ok := c.reg.(prometheus.Gatherer); ok {
			g = rg
		} else {
			g = prometheus.NewRegistry()
		}
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !c.Ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte("not ready\n"))
			return
		}
		w.Write([]byte("ready\n"))
	})
	return mux
}

// info snapshots n for listings, with its session's flow telemetry
// (tunnel.Session.FlowStats).
func (n *node) info(coordinatorID string) protocol.NodeInfo {
	var fs tunnel.FlowStats
	if n.sess != nil {
		fs = n.sess.FlowStats()
	}
	return protocol.NodeInfo{
		ID:            n.id,
		Labels:        maps.Clone(n.hello.Labels),
		Capacity:      n.hello.Capacity,
		AgentVersion:  n.hello.AgentVersion,
		Coordinator:   coordinatorID,
		SessionID:     n.sessionID,
		RemoteAddr:    n.remoteAddr,
		ConnectedAt:   n.connectedAt,
		LastHeartbeat: time.Unix(0, n.lastHeartbeat.Load()).UTC(),
		RTTMicros:     n.rttMicros.Load(),
		RunningExecs:  int(n.runningExecs.Load()),
		Targets:       slices.Clone(n.hello.Targets),
		Transport:     n.transport,

		WindowStalls:       fs.Stalls,
		WindowStallSeconds: fs.StallTime.Seconds(),
		SendQueuedBytes:    fs.QueuedBytes,

		AgentWindowStalls:       n.agentStalls.Load(),
		AgentWindowStallSeconds: float64(n.agentStallMicros.Load()) / 1e6,
		AgentSendQueuedBytes:    n.agentQueued.Load(),
	}
}

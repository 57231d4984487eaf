package agent

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/crypto/ssh"

	"github.com/tetherfleet/tether/agent/localpolicy"
	"github.com/tetherfleet/tether/internal/panics"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// Agent is the node daemon. Create it with New and call Run once.
type Agent struct {
	cfg      Config
	log      *slog.Logger
	m        *metrics
	running  atomic.Int64 // execs in flight, for heartbeats and Config.MaxExecs
	sessions atomic.Int64 // sessions welcomed so far, for Hello.Reconnects
	instance string       // random id of this agent process, for Hello.Instance
	// ident is the node certificate, once loaded or enrolled
	// (identity.go); replaced by renewals.
	ident atomic.Pointer[tunnel.Identity]
	// certRefused is set when a coordinator refused the certificate
	// (protocol.CodeCertRefused): the next dial enrolls, if there is a
	// token (identity.go).
	certRefused atomic.Bool
	// dataWriteTimeout bounds one output frame's wait for the coordinator
	// to make room (dataWriteTimeout in exec.go); tests shorten it.
	dataWriteTimeout time.Duration
	// jobs are the shims of the detached jobs this agent started (jobs.go).
	jobs jobTable
	// lastTransport is the transport that last connected (transport.go).
	lastTransport atomic.Pointer[string]
	// self is this agent process's identity, read once (orphans.go).
	selfOnce sync.Once
	self     procIdentity
	selfErr  error
	// slots is the file recording the process groups of running execs
	// (orphans.go).
	slots groupSlots
	// bootClock says whether CLOCK_BOOTTIME read around a fork names its
	// child's /proc start time (orphans.go, startTicks): 0 not known yet,
	// 1 it does, -1 it does not (every record then reads /proc).
	bootClock atomic.Int32
	// systemdRunPath, set only by tests, replaces the detection of
	// systemd-run for detached jobs' scopes (jobScope).
	systemdRunPath func() string
	// cancels are the operations the coordinator can cancel out of band,
	// per session (cancel.go).
	cancels cancelRegistry
	// targets are the addresses dial streams may reach, by target name
	// (Config.OpenShell, Config.OpenSandbox, Config.Targets); targetNames
	// are their names, sorted, for Hello and error messages.
	targets     map[string]string
	targetNames []string
	dialing     atomic.Int64 // dial streams open, for Config.MaxDials
	// guard contains panics of per-stream goroutines (panic.go).
	guard *panics.Guard
	// testHook, set only by tests, is called at named points of stream
	// handling in the goroutine that reaches them (Agent.hook): "exec" in
	// an exec's handler after its params were checked (v is the
	// *protocol.ExecParams), "exec-output" in an exec's output copier for
	// each chunk read (v is the *protocol.ExecParams), "pty-output" in a pty's output copier before each
	// read of the terminal and "pty-drain" in its handler after each step
	// of its end once the leader exited (v is the *protocol.PTYParams).
	testHook func(point string, v any)
	// lp is the local policy in force; nil means none (localpolicy.go).
	lp atomic.Pointer[localpolicy.Policy]
	// hostKey is the SSH host key, loaded on first use (ssh.go).
	hostKeyMu sync.Mutex
	hostKey   ssh.Signer
	// ctl is the current session's control stream, nil between sessions;
	// ctlMu serialises its writers (writeControl).
	ctl   atomic.Pointer[yamux.Stream]
	ctlMu sync.Mutex
	// reports is the reporter of detached jobs' ends (jobreport.go).
	reports jobReporter
	// drained counts the sessions serve runs in goroutines (every one,
	// so that a drained session can outlive its serve); Run waits for
	// them. live counts the welcomed sessions open (a drained one and
	// its successor overlap), for the connected gauge.
	drained sync.WaitGroup
	live    atomic.Int64
	// notify is what the systemd notifier reports (notify.go).
	notify notifyState
}

// New checks cfg, fills its zero fields with defaults and returns an Agent.
// It does not touch the network or the file system.
func New(cfg Config) (*Agent, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if dir, err := filepath.Abs(cfg.DataDir); err == nil {
		cfg.DataDir = dir
	}
	if cfg.IdentityDir == "" {
		cfg.IdentityDir = filepath.Join(cfg.DataDir, DefaultIdentityDirName)
	}
	if dir, err := filepath.Abs(cfg.IdentityDir); err == nil {
		cfg.IdentityDir = dir
	}
	cfg.SSHHostKeyFile = sshHostKeyFile(&cfg)
	if f, err := filepath.Abs(cfg.SSHHostKeyFile); err == nil {
		cfg.SSHHostKeyFile = f
	}
	if cfg.Tunnel.Flow == nil {
		// The agent's sessions add up their flow telemetry here
		// (tether_agent_tunnel_window_stalls_total and the like).
		cfg.Tunnel.Flow = new(tunnel.FlowCounters)
	}
	log := cfg.Logger.With("component", "agent", "node", cfg.NodeID)
	targets := cfg.targetTable()
	a := &Agent{cfg: cfg, log: log, m: newMetrics(cfg.Registerer, cfg.Tunnel.Flow), dataWriteTimeout: dataWriteTimeout, instance: rand.Text(),
		targets: targets, targetNames: slices.Sorted(maps.Keys(targets)),
		guard: panics.New(cfg.Registerer, log, "agent")}
	a.reports.wake = make(chan struct{}, 1)
	a.notify.wake = make(chan struct{}, 1)
	a.lp.Store(cfg.LocalPolicy)
	return a, nil
}

// Run creates the data directory, finds the detached jobs of earlier agent
// processes again (marking those whose shim died lost), kills the process
// groups that attached execs of a dead agent process left (it waits up to
// Config.KillGrace for them), measures the node's capacity, then keeps a
// session with one of the coordinators until ctx is done, redialing with
// backoff after every failure, rejection or disconnect. It returns nil once
// ctx is done and everything it started has stopped: no goroutine and no
// exec process group is left behind (an exec's background child that
// redirected its output away is the one exception; see the package doc). It
// returns an error if it cannot start, or one wrapping ErrEnrollRefused
// when a coordinator refused its enrollment for good (logged as an error
// first). Run must be called once.
func (a *Agent) Run(ctx context.Context) error {
	if err := os.MkdirAll(a.cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("agent %s: create data dir: %w", a.cfg.NodeID, err)
	}
	// Before serving anything: find the detached jobs a previous agent
	// process started, and end the attached execs it left behind.
	a.recoverJobs()
	a.killOrphanGroups()
	if run := a.jobScope(); run != "" {
		a.log.Info("detached jobs run in transient systemd scopes (tether-job-ID.scope)", "systemd_run", run)
	} else {
		a.log.Info("detached jobs run in their own session (no systemd scopes: systemd is not the init system, the agent is not root, or systemd-run is missing)")
	}
	if err := a.loadIdentity(); err != nil {
		return err
	}
	hostKey, err := a.sshHostKey()
	if err != nil {
		return err
	}
	if a.ident.Load() == nil && a.cfg.Token == "" {
		return fmt.Errorf("agent %s: no node certificate in %s and no join token to enroll with: create one (tether token create) and give it with --token-file",
			a.cfg.NodeID, a.cfg.IdentityDir)
	}
	capacity := a.cfg.Capacity
	if capacity == nil {
		c := DetectCapacity(ctx)
		capacity = &c
	}
	a.log.Info("agent starting", "coordinators", a.cfg.Coordinators, "transports", a.cfg.Transports, "labels", a.cfg.Labels,
		"cpus", capacity.CPUs, "memory_bytes", capacity.MemoryBytes, "gpus", capacity.GPUs,
		"gpu_model", capacity.GPUModel, "version", a.cfg.Version, "data_dir", a.cfg.DataDir, "targets", a.targetNames)

	// Each transport gets the handshake timeout of its own
	// (dialTransports); a test's Dial gets one in all.
	dial := a.dialTransports
	if a.cfg.Dial != nil {
		dial = func(ctx context.Context, addr string) (net.Conn, error) {
			dctx, cancel := context.WithTimeout(ctx, a.cfg.HandshakeTimeout)
			defer cancel()
			return a.cfg.Dial(dctx, addr)
		}
	}
	hello := protocol.Hello{
		ProtocolVersion: protocol.Version,
		NodeID:          a.cfg.NodeID,
		Labels:          a.cfg.Labels,
		Capacity:        *capacity,
		AgentVersion:    a.cfg.Version,
		Targets:         a.targetNames,
		Features:        []string{protocol.FeatureCancelStream, protocol.FeatureSSH, protocol.FeatureCopyRoots, protocol.FeatureDrain, protocol.FeatureJobExit},
		SSHHostKey:      hostKey.PublicKey().Marshal(),
	}
	lookup := a.cfg.LookupHost
	if lookup == nil {
		lookup = net.DefaultResolver.LookupHost
	}
	seed := a.cfg.NodeID
	if a.cfg.CoordinatorsInOrder {
		seed = "" // the Redialer keeps the listed order
	}
	r := &tunnel.Redialer{
		Addrs:      a.cfg.Coordinators,
		Resolve:    lookup,
		Seed:       seed,
		RefusedMax: a.cfg.RefusedMax,
		Dial:       dial,
		Backoff:    a.cfg.Backoff,
		Logger:     a.log,
		OnRetry: func(attempt int, err error) {
			if !errors.Is(err, tunnel.ErrHandover) {
				a.m.reconnects.Inc()
			}
			a.noteRetry(attempt, err)
		},
	}
	// The reporter of detached jobs' ends (jobreport.go) lives as long as
	// the sessions do.
	var reporter sync.WaitGroup
	rctx, stopReporter := context.WithCancel(ctx)
	a.startReporter(rctx, &reporter)
	// The systemd notifier says STOPPING=1 as soon as ctx ends, and is
	// gone before Run returns.
	a.startNotify(ctx, &reporter)
	defer func() {
		stopReporter()
		reporter.Wait()
	}()
	err = r.Run(ctx, func(ctx context.Context, conn net.Conn, addr string) (err error) {
		// A panic in the session's own goroutine (the handshake, the
		// accept loop) ends this session only: the redialer backs off
		// and dials again.
		defer a.guard.Recover("session", func(e *panics.Error) { err = fmt.Errorf("agent %s: session with %s: %w", a.cfg.NodeID, addr, e) })
		h := hello
		h.Targets = a.advertisedTargets()
		h.Reconnects = int(a.sessions.Load())
		h.Instance = a.instance
		if a.needsEnrollment() {
			if !a.cfg.SharedToken {
				conn := conn
				defer conn.Close()
				if err := a.enroll(ctx, conn, addr); err != nil {
					return err
				}
				// The first session presents the new certificate: a
				// hand-over, not a reconnect.
				return tunnel.ErrHandover
			}
			h.Token = a.cfg.Token // deprecated: the coordinator's --allow-shared-token
		}
		return a.serve(ctx, conn, addr, &h)
	})
	a.drained.Wait() // drained sessions end with ctx
	a.closeSlots()   // no exec runs any more
	if errors.Is(err, ErrEnrollRefused) {
		a.log.Info("agent stopped: enrollment refused")
		return err
	}
	a.log.Info("agent stopped")
	return nil
}

// advertisedTargets are the dial targets a hello announces: the
// configured ones (sorted) that the local policy in force allows, all of
// them without one. A target the node would refuse is not announced, so
// the coordinator does not route to it (the facades place sandboxes only
// on nodes whose hello lists their target) nor show it in tether nodes,
// only for every call there to be refused. A policy reloaded during a
// session applies to the next session's hello (reconnecting would drop the
// session's streams); until then the agent refuses such dials itself.
func (a *Agent) advertisedTargets() []string {
	lp := a.localPolicy()
	if lp == nil {
		return a.targetNames
	}
	out := make([]string, 0, len(a.targetNames))
	for _, t := range a.targetNames {
		if lp.AllowDial(t) == nil {
			out = append(out, t)
		}
	}
	return out
}

// shutdownSlack is what a stopping agent's session waits, beyond
// Config.KillGrace, for its streams' final frames (see serve).
const shutdownSlack = 2 * time.Second

// shutdownWait bounds how long a stopping agent keeps a session up for
// its streams to end: the kill grace of their processes and shutdownSlack.
func (a *Agent) shutdownWait() time.Duration { return a.cfg.KillGrace + shutdownSlack }

// errSoleCoordinatorDrained ends Run when the only coordinator
// (Config.SoleCoordinator) drained the session.
var errSoleCoordinatorDrained = errors.New("the agent's only coordinator drained its session")

// serve runs one tunnel session over conn: handshake, heartbeats, streams. It
// returns when the session ends or ctx is done, after every exec of the
// session ended. It returns an error when the session could not be
// established (so the redialer moves on to the next address), nil when an
// established session ended.
//
// When the coordinator drains the session (protocol.Drain), serve returns
// tunnel.Moved at once, so the redialer connects elsewhere after the
// drain's stagger, and the drained session goes on in a goroutine of its
// own (Agent.drained, which Run waits for) until its streams in flight
// ended and the coordinator closed it, or ctx is done.
func (a *Agent) serve(ctx context.Context, conn net.Conn, addr string, hello *protocol.Hello) error {
	transport := a.dialedTransport()
	sess, err := tunnel.Client(conn, a.cfg.Tunnel)
	if err != nil {
		return fmt.Errorf("agent %s: tunnel to %s: %w", a.cfg.NodeID, addr, err)
	}
	// Closing the session when ctx ends unblocks every read and write on
	// it. Once the session is up, an agent stopping gracefully first lets
	// its streams end (each exec is killed and says so in a final frame,
	// serveStreams): the session goroutine closes the session when they
	// did, and this closes it only when they take longer than
	// shutdownWait. Closing it at once lost those frames, and the clients
	// saw "tunnel lost during exec: unexpected EOF".
	closed := make(chan struct{})
	up := make(chan struct{})   // closed once the session goroutine runs
	done := make(chan struct{}) // closed when it returned
	stop := context.AfterFunc(ctx, func() {
		defer close(closed)
		select {
		case <-up:
		default:
			sess.Close() // the handshake: nothing in flight to wait for
			return
		}
		sess.GoAway() // the coordinator opens nothing more
		t := time.NewTimer(a.shutdownWait())
		defer t.Stop()
		select {
		case <-done:
		case <-sess.Done(): // also when the session goroutine's release closed it
		case <-t.C:
			a.log.Warn("streams still open after the shutdown wait: closing the session", "wait", a.shutdownWait(), "streams", sess.NumStreams())
		}
		sess.Close()
	})
	release := func() {
		sess.Close()
		if !stop() {
			<-closed
		}
	}
	ctl, welcome, err := a.handshake(ctx, sess, addr, hello)
	if err != nil {
		release()
		return err
	}
	drains := make(chan protocol.Drain, 1)
	a.drained.Add(1)
	close(up)
	go func() {
		defer a.drained.Done()
		defer close(done)
		defer release()
		defer a.guard.Recover("session", func(*panics.Error) { sess.Close() })
		a.runSession(ctx, sess, ctl, welcome, addr, transport, hello, drains)
	}()
	select {
	case <-done:
		return nil
	case d := <-drains:
		// A draining coordinator gets no more job reports: the next
		// session's coordinator gets them.
		a.setReportSession(nil)
		if a.cfg.SoleCoordinator {
			// No other coordinator to move to: Run waits for the drained
			// session (a.drained), then the agent stops.
			a.log.Info("coordinator is draining this session and there is no other: stopping once its streams finish",
				"coordinator", addr, "message", clip(d.Message, 200))
			return tunnel.Permanent(errSoleCoordinatorDrained)
		}
		a.log.Info("coordinator is draining this session: moving to another coordinator while its streams finish",
			"coordinator", addr, "retry_after", d.RetryAfter(), "message", clip(d.Message, 200))
		return tunnel.Moved(d.RetryAfter(), d.Coordinator)
	}
}

// runSession serves an established session (serve) until it ends or ctx
// is done; a Drain read on its control stream goes to drains.
func (a *Agent) runSession(ctx context.Context, sess *tunnel.Session, ctl *yamux.Stream, welcome *protocol.Welcome, addr, transport string, hello *protocol.Hello, drains chan<- protocol.Drain) {
	interval := welcome.HeartbeatInterval()
	if interval <= 0 {
		interval = defaultHeartbeat
	}
	a.sessions.Add(1)
	a.ctl.Store(ctl)
	defer a.ctl.CompareAndSwap(ctl, nil) // a drained session's successor may hold it
	if welcome.HasFeature(protocol.FeatureJobExit) {
		rs := &reportSession{ctl: ctl, id: welcome.SessionID}
		a.setReportSession(rs)
		defer a.reports.cur.CompareAndSwap(rs, nil)
	}
	defer a.sessionUp(&liveSession{sess: sess, addr: addr, coordinator: welcome.CoordinatorID, transport: transport})()
	log := a.log.With("coordinator", addr, "session", welcome.SessionID)
	log.Info("connected to coordinator", "coordinator_id", welcome.CoordinatorID, "heartbeat_interval", interval, "transport", transport)
	if a.live.Add(1) == 1 {
		a.m.connected.Set(1)
	}
	a.setTransportMetric(transport)
	defer func() {
		if a.live.Add(-1) == 0 {
			a.m.connected.Set(0)
			a.setTransportMetric("")
		}
	}()

	sctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// Also when a panic unwinds the session: nothing of it outlives serve.
	defer func() {
		cancel()
		if ctx.Err() != nil {
			lingerStreams(sess)
		}
		sess.Close()
		wg.Wait()
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer a.guard.Recover("heartbeat", func(*panics.Error) { sess.Close() })
		a.heartbeat(sctx, sess, ctl, interval, log)
	}()
	replies := make(chan protocol.Frame, 1)
	a.startControl(ctl, sess, &wg, replies, drains, log)
	if hello.Token == "" && a.ident.Load() != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer a.guard.Recover("renewal", func(*panics.Error) { sess.Close() })
			a.renewLoop(sctx, ctl, replies, log)
		}()
	}
	a.serveStreams(sctx, sess)
	log.Info("disconnected from coordinator")
}

// streamLinger bounds lingerStreams.
const streamLinger = time.Second

// lingerStreams waits, at most streamLinger, until the coordinator closed
// its side of every stream of sess but the control stream (yamux forgets a
// stream closed both ways), or sess ended. A stopping agent calls it after
// its streams' handlers wrote their final frames and closed their side:
// closing the connection while the coordinator may still send (a window
// update, a ping) can reset it, and a reset can take the final frames
// still unread on the coordinator's side with it.
func lingerStreams(sess *tunnel.Session) {
	deadline := time.Now().Add(streamLinger)
	for sess.NumStreams() > 1 && !sess.IsClosed() && time.Now().Before(deadline) {
		select {
		case <-sess.Done():
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// handshake opens the control stream, sends hello and waits for welcome.
func (a *Agent) handshake(ctx context.Context, sess *tunnel.Session, addr string, hello *protocol.Hello) (*yamux.Stream, *protocol.Welcome, error) {
	hctx, cancel := context.WithTimeout(ctx, a.cfg.HandshakeTimeout)
	defer cancel()
	ctl, err := sess.Open(hctx, protocol.KindControl, protocol.ControlParams{})
	if err != nil {
		return nil, nil, fmt.Errorf("agent %s: open control stream to %s: %w", a.cfg.NodeID, addr, err)
	}
	deadline := time.Now().Add(a.cfg.HandshakeTimeout)
	ctl.SetWriteDeadline(deadline)
	// yamux may report the hello's write as failed when the coordinator
	// already answered and closed (a fast reject), so a failed write still
	// reads what the coordinator said before giving up.
	writeErr := protocol.WriteJSONFrame(ctl, protocol.FrameHello, hello)
	ctl.SetWriteDeadline(time.Time{})
	// Session loss closes the stream, so the read below also ends then.
	ctl.SetReadDeadline(deadline)
	f, err := protocol.NewFrameReader(ctl).Next()
	ctl.SetReadDeadline(time.Time{})
	if err != nil && writeErr != nil {
		return nil, nil, fmt.Errorf("agent %s: send hello to %s: %w", a.cfg.NodeID, addr, writeErr)
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, nil, fmt.Errorf("agent %s: wait for welcome from %s: %w", a.cfg.NodeID, addr, err)
	}
	switch f.Type {
	case protocol.FrameWelcome:
		var w protocol.Welcome
		if err := protocol.DecodeJSON(f.Payload, &w); err != nil {
			return nil, nil, fmt.Errorf("agent %s: welcome from %s: %w", a.cfg.NodeID, addr, err)
		}
		return ctl, &w, nil
	case protocol.FrameReject:
		info := &protocol.ErrorInfo{}
		if err := protocol.DecodeJSON(f.Payload, info); err != nil {
			return nil, nil, fmt.Errorf("agent %s: reject from %s: %w", a.cfg.NodeID, addr, err)
		}
		a.log.Error("coordinator rejected agent: "+info.Error(), "coordinator", addr, "code", info.Code, "message", info.Message)
		if info.Code == protocol.CodeCertRefused {
			a.certRefused.Store(true)
		}
		return nil, nil, fmt.Errorf("agent %s: coordinator %s rejected agent: %w", a.cfg.NodeID, addr, info)
	default:
		return nil, nil, fmt.Errorf("agent %s: handshake with %s: %w: got %s frame, want welcome or reject",
			a.cfg.NodeID, addr, protocol.ErrUnexpected, f.Type)
	}
}

// pinger is what the heartbeat loop needs of a session: *tunnel.Session
// in production, a fake in tests.
type pinger interface {
	Ping() (time.Duration, error)
	Close() error
}

// flowReporter is a pinger whose flow telemetry goes into the heartbeats
// (*tunnel.Session).
type flowReporter interface {
	FlowStats() tunnel.FlowStats
}

// heartbeat writes a Heartbeat on the control stream right away and then
// every interval, until ctx is done. A failed write closes the session.
//
// The RTT is measured by a goroutine the loop owns, pinging once per
// interval: a ping may wait up to the tunnel's write timeout for its answer,
// and heartbeats must not wait behind it (the coordinator would count them
// late). Each heartbeat carries the last RTT measured, and each answered
// ping is a sample of tether_agent_tunnel_rtt_seconds. On return the pinger
// goroutine has returned too; it ends when ctx is done and its ping in
// flight, if any, returned (closing the session ends it).
func (a *Agent) heartbeat(ctx context.Context, sess pinger, ctl *yamux.Stream, interval time.Duration, log *slog.Logger) {
	var rttMicros atomic.Int64
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer a.guard.Recover("pinger", func(*panics.Error) { sess.Close() })
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			// A failed ping keeps the last RTT (keepalives judge
			// liveness).
			if d, err := sess.Ping(); err == nil {
				rttMicros.Store(d.Microseconds())
				a.m.tunnelRTT.Observe(d.Seconds())
			} else if ctx.Err() == nil {
				log.Debug("ping failed", "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()

	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if ctx.Err() != nil {
			return
		}
		hb := protocol.Heartbeat{RTTMicros: rttMicros.Load(), RunningExecs: int(a.running.Load())}
		if fl, ok := sess.(flowReporter); ok {
			fs := fl.FlowStats()
			hb.WindowStalls, hb.WindowStallMicros, hb.SendQueuedBytes = fs.Stalls, fs.StallTime.Microseconds(), fs.QueuedBytes
		}
		if err := a.writeControl(ctl, protocol.FrameHeartbeat, &hb); err != nil {
			if ctx.Err() == nil {
				log.Warn("heartbeat failed; closing session", "err", err)
				sess.Close()
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// serveStreams accepts the streams the coordinator opens on sess and serves
// each by kind, until sess ends or ctx is done. On return every stream
// handler it started has returned (so every exec was killed or ended), and
// the session's gateway clients are closed.
func (a *Agent) serveStreams(ctx context.Context, sess *tunnel.Session) {
	// The handlers' ctx ends with errSessionGone when the session died,
	// and with the parent's cause when the agent is stopping (ctx, the
	// session's context, ends only then while serveStreams runs): an
	// exec tells its coordinator it was ended by a shutdown only in the
	// second case, when the session can still carry the word.
	ctx, cancel := context.WithCancelCause(ctx)
	gw := &gatewayClients{cfg: &a.cfg}
	defer gw.close() // after the handlers, below
	var wg sync.WaitGroup
	defer wg.Wait()
	defer func() {
		if sess.IsClosed() {
			cancel(errSessionGone)
		}
		cancel(nil)
	}()
	// A stream's reads see a plain EOF when the session dies, which an exec
	// cannot tell from a half-close: cancel ctx instead.
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-sess.Done():
			cancel(errSessionGone)
		case <-ctx.Done():
		}
	}()
	for {
		st, err := sess.AcceptRaw(ctx)
		if err != nil {
			if ctx.Err() != nil || sess.IsClosed() || errors.Is(err, io.EOF) {
				return
			}
			a.log.Warn("accept stream", "err", err)
			continue
		}
		// The header is read in the stream's own goroutine, so that one
		// slow opener cannot hold up the others.
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.serveStream(ctx, sess, st, gw)
		}()
	}
}

// errSessionGone is the cause of the stream handlers' ctx when their
// session died (see serveStreams).
var errSessionGone = errors.New("agent: tunnel session gone")

// serveStream reads st's header and serves st by kind. It returns when the
// stream's operation ended, and st is closed. A panic is contained (each
// handler answers its own stream with an internal error; this guard covers
// the header and the dispatch).
func (a *Agent) serveStream(ctx context.Context, sess *tunnel.Session, st *yamux.Stream, gw *gatewayClients) {
	defer a.guard.Recover("stream", func(e *panics.Error) {
		a.refuse(st, protocol.CodeInternal, fmt.Sprintf("node %s: %v", a.cfg.NodeID, e))
	})
	h, err := sess.ReadHeader(st)
	if err != nil {
		// A missing or malformed header: ReadHeader answered and closed st.
		a.log.Warn("rejected stream", "err", err)
		return
	}
	a.m.streams.WithLabelValues(h.Kind.String()).Inc()
	switch h.Kind {
	case protocol.KindExec:
		a.serveExec(ctx, st, h)
	case protocol.KindPTY:
		a.servePTY(ctx, st, h)
	case protocol.KindCopy:
		// An out-of-band cancel aborts the copy as the session's end does.
		cctx, stop := context.WithCancel(ctx)
		defer stop()
		defer a.cancels.add(st, stop)()
		a.serveCopy(cctx, st, h)
	case protocol.KindJob:
		a.serveJob(ctx, st, h)
	case protocol.KindDial:
		a.serveDial(ctx, st, h)
	case protocol.KindInventory:
		a.serveInventory(ctx, st, h, gw)
	case protocol.KindSandbox:
		a.serveSandboxOp(ctx, st, h, gw)
	case protocol.KindSSH:
		a.serveSSH(ctx, st, h)
	default:
		a.log.Warn("unsupported stream kind", "kind", h.Kind.String(), "stream", st.StreamID())
		a.refuse(st, protocol.CodeUnsupported, fmt.Sprintf("node %s does not serve %s streams", a.cfg.NodeID, h.Kind))
	}
}

// secretEnvVars are the environment variables the tether CLI reads secrets
// from: the join token and the gateways' credentials. They are never passed
// on to child processes.
var secretEnvVars = map[string]bool{
	"TETHER_TOKEN":               true,
	"TETHER_OPENSHELL_TOKEN":     true,
	"TETHER_OPENSANDBOX_API_KEY": true,
}

// childEnv returns the environment of a process the agent starts for a
// stream (exec, pty, ...): the agent's own environment without its secrets
// (TETHER_TOKEN, TETHER_OPENSHELL_TOKEN, TETHER_OPENSANDBOX_API_KEY), then
// PWD=dir as a shell would set it, then extra in key order (os/exec keeps
// the last of duplicate keys, so extra overrides everything before it, PWD
// included).
func (a *Agent) childEnv(extra map[string]string, dir string) []string {
	env := os.Environ()
	base := make([]string, 0, len(env)+1+len(extra))
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); secretEnvVars[k] {
			continue
		}
		base = append(base, kv)
	}
	return a.childEnvFrom(base, extra, dir)
}

// childEnvFrom appends PWD (when dir is set) and extra, sorted by name, to
// base.
func (a *Agent) childEnvFrom(base []string, extra map[string]string, dir string) []string {
	out := base
	if dir != "" {
		out = append(out, "PWD="+dir)
	}
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		out = append(out, k+"="+extra[k])
	}
	return out
}

// refuse answers st with an error frame and closes it.
func (a *Agent) refuse(st *yamux.Stream, code, msg string) {
	st.SetWriteDeadline(time.Now().Add(a.cfg.Tunnel.WriteTimeout))
	protocol.WriteJSONFrame(st, protocol.FrameError, &protocol.ErrorInfo{Code: code, Message: msg})
	st.Close()
}

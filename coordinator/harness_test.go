package coordinator_test

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/coordinator/internal/natstest"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// TestMain checks for leaked goroutines, but for the agent's wait on a
// detached job's shim: a detached job outlives its agent by design (issue
// 11), and that goroutine of a fleettest agent ends only with the shim's
// process, which may still be finishing a cancelled job after its test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/tetherfleet/tether/agent.(*Agent).startShim.func1"))
}

// defaultTestTimeout bounds every wait in these tests.
const defaultTestTimeout = 10 * time.Second

const testToken = "s3cret-join-token"

// checkFor polls f until it returns nil, failing the test after d.
func checkFor(tb testing.TB, d time.Duration, f func() error) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("condition not met within %v: %v", d, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func testLogger(tb testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tb.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// harness is a coordinator serving over real TLS on loopback, with an
// embedded nats-server and a separate client connection.
type harness struct {
	t         testing.TB
	c         *coordinator.Coordinator
	reg       *prometheus.Registry
	client    *nats.Conn // a client user's (CLIENTS)
	env       *natstest.Env
	coordNC   *nats.Conn // the coordinator's own (TETHER)
	addr      string
	clientTLS *tls.Config

	cancel   context.CancelFunc
	done     chan error
	stopOnce sync.Once
	stopErr  error
}

// harnessDirect, as a mutate's Config.Direct.Addr, turns on the direct
// data path: the harness sets the listener's address and pin.
const harnessDirect = "harness:direct"

// directRun, set only by TestDirectRelaySemantics while its subtests run
// (one at a time), runs the relay's tests on the direct path: every
// harness and startFleet turns it on, and streamClient and the fleet's
// Client use it or fail.
var directRun bool

// startFleet is fleettest.Start, on the direct path under directRun.
func startFleet(t *testing.T, o fleettest.Options) *fleettest.Fleet {
	t.Helper()
	o.Direct = o.Direct || directRun
	return fleettest.Start(t, o)
}

// streamClient is a client of h for streams: on the direct path only
// under directRun, else as client.New makes it.
func (h *harness) streamClient() *client.Client {
	c := client.New(h.client)
	if directRun {
		c.Direct = client.DirectOnly
	}
	h.t.Cleanup(func() { c.Close() })
	return c
}

// withDirect is a newHarness mutate that turns on the direct path, then
// applies mutate (if not nil).
func withDirect(mutate func(*coordinator.Config)) func(*coordinator.Config) {
	return func(c *coordinator.Config) {
		c.Direct.Addr = harnessDirect
		if mutate != nil {
			mutate(c)
		}
	}
}

func newHarness(t *testing.T, mutate func(*coordinator.Config)) *harness {
	t.Helper()
	return newHarnessNATS(t, nil, mutate)
}

// newHarnessNATS is newHarness with natsOpts (if not nil) adjusting the
// nats-server's options.
func newHarnessNATS(t testing.TB, natsOpts func(*server.Options), mutate func(*coordinator.Config)) *harness {
	t.Helper()
	var s *natstest.Env
	if natsOpts != nil {
		s = natstest.Run(t, natsOpts)
	} else {
		s = natstest.Run(t)
	}
	nc := s.Coordinator(t, nats.Name("coordinator"))
	client := s.Client(t, "client")

	pki, err := tunnel.EnsureDevPKI(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	srvTLS, err := tunnel.LoadServerTLS(pki.ServerCert, pki.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	// As the tether binary does: agents with a node certificate present
	// it (identity_test.go); the others do not.
	srvTLS = tunnel.ServeALPN(srvTLS)
	srvTLS.NextProtos = append(srvTLS.NextProtos, protocol.ALPNClient)
	srvTLS = tunnel.RequestClientCert(srvTLS)
	leaf, err := x509.ParseCertificate(srvTLS.Certificates[0].Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	cliTLS, err := tunnel.LoadClientTLS(pki.CACert)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	cfg := coordinator.DefaultConfig()
	cfg.ID = "coord-test"
	cfg.Token = testToken
	cfg.NATS = nc
	cfg.Identify = caller.FromNATS(s.Layout.Verifier())
	cfg.Version = "dev"
	cfg.Registerer = reg
	cfg.Logger = testLogger(t)
	cfg.HeartbeatInterval = time.Second
	cfg.Tunnel.WriteTimeout = 5 * time.Second
	if mutate != nil {
		mutate(&cfg)
	}
	if directRun {
		cfg.Direct.Addr = harnessDirect
	}
	if cfg.Direct.Addr == harnessDirect {
		cfg.Direct.Addr, cfg.Direct.Pin = ln.Addr().String(), tunnel.CertPin(leaf)
	}
	c, err := coordinator.New(cfg)
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{
		t: t, c: c, reg: reg, client: client, env: s, coordNC: nc,
		addr: ln.Addr().String(), clientTLS: cliTLS,
		cancel: cancel, done: make(chan error, 1),
	}
	go func() { h.done <- c.Serve(ctx, tunnel.NewListener(ln, srvTLS)) }()
	t.Cleanup(func() {
		if err := h.stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	checkFor(t, defaultTestTimeout, func() error {
		if !c.Ready() {
			return errors.New("coordinator not ready")
		}
		return nil
	})
	return h
}

// stop cancels Serve and waits for it to return.
func (h *harness) stop() error {
	h.stopOnce.Do(func() {
		h.cancel()
		select {
		case h.stopErr = <-h.done:
		case <-time.After(defaultTestTimeout):
			h.stopErr = errors.New("Serve did not return after its ctx was cancelled")
		}
	})
	return h.stopErr
}

// metric returns the value of a counter or gauge, picking the series whose
// labels include labelPairs ("k", "v", ...). Missing series fail the test.
func (h *harness) metric(name string, labelPairs ...string) float64 {
	h.t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labelPairs); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labelPairs[i] && lp.GetValue() == labelPairs[i+1] {
						found = true
					}
				}
				if !found {
					continue series
				}
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	h.t.Fatalf("metric %s%v not found", name, labelPairs)
	return 0
}

// execReply is everything a client saw for one exec request.
type execReply struct {
	msgs   []*nats.Msg // output messages and the result message, in arrival order
	result *protocol.ExecResult
	err    *protocol.APIError // set for a micro error reply
	status string             // the micro error code header
	desc   string             // the micro error description header
}

// execRaw sends an exec request and collects replies until the result or an
// error reply. It does not touch tb, so it may run in any goroutine.
func execRaw(nc *nats.Conn, body []byte) (execReply, error) {
	var r execReply
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return r, err
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(protocol.SubjectExec, inbox, body); err != nil {
		return r, err
	}
	for {
		m, err := sub.NextMsg(defaultTestTimeout)
		if err != nil {
			return r, fmt.Errorf("waiting for exec replies after %d messages: %w", len(r.msgs), err)
		}
		if code := m.Header.Get(micro.ErrorCodeHeader); code != "" {
			r.status, r.desc = code, m.Header.Get(micro.ErrorHeader)
			r.err = &protocol.APIError{}
			if err := json.Unmarshal(m.Data, r.err); err != nil {
				return r, fmt.Errorf("decode error body %q: %w", m.Data, err)
			}
			return r, nil
		}
		r.msgs = append(r.msgs, m)
		if m.Header.Get(protocol.HeaderType) == protocol.ReplyResult {
			r.result = &protocol.ExecResult{}
			if err := json.Unmarshal(m.Data, r.result); err != nil {
				return r, fmt.Errorf("decode result %q: %w", m.Data, err)
			}
			return r, nil
		}
	}
}

func mustJSON(tb testing.TB, v any) []byte {
	tb.Helper()
	if b, ok := v.([]byte); ok {
		return b
	}
	if s, ok := v.(string); ok {
		return []byte(s)
	}
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// exec runs an exec request and fails the test on transport errors.
func (h *harness) exec(body any) execReply {
	h.t.Helper()
	r, err := execRaw(h.client, mustJSON(h.t, body))
	if err != nil {
		h.t.Fatal(err)
	}
	return r
}

// execAsync runs an exec request in the background.
func (h *harness) execAsync(body any) <-chan execReply {
	h.t.Helper()
	b := mustJSON(h.t, body)
	ch := make(chan execReply, 1)
	go func() {
		r, err := execRaw(h.client, b)
		if err != nil {
			r.err = &protocol.APIError{Code: "test_transport", Message: err.Error()}
		}
		ch <- r
	}()
	return ch
}

// request sends a plain request and returns the reply.
func (h *harness) request(subject string, body any) *nats.Msg {
	h.t.Helper()
	m, err := h.client.Request(subject, mustJSON(h.t, body), defaultTestTimeout)
	if err != nil {
		h.t.Fatalf("request %s: %v", subject, err)
	}
	return m
}

// concurrency tracks how many fake execs run at once, across agents.
type concurrency struct {
	cur, max atomic.Int32
}

func (c *concurrency) enter() {
	n := c.cur.Add(1)
	for {
		m := c.max.Load()
		if n <= m || c.max.CompareAndSwap(m, n) {
			return
		}
	}
}
func (c *concurrency) leave() { c.cur.Add(-1) }

// agentOpts configures a fake agent.
type agentOpts struct {
	id           string
	token        string            // default testToken; "-" sends none
	labels       map[string]string // default none
	version      int               // protocol version in Hello; default protocol.Version
	noHello      bool              // open the control stream but never send a Hello
	firstKind    protocol.Kind     // kind of the first stream; default control
	heartbeat    bool              // send heartbeats
	silent       bool              // send no yamux pings (a fake agent pings every 200ms by default)
	reconnects   int               // Hello.Reconnects
	instance     string            // Hello.Instance; default "instance-<id>"
	features     []string          // Hello.Features
	agentVersion string            // Hello.AgentVersion; default "fake-1.0"
	localIP      string            // source address to dial from; default any
	clientCert   *tls.Certificate  // TLS client certificate (identity_test.go); default none
	ws           bool              // dial the WebSocket transport instead of raw TLS
	sshHostKey   []byte            // Hello.SSHHostKey
	targets      []string          // Hello.Targets
	window       uint32            // the agent's stream window (tunnel.Config.MaxStreamWindow); default tunnel.DefaultConfig's
	// handler serves exec streams; nil uses scriptedExec.
	handler func(a *fakeAgent, st *yamux.Stream, p protocol.ExecParams)
	// stream, if set, serves the streams of other kinds (it closes st);
	// nil closes them at once.
	stream func(a *fakeAgent, st *yamux.Stream, h protocol.Header)
	// header, if set, sees the header of every stream the coordinator
	// opens, before it is served.
	header func(h protocol.Header)
	gauge  *concurrency // shared concurrency tracking for the "slow" command
}

// fakeAgent speaks the agent side of the tunnel protocol with scripted exec
// behaviour. It is deliberately not the real agent package.
type fakeAgent struct {
	t       testing.TB
	o       agentOpts
	sess    *tunnel.Session
	ctrl    *yamux.Stream
	welcome *protocol.Welcome
	reject  *protocol.ErrorInfo
	execs   atomic.Int32 // exec streams accepted
	openErr error        // opening a non-control first stream failed

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// dialAgent connects a fake agent and waits for its Welcome or Reject (not
// for anything when noHello is set).
func (h *harness) dialAgent(t testing.TB, o agentOpts) *fakeAgent {
	t.Helper()
	if o.token == "" {
		o.token = testToken
	} else if o.token == "-" {
		o.token = ""
	}
	if o.version == 0 {
		o.version = protocol.Version
	}
	if o.firstKind == 0 {
		o.firstKind = protocol.KindControl
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := &fakeAgent{t: t, o: o, ctx: ctx, cancel: cancel}
	t.Cleanup(a.close)

	dctx, dcancel := context.WithTimeout(ctx, defaultTestTimeout)
	defer dcancel()
	var conn net.Conn
	var err error
	for {
		if o.ws {
			cfg := h.clientTLS.Clone()
			if o.clientCert != nil {
				cfg.Certificates = []tls.Certificate{*o.clientCert}
			}
			d := tunnel.WebSocketDialer{TLS: cfg}
			conn, err = d.Dial(dctx, h.addr)
		} else if o.clientCert != nil {
			cfg := h.clientTLS.Clone()
			cfg.Certificates = []tls.Certificate{*o.clientCert}
			conn, err = tunnel.DialTLS(dctx, h.addr, cfg)
		} else {
			conn, err = h.dialTLS(dctx, o.localIP)
		}
		// The pacer may ask a fast redialer to come back (a real agent's
		// Redialer does): do so, as tests are not about pacing here.
		var busy *tunnel.RetryAfterError
		if !errors.As(err, &busy) || dctx.Err() != nil {
			break
		}
		time.Sleep(busy.After)
	}
	if err != nil {
		t.Fatal(err)
	}
	tcfg := tunnel.DefaultConfig()
	if o.window != 0 {
		tcfg.MaxStreamWindow = o.window
	}
	// Pings keep a session that sends no heartbeats alive, as they keep a
	// real agent's (the coordinator drops sessions it hears nothing from).
	tcfg.KeepAliveInterval = 200 * time.Millisecond
	if o.silent {
		tcfg.KeepAliveInterval = 0
	}
	a.sess, err = tunnel.Client(conn, tcfg)
	if err != nil {
		t.Fatal(err)
	}
	var params any = protocol.ControlParams{}
	if o.firstKind == protocol.KindExec {
		params = protocol.ExecParams{Argv: []string{"true"}}
	}
	a.ctrl, err = a.sess.Open(dctx, o.firstKind, params)
	if err != nil {
		if o.firstKind != protocol.KindControl {
			// The coordinator may refuse the stream before Open returns.
			a.openErr = err
			return a
		}
		t.Fatal(err)
	}
	if o.noHello {
		return a
	}
	hello := protocol.Hello{
		ProtocolVersion: o.version,
		Token:           o.token,
		NodeID:          o.id,
		Labels:          o.labels,
		Capacity:        protocol.Capacity{CPUs: 2, MemoryBytes: 1 << 30},
		AgentVersion:    cmp.Or(o.agentVersion, "fake-1.0"),
		Reconnects:      o.reconnects,
		Instance:        instanceOf(o),
		Features:        o.features,
		SSHHostKey:      o.sshHostKey,
		Targets:         o.targets,
	}
	// A write error is not fatal yet: yamux may report "session shutdown"
	// for a frame that was sent when the coordinator answered and closed
	// quickly; the answer is still buffered for reading.
	helloErr := protocol.WriteJSONFrame(a.ctrl, protocol.FrameHello, &hello)
	a.ctrl.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	f, err := protocol.NewFrameReader(a.ctrl).Next()
	a.ctrl.SetReadDeadline(time.Time{})
	if err != nil {
		t.Fatalf("agent %s: read welcome: %v (hello write: %v)", o.id, err, helloErr)
	}
	switch f.Type {
	case protocol.FrameWelcome:
		a.welcome = &protocol.Welcome{}
		if err := json.Unmarshal(f.Payload, a.welcome); err != nil {
			t.Fatal(err)
		}
	case protocol.FrameReject:
		a.reject = &protocol.ErrorInfo{}
		if err := json.Unmarshal(f.Payload, a.reject); err != nil {
			t.Fatal(err)
		}
		return a
	default:
		t.Fatalf("agent %s: got %s frame, want welcome or reject", o.id, f.Type)
	}

	a.wg.Add(1)
	go a.acceptLoop()
	if o.heartbeat {
		a.wg.Add(1)
		go a.heartbeats(a.welcome.HeartbeatInterval() / 2)
	}
	return a
}

// dialTLS dials the coordinator over TLS from localIP (any when empty).
func (h *harness) dialTLS(ctx context.Context, localIP string) (net.Conn, error) {
	if localIP == "" {
		return tunnel.DialTLS(ctx, h.addr, h.clientTLS)
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(localIP)}}
	raw, err := d.DialContext(ctx, "tcp", h.addr)
	if err != nil {
		return nil, err
	}
	cfg := h.clientTLS.Clone()
	cfg.ServerName = "127.0.0.1"
	tc := tls.Client(raw, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, fmt.Errorf("TLS handshake from %s: %w", localIP, err)
	}
	return tc, nil
}

// close ends the agent and waits for its goroutines.
func (a *fakeAgent) close() {
	a.once.Do(func() {
		if a.sess == nil {
			a.cancel()
			return // the dial failed
		}
		// The session first, then the handlers' context: a handler that
		// returns on ctx.Done closes its stream, and that FIN, sent
		// before the session is gone, looked to the coordinator like the
		// agent's clean end of the stream instead of a lost tunnel
		// (TestRelayTunnelLost failed so, once in CI).
		a.sess.Close()
		a.cancel()
		a.wg.Wait()
	})
}

// closedByPeer waits until the coordinator closed the session.
func (a *fakeAgent) waitClosed() {
	a.t.Helper()
	select {
	case <-a.sess.Done():
	case <-time.After(defaultTestTimeout):
		a.t.Fatalf("agent %s: session still open", a.o.id)
	}
}

func (a *fakeAgent) heartbeats(every time.Duration) {
	defer a.wg.Done()
	tk := time.NewTicker(every)
	defer tk.Stop()
	for {
		select {
		case <-a.ctx.Done():
			return
		case <-a.sess.Done():
			return
		case <-tk.C:
		}
		hb := protocol.Heartbeat{RTTMicros: 1234, RunningExecs: int(a.execs.Load()), WindowStalls: 7, WindowStallMicros: 1500, SendQueuedBytes: 12}
		if err := protocol.WriteJSONFrame(a.ctrl, protocol.FrameHeartbeat, &hb); err != nil {
			return
		}
	}
}

func (a *fakeAgent) acceptLoop() {
	defer a.wg.Done()
	for {
		st, h, err := a.sess.Accept(a.ctx)
		if err != nil {
			if st == nil && (errors.Is(err, io.EOF) || a.ctx.Err() != nil || a.sess.IsClosed()) {
				return
			}
			continue
		}
		if a.o.header != nil {
			a.o.header(h)
		}
		if h.Kind != protocol.KindExec {
			if a.o.stream == nil {
				st.Close()
				continue
			}
			a.wg.Add(1)
			go func() {
				defer a.wg.Done()
				a.o.stream(a, st, h)
			}()
			continue
		}
		var p protocol.ExecParams
		if err := h.DecodeParams(&p); err != nil {
			protocol.WriteJSONFrame(st, protocol.FrameError, &protocol.ErrorInfo{Code: protocol.CodeBadRequest, Message: err.Error()})
			st.Close()
			continue
		}
		a.execs.Add(1)
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			defer st.Close()
			if a.o.handler != nil {
				a.o.handler(a, st, p)
				return
			}
			scriptedExec(a, st, p)
		}()
	}
}

// scriptedExec answers an exec stream according to its command (the script,
// or argv[0]):
//
//	echo  stdout "hello\n", stderr "oops\n", stdout "bye\n", exit 3
//	ok    exit 0
//	cat   echo stdin to stdout, exit 0
//	slow  record concurrency, wait 50ms, stdout the node id, exit 0
//	hang  wait for a cancel, then exit 137 (KILL, cancelled)
//	fail  error frame start_failed
func scriptedExec(a *fakeAgent, st *yamux.Stream, p protocol.ExecParams) {
	cmd := p.Script
	if cmd == "" && len(p.Argv) > 0 {
		cmd = p.Argv[0]
	}
	out := func(t protocol.FrameType, s string) { protocol.WriteFrame(st, t, []byte(s)) }
	exit := func(es protocol.ExitStatus) { protocol.WriteJSONFrame(st, protocol.FrameExit, &es) }
	fr := protocol.NewFrameReader(st)
	switch cmd {
	case "echo":
		out(protocol.FrameStdout, "hello\n")
		out(protocol.FrameStderr, "oops\n")
		out(protocol.FrameStdout, "bye\n")
		exit(protocol.ExitStatus{ExitCode: 3, DurationMS: 1.5, StdoutBytes: 10, StderrBytes: 5})
	case "ok":
		exit(protocol.ExitStatus{DurationMS: 1})
	case "cat":
		var n int64
		for {
			f, err := fr.Next()
			if err != nil {
				return
			}
			if f.Type == protocol.FrameStdinClose {
				break
			}
			if f.Type == protocol.FrameStdin {
				n += int64(len(f.Payload))
				protocol.WriteFrame(st, protocol.FrameStdout, f.Payload)
			}
		}
		exit(protocol.ExitStatus{DurationMS: 1, StdoutBytes: n})
	case "slow":
		if a.o.gauge != nil {
			a.o.gauge.enter()
		}
		select { // a workload, not synchronisation
		case <-time.After(50 * time.Millisecond):
		case <-a.ctx.Done():
		}
		if a.o.gauge != nil {
			a.o.gauge.leave() // before the exit frame lets the job finish
		}
		out(protocol.FrameStdout, a.o.id)
		exit(protocol.ExitStatus{DurationMS: 50, StdoutBytes: int64(len(a.o.id))})
	case "hang":
		for {
			f, err := fr.Next()
			if err != nil {
				return
			}
			if f.Type == protocol.FrameCancel {
				exit(protocol.ExitStatus{ExitCode: 137, Signal: "KILL", Cancelled: true, DurationMS: 2})
				return
			}
		}
	case "fail":
		protocol.WriteJSONFrame(st, protocol.FrameError, &protocol.ErrorInfo{Code: protocol.CodeStartFailed, Message: "start bash: no such file"})
	default:
		protocol.WriteJSONFrame(st, protocol.FrameError, &protocol.ErrorInfo{Code: protocol.CodeBadRequest, Message: "fake agent: unknown command " + cmd})
	}
}

func instanceOf(o agentOpts) string {
	if o.instance != "" {
		return o.instance
	}
	return "instance-" + o.id
}

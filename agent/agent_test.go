package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/yamux"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
	"github.com/tetherfleet/tether/tunnel/tunneltest"
)

// fakeCoordinator is the smallest coordinator: TLS listener, tunnel server,
// hello check by token, welcome with a short heartbeat interval, and it
// records what it sees.
type fakeCoordinator struct {
	addr       string
	clientTLS  *tls.Config
	hellos     chan protocol.Hello
	heartbeats chan protocol.Heartbeat
	sessions   chan *tunnel.Session // welcomed sessions
	ctls       chan *yamux.Stream   // their control streams, in the same order
	// features are the Welcome's; jobExits gets the FrameJobExit
	// reports the agents send (decoded as the coordinator does).
	features []string
	jobExits chan protocol.JobStatus

	// window, if set before the agent connects, is the stream window of
	// the coordinator's sessions (tunnel.Config.MaxStreamWindow).
	window atomic.Uint32

	ln     net.Listener
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	open   []*tunnel.Session
}

func startFakeCoordinator(t *testing.T, token string) *fakeCoordinator {
	t.Helper()
	return startFakeCoordinatorFeatures(t, token)
}

// startFakeCoordinatorFeatures is startFakeCoordinator whose Welcome
// lists features.
func startFakeCoordinatorFeatures(t *testing.T, token string, features ...string) *fakeCoordinator {
	t.Helper()
	pki, err := tunnel.EnsureDevPKI(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	srvTLS, err := tunnel.LoadServerTLS(pki.ServerCert, pki.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	clientTLS, err := tunnel.LoadClientTLS(pki.CACert)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", srvTLS)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	fc := &fakeCoordinator{
		addr:       ln.Addr().String(),
		clientTLS:  clientTLS,
		hellos:     make(chan protocol.Hello, 64),
		heartbeats: make(chan protocol.Heartbeat, 256),
		sessions:   make(chan *tunnel.Session, 16),
		ctls:       make(chan *yamux.Stream, 16),
		features:   features,
		jobExits:   make(chan protocol.JobStatus, 256),
		ln:         ln,
		ctx:        ctx,
		cancel:     cancel,
	}
	fc.wg.Add(1)
	go func() {
		defer fc.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fc.wg.Add(1)
			go func() {
				defer fc.wg.Done()
				fc.handle(t, c, token)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		cancel()
		fc.mu.Lock()
		for _, s := range fc.open {
			s.Close()
		}
		fc.mu.Unlock()
		fc.wg.Wait()
	})
	return fc
}

func (fc *fakeCoordinator) handle(t *testing.T, c net.Conn, token string) {
	cfg := tunneltest.Config(t)
	if w := fc.window.Load(); w != 0 {
		cfg.MaxStreamWindow = w
	}
	sess, err := tunnel.Server(c, cfg)
	if err != nil {
		t.Error(err)
		return
	}
	defer sess.Close()
	fc.mu.Lock()
	fc.open = append(fc.open, sess)
	fc.mu.Unlock()
	st, h, err := sess.Accept(fc.ctx)
	if err != nil {
		return
	}
	defer st.Close()
	if h.Kind != protocol.KindControl {
		t.Errorf("first stream is %s, want control", h.Kind)
		return
	}
	fr := protocol.NewFrameReader(st)
	f, err := fr.Next()
	if err != nil || f.Type != protocol.FrameHello {
		t.Errorf("first frame: %v %v, want hello", f.Type, err)
		return
	}
	var hello protocol.Hello
	if err := protocol.DecodeJSON(f.Payload, &hello); err != nil {
		t.Error(err)
		return
	}
	fc.hellos <- hello
	if hello.Token != token {
		protocol.WriteJSONFrame(st, protocol.FrameReject, &protocol.ErrorInfo{Code: protocol.CodeAuth, Message: "join token not accepted"})
		return
	}
	protocol.WriteJSONFrame(st, protocol.FrameWelcome, &protocol.Welcome{
		SessionID: "sess-1", CoordinatorID: "fake", HeartbeatIntervalMS: 50,
		Limits:   protocol.Limits{MaxFrameSize: protocol.MaxFrameSize},
		Features: fc.features,
	})
	fc.sessions <- sess
	fc.ctls <- st
	for {
		f, err := fr.Next()
		if err != nil {
			return
		}
		if f.Type == protocol.FrameJobExit && slices.Contains(fc.features, protocol.FeatureJobExit) {
			st, err := protocol.DecodeJobExit(f.Payload)
			if err != nil {
				t.Errorf("job exit report: %v", err)
				return
			}
			fc.jobExits <- *st
			continue
		}
		if f.Type != protocol.FrameHeartbeat {
			t.Errorf("control frame %s, want heartbeat", f.Type)
			return
		}
		var hb protocol.Heartbeat
		if err := protocol.DecodeJSON(f.Payload, &hb); err != nil {
			t.Error(err)
			return
		}
		select {
		case fc.heartbeats <- hb:
		default:
		}
	}
}

// runAgent runs a.Run until the test ends (or stop is called) and checks
// that it returns nil promptly.
func runAgent(t *testing.T, a *Agent) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- a.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-errc:
				if err != nil {
					t.Errorf("Run returned %v, want nil", err)
				}
			case <-time.After(testWait):
				t.Fatal("Run did not return after its context was cancelled")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(testWait):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func TestRunHelloWelcomeHeartbeatsAndExec(t *testing.T) {
	fc := startFakeCoordinator(t, "good-token")
	reg := prometheus.NewRegistry()
	cfg := testConfig(t)
	cfg.Coordinators = []string{fc.addr}
	cfg.TLS = fc.clientTLS
	cfg.Token = "good-token"
	cfg.Labels = map[string]string{"zone": "a", "gpu": "h100"}
	cfg.Version = "v0.0.1-test"
	cfg.Registerer = reg
	cfg.DataDir = filepath.Join(t.TempDir(), "created", "by", "run")
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := runAgent(t, a)

	hello := recv(t, fc.hellos, "hello")
	want := protocol.Hello{
		ProtocolVersion: protocol.Version,
		Token:           "good-token",
		NodeID:          "node-a",
		Labels:          map[string]string{"zone": "a", "gpu": "h100"},
		Capacity:        protocol.Capacity{CPUs: 4, MemoryBytes: 1 << 30},
		AgentVersion:    "v0.0.1-test",
		Instance:        a.instance,
		Features:        []string{protocol.FeatureCancelStream, protocol.FeatureSSH, protocol.FeatureCopyRoots, protocol.FeatureDrain, protocol.FeatureJobExit},
	}
	hostKey, err := a.sshHostKey()
	if err != nil {
		t.Fatal(err)
	}
	want.SSHHostKey = hostKey.PublicKey().Marshal()
	if fi, err := os.Stat(filepath.Join(cfg.DataDir, DefaultSSHHostKeyName)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("ssh host key file: %v, want mode 0600", err)
	}
	if len(hello.Instance) < 16 {
		t.Errorf("hello instance %q: want a random process id", hello.Instance)
	}
	if diff := cmp.Diff(want, hello); diff != "" {
		t.Errorf("hello (-want +got):\n%s", diff)
	}
	if fi, err := os.Stat(cfg.DataDir); err != nil || !fi.IsDir() {
		t.Errorf("data dir not created: %v", err)
	}
	for i := 0; i < 3; i++ {
		hb := recv(t, fc.heartbeats, "heartbeat")
		if hb.RunningExecs != 0 || hb.RTTMicros < 0 {
			t.Errorf("heartbeat %+v", hb)
		}
	}
	waitFor(t, testWait, "connected gauge", func() bool { return testutil.ToFloat64(a.m.connected) == 1 })
	// Each answered heartbeat ping is an RTT sample; the tunnel's flow
	// counters are exported, nothing queued on an idle tunnel.
	waitFor(t, testWait, "RTT samples", func() bool { return histogramCount(t, reg, "tether_agent_tunnel_rtt_seconds") >= 1 })
	for _, name := range []string{"tether_agent_tunnel_window_stalls_total", "tether_agent_tunnel_window_stall_seconds_total", "tether_agent_tunnel_send_queued_bytes"} {
		if got, err := testutil.GatherAndCount(reg, name); err != nil || got != 1 {
			t.Errorf("%s: %d series, %v; want 1", name, got, err)
		}
	}
	waitFor(t, testWait, "nothing queued", func() bool { return a.cfg.Tunnel.Flow.QueuedBytes() == 0 })

	// An exec through the real TLS tunnel.
	sess := recv(t, fc.sessions, "welcomed session")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := sess.Open(ctx, protocol.KindExec, protocol.ExecParams{Script: "echo hello from $(pwd)"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	st.SetReadDeadline(time.Now().Add(10 * time.Second))
	e := &execStream{st: st, fr: protocol.NewFrameReader(st)}
	e.finish(t)
	if e.exit == nil || e.exit.ExitCode != 0 || e.stdout.String() != "hello from "+cfg.DataDir+"\n" {
		t.Errorf("exec: exit %+v error %v stdout %q", e.exit, e.errInfo, e.stdout.String())
	}
	if got := testutil.ToFloat64(a.m.streams.WithLabelValues("exec")); got != 1 {
		t.Errorf("streams_total{kind=exec} = %v, want 1", got)
	}

	// The coordinator drops the session: the agent comes back by itself.
	sess.Close()
	if h := recv(t, fc.hellos, "hello after the session was dropped"); h.Reconnects != 1 {
		t.Errorf("second hello has reconnects = %d, want 1", h.Reconnects)
	}
	recv(t, fc.sessions, "second session")
	if got := testutil.ToFloat64(a.m.reconnects); got < 1 {
		t.Errorf("reconnects_total = %v, want >= 1", got)
	}

	stop()
	if got := testutil.ToFloat64(a.m.connected); got != 0 {
		t.Errorf("connected gauge = %v after Run returned, want 0", got)
	}
	n, err := testutil.GatherAndCount(reg,
		"tether_agent_tunnel_reconnects_total", "tether_agent_tunnel_connected",
		"tether_agent_streams_total", "tether_agent_execs_running", "tether_agent_exec_duration_seconds")
	if err != nil {
		t.Fatal(err)
	}
	if want := 4 + len(protocol.Kinds()); n != want {
		t.Errorf("gathered %d series, want %d", n, want)
	}
}

func TestRunRejectedTokenRedialsWithBackoff(t *testing.T) {
	fc := startFakeCoordinator(t, "good-token")
	var logs syncBuffer
	cfg := testConfig(t)
	cfg.Coordinators = []string{fc.addr}
	cfg.TLS = fc.clientTLS
	cfg.Token = "wrong-token"
	cfg.Logger = testLogger(t, &logs)
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := runAgent(t, a)
	for i := 0; i < 3; i++ {
		if h := recv(t, fc.hellos, "hello"); h.Token != "wrong-token" {
			t.Errorf("hello token = %q", h.Token)
		}
	}
	waitFor(t, testWait, "reconnects metric", func() bool { return testutil.ToFloat64(a.m.reconnects) >= 2 })
	stop()
	out := logs.String()
	if !strings.Contains(out, "coordinator rejected agent: auth_failed: join token not accepted") {
		t.Errorf("logs do not report the rejection clearly:\n%s", out)
	}
	if strings.Contains(out, "wrong-token") {
		t.Errorf("logs contain the token:\n%s", out)
	}
	if got := testutil.ToFloat64(a.m.connected); got != 0 {
		t.Errorf("connected gauge = %v, want 0", got)
	}
}

func TestRunUnreachableCoordinatorReturnsOnCancel(t *testing.T) {
	var dials sync.WaitGroup
	dials.Add(2)
	var once [2]sync.Once
	var mu sync.Mutex
	seen := map[string]int{}
	cfg := testConfig(t)
	cfg.Coordinators = []string{"10.0.0.1:7443", "10.0.0.2:7443"}
	cfg.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
		mu.Lock()
		seen[addr]++
		mu.Unlock()
		for i, c := range cfg.Coordinators {
			if c == addr {
				once[i].Do(dials.Done)
			}
		}
		return nil, errors.New("connection refused (test)")
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := runAgent(t, a)
	done := make(chan struct{})
	go func() { dials.Wait(); close(done) }()
	recv(t, done, "dials to both coordinators")
	stop()
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr []string // substrings; nil means valid
	}{
		{"valid", func(*Config) {}, nil},
		{"everything missing", func(c *Config) { *c = Config{} }, []string{"Coordinators", "TLS"}},
		{"bad address", func(c *Config) { c.Coordinators = []string{"no-port"} }, []string{`"no-port" is not host:port`}},
		{"bad node id", func(c *Config) { c.NodeID = "-bad id" }, []string{"NodeID"}},
		{"bad label", func(c *Config) { c.Labels = map[string]string{"bad key!": "v"} }, []string{"Labels"}},
		{"negative durations and limits", func(c *Config) {
			c.KillGrace, c.PipeWait, c.HandshakeTimeout, c.OutputLimit = -1, -1, -1, -1
		}, []string{"KillGrace", "PipeWait", "HandshakeTimeout", "OutputLimit"}},
		{"bad tunnel config", func(c *Config) { c.Tunnel = tunnel.Config{MaxStreamWindow: 1} }, []string{"Tunnel"}},
		{"ssh accept env names and prefixes", func(c *Config) { c.SSHAcceptEnv = []string{"GOOD", "PRE_*"} }, nil},
		{"ssh accept env", func(c *Config) { c.SSHAcceptEnv = []string{"GOOD", "PRE_*", "A=B", "*", "X*Y*"} }, []string{`"A=B"`, `"*"`, `"X*Y*"`}},
		{"transports", func(c *Config) { c.Transports = []string{"wss", "tls"} }, nil},
		{"bad transports", func(c *Config) { c.Transports = []string{"wss", "quic", "wss"} }, []string{`"quic" is not a transport`, `"wss" is listed twice`}},
		{"dial hook replaces TLS", func(c *Config) {
			c.TLS = nil
			c.Dial = func(context.Context, string) (net.Conn, error) { return nil, errors.New("x") }
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			tt.mutate(&cfg)
			err := cfg.Validate()
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatal("Validate() = nil, want an error")
			}
			for _, s := range tt.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func TestNewFillsDefaults(t *testing.T) {
	a, err := New(Config{Coordinators: []string{"c:7443"}, Token: "t", TLS: &tls.Config{}})
	if err != nil {
		// The host name may not be a valid node id on odd machines.
		if strings.Contains(err.Error(), "NodeID") {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	c := a.cfg
	host, _ := os.Hostname()
	if c.NodeID != host || c.OutputLimit != 64<<20 || c.KillGrace != 2*time.Second || c.PipeWait != 0 || c.JobRetention != 24*time.Hour ||
		c.Tunnel.KeepAliveInterval != 5*time.Second || c.Tunnel.WriteTimeout != 10*time.Second ||
		c.Logger == nil || c.Registerer == nil || !filepath.IsAbs(c.DataDir) {
		t.Errorf("defaults not filled: %+v", c)
	}
	if d := c.Tunnel.DeadPeerBound(); d <= 0 || d > 15*time.Second {
		t.Errorf("dead peer detection bound %v, want at most 15s", d)
	}
}

func TestDetectCapacity(t *testing.T) {
	// A fake nvidia-smi on PATH.
	dir := t.TempDir()
	script := "#!/bin/sh\necho 'NVIDIA H100 80GB HBM3'\necho 'NVIDIA H100 80GB HBM3'\n"
	if err := os.WriteFile(filepath.Join(dir, "nvidia-smi"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	c := DetectCapacity(context.Background())
	if c.CPUs != runtime.NumCPU() {
		t.Errorf("CPUs = %d, want %d", c.CPUs, runtime.NumCPU())
	}
	if runtime.GOOS == "linux" && c.MemoryBytes == 0 {
		t.Error("MemoryBytes = 0 on Linux")
	}
	if c.GPUs != 2 || c.GPUModel != "NVIDIA H100 80GB HBM3" {
		t.Errorf("GPUs = %d %q, want 2 H100", c.GPUs, c.GPUModel)
	}

	t.Setenv("PATH", t.TempDir()) // no nvidia-smi
	if c := DetectCapacity(context.Background()); c.GPUs != 0 || c.GPUModel != "" {
		t.Errorf("without nvidia-smi: GPUs = %d %q", c.GPUs, c.GPUModel)
	}
}

func TestParseMemTotal(t *testing.T) {
	tests := []struct {
		in   string
		want uint64
	}{
		{"MemTotal:       16318480 kB\nMemFree:  1 kB\n", 16318480 * 1024},
		{"MemFree:  1 kB\nMemTotal: 2048 kB\n", 2048 * 1024},
		{"MemFree:  1 kB\n", 0},
		{"MemTotal: lots kB\n", 0},
		{"", 0},
	}
	for _, tt := range tests {
		if got := parseMemTotal([]byte(tt.in)); got != tt.want {
			t.Errorf("parseMemTotal(%q) = %d, want %d", tt.in, got, tt.want)
		}
	}
}

func TestParseGPUNames(t *testing.T) {
	tests := []struct {
		in        string
		wantN     int
		wantModel string
	}{
		{"", 0, ""},
		{"NVIDIA A100-SXM4-40GB\n", 1, "NVIDIA A100-SXM4-40GB"},
		{"  Tesla T4 \n\nTesla T4\n", 2, "Tesla T4"},
	}
	for _, tt := range tests {
		n, model := parseGPUNames([]byte(tt.in))
		if n != tt.wantN || model != tt.wantModel {
			t.Errorf("parseGPUNames(%q) = %d %q, want %d %q", tt.in, n, model, tt.wantN, tt.wantModel)
		}
	}
}

// TestTransportOrder: transports are tried in the configured order, but the
// one that last connected comes first.
func TestTransportOrder(t *testing.T) {
	a := &Agent{cfg: Config{Transports: []string{TransportTLS, TransportWebSocket}}}
	if got := a.transportOrder(); !slices.Equal(got, []string{"tls", "wss"}) {
		t.Errorf("before any connection: %v", got)
	}
	w := TransportWebSocket
	a.lastTransport.Store(&w)
	if got := a.transportOrder(); !slices.Equal(got, []string{"wss", "tls"}) {
		t.Errorf("after wss connected: %v, want it first", got)
	}
	if got := a.cfg.Transports; !slices.Equal(got, []string{"tls", "wss"}) {
		t.Errorf("the configured order changed: %v", got)
	}
}

// histogramCount is the sample count of the histogram name in reg, 0 if it
// has none.
func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	return 0
}

// The agent's own side of the tunnel: exec output the coordinator reads
// slower than the agent writes it runs out of the coordinator's window;
// the agent counts the stall, and its heartbeats report it.
func TestHeartbeatsCarryFlowStats(t *testing.T) {
	fc := startFakeCoordinator(t, "good-token")
	fc.window.Store(256 << 10) // yamux's least: 2 MB of output is eight windows
	cfg := testConfig(t)
	cfg.Coordinators = []string{fc.addr}
	cfg.TLS = fc.clientTLS
	cfg.Token = "good-token"
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, a)
	sess := recv(t, fc.sessions, "welcomed session")
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	st, err := sess.Open(ctx, protocol.KindExec, protocol.ExecParams{Script: "head -c 2000000 /dev/zero"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// The coordinator reads nothing until the agent stalled.
	waitFor(t, testWait, "the agent's stall", func() bool { return a.cfg.Tunnel.Flow.Stalls() >= 1 })
	st.SetReadDeadline(time.Now().Add(testWait))
	e := &execStream{st: st, fr: protocol.NewFrameReader(st)}
	e.finish(t)
	if e.exit == nil || e.exit.ExitCode != 0 || e.stdout.Len() != 2000000 {
		t.Fatalf("exec: exit %+v error %v, %d bytes of stdout", e.exit, e.errInfo, e.stdout.Len())
	}
	deadline := time.Now().Add(testWait)
	for {
		hb := recv(t, fc.heartbeats, "heartbeat")
		if hb.WindowStalls >= 1 && hb.WindowStallMicros > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no heartbeat reports the stall: last %+v", hb)
		}
	}
}

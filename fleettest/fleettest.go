// Package fleettest runs a whole Tether fleet inside one test process: an
// embedded nats-server with JetStream, a coordinator serving real TLS tunnels
// on loopback, and N real agents dialing it. Tests and benchmarks use it to
// exercise the system end to end without building binaries; the multi-process
// tests live in e2e/.
//
// It is a test helper: only _test.go files and benchmarks import it. It may
// import agent, coordinator and client, which nothing else may combine.
//
// Goroutines: Start runs the coordinator's Serve and each agent's Run in
// goroutines owned by the Fleet; the test's Cleanup stops and waits for all.
package fleettest

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/coordinator/jobstore"
	"github.com/tetherfleet/tether/coordinator/sandboxes"
	"github.com/tetherfleet/tether/natsauth"
	"github.com/tetherfleet/tether/natsauth/natsauthtest"
	"github.com/tetherfleet/tether/policy"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// Options configure a Fleet. The zero value starts one agent named "node-0".
type Options struct {
	// Agents is the number of agents to start; default 1.
	Agents int
	// NodeID names agent i; default "node-<i>".
	NodeID func(i int) string
	// Labels labels agent i; default {"index": "<i>"}.
	Labels func(i int) map[string]string
	// HeartbeatInterval is the coordinator's; default 5 s.
	HeartbeatInterval time.Duration
	// Logger receives every component's logs; nil discards.
	Logger *slog.Logger
	// Processes, when above 1, runs the agents in that many child
	// processes (this test binary re-executed; its TestMain must call
	// RunAgentHostIfChild first) instead of in the test process. A Go
	// process forks one child at a time (syscall.ForkLock), so a fleet
	// whose agents should run commands in parallel, as separate nodes do,
	// needs several processes. Options.Labels and Options.NodeID are not
	// used for child agents: they are node-<i> with label index=<i>.
	Processes int
	// Coordinator, if set, adjusts the coordinator's config before New.
	Coordinator func(c *coordinator.Config)
	// Agent, if set, adjusts agent i's config before New (e.g. its Dial,
	// to put a faulty connection under one agent).
	Agent func(i int, c *agent.Config)
	// Anonymous runs the fleet as every coordinator ran before NATS
	// required credentials: an open NATS server with one account,
	// callers not identified (Identify names every one nats:anonymous),
	// and no policy. Only benchmarks use it, as the baseline that
	// authorization is measured against (BenchmarkExecAuth); Layout,
	// ClientCreds and CredsFile are then nil or empty.
	Anonymous bool
	// Coordinators is the number of coordinators sharing the NATS server
	// and the fleet registry (coordinator.Config.Fleet); default 1, which
	// runs without a fleet registry, as a lone coordinator always did.
	// Agent i dials coordinator i mod Coordinators first and the others
	// after it. Not with Processes or Anonymous; with Gateways, each
	// coordinator runs its own sandbox services (one reaper runs at a
	// time, as the fleet's reaper lock decides).
	Coordinators int
	// Gateways, if set, gives each in-process agent its own fake OpenShell
	// gateway and OpenSandbox server and runs the coordinator's sandbox
	// services (gateways.go). Not with Processes.
	Gateways *GatewayOptions
	// Direct turns on the coordinators' direct data path for client
	// streams (coordinator.Config.Direct) and makes Client use it or fail
	// (client.DirectOnly); without it streams are relayed over NATS.
	Direct bool
	// Jobs opens a job store (coordinator/jobstore) for the coordinator,
	// as tether coordinator does: exec jobs are recorded and
	// tether.v1.job.get and .list answer.
	Jobs bool
}

// Fleet is a running coordinator with its agents.
type Fleet struct {
	NATS *server.Server
	// Layout is the NATS layout the server enforces; ClientCreds the
	// client user NC connects as ("fleettest"), also written to CredsFile
	// (0600) for commands that take --nats-creds.
	Layout      *natsauth.Layout
	ClientCreds *natsauth.Creds
	CredsFile   string
	// NC is a client connection (a CLIENTS user, private inbox prefix),
	// as a submitter's would be; Client wraps it.
	NC          *nats.Conn
	Client      *client.Client
	Coordinator *coordinator.Coordinator
	// TunnelAddr is where agents dial.
	TunnelAddr string
	// With Options.Coordinators above 1: every coordinator (Coordinators[0]
	// is Coordinator), their tunnel addresses, and each one's own NATS
	// connection (TETHER credentials).
	Coordinators []*coordinator.Coordinator
	TunnelAddrs  []string
	CoordNCs     []*nats.Conn
	// Registries are the coordinators' metric registries (with
	// Options.Coordinators above 1).
	Registries []*prometheus.Registry
	stops      []context.CancelFunc
	serveDone  []chan struct{}
	listeners  []*killableListener
	// ClientTLS trusts the fleet's CA; AddAgent uses it.
	ClientTLS *tls.Config

	opts     Options
	token    string
	dataDirs map[string]string // node id → agent data dir (its copy root)
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	mu       sync.Mutex
	agents   int

	// With Options.Gateways: the sandbox services, and the facades'
	// addresses (OpenShell gRPC, OpenSandbox HTTP host:port).
	Sandboxes                          *sandboxes.Service
	OpenShellFacade, OpenSandboxFacade string
	// With Options.Coordinators above 1 too: every coordinator's sandbox
	// services and facade addresses, in coordinator order.
	SandboxServices                      []*sandboxes.Service
	OpenShellFacades, OpenSandboxFacades []string
	gw                                   gatewayFleet
	// hosts are the agent host children (Options.Processes above 1).
	hosts []*os.Process
}

// Start starts a fleet and waits until every agent is registered. Everything
// is stopped when the test ends.
func Start(tb testing.TB, opts Options) *Fleet {
	tb.Helper()
	if opts.Agents == 0 {
		opts.Agents = 1
	}
	if opts.NodeID == nil {
		opts.NodeID = func(i int) string { return fmt.Sprintf("node-%d", i) }
	}
	if opts.Labels == nil {
		opts.Labels = func(i int) map[string]string { return map[string]string{"index": fmt.Sprint(i)} }
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	dir := tb.TempDir()
	var (
		layout      *natsauth.Layout
		ns          *server.Server
		creds       *natsauth.Creds
		nc, coordNC *nats.Conn
		identify    func(nats.Header) (policy.Identity, error)
		credsFile   string
		err         error
	)
	if opts.Anonymous {
		ns, err = server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: filepath.Join(dir, "nats"), NoSigs: true, NoLog: true})
		if err != nil {
			tb.Fatal(err)
		}
		ns.Start()
		if !ns.ReadyForConnections(10 * time.Second) {
			tb.Fatal("anonymous NATS server not ready")
		}
		tb.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
		if nc, err = nats.Connect(ns.ClientURL()); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(nc.Close)
		if coordNC, err = nats.Connect(ns.ClientURL(), nats.InProcessServer(ns)); err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(coordNC.Close)
		identify = func(nats.Header) (policy.Identity, error) {
			return policy.Identity{Kind: policy.KindNATS, Name: "anonymous"}, nil
		}
	} else {
		layout = natsauthtest.NewLayout(tb)
		ns, err = coordinator.StartEmbeddedNATS(coordinator.EmbeddedNATSConfig{
			Host: "127.0.0.1", Port: server.RANDOM_PORT, StoreDir: filepath.Join(dir, "nats"), Auth: layout, Logger: opts.Logger,
		})
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
		creds = natsauthtest.ClientCreds(tb, layout, "fleettest")
		credsFile = natsauthtest.CredsFile(tb, creds)
		nc = natsauthtest.Connect(tb, ns.ClientURL(), creds)
		// The coordinator reaches its embedded server in-process, as
		// `tether coordinator` and `tether dev` do, with coordinator
		// credentials; clients (NC) connect over TCP.
		coordNC = natsauthtest.Connect(tb, ns.ClientURL(), natsauthtest.CoordinatorCreds(tb, layout, "fleettest-coordinator"), nats.InProcessServer(ns))
		identify = caller.FromNATS(layout.Verifier())
	}

	pki, err := tunnel.EnsureDevPKI(filepath.Join(dir, "pki"), nil)
	if err != nil {
		tb.Fatal(err)
	}
	srvTLS, err := tunnel.LoadServerTLS(pki.ServerCert, pki.ServerKey)
	if err != nil {
		tb.Fatal(err)
	}
	cliTLS, err := tunnel.LoadClientTLS(pki.CACert)
	if err != nil {
		tb.Fatal(err)
	}
	cliTLS.ServerName = "localhost"
	// As tether coordinator does: agents offer no ALPN protocol, tether/1,
	// or http/1.1 (the WebSocket transport); clients' direct sessions
	// tether-client/1.
	srvTLS = tunnel.ServeALPN(srvTLS)
	srvTLS.NextProtos = append(srvTLS.NextProtos, protocol.ALPNClient)
	leaf, err := x509.ParseCertificate(srvTLS.Certificates[0].Certificate[0])
	if err != nil {
		tb.Fatal(err)
	}
	pin := tunnel.CertPin(leaf)

	f := &Fleet{NATS: ns, Layout: layout, ClientCreds: creds, CredsFile: credsFile,
		NC: nc, Client: client.New(nc), ClientTLS: cliTLS, opts: opts, token: "fleettest-token"}
	k := max(opts.Coordinators, 1)
	if k > 1 && (opts.Processes > 1 || opts.Anonymous) {
		tb.Fatal("fleettest: Coordinators above 1 does not go with Processes or Anonymous")
	}
	// Every coordinator's own NATS connection, connected (and so closed by
	// the cleanup) before the fleet stops: a coordinator drains with its
	// connection up.
	cncs := []*nats.Conn{coordNC}
	for ci := 1; ci < k; ci++ {
		cncs = append(cncs, natsauthtest.Connect(tb, ns.ClientURL(), natsauthtest.CoordinatorCreds(tb, layout, fmt.Sprintf("fleettest-coordinator-%d", ci)), nats.InProcessServer(ns)))
	}
	if opts.Direct {
		f.Client.Direct = client.DirectOnly
	}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	tb.Cleanup(f.stop)
	for ci := 0; ci < k; ci++ {
		cnc := cncs[ci]
		ccfg := coordinator.DefaultConfig()
		ccfg.ID = "fleettest"
		if k > 1 {
			ccfg.ID = fmt.Sprintf("fleettest-%d", ci)
			kv, err := coordinator.OpenFleetBucket(context.Background(), cnc, 1, nil)
			if err != nil {
				tb.Fatal(err)
			}
			ccfg.Fleet = kv
			reg := prometheus.NewRegistry()
			ccfg.Registerer = reg
			f.Registries = append(f.Registries, reg)
		}
		ccfg.Token = f.token
		ccfg.NATS = cnc
		ccfg.Identify = identify
		ccfg.Logger = opts.Logger
		if k > 1 {
			ccfg.Logger = opts.Logger.With("fleettest_coordinator", ci)
		}
		if opts.HeartbeatInterval > 0 {
			ccfg.HeartbeatInterval = opts.HeartbeatInterval
		}
		if opts.Gateways != nil {
			f.openSandboxes(tb, cnc, &ccfg)
		}
		if opts.Jobs {
			jctx, jcancel := context.WithTimeout(context.Background(), 30*time.Second)
			js, err := jobstore.Open(jctx, jobstore.Config{NATS: cnc, Coordinator: ccfg.ID})
			jcancel()
			if err != nil {
				tb.Fatal(err)
			}
			ccfg.Jobs = js
		}
		tcp, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		if opts.Direct {
			ccfg.Direct = coordinator.DirectConfig{Addr: tcp.Addr().String(), Pin: pin}
		}
		if opts.Coordinator != nil {
			opts.Coordinator(&ccfg)
		}
		c, err := coordinator.New(ccfg)
		if err != nil {
			tcp.Close()
			tb.Fatal(err)
		}
		ln := &killableListener{Listener: tcp, conns: map[net.Conn]struct{}{}}
		f.listeners = append(f.listeners, ln)
		if ci == 0 {
			f.Coordinator = c
			f.TunnelAddr = ln.Addr().String()
		}
		f.Coordinators = append(f.Coordinators, c)
		f.TunnelAddrs = append(f.TunnelAddrs, ln.Addr().String())
		f.CoordNCs = append(f.CoordNCs, cnc)
		cctx, stop := context.WithCancel(f.ctx)
		if opts.Gateways != nil {
			f.attachSandboxes(tb, c, cctx)
		}
		done := make(chan struct{})
		f.stops = append(f.stops, stop)
		f.serveDone = append(f.serveDone, done)
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer close(done)
			if err := c.Serve(cctx, tunnel.NewListener(ln, srvTLS)); err != nil {
				opts.Logger.Error("coordinator stopped", "err", err)
			}
		}()
	}
	if opts.Processes > 1 {
		f.startAgentHosts(tb, pki.CACert)
	} else {
		for i := 0; i < opts.Agents; i++ {
			f.AddAgent(tb)
		}
	}
	f.WaitNodes(tb, opts.Agents)
	return f
}

// agentHostEnv marks a re-executed test binary as an agent host and carries
// its job: "ADDR|TOKEN|CAFILE|FIRST|COUNT".
const agentHostEnv = "TETHER_FLEETTEST_AGENT_HOST"

// RunAgentHostIfChild must be called first in the TestMain of a package that
// starts fleets with Options.Processes > 1. In the test process it returns
// at once. In an agent host child it runs that child's agents until its
// standard input closes, then exits the process.
func RunAgentHostIfChild() {
	spec := os.Getenv(agentHostEnv)
	if spec == "" {
		return
	}
	parts := strings.Split(spec, "|")
	if len(parts) != 5 {
		fmt.Fprintf(os.Stderr, "fleettest: bad %s %q\n", agentHostEnv, spec)
		os.Exit(2)
	}
	first, _ := strconv.Atoi(parts[3])
	count, _ := strconv.Atoi(parts[4])
	cliTLS, err := tunnel.LoadClientTLS(parts[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleettest:", err)
		os.Exit(2)
	}
	cliTLS.ServerName = "localhost"
	dir, err := os.MkdirTemp("", "fleettest-agents")
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleettest:", err)
		os.Exit(2)
	}
	stopProfile := profileOnSignal(first)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := first; i < first+count; i++ {
		cfg := agentConfig(fmt.Sprintf("node-%d", i), map[string]string{"index": fmt.Sprint(i)},
			parts[0], parts[1], cliTLS, filepath.Join(dir, fmt.Sprint(i)), slog.New(slog.DiscardHandler))
		a, err := agent.New(cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fleettest:", err)
			os.Exit(2)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.Run(ctx)
		}()
	}
	fmt.Println("READY")
	io.Copy(io.Discard, os.Stdin)
	cancel()
	wg.Wait()
	stopProfile()
	os.RemoveAll(dir)
	os.Exit(0)
}

// AgentHostProfileEnv, set to a path prefix in the test process's
// environment, makes every agent host child (Options.Processes above 1)
// write a CPU profile of what it does between Fleet.ProfileAgentHosts(true)
// and (false), to PREFIX-<first agent index>.cpu: benchmarks use it to see
// the agents' share of a fan-out without their start-up.
const AgentHostProfileEnv = "TETHER_FLEETTEST_AGENT_CPUPROFILE"

// profileOnSignal, in an agent host child with AgentHostProfileEnv set,
// starts a CPU profile on SIGUSR1 and stops it on SIGUSR2; the returned
// func stops it (if running) and the signal handling.
func profileOnSignal(first int) (stop func()) {
	prefix := os.Getenv(AgentHostProfileEnv)
	if prefix == "" {
		return func() {}
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2)
	done := make(chan struct{})
	var mu sync.Mutex
	var out *os.File
	end := func() {
		mu.Lock()
		defer mu.Unlock()
		if out != nil {
			pprof.StopCPUProfile()
			out.Close()
			out = nil
		}
	}
	go func() {
		defer close(done)
		for sig := range sigs {
			if sig != syscall.SIGUSR1 {
				end()
				continue
			}
			mu.Lock()
			if out == nil {
				f, err := os.Create(fmt.Sprintf("%s-%d.cpu", prefix, first))
				if err == nil && pprof.StartCPUProfile(f) == nil {
					out = f
				} else if f != nil {
					f.Close()
				}
			}
			mu.Unlock()
		}
	}()
	return func() {
		signal.Stop(sigs)
		close(sigs)
		<-done
		end()
	}
}

// ProfileAgentHosts starts (on) or stops the agent host children's CPU
// profiles (AgentHostProfileEnv); without children or the variable it does
// nothing. The signal is asynchronous: the profile may start a moment late.
func (f *Fleet) ProfileAgentHosts(on bool) {
	if os.Getenv(AgentHostProfileEnv) == "" {
		return
	}
	sig := syscall.SIGUSR2
	if on {
		sig = syscall.SIGUSR1
	}
	for _, p := range f.hosts {
		p.Signal(sig)
	}
}

// startAgentHosts runs the fleet's agents in Options.Processes children.
func (f *Fleet) startAgentHosts(tb testing.TB, caFile string) {
	tb.Helper()
	n, p := f.opts.Agents, f.opts.Processes
	for k := 0; k < p; k++ {
		first, count := k*n/p, (k+1)*n/p-k*n/p
		cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|%s|%s|%d|%d", agentHostEnv, f.TunnelAddr, f.token, caFile, first, count))
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			tb.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			tb.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			tb.Fatal(err)
		}
		f.hosts = append(f.hosts, cmd.Process)
		tb.Cleanup(func() {
			stdin.Close() // the child stops its agents and exits
			done := make(chan struct{})
			go func() { cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				cmd.Process.Kill()
				<-done
			}
		})
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil || strings.TrimSpace(line) != "READY" {
			tb.Fatalf("fleettest: agent host %d: %q, %v (does TestMain call fleettest.RunAgentHostIfChild?)", k, line, err)
		}
	}
}

// Dial starts n agents (node-0 … node-<n-1>) against a coordinator that runs
// elsewhere, such as in a child process, and returns without waiting for them
// to register. They stop when the test ends.
func Dial(tb testing.TB, addr string, clientTLS *tls.Config, token string, n int) *Fleet {
	tb.Helper()
	return DialWith(tb, addr, clientTLS, token, n, nil)
}

// DialWith is Dial with each agent's config adjusted by mutate, if not
// nil, as Options.Agent does (e.g. its Transports).
func DialWith(tb testing.TB, addr string, clientTLS *tls.Config, token string, n int, mutate func(i int, c *agent.Config)) *Fleet {
	tb.Helper()
	f := &Fleet{TunnelAddr: addr, ClientTLS: clientTLS, token: token}
	f.opts.Agent = mutate
	f.opts.NodeID = func(i int) string { return fmt.Sprintf("node-%d", i) }
	f.opts.Labels = func(i int) map[string]string { return map[string]string{"index": fmt.Sprint(i)} }
	f.opts.Logger = slog.New(slog.DiscardHandler)
	f.ctx, f.cancel = context.WithCancel(context.Background())
	tb.Cleanup(f.stop)
	for i := 0; i < n; i++ {
		f.AddAgent(tb)
	}
	return f
}

// AddAgent starts one more agent, numbered after the existing ones, and
// returns its node id. It does not wait for registration.
func (f *Fleet) AddAgent(tb testing.TB) string {
	tb.Helper()
	f.mu.Lock()
	i := f.agents
	f.agents++
	f.mu.Unlock()
	cfg := agentConfig(f.opts.NodeID(i), f.opts.Labels(i), f.TunnelAddr, f.token, f.ClientTLS, tb.TempDir(), f.opts.Logger)
	if k := len(f.TunnelAddrs); k > 1 {
		// Its own coordinator first, then the others in turn.
		cfg.CoordinatorsInOrder = true
		cfg.Coordinators = nil
		for d := 0; d < k; d++ {
			cfg.Coordinators = append(cfg.Coordinators, f.TunnelAddrs[(i+d)%k])
		}
	}
	f.mu.Lock()
	if f.dataDirs == nil {
		f.dataDirs = map[string]string{}
	}
	f.dataDirs[cfg.NodeID] = cfg.DataDir
	f.mu.Unlock()
	if f.opts.Gateways != nil {
		f.addGateways(tb, cfg.NodeID, &cfg)
	}
	if f.opts.Agent != nil {
		f.opts.Agent(i, &cfg)
	}
	a, err := agent.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		a.Run(f.ctx)
	}()
	return cfg.NodeID
}

// agentConfig is the configuration of fleet agent i.
func agentConfig(id string, labels map[string]string, addr, token string, tlsCfg *tls.Config, dataDir string, log *slog.Logger) agent.Config {
	cfg := agent.DefaultConfig()
	cfg.NodeID = id
	cfg.Labels = labels
	cfg.Coordinators = []string{addr}
	cfg.Token = token
	// The fleet's coordinator admits agents by the shared token
	// (deprecated); per-node identity has its own tests
	// (coordinator/identity_test.go).
	cfg.SharedToken = true
	cfg.TLS = tlsCfg
	cfg.DataDir = dataDir
	cfg.Version = "fleettest"
	cfg.Logger = log
	// Capacity detection looks for nvidia-smi; a thousand agents share one
	// machine, so report a fixed capacity.
	capy := protocol.Capacity{CPUs: 2}
	cfg.Capacity = &capy
	cfg.Backoff = tunnel.Backoff{Base: 50 * time.Millisecond, Max: time.Second}
	return cfg
}

// DataDir returns the data directory of the agent with node id, which is
// also its only copy root; "" for an unknown node.
func (f *Fleet) DataDir(node string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.dataDirs[node]
}

// StopCoordinator drains coordinator k (Options.Coordinators) and waits
// until its Serve returned; its agents move to the others.
func (f *Fleet) StopCoordinator(k int) {
	f.stops[k]()
	<-f.serveDone[k]
}

// KillCoordinator cuts coordinator k off as kill -9 would, seen from
// outside: its NATS connection closes (its subscriptions vanish from the
// server at once) and so do its tunnel listener and every connection it
// accepted (its agents redial the others). Its goroutines go on inside
// the test process, unheard, until the fleet stops.
func (f *Fleet) KillCoordinator(k int) {
	f.CoordNCs[k].Close()
	f.listeners[k].kill()
}

// killableListener tracks the connections it accepted so that kill can
// close them all with the listener.
type killableListener struct {
	net.Listener
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	killed bool
}

func (l *killableListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.killed {
		c.Close()
		return nil, net.ErrClosed
	}
	l.conns[c] = struct{}{}
	return c, nil
}

func (l *killableListener) kill() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.killed = true
	l.Listener.Close()
	for c := range l.conns {
		c.Close()
	}
}

// WaitNodes waits until at least n nodes are connected: to the coordinator,
// or with Options.Coordinators above 1, in the fleet registry as every
// running coordinator sees it.
func (f *Fleet) WaitNodes(tb testing.TB, n int) {
	tb.Helper()
	deadline := time.Now().Add(time.Duration(30+n/20) * time.Second)
	for {
		got := len(f.Coordinator.Nodes(protocol.Selector{}))
		if len(f.Coordinators) > 1 {
			got = n
			for k, c := range f.Coordinators {
				select {
				case <-f.serveDone[k]:
					continue
				default:
				}
				got = min(got, len(c.FleetNodes(protocol.Selector{})))
			}
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("fleettest: %d of %d nodes connected before the deadline", got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (f *Fleet) stop() {
	if f.Client != nil { // Dial's fleets of agents only have none
		f.Client.Close()
	}
	f.cancel()
	f.wg.Wait()
}

// Forwarded returns how many requests the fleet's coordinators forwarded
// to another coordinator (tether_coordinator_forwarded_requests_total,
// summed), with Options.Coordinators above 1.
func (f *Fleet) Forwarded(tb testing.TB) float64 {
	tb.Helper()
	return f.CounterSum(tb, "tether_coordinator_forwarded_requests_total")
}

// CounterSum returns counter name summed over its label values and over
// the fleet's coordinators, with Options.Coordinators above 1.
func (f *Fleet) CounterSum(tb testing.TB, name string) float64 {
	tb.Helper()
	var sum float64
	for _, reg := range f.Registries {
		mfs, err := reg.Gather()
		if err != nil {
			tb.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				for _, m := range mf.GetMetric() {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

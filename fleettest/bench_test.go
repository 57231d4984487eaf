package fleettest_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/client"
	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/coordinator/caller"
	"github.com/tetherfleet/tether/fleettest"
	"github.com/tetherfleet/tether/natsauth"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// The system benchmarks of issue 2, each reported against a baseline measured
// in the same run:
//
//	(a) BenchmarkExecRoundTrip: NATS request → coordinator → tunnel → agent
//	    runs /bin/true as argv → final reply, against os/exec running
//	    /bin/true locally. Reports p50/p99 in µs besides ns/op.
//	(c) BenchmarkIdleAgentMemory: coordinator RSS per idle connected agent
//	    with 1,000 agents, against a process holding 1,000 bare TLS
//	    connections. The coordinator runs in a child process (this test
//	    binary re-executed) so that its RSS is its own.
//
// Run: go test -run '^$' -bench . -benchtime 2000x ./fleettest

func TestMain(m *testing.M) {
	fleettest.RunAgentHostIfChild()
	switch os.Getenv("TETHER_FLEETTEST_CHILD") {
	case "coordinator":
		childCoordinator()
		return
	case "tls":
		childTLSServer()
		return
	case "forks":
		childForks()
		return
	}
	os.Exit(m.Run())
}

// BenchmarkExecRoundTrip times one exec of /bin/true through a fleet of 1
// and of 1,000 agents, and in the same iterations (order alternating) its
// floor: a NATS request/reply on a bare embedded server, a yamux stream
// opened, echoed one byte and closed over loopback TCP, and an os/exec of
// /bin/true, one after the other. x-floor is the median of the
// per-iteration ratios exec/floor (issue 12's target: <= 1.15; p99 <= 2 ms).
func BenchmarkExecRoundTrip(b *testing.B) {
	b.Run("baseline=local-os-exec", func(b *testing.B) {
		lat := make([]time.Duration, 0, b.N)
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			if err := exec.Command("/bin/true").Run(); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(t0))
		}
		reportPercentiles(b, lat)
	})
	for _, agents := range []int{1, 1000} {
		b.Run(fmt.Sprintf("tether-agents=%d", agents), func(b *testing.B) {
			if agents > 1 && testing.Short() {
				b.Skip("1000 agents in -short mode")
			}
			f := fleettest.Start(b, fleettest.Options{Agents: agents})
			floor := newExecFloor(b)
			ctx := context.Background()
			req := protocol.ExecRequest{Target: protocol.Target{Node: "node-0"}, Argv: []string{"/bin/true"}}
			lat := make([]time.Duration, 0, b.N)
			var floors, ratios []float64
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				var fl time.Duration
				if i%2 == 1 {
					fl = floor.once(b)
				}
				r := req
				t0 := time.Now()
				res, err := f.Client.Exec(ctx, &r, nil)
				if err != nil {
					b.Fatal(err)
				}
				d := time.Since(t0)
				lat = append(lat, d)
				if len(res.Results) != 1 || !res.Results[0].OK() {
					b.Fatalf("result %+v", res.Results)
				}
				if i%2 == 0 {
					fl = floor.once(b)
				}
				floors = append(floors, float64(fl.Microseconds()))
				ratios = append(ratios, float64(d)/float64(fl))
			}
			b.StopTimer()
			reportPercentiles(b, lat)
			slices.Sort(floors)
			slices.Sort(ratios)
			b.ReportMetric(floors[len(floors)/2], "floor-p50-µs")
			b.ReportMetric(ratios[len(ratios)/2], "x-floor")
		})
	}
}

// execFloor is what an exec round trip cannot do without: a bare NATS
// server with a responder, and a yamux session over loopback TCP whose
// server side echoes each stream's byte.
type execFloor struct {
	nc   *nats.Conn
	sess *yamux.Session
}

func newExecFloor(b *testing.B) *execFloor {
	b.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true})
	if err != nil {
		b.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		b.Fatal("floor NATS server not ready")
	}
	b.Cleanup(ns.Shutdown)
	resp, err := nats.Connect(ns.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(resp.Close)
	if _, err := resp.Subscribe("floor", func(m *nats.Msg) { m.Respond(m.Data) }); err != nil {
		b.Fatal(err)
	}
	resp.Flush()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		srv, err := yamux.Server(c, nil)
		if err != nil {
			return
		}
		for {
			st, err := srv.Accept()
			if err != nil {
				return
			}
			go func() {
				defer st.Close()
				var one [1]byte
				if _, err := io.ReadFull(st, one[:]); err == nil {
					st.Write(one[:])
				}
			}()
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	sess, err := yamux.Client(c, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { sess.Close() })
	return &execFloor{nc: nc, sess: sess}
}

// once is one floor: request/reply, then stream open/echo, then os/exec.
func (f *execFloor) once(b *testing.B) time.Duration {
	t0 := time.Now()
	if _, err := f.nc.Request("floor", []byte("x"), 10*time.Second); err != nil {
		b.Fatalf("floor request: %v", err)
	}
	st, err := f.sess.OpenStream()
	if err != nil {
		b.Fatalf("floor stream: %v", err)
	}
	var one [1]byte
	if _, err := st.Write([]byte("x")); err != nil {
		b.Fatalf("floor stream write: %v", err)
	}
	if _, err := io.ReadFull(st, one[:]); err != nil {
		b.Fatalf("floor stream read: %v", err)
	}
	st.Close()
	if err := exec.Command("/bin/true").Run(); err != nil {
		b.Fatalf("floor exec: %v", err)
	}
	return time.Since(t0)
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	p := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) }
	b.ReportMetric(p(0.50), "p50-µs")
	b.ReportMetric(p(0.99), "p99-µs")
}

const idleAgents = 1000

// BenchmarkIdleAgentMemory measures what an idle agent costs a coordinator
// (a child process: its RSS is its own) against a bare TLS connection held
// by a server with one goroutine blocked in Read. Each tether sub-benchmark
// runs TETHER_IDLEBENCH_ROUNDS rounds (default 1), each measuring a fresh
// bare-TLS child and then a fresh coordinator child, and reports the
// medians over the rounds, x-bare-tls being the median of the per-round
// ratios of RSS per agent (issue 12's target: <= 1.2).
func BenchmarkIdleAgentMemory(b *testing.B) {
	if testing.Short() {
		b.Skip("starts 1000 agents")
	}
	b.Run("baseline=bare-tls", func(b *testing.B) {
		reportPerConn(b, []perConn{measureBareTLS(b)}, nil)
	})
	rounds := 1
	if v, err := strconv.Atoi(os.Getenv("TETHER_IDLEBENCH_ROUNDS")); err == nil && v > 0 {
		rounds = v
	}
	for _, transport := range []string{agent.TransportTLS, agent.TransportWebSocket} {
		name := "tether-coordinator"
		if transport != agent.TransportTLS {
			name += "-" + transport
		}
		b.Run(name, func(b *testing.B) {
			// One sub-benchmark per round, so that its children and
			// agents are gone before the next round starts.
			var got, bare []perConn
			for r := range rounds {
				b.Run(fmt.Sprintf("round=%d", r+1), func(b *testing.B) {
					bare = append(bare, measureBareTLS(b))
					got = append(got, measureIdleCoordinator(b, transport))
					reportPerConn(b, got[r:], bare[r:])
				})
			}
			if len(got) == rounds {
				b.Run("median", func(b *testing.B) { reportPerConn(b, got, bare) })
			}
		})
	}
}

// measureBareTLS measures a bare TLS server child holding idleAgents
// connections.
func measureBareTLS(b *testing.B) perConn {
	child := startChild(b, "tls")
	base := child.rss(b)
	conns := make([]net.Conn, 0, idleAgents)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < idleAgents; i++ {
		c, err := tunnel.DialTLS(context.Background(), child.addr, child.tls)
		if err != nil {
			b.Fatal(err)
		}
		c.Write([]byte("x")) // make the server finish its side and block in Read
		conns = append(conns, c)
	}
	child.waitCount(b, idleAgents)
	// As for the coordinator: measured a moment after the last one.
	time.Sleep(2 * time.Second)
	return newPerConn(base, child.rss(b))
}

// measureIdleCoordinator measures a coordinator child's memory per idle
// agent whose tunnel uses transport.
func measureIdleCoordinator(b *testing.B, transport string) perConn {
	child := startChild(b, "coordinator")
	creds, err := natsauth.ReadCreds(child.credsFile)
	if err != nil {
		b.Fatal(err)
	}
	nc, err := nats.Connect(child.natsURL, creds.Options()...)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	base := child.rss(b)
	fleettest.DialWith(b, child.addr, child.tls, child.token, idleAgents, func(_ int, c *agent.Config) {
		c.Transports = []string{transport}
	})
	cl := client.New(nc)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		nodes, err := cl.Nodes(context.Background(), "")
		if err == nil && len(nodes) == idleAgents {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("only %d agents registered: %v", len(nodes), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Let every agent finish its first heartbeat, then measure.
	time.Sleep(2 * time.Second)
	return newPerConn(base, child.rss(b))
}

// perConn is what each of the idleAgents connections added to a child:
// RSS, goroutines, heap and stacks in use, and the part of that heap that
// holds no object (KiB, count, KiB, KiB, KiB), and the child's RSS at the
// end (KiB).
type perConn struct{ rss, goroutines, heap, stack, unused, total float64 }

func newPerConn(before, after usage) perConn {
	return perConn{
		rss:        float64(after.rss-before.rss) / idleAgents,
		goroutines: float64(after.goroutines-before.goroutines) / idleAgents,
		heap:       float64(after.heap-before.heap) / 1024 / idleAgents,
		stack:      float64(after.stack-before.stack) / 1024 / idleAgents,
		unused:     float64(after.unused-before.unused) / 1024 / idleAgents,
		total:      float64(after.rss),
	}
}

// reportPerConn reports the medians of got over its rounds, and with bare
// (measured in the same rounds) the median of the per-round ratios of RSS
// per connection as x-bare-tls.
func reportPerConn(b *testing.B, got, bare []perConn) {
	med := func(f func(perConn) float64, ps []perConn) float64 {
		v := make([]float64, len(ps))
		for i, p := range ps {
			v[i] = f(p)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	b.ReportMetric(med(func(p perConn) float64 { return p.rss }, got), "KiB/agent")
	b.ReportMetric(med(func(p perConn) float64 { return p.goroutines }, got), "goroutines/agent")
	b.ReportMetric(med(func(p perConn) float64 { return p.heap }, got), "heap-KiB/agent")
	b.ReportMetric(med(func(p perConn) float64 { return p.stack }, got), "stack-KiB/agent")
	b.ReportMetric(med(func(p perConn) float64 { return p.unused }, got), "heap-unused-KiB/agent")
	b.ReportMetric(med(func(p perConn) float64 { return p.total }, got), "RSS-KiB")
	if len(bare) == len(got) && len(bare) > 0 {
		ratios := make([]perConn, len(got))
		for i := range got {
			ratios[i].rss = got[i].rss / bare[i].rss
		}
		b.ReportMetric(med(func(p perConn) float64 { return p.rss }, ratios), "x-bare-tls")
		b.ReportMetric(med(func(p perConn) float64 { return p.rss }, bare), "bare-KiB/conn")
	}
	for i := 0; i < b.N; i++ {
	}
}

type child struct {
	pid                  int
	addr, natsURL, token string
	credsFile            string // a client user's, for a coordinator child
	tls                  *tls.Config
	lines                *bufio.Scanner
	stdin                io.Writer // commands for serveChildCommands
}

// startChild re-executes the test binary as a coordinator or a bare TLS
// server, in a fresh data dir, and reads its READY line.
func startChild(b *testing.B, role string) *child {
	b.Helper()
	dir := b.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "TETHER_FLEETTEST_CHILD="+role, "TETHER_FLEETTEST_DIR="+dir, "GOMAXPROCS=2")
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close() // the child exits when stdin closes
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() {
		b.Fatalf("child %s printed nothing", role)
	}
	f := strings.Fields(sc.Text())
	if len(f) < 4 || f[0] != "READY" {
		b.Fatalf("child %s: %q", role, sc.Text())
	}
	cliTLS, err := tunnel.LoadClientTLS(filepath.Join(dir, "pki", tunnel.CAFile))
	if err != nil {
		b.Fatal(err)
	}
	cliTLS.ServerName = "localhost"
	c := &child{pid: cmd.Process.Pid, addr: f[1], natsURL: f[2], token: f[3], tls: cliTLS, lines: sc, stdin: stdin}
	if len(f) > 4 {
		c.credsFile = f[4]
	}
	return c
}

// waitCount waits for the TLS child to report n established connections.
func (c *child) waitCount(b *testing.B, n int) {
	for c.lines.Scan() {
		if v, _ := strconv.Atoi(c.lines.Text()); v >= n {
			return
		}
	}
	b.Fatal("TLS child stopped before reaching the connection count")
}

// usage is what a child holds: its VmRSS in KiB, its goroutines, the
// bytes of its heap and goroutine stacks in use, and of the heap in use
// that holds no object (free slots of spans in use: fragmentation).
type usage struct{ rss, goroutines, heap, stack, unused int64 }

// rss asks the child to collect and scavenge, then reads its VmRSS and
// what the child reported of its goroutines, heap and stacks.
func (c *child) rss(b *testing.B) usage {
	b.Helper()
	fmt.Fprintln(c.stdin, "gc")
	for c.lines.Scan() {
		f := strings.Fields(c.lines.Text())
		if len(f) == 5 && f[0] == "gc-done" {
			u := usage{rss: rssKiB(b, c.pid)}
			u.goroutines, _ = strconv.ParseInt(f[1], 10, 64)
			u.heap, _ = strconv.ParseInt(f[2], 10, 64)
			u.stack, _ = strconv.ParseInt(f[3], 10, 64)
			u.unused, _ = strconv.ParseInt(f[4], 10, 64)
			return u
		}
	}
	b.Fatal("child stopped before answering gc")
	return usage{}
}

func rssKiB(b *testing.B, pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	b.Fatal("no VmRSS")
	return 0
}

// serveChildCommands reads the parent's commands on stdin until EOF: "gc"
// collects garbage and returns freed memory to the OS, then answers
// "gc-done", so that both children are measured at their retained size, not
// at wherever their garbage collector happened to be (settle).
func serveChildCommands() {
	sc := bufio.NewScanner(os.Stdin)
	for n := 0; sc.Scan(); {
		if sc.Text() == "gc" {
			n++
			var ms runtime.MemStats
			settle(&ms)
			if path := os.Getenv("TETHER_FLEETTEST_HEAPPROFILE"); path != "" {
				// For finding what an idle agent costs: the heap as of
				// this point, at each "gc" FILE.ROLE.1, FILE.ROLE.2, ...
				// (ROLE coordinator or tls; the first is the child
				// before any connection: pprof -base), and the
				// goroutines beside it. A later round writes over an
				// earlier one's.
				name := fmt.Sprintf("%s.%s.%d", path, os.Getenv("TETHER_FLEETTEST_CHILD"), n)
				if f, err := os.Create(name); err == nil {
					pprof.Lookup("heap").WriteTo(f, 0)
					f.Close()
				}
				if f, err := os.Create(name + ".goroutines"); err == nil {
					pprof.Lookup("goroutine").WriteTo(f, 1)
					f.Close()
				}
			}
			unused := []metrics.Sample{{Name: "/memory/classes/heap/unused:bytes"}}
			metrics.Read(unused)
			fmt.Printf("gc-done %d %d %d %d\n", runtime.NumGoroutine(), ms.HeapInuse, ms.StackInuse, unused[0].Value.Uint64())
		}
	}
}

// settle collects garbage and returns freed memory to the OS until the
// goroutine stacks stop shrinking (the runtime halves an idle goroutine's
// oversized stack at most once per collection, so a stack grown by a TLS
// handshake takes several), at least four times and at most 16, and
// leaves the last statistics in ms.
func settle(ms *runtime.MemStats) {
	prev := ^uint64(0)
	for i := 0; i < 16; i++ {
		debug.FreeOSMemory()
		runtime.ReadMemStats(ms)
		if i >= 3 && ms.StackInuse >= prev {
			return
		}
		prev = ms.StackInuse
	}
}

func childPKI() (*tls.Config, string) {
	dir := os.Getenv("TETHER_FLEETTEST_DIR")
	pki, err := tunnel.EnsureDevPKI(filepath.Join(dir, "pki"), nil)
	if err != nil {
		panic(err)
	}
	cfg, err := tunnel.LoadServerTLS(pki.ServerCert, pki.ServerKey)
	if err != nil {
		panic(err)
	}
	return cfg, dir
}

func childCoordinator() {
	if os.Getenv("TETHER_FLEETTEST_HEAPPROFILE") != "" {
		runtime.MemProfileRate = 1 // every allocation, for a profile per agent
	}
	srvTLS, dir := childPKI()
	layout, err := natsauth.Load(filepath.Join(dir, "nats-auth"), natsauth.Config{})
	if err != nil {
		panic(err)
	}
	ns, err := coordinator.StartEmbeddedNATS(coordinator.EmbeddedNATSConfig{Host: "127.0.0.1", Port: server.RANDOM_PORT, StoreDir: filepath.Join(dir, "nats"), Auth: layout})
	if err != nil {
		panic(err)
	}
	coordCreds, err := layout.MintCoordinator("bench-coordinator")
	if err != nil {
		panic(err)
	}
	nc, err := nats.Connect(ns.ClientURL(), coordCreds.Options()...)
	if err != nil {
		panic(err)
	}
	clientCreds, err := layout.MintClient("bench", 0)
	if err != nil {
		panic(err)
	}
	credsFile := filepath.Join(dir, "bench.creds")
	if err := natsauth.WriteCreds(credsFile, clientCreds); err != nil {
		panic(err)
	}
	cfg := coordinator.DefaultConfig()
	cfg.Token = "bench-token"
	cfg.NATS = nc
	cfg.Identify = caller.FromNATS(layout.Verifier())
	c, err := coordinator.New(cfg)
	if err != nil {
		panic(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { serveChildCommands(); cancel() }()
	fmt.Printf("READY %s %s %s %s\n", ln.Addr(), ns.ClientURL(), cfg.Token, credsFile)
	// As the tether binary offers it: ALPN http/1.1 reaches the
	// WebSocket transport.
	c.Serve(ctx, tls.NewListener(ln, tunnel.ServeALPN(srvTLS)))
	nc.Close()
	ns.Shutdown()
}

// childTLSServer holds every TLS connection it accepts, with one goroutine
// blocked in Read per connection (the least any server holding idle clients
// does), and prints the count of established connections.
func childTLSServer() {
	if os.Getenv("TETHER_FLEETTEST_HEAPPROFILE") != "" {
		runtime.MemProfileRate = 1
	}
	srvTLS, _ := childPKI()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", srvTLS)
	if err != nil {
		panic(err)
	}
	fmt.Printf("READY %s - -\n", ln.Addr())
	go func() { serveChildCommands(); os.Exit(0) }()
	established := make(chan struct{}, 1024)
	go func() {
		n := 0
		for range established {
			n++
			if n%100 == 0 {
				fmt.Println(n)
			}
		}
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			var buf [1]byte
			if _, err := c.Read(buf[:]); err != nil {
				return
			}
			established <- struct{}{}
			for {
				if _, err := c.Read(buf[:]); err != nil {
					c.Close()
					return
				}
			}
		}()
	}
}

package fleettest

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherfleet/tether/agent"
	"github.com/tetherfleet/tether/coordinator"
	"github.com/tetherfleet/tether/internal/sdnotify"
	"github.com/tetherfleet/tether/internal/sdnotify/sdnotifytest"
	"github.com/tetherfleet/tether/protocol"
)

// testWatchdog is the watchdog interval (WATCHDOG_USEC) the tests give the
// daemons: they pet every 1.5 s and probe with a 750 ms bound.
const testWatchdog = 3 * time.Second

func has(kv string) func(sdnotifytest.Message) bool {
	return func(m sdnotifytest.Message) bool { return m.Has(kv) }
}

func statusHas(sub string) func(sdnotifytest.Message) bool {
	return func(m sdnotifytest.Message) bool {
		v, ok := m.Value("STATUS")
		return ok && strings.Contains(v, sub)
	}
}

// A real agent against a real coordinator tells systemd it is ready once
// its tunnel is up, says where it is connected, pets the watchdog while
// the tunnel answers, and says STOPPING=1 when it stops.
func TestAgentNotifiesSystemd(t *testing.T) {
	sock := sdnotifytest.Listen(t)
	// Registered before Start, so it runs after the fleet stopped.
	t.Cleanup(func() {
		sock.Wait(t, 30*time.Second, "STOPPING=1 from the stopped agent", has("STOPPING=1"))
	})
	f := Start(t, Options{Agent: func(i int, c *agent.Config) {
		c.Notify = sdnotify.New(sock.Path, testWatchdog)
	}})
	ready := sock.Wait(t, 30*time.Second, "READY=1", has("READY=1"))
	if v, _ := ready.Value("STATUS"); !strings.Contains(v, "connected to coordinator fleettest at "+f.TunnelAddr+" via tls") {
		t.Errorf("READY=1 came with STATUS=%q, want it to name the coordinator, its address and the transport", v)
	}
	sock.Wait(t, 30*time.Second, "WATCHDOG=1", has("WATCHDOG=1"))
	// The status counts the execs running (refreshed at every tick).
	ctx, cancel := context.WithCancel(context.Background())
	execDone := make(chan struct{})
	go func() {
		defer close(execDone)
		f.Client.Exec(ctx, &protocol.ExecRequest{Target: protocol.Target{All: true}, Commands: []string{"sleep 60"}}, nil)
	}()
	sock.Wait(t, 30*time.Second, "a status counting the exec", statusHas(", 1 execs running"))
	cancel()
	<-execDone
	for i, m := range sock.Messages() {
		if m.Has("READY=1") {
			break
		}
		if m.Has("WATCHDOG=1") {
			t.Errorf("message %d: WATCHDOG=1 before READY=1: %q", i, sock.Messages())
		}
	}
}

// stallProxy relays TCP connections to target until Stall, after which it
// forwards nothing more, either way, on any connection, old or new, while
// keeping them open: a middlebox that wedged, or a partition the kernel
// does not report.
type stallProxy struct {
	ln      net.Listener
	target  string
	stalled atomic.Bool
	stop    chan struct{} // closed by close: blocked relays return
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
}

func startStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, target: target, stop: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *stallProxy) Addr() string { return p.ln.Addr().String() }

// Stall stops all forwarding from now on.
func (p *stallProxy) Stall() { p.stalled.Store(true) }

func (p *stallProxy) track(c net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
}

func (p *stallProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.track(c)
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.track(up)
		p.wg.Add(2)
		go p.relay(up, c)
		go p.relay(c, up)
	}
}

// relay copies src to dst until either fails, holding each chunk read
// once the proxy stalled.
func (p *stallProxy) relay(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if p.stalled.Load() {
			<-p.stop
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err == io.EOF {
				if cw, ok := dst.(interface{ CloseWrite() error }); ok {
					cw.CloseWrite()
				}
			}
			return
		}
	}
}

func (p *stallProxy) close() {
	p.ln.Close()
	close(p.stop)
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// An agent whose tunnel is wedged (the TCP connection to the coordinator
// open, nothing forwarded any more) stops sending WATCHDOG=1 within one
// watchdog interval, so that systemd restarts it; the session is still
// open then (the tunnel's keepalive gives up later), so what stops the
// petting is the failed round trip, not the session's end. Its status
// says why.
func TestWedgedAgentStopsPettingWatchdog(t *testing.T) {
	sock := sdnotifytest.Listen(t)
	var proxy *stallProxy
	Start(t, Options{Agent: func(i int, c *agent.Config) {
		proxy = startStallProxy(t, c.Coordinators[0])
		c.Coordinators = []string{proxy.Addr()}
		c.Notify = sdnotify.New(sock.Path, testWatchdog)
	}})
	sock.Wait(t, 30*time.Second, "READY=1", has("READY=1"))
	// Petting while healthy: two in a row, so it is a rhythm.
	first := sock.Wait(t, 30*time.Second, "WATCHDOG=1", has("WATCHDOG=1"))
	sock.Wait(t, 30*time.Second, "a second WATCHDOG=1", func(m sdnotifytest.Message) bool {
		return m.Has("WATCHDOG=1") && m.At.After(first.At)
	})

	proxy.Stall()
	wedged := time.Now()
	sock.Wait(t, 30*time.Second, "a status saying the watchdog is not petted", statusHas("not petting the watchdog"))
	// Wait out one interval after the wedge, and then as long again, and
	// look at everything that came.
	time.Sleep(time.Until(wedged.Add(2 * testWatchdog)))
	var pets []time.Duration
	for _, m := range sock.Messages() {
		if m.Has("WATCHDOG=1") && m.At.After(wedged.Add(testWatchdog)) {
			pets = append(pets, m.At.Sub(wedged))
		}
	}
	if len(pets) > 0 {
		t.Fatalf("WATCHDOG=1 still sent %v after the tunnel was wedged (watchdog interval %v); messages: %q", pets, testWatchdog, sock.Messages())
	}
}

// A real coordinator tells systemd it is ready once it serves, how many
// agents it serves, pets the watchdog while its NATS connection works,
// and says STOPPING=1 when its drain starts.
func TestCoordinatorNotifiesSystemd(t *testing.T) {
	sock := sdnotifytest.Listen(t)
	f := Start(t, Options{Coordinator: func(c *coordinator.Config) {
		c.Notify = sdnotify.New(sock.Path, testWatchdog)
	}})
	ready := sock.Wait(t, 30*time.Second, "READY=1", has("READY=1"))
	if v, _ := ready.Value("STATUS"); !strings.HasPrefix(v, "serving ") {
		t.Errorf("READY=1 came with STATUS=%q, want serving …", v)
	}
	sock.Wait(t, 30*time.Second, "STATUS=serving 1 agents", statusHas("serving 1 agents"))
	sock.Wait(t, 30*time.Second, "WATCHDOG=1", has("WATCHDOG=1"))
	f.StopCoordinator(0)
	stopping := sock.Wait(t, 30*time.Second, "STOPPING=1", has("STOPPING=1"))
	if v, _ := stopping.Value("STATUS"); !strings.Contains(v, "draining: moving 1 agents") {
		t.Errorf("STOPPING=1 came with STATUS=%q, want draining: moving 1 agents …", v)
	}
}

// A coordinator whose NATS connection is gone serves no API: it stops
// petting the watchdog within one interval.
func TestCoordinatorWithoutNATSStopsPettingWatchdog(t *testing.T) {
	sock := sdnotifytest.Listen(t)
	f := Start(t, Options{Coordinator: func(c *coordinator.Config) {
		c.Notify = sdnotify.New(sock.Path, testWatchdog)
	}})
	sock.Wait(t, 30*time.Second, "WATCHDOG=1", has("WATCHDOG=1"))
	f.CoordNCs[0].Close()
	cut := time.Now()
	sock.Wait(t, 30*time.Second, "a status saying NATS is down", statusHas("NATS connection down"))
	time.Sleep(time.Until(cut.Add(2 * testWatchdog)))
	for _, m := range sock.Messages() {
		if m.Has("WATCHDOG=1") && m.At.After(cut.Add(testWatchdog)) {
			t.Fatalf("WATCHDOG=1 at %v after the NATS connection closed (watchdog interval %v)", m.At.Sub(cut), testWatchdog)
		}
	}
}

package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/yamux"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tetherfleet/tether/internal/countcopy"
	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
)

// targetServer is a loopback TCP server that runs handle for every
// connection; the test's cleanup closes it and waits for the handlers.
func targetServer(t *testing.T, handle func(c *net.TCPConn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(c.(*net.TCPConn))
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// echo copies everything back until EOF, then closes.
func echo(c *net.TCPConn) { io.Copy(c, c) }

// dial opens a dial stream to target from the coordinator side and reads
// the agent's answer: the stream after FrameDialOK, or the error frame.
func (h *harness) dial(t *testing.T, target string) (*yamux.Stream, *protocol.ErrorInfo) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := h.srv.Open(ctx, protocol.KindDial, protocol.DialParams{Target: target})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	st.SetDeadline(time.Now().Add(time.Minute)) // an upper bound for a loaded machine
	f, err := protocol.NewFrameReader(st).Next()
	if err != nil {
		t.Fatalf("dial %s: read answer: %v", target, err)
	}
	switch f.Type {
	case protocol.FrameDialOK:
		if len(f.Payload) != 0 {
			t.Errorf("dial-ok frame with %d bytes of payload, want none", len(f.Payload))
		}
		return st, nil
	case protocol.FrameError:
		info := &protocol.ErrorInfo{}
		if err := protocol.DecodeJSON(f.Payload, info); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("read after the error frame: %v, want EOF", err)
		}
		return nil, info
	default:
		t.Fatalf("dial %s: answer is a %s frame, want dial-ok or error", target, f.Type)
		return nil, nil
	}
}

func TestDialEchoesBytesBothWays(t *testing.T) {
	t.Parallel()
	addr := targetServer(t, echo)
	reg := prometheus.NewRegistry()
	h := newHarness(t, func(c *Config) {
		c.Targets = map[string]string{"echo": addr}
		c.Registerer = reg
	})
	st, info := h.dial(t, "echo")
	if info != nil {
		t.Fatalf("dial: %v", info)
	}
	data := make([]byte, 3<<20+17)
	rand.Read(data)
	werr := make(chan error, 1)
	go func() {
		_, err := st.Write(data)
		st.Close() // half-close: the echo server sees EOF and closes
		werr <- err
	}()
	got, err := io.ReadAll(st)
	if err != nil {
		t.Fatalf("read echo: %v", err)
	}
	if err := <-werr; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("echoed %d bytes, want the %d sent", len(got), len(data))
	}
	waitFor(t, testWait, "the dial to end", func() bool { return h.a.dialing.Load() == 0 })
	if got := testutil.ToFloat64(h.a.m.dialsOpen); got != 0 {
		t.Errorf("dials open = %v, want 0", got)
	}
	for dir, want := range map[string]float64{toTarget: float64(len(data)), fromTarget: float64(len(data))} {
		if got := testutil.ToFloat64(h.a.m.dialBytes.WithLabelValues(dir)); got != want {
			t.Errorf("dial bytes %s = %v, want %v", dir, got, want)
		}
	}
	if got := testutil.ToFloat64(h.a.m.dials.WithLabelValues(dialOK)); got != 1 {
		t.Errorf("dials ok = %v, want 1", got)
	}
}

// A half-close passes through either way, and the other direction goes on.
func TestDialHalfClose(t *testing.T) {
	t.Parallel()
	t.Run("coordinator closes first", func(t *testing.T) {
		t.Parallel()
		// The target reads to EOF, then answers and closes.
		addr := targetServer(t, func(c *net.TCPConn) {
			b, err := io.ReadAll(c)
			if err != nil {
				t.Errorf("target read: %v", err)
				return
			}
			c.Write([]byte("got " + string(b)))
		})
		h := newHarness(t, func(c *Config) { c.Targets = map[string]string{"t": addr} })
		st, info := h.dial(t, "t")
		if info != nil {
			t.Fatal(info)
		}
		if _, err := st.Write([]byte("request")); err != nil {
			t.Fatal(err)
		}
		st.Close()
		got, err := io.ReadAll(st)
		if err != nil || string(got) != "got request" {
			t.Errorf("read %q, %v; want %q after the target's reply", got, err, "got request")
		}
	})
	t.Run("target closes first", func(t *testing.T) {
		t.Parallel()
		// The target greets, half-closes, then reads what comes after.
		late := make(chan string, 1)
		addr := targetServer(t, func(c *net.TCPConn) {
			c.Write([]byte("banner"))
			c.CloseWrite()
			b, _ := io.ReadAll(c)
			late <- string(b)
		})
		h := newHarness(t, func(c *Config) { c.Targets = map[string]string{"t": addr} })
		st, info := h.dial(t, "t")
		if info != nil {
			t.Fatal(info)
		}
		got, err := io.ReadAll(st)
		if err != nil || string(got) != "banner" {
			t.Fatalf("read %q, %v; want the banner, then EOF", got, err)
		}
		// The stream is still writable after the target's EOF.
		if _, err := st.Write([]byte("after EOF")); err != nil {
			t.Fatal(err)
		}
		st.Close()
		if got := recv(t, late, "the target to read to EOF"); got != "after EOF" {
			t.Errorf("target read %q after its half-close, want %q", got, "after EOF")
		}
		waitFor(t, testWait, "the dial to end", func() bool { return h.a.dialing.Load() == 0 })
	})
}

func TestDialRefusals(t *testing.T) {
	t.Parallel()
	// A port nobody listens on: listen, note the port, close.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	live := targetServer(t, echo)
	h := newHarness(t, func(c *Config) {
		c.Targets = map[string]string{"gone": closed, "web": live}
		c.OpenSandbox = &OpenSandboxTarget{Addr: live}
	})
	tests := []struct {
		target, code, msg string
	}{
		{"etcd", protocol.CodeUnknownTarget, `node node-a has no target "etcd" (it serves: gone, opensandbox, web)`},
		{"openshell", protocol.CodeUnknownTarget, `node node-a has no target "openshell" (it serves: gone, opensandbox, web)`},
		{"127.0.0.1:22", protocol.CodeUnknownTarget, `node node-a has no target "127.0.0.1:22" (it serves: gone, opensandbox, web)`},
		{"own-ports", protocol.CodeUnknownTarget, `node node-a has no target "own-ports" (it serves: gone, opensandbox, web); own-ports is for port forwards inside an SSH connection (ssh -L), as your login`},
		{"", protocol.CodeUnknownTarget, `node node-a has no target "" (it serves: gone, opensandbox, web)`},
		{strings.Repeat("x", 200), protocol.CodeUnknownTarget, `node node-a has no target "` + strings.Repeat("x", 100) + `..." (it serves: gone, opensandbox, web)`},
		{"gone", protocol.CodeDialFailed, "node node-a: dial target gone at " + closed + ": connect: connection refused"},
	}
	for _, tt := range tests {
		_, info := h.dial(t, tt.target)
		if info == nil {
			t.Errorf("dial %q succeeded, want %s", tt.target, tt.code)
			continue
		}
		if diff := cmp.Diff(&protocol.ErrorInfo{Code: tt.code, Message: tt.msg}, info); diff != "" {
			t.Errorf("dial %q: error (-want +got):\n%s", tt.target, diff)
		}
		if tt.code == protocol.CodeUnknownTarget && (strings.Contains(info.Message, live) || strings.Contains(info.Message, closed)) {
			t.Errorf("unknown target message %q shows a target's address", info.Message)
		}
	}
	// Strict params: an unknown field is a bad request.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := h.srv.Open(ctx, protocol.KindDial, map[string]string{"target": "web", "addr": "10.0.0.1:80"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	st.SetReadDeadline(time.Now().Add(10 * time.Second))
	f, err := protocol.NewFrameReader(st).Next()
	var info protocol.ErrorInfo
	if err != nil || f.Type != protocol.FrameError || protocol.DecodeJSON(f.Payload, &info) != nil || info.Code != protocol.CodeBadRequest {
		t.Errorf("dial with an address param: %v %v %+v, want a bad_request error", f.Type, err, info)
	}
	for result, want := range map[string]float64{dialUnknownTarget: 6, dialFailed: 1, dialBadRequest: 1, dialOK: 0} {
		if got := testutil.ToFloat64(h.a.m.dials.WithLabelValues(result)); got != want {
			t.Errorf("dials %s = %v, want %v", result, got, want)
		}
	}
}

func TestDialNoTargetsConfigured(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	_, info := h.dial(t, "openshell")
	want := &protocol.ErrorInfo{Code: protocol.CodeUnknownTarget, Message: `node node-a has no target "openshell" (it serves: no targets)`}
	if diff := cmp.Diff(want, info); diff != "" {
		t.Errorf("error (-want +got):\n%s", diff)
	}
}

func TestDialBusyPastMaxDials(t *testing.T) {
	t.Parallel()
	addr := targetServer(t, echo)
	h := newHarness(t, func(c *Config) {
		c.Targets = map[string]string{"echo": addr}
		c.MaxDials = 1
	})
	first, info := h.dial(t, "echo")
	if info != nil {
		t.Fatal(info)
	}
	_, info = h.dial(t, "echo")
	want := &protocol.ErrorInfo{Code: protocol.CodeBusy, Message: "node node-a has 1 dial streams open, its limit"}
	if diff := cmp.Diff(want, info); diff != "" {
		t.Errorf("second dial (-want +got):\n%s", diff)
	}
	first.Close()
	if _, err := io.ReadAll(first); err != nil {
		t.Fatal(err)
	}
	waitFor(t, testWait, "the first dial to end", func() bool { return h.a.dialing.Load() == 0 })
	third, info := h.dial(t, "echo")
	if info != nil {
		t.Fatalf("third dial: %v", info)
	}
	third.Write([]byte("ping"))
	third.Close()
	if got, err := io.ReadAll(third); err != nil || string(got) != "ping" {
		t.Errorf("third dial echoed %q, %v", got, err)
	}
}

// When the tunnel dies the target connection is closed, and the handler
// returns (the harness checks serveStreams returned; goleak checks the
// copiers).
func TestDialSessionLossClosesTarget(t *testing.T) {
	t.Parallel()
	ended := make(chan error, 1)
	addr := targetServer(t, func(c *net.TCPConn) {
		c.Write([]byte("hi"))
		_, err := io.Copy(io.Discard, c)
		ended <- err
	})
	h := newHarness(t, func(c *Config) { c.Targets = map[string]string{"t": addr} })
	st, info := h.dial(t, "t")
	if info != nil {
		t.Fatal(info)
	}
	if _, err := io.ReadFull(st, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	h.srv.Close()
	if err := recv(t, ended, "the target connection to end"); err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
		t.Errorf("target connection ended with %v", err)
	}
	waitFor(t, testWait, "the dial to end", func() bool { return h.a.dialing.Load() == 0 })
}

func TestTargetsConfig(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr []string // substrings; nil means valid
	}{
		{"gateways and targets", func(c *Config) {
			c.OpenShell = &OpenShellTarget{Addr: "127.0.0.1:8080", Token: "tok", Workspaces: []string{"default", "team-a"}, TLS: &tls.Config{}}
			c.OpenSandbox = &OpenSandboxTarget{Addr: "localhost:8090", APIKey: "key"}
			c.Targets = map[string]string{"web": "127.0.0.1:80", "db-1": "[::1]:5432"}
		}, nil},
		{"bad gateway addresses", func(c *Config) {
			c.OpenShell = &OpenShellTarget{Addr: "8080"}
			c.OpenSandbox = &OpenSandboxTarget{Addr: ":8090"}
		}, []string{`OpenShell.Addr: "8080" is not host:port`, `OpenSandbox.Addr: ":8090" is not host:port`}},
		{"bad port", func(c *Config) { c.Targets = map[string]string{"web": "localhost:http"} }, []string{`target "web": "localhost:http": port "http" is not a number`}},
		{"port out of range", func(c *Config) { c.Targets = map[string]string{"web": "localhost:70000"} }, []string{`port "70000"`}},
		{"reserved names", func(c *Config) {
			c.Targets = map[string]string{"openshell": "127.0.0.1:1", "opensandbox": "127.0.0.1:2"}
		}, []string{`"openshell" is reserved for the openshell gateway (configure it with OpenShell)`, `"opensandbox" is reserved for the opensandbox gateway (configure it with OpenSandbox)`}},
		{"own-ports is reserved", func(c *Config) { c.Targets = map[string]string{"own-ports": "127.0.0.1:1"} },
			[]string{`"own-ports" is reserved (the SSH login's own loopback ports)`}},
		{"bad names", func(c *Config) {
			c.Targets = map[string]string{"Web": "127.0.0.1:1", "9x": "127.0.0.1:2"}
		}, []string{`target name "Web"`, `target name "9x"`}},
		{"secrets with whitespace", func(c *Config) {
			c.OpenShell = &OpenShellTarget{Addr: "127.0.0.1:8080", Token: "tok\n"}
			c.OpenSandbox = &OpenSandboxTarget{Addr: "127.0.0.1:8090", APIKey: "a key"}
		}, []string{"OpenShell.Token: has spaces", "OpenSandbox.APIKey: has spaces"}},
		{"bad workspaces", func(c *Config) {
			c.OpenShell = &OpenShellTarget{Addr: "127.0.0.1:8080", Workspaces: []string{"a", "a", ""}}
		}, []string{`"a" is listed twice`, `"" is empty`}},
		{"negative limits", func(c *Config) { c.MaxDials, c.DialTimeout, c.InventoryTimeout = -1, -1, -1 },
			[]string{"MaxDials", "DialTimeout", "InventoryTimeout"}},
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
			if strings.Contains(err.Error(), "tok") || strings.Contains(err.Error(), "a key") {
				t.Errorf("error %q shows a secret", err)
			}
		})
	}
}

// New fills the gateway defaults on copies, and Hello lists the targets.
func TestTargetsDefaultsAndHello(t *testing.T) {
	shell := &OpenShellTarget{Addr: "127.0.0.1:8080"}
	targets := map[string]string{"web": "127.0.0.1:80"}
	fc := startFakeCoordinator(t, "secret-token")
	cfg := testConfig(t)
	cfg.Coordinators = []string{fc.addr}
	cfg.TLS = fc.clientTLS
	cfg.OpenShell = shell
	cfg.OpenSandbox = &OpenSandboxTarget{Addr: "127.0.0.1:8090"}
	cfg.Targets = targets
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if shell.Workspaces != nil {
		t.Errorf("New changed the caller's OpenShellTarget: %+v", shell)
	}
	if diff := cmp.Diff([]string{"default"}, a.cfg.OpenShell.Workspaces); diff != "" {
		t.Errorf("workspaces (-want +got):\n%s", diff)
	}
	if a.cfg.MaxDials != DefaultMaxDials || a.cfg.DialTimeout != DefaultDialTimeout || a.cfg.InventoryTimeout != DefaultInventoryTimeout {
		t.Errorf("defaults not filled: MaxDials %d, DialTimeout %v, InventoryTimeout %v", a.cfg.MaxDials, a.cfg.DialTimeout, a.cfg.InventoryTimeout)
	}
	targets["late"] = "127.0.0.1:81"
	runAgent(t, a)
	hello := recv(t, fc.hellos, "hello")
	if diff := cmp.Diff([]string{"opensandbox", "openshell", "web"}, hello.Targets); diff != "" {
		t.Errorf("Hello.Targets (-want +got):\n%s", diff)
	}
}

// A coordinator that closed its side and stopped reading does not hold the
// stream and its dial slot while the target ignores the half-close and
// keeps sending: a write unread for halfClosedWriteTimeout ends the dial,
// also the write already waiting for window when the half-close came.
func TestDialEndsWhenClosedSideStopsReading(t *testing.T) {
	old := halfClosedWriteTimeout
	halfClosedWriteTimeout = 300 * time.Millisecond
	t.Cleanup(func() { halfClosedWriteTimeout = old })
	// Copies of 32 KiB, each counted as it passes, so that the count below
	// tells when the window is full (a 256 KiB write blocked on the
	// window would be counted only once it went through).
	oldCopy := dialCopy
	dialCopy = func(dst io.Writer, src io.Reader, c countcopy.Counter) (int64, error) {
		return countcopy.Copy(dst, src, make([]byte, protocol.ChunkSize), c)
	}
	t.Cleanup(func() { dialCopy = oldCopy })
	addr := targetServer(t, func(c *net.TCPConn) {
		buf := make([]byte, 32<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	})
	// A 256 KiB window (yamux's least, and it does not grow while nobody
	// reads): the agent's writes stall after 256 KiB, whatever the load.
	const window = 256 << 10
	h := newHarnessTunnel(t, func(c *Config) {
		c.Targets = map[string]string{"firehose": addr}
		c.MaxDials = 1
	}, nil, func(c *tunnel.Config) { c.MaxStreamWindow = window })
	st, info := h.dial(t, "firehose")
	if info != nil {
		t.Fatal(info)
	}
	// Half-close only once the window is (all but) full, so that the
	// agent's write is blocked waiting for room when the EOF arrives.
	fromTarget := h.a.m.dialBytes.WithLabelValues(fromTarget)
	waitFor(t, time.Minute, "the window to fill", func() bool {
		return testutil.ToFloat64(fromTarget) >= window-2*protocol.ChunkSize
	})
	st.Close() // half-close, and never read again
	// Bounded by halfClosedWriteTimeout once the EOF is read; the wait
	// only has to outlast a starved machine.
	waitFor(t, time.Minute, "the dial slot to be freed", func() bool { return h.a.dialing.Load() == 0 })
}

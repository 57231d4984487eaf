package tunnel_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
	"github.com/tetherfleet/tether/tunnel"
	"github.com/tetherfleet/tether/tunnel/tunneltest"
)

// coordName is the coordinator's name in these tests: only the proxy knows
// it (tunneltest.ProxyConfig.Resolve), and net/http's proxy rules never
// proxy a loopback address.
const coordName = "coord.test"

// wsEchoServer is a WebSocket transport server as the coordinator runs it
// (TLS over Cork, ALPN, the upgrade), whose sessions echo every stream.
type wsEchoServer struct {
	addr   string // 127.0.0.1:PORT
	port   string
	mu     sync.Mutex
	sesses []*tunnel.Session
}

func startWSEcho(t *testing.T) (*wsEchoServer, *tunnel.WebSocketDialer) {
	t.Helper()
	pki, err := tunnel.EnsureDevPKI(filepath.Join(t.TempDir(), "pki"), []string{coordName})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := tunnel.LoadServerTLS(pki.ServerCert, pki.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := tunnel.LoadClientTLS(pki.CACert)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &wsEchoServer{addr: ln.Addr().String()}
	_, s.port, _ = net.SplitHostPort(s.addr)
	var wg sync.WaitGroup
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, err := tunnel.UpgradeWebSocket(w, r)
		if err != nil {
			return
		}
		cfg := tunneltest.Config(t)
		sess, err := tunnel.Server(conn, cfg)
		if err != nil {
			return
		}
		s.mu.Lock()
		s.sesses = append(s.sesses, sess)
		s.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				st, _, err := sess.Accept(context.Background())
				if err != nil {
					if errors.Is(err, io.EOF) {
						return
					}
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					io.Copy(st, st)
					st.Close()
				}()
			}
		}()
	})}
	go srv.Serve(tunnel.NewListener(ln, tunnel.ServeALPN(sc)))
	t.Cleanup(func() {
		srv.Close()
		s.mu.Lock()
		for _, ss := range s.sesses {
			ss.Close()
		}
		s.mu.Unlock()
		wg.Wait()
	})
	return s, &tunnel.WebSocketDialer{TLS: tunnel.TunedTLS(cc)}
}

// echo checks a round trip on a new stream of sess.
func echo(t *testing.T, sess *tunnel.Session) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := sess.Open(ctx, protocol.KindExec, struct{}{})
	if err != nil {
		t.Fatalf("open stream: %v", err)
	}
	defer st.Close()
	st.SetDeadline(time.Now().Add(10 * time.Second))
	msg := []byte("ping through the proxy")
	if _, err := st.Write(msg); err != nil {
		t.Fatalf("write: %v", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(st, got); err != nil || string(got) != string(msg) {
		t.Fatalf("echo: %q, %v", got, err)
	}
}

func fixedProxy(u string) tunnel.ProxyFunc {
	pu, err := url.Parse(u)
	return func(*url.URL) (*url.URL, error) { return pu, err }
}

// TestWebSocketThroughIdleKillingProxy runs sessions through a CONNECT
// proxy (with Basic auth) that cuts tunnels silent for two seconds: with
// WebSocket pings, or with the session's yamux keepalive, a session
// survives an idle period of more than twice that; with neither, the proxy cuts
// it (which shows the proxy does cut). When the proxy kills the tunnel,
// the Redialer gets a new session through it.
func TestWebSocketThroughIdleKillingProxy(t *testing.T) {
	// The keepalives below run 20 times as often as the proxy cuts: a
	// busy machine must stall a timer for most of two seconds to fail it.
	const proxyIdle = 2 * time.Second
	for _, tc := range []struct {
		name      string
		ping      time.Duration // WebSocketDialer.PingInterval
		keepalive time.Duration // the client session's KeepAliveInterval
		survives  bool
	}{
		{"websocket-pings", 100 * time.Millisecond, 0, true},
		{"yamux-keepalive", -1, 100 * time.Millisecond, true},
		{"no-keepalive", -1, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, d := startWSEcho(t)
			target := net.JoinHostPort(coordName, srv.port)
			proxy := tunneltest.StartProxy(t, tunneltest.ProxyConfig{
				IdleTimeout: proxyIdle, User: "agent", Password: "s3cret",
				Resolve: map[string]string{target: srv.addr},
			})
			d.Proxy = fixedProxy(proxy.URL)
			d.PingInterval = tc.ping

			sessions := make(chan *tunnel.Session, 4)
			ctx, cancel := context.WithCancel(context.Background())
			r := &tunnel.Redialer{
				Addrs:   []string{target},
				Dial:    d.Dial,
				Backoff: tunnel.Backoff{Base: 10 * time.Millisecond, Max: 50 * time.Millisecond},
			}
			done := make(chan error, 1)
			go func() {
				done <- r.Run(ctx, func(ctx context.Context, conn net.Conn, addr string) error {
					cfg := tunneltest.Config(t)
					cfg.KeepAliveInterval = tc.keepalive
					sess, err := tunnel.Client(conn, cfg)
					if err != nil {
						return err
					}
					defer sess.Close()
					sessions <- sess
					select {
					case <-sess.Done():
					case <-ctx.Done():
					}
					return nil
				})
			}()
			defer func() {
				cancel()
				<-done
			}()
			first := <-sessions
			echo(t, first)
			if !tc.survives {
				select {
				case <-first.Done():
				case <-time.After(10 * time.Second):
					t.Fatal("the proxy did not cut a session without keepalive")
				}
				if proxy.IdleCuts() < 1 {
					t.Fatalf("session ended, but not by the proxy's idle cut")
				}
				return
			}
			// Idle for more than twice the proxy's timeout.
			time.Sleep(proxyIdle * 9 / 4)
			if first.IsClosed() {
				t.Fatalf("session closed while idle (proxy idle cuts: %d)", proxy.IdleCuts())
			}
			echo(t, first)
			if n := proxy.IdleCuts(); n != 0 {
				t.Fatalf("proxy cut %d idle tunnels", n)
			}
			// The proxy goes away with the tunnel: the agent comes back
			// through it.
			if n := proxy.KillAll(); n != 1 {
				t.Fatalf("proxy relayed %d tunnels, want 1", n)
			}
			<-first.Done()
			var second *tunnel.Session
			select {
			case second = <-sessions:
			case <-time.After(10 * time.Second):
				t.Fatal("no new session through the proxy after it killed the first")
			}
			echo(t, second)
			if got := proxy.Targets(); !slices.Equal(got, []string{target, target}) {
				t.Errorf("proxy CONNECT targets %v, want %s twice", got, target)
			}
		})
	}
}

// TestWebSocketProxyAuthRefused: a proxy that wants credentials the dial
// lacks refuses, and the error says what the proxy answered.
func TestWebSocketProxyAuthRefused(t *testing.T) {
	srv, d := startWSEcho(t)
	target := net.JoinHostPort(coordName, srv.port)
	proxy := tunneltest.StartProxy(t, tunneltest.ProxyConfig{User: "agent", Password: "s3cret", Resolve: map[string]string{target: srv.addr}})
	d.Proxy = fixedProxy(strings.Replace(proxy.URL, "agent:s3cret@", "agent:wrong@", 1))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := d.Dial(ctx, target)
	if err == nil || !strings.Contains(err.Error(), "407") || strings.Contains(err.Error(), "wrong") {
		t.Fatalf("dial with wrong proxy credentials: %v, want a 407 error that does not show the password", err)
	}
	if proxy.Refused() != 1 || len(proxy.Targets()) != 0 {
		t.Errorf("proxy refused %d, relayed %v", proxy.Refused(), proxy.Targets())
	}
}

// TestWebSocketProxyFromEnvironment: HTTPS_PROXY is used for the
// coordinator's name (the one the Redialer resolved the address from),
// unless NO_PROXY excludes it: then the dial goes straight to the address.
func TestWebSocketProxyFromEnvironment(t *testing.T) {
	srv, d := startWSEcho(t)
	target := net.JoinHostPort(coordName, srv.port)
	proxy := tunneltest.StartProxy(t, tunneltest.ProxyConfig{Resolve: map[string]string{target: srv.addr}})
	t.Setenv("HTTP_PROXY", "")
	t.Setenv("http_proxy", "")
	t.Setenv("https_proxy", "")
	t.Setenv("no_proxy", "")
	t.Setenv("HTTPS_PROXY", proxy.URL)
	dial := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d.Proxy = tunnel.ProxyFromEnvironment()
		conn, err := d.Dial(tunnel.WithServerName(ctx, coordName), srv.addr)
		if err != nil {
			t.Fatal(err)
		}
		sess, err := tunnel.Client(conn, tunneltest.Config(t))
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close()
		echo(t, sess)
	}
	for _, np := range []string{coordName, "other.test," + coordName, ".test"} {
		t.Run(fmt.Sprintf("NO_PROXY=%s", np), func(t *testing.T) {
			t.Setenv("NO_PROXY", np)
			dial()
			if got := proxy.Targets(); len(got) != 0 {
				t.Fatalf("NO_PROXY=%s: the dial went through the proxy (%v)", np, got)
			}
		})
	}
	t.Setenv("NO_PROXY", "other.test")
	dial()
	if got := proxy.Targets(); !slices.Equal(got, []string{target}) {
		t.Fatalf("NO_PROXY=other.test: proxy CONNECT targets %v, want [%s]", got, target)
	}
}

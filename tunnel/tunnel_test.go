package tunnel

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetherfleet/tether/protocol"
)

const defaultTestTimeout = 10 * time.Second

func testConfig() Config {
	c := DefaultConfig()
	c.KeepAliveInterval = 0
	c.HeaderTimeout = 2 * time.Second
	return c
}

// transports returns connected conn pairs over each transport sessions run on.
func transports(t *testing.T) map[string]func() (client, server net.Conn) {
	return map[string]func() (net.Conn, net.Conn){
		"pipe": func() (net.Conn, net.Conn) { return net.Pipe() },
		"tcp":  func() (net.Conn, net.Conn) { return tcpPair(t) },
		"tls":  func() (net.Conn, net.Conn) { return tlsPair(t) },
		// As DialTLS and NewListener make them: corked writes and
		// read-ahead beneath the TLS.
		"tls-corked": func() (net.Conn, net.Conn) { return corkedTLSPair(t) },
		"wss":        func() (net.Conn, net.Conn) { return wsPair(t) },
	}
}

func tcpPair(tb testing.TB) (net.Conn, net.Conn) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		ch <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	s := <-ch
	if s == nil {
		tb.Fatal("accept failed")
	}
	return c, s
}

func tlsConfigs(tb testing.TB) (client, server *tls.Config) {
	tb.Helper()
	dir := tb.TempDir()
	pki, err := EnsureDevPKI(dir, nil)
	if err != nil {
		tb.Fatal(err)
	}
	server, err = LoadServerTLS(pki.ServerCert, pki.ServerKey)
	if err != nil {
		tb.Fatal(err)
	}
	client, err = LoadClientTLS(pki.CACert)
	if err != nil {
		tb.Fatal(err)
	}
	client.ServerName = "localhost"
	return client, server
}

func tlsPair(tb testing.TB) (net.Conn, net.Conn) {
	tb.Helper()
	cc, sc := tlsConfigs(tb)
	c, s := tcpPair(tb)
	tc, ts := tls.Client(c, cc), tls.Server(s, sc)
	errc := make(chan error, 1)
	go func() { errc <- ts.Handshake() }()
	if err := tc.Handshake(); err != nil {
		tb.Fatal(err)
	}
	if err := <-errc; err != nil {
		tb.Fatal(err)
	}
	return tc, ts
}

// corkedTLSPair is tlsPair with both ends' TLS over Cork, as DialTLS and
// NewListener make them.
func corkedTLSPair(tb testing.TB) (net.Conn, net.Conn) {
	tb.Helper()
	cc, sc := tlsConfigs(tb)
	c, s := tcpPair(tb)
	tc, ts := tls.Client(Cork(c), cc), tls.Server(Cork(s), sc)
	errc := make(chan error, 1)
	go func() { errc <- ts.Handshake() }()
	if err := tc.Handshake(); err != nil {
		tb.Fatal(err)
	}
	if err := <-errc; err != nil {
		tb.Fatal(err)
	}
	return tc, ts
}

func sessionPair(tb testing.TB, c, s net.Conn, cfg Config) (*Session, *Session) {
	tb.Helper()
	cs, err := Client(c, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ss, err := Server(s, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cs.Close(); ss.Close() })
	return cs, ss
}

func TestStreamsOverTransports(t *testing.T) {
	for name, mk := range transports(t) {
		t.Run(name, func(t *testing.T) {
			c, s := mk()
			client, server := sessionPair(t, c, s, testConfig())
			ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
			defer cancel()

			payload := make([]byte, 3<<20)
			rand.Read(payload)
			// Both roles open streams: the coordinator opens exec streams,
			// the agent opens the control stream.
			for _, dir := range []struct {
				name         string
				opener, peer *Session
			}{{"client-opens", client, server}, {"server-opens", server, client}} {
				var wg sync.WaitGroup
				wg.Add(1)
				var got []byte
				var hdr protocol.Header
				var acceptErr error
				go func() {
					defer wg.Done()
					st, h, err := dir.peer.Accept(ctx)
					if err != nil {
						acceptErr = err
						return
					}
					hdr = h
					got, acceptErr = io.ReadAll(st)
					st.Write([]byte("done"))
					st.Close()
				}()
				st, err := dir.opener.Open(ctx, protocol.KindExec, &protocol.ExecParams{Argv: []string{"x"}})
				if err != nil {
					t.Fatalf("%s: Open: %v", dir.name, err)
				}
				if _, err := st.Write(payload); err != nil {
					t.Fatal(err)
				}
				st.Close() // half-close: the peer reads EOF
				ack, err := io.ReadAll(st)
				if err != nil || string(ack) != "done" {
					t.Fatalf("%s: ack = %q, %v", dir.name, ack, err)
				}
				wg.Wait()
				if acceptErr != nil {
					t.Fatalf("%s: accept side: %v", dir.name, acceptErr)
				}
				if hdr.Kind != protocol.KindExec || !bytes.Equal(got, payload) {
					t.Fatalf("%s: kind %v, %d bytes received, payload intact=%v", dir.name, hdr.Kind, len(got), bytes.Equal(got, payload))
				}
			}
		})
	}
}

func TestAcceptRejectsBadHeader(t *testing.T) {
	c, s := tcpPair(t)
	client, server := sessionPair(t, c, s, testConfig())
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()

	// A raw yamux stream with a header of a future version.
	raw, err := client.y.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	raw.Write([]byte{9, 2, 0, 0, 0, 2, '{', '}'})
	_, _, err = server.Accept(ctx)
	if !errors.Is(err, protocol.ErrVersion) {
		t.Fatalf("Accept = %v, want ErrVersion", err)
	}
	f, err := protocol.NewFrameReader(raw).Next()
	if err != nil || f.Type != protocol.FrameError {
		t.Fatalf("opener got %v, %v; want an error frame", f.Type, err)
	}
	var info protocol.ErrorInfo
	protocol.DecodeJSON(f.Payload, &info)
	if info.Code != protocol.CodeVersion {
		t.Fatalf("error code %q, want %q", info.Code, protocol.CodeVersion)
	}
	raw.Close()
}

func TestAcceptReturnsEOFAfterClose(t *testing.T) {
	c, s := net.Pipe()
	client, server := sessionPair(t, c, s, testConfig())
	client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	if _, _, err := server.Accept(ctx); err != io.EOF {
		t.Fatalf("Accept after peer closed = %v, want io.EOF", err)
	}
	select {
	case <-server.Done():
	case <-ctx.Done():
		t.Fatal("session did not end")
	}
}

func TestOpenHonoursContext(t *testing.T) {
	c, s := net.Pipe()
	cfg := testConfig()
	cfg.AcceptBacklog = 1
	client, _ := sessionPair(t, c, s, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	// The server never accepts: the first open takes the only backlog slot,
	// the second must give up when its ctx ends.
	st, err := client.Open(ctx, protocol.KindExec, struct{}{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	if _, err := client.Open(short, protocol.KindExec, struct{}{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Open = %v, want DeadlineExceeded", err)
	}
	client.Close() // releases the goroutine still waiting for a slot
}

// blackhole accepts writes and never delivers them, like a peer whose
// network vanished without a FIN or RST.
type blackhole struct {
	net.Conn
	closed chan struct{}
	once   sync.Once
}

func (b *blackhole) Read(p []byte) (int, error)  { <-b.closed; return 0, io.EOF }
func (b *blackhole) Write(p []byte) (int, error) { return len(p), nil }
func (b *blackhole) Close() error                { b.once.Do(func() { close(b.closed) }); return nil }

func TestKeepaliveDetectsDeadPeer(t *testing.T) {
	c, _ := net.Pipe()
	cfg := testConfig()
	cfg.KeepAliveInterval = 20 * time.Millisecond
	cfg.WriteTimeout = 50 * time.Millisecond
	s, err := Client(&blackhole{Conn: c, closed: make(chan struct{})}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	select {
	case <-s.Done():
	case <-time.After(defaultTestTimeout):
		t.Fatal("session with a dead peer was not closed by keepalive")
	}
}

func TestConfigValidate(t *testing.T) {
	good := DefaultConfig()
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := Config{MaxStreamWindow: 1, KeepAliveInterval: -1, IdleTimeout: -1}
	err := bad.Validate()
	if err == nil {
		t.Fatal("invalid config accepted")
	}
	for _, field := range []string{"MaxStreamWindow", "KeepAliveInterval", "WriteTimeout", "IdleTimeout", "AcceptBacklog", "HeaderTimeout"} {
		if !bytes.Contains([]byte(err.Error()), []byte(field)) {
			t.Errorf("error does not name %s: %v", field, err)
		}
	}
}

func TestBackoff(t *testing.T) {
	b := Backoff{Base: 100 * time.Millisecond, Max: time.Second, Rand: func() float64 { return 0.999999 }}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := b.Window(i); got != w*time.Millisecond {
			t.Errorf("Window(%d) = %v, want %v", i, got, w*time.Millisecond)
		}
	}
	if d := b.Delay(3); d >= 800*time.Millisecond || d < 799*time.Millisecond {
		t.Errorf("Delay(3) = %v, want just under the 800ms window", d)
	}
	b.Rand = func() float64 { return 0 }
	if d := b.Delay(10); d != 0 {
		t.Errorf("full jitter must reach 0, got %v", d)
	}
	if w := (Backoff{}).Window(100); w != 30*time.Second {
		t.Errorf("default cap = %v, want 30s", w)
	}
}

func TestRedialerRotatesAndStops(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	defer cancel()
	var mu sync.Mutex
	var tried []string
	var served atomic.Int32
	r := &Redialer{
		Addrs:   []string{"a:1", "b:2"},
		Backoff: Backoff{Base: time.Millisecond, Max: 2 * time.Millisecond},
		Dial: func(ctx context.Context, addr string) (net.Conn, error) {
			mu.Lock()
			tried = append(tried, addr)
			n := len(tried)
			mu.Unlock()
			if n < 3 {
				return nil, errors.New("refused")
			}
			c, s := net.Pipe()
			s.Close()
			return c, nil
		},
	}
	err := r.Run(ctx, func(ctx context.Context, conn net.Conn, addr string) error {
		conn.Close()
		if served.Add(1) == 2 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(tried) < 4 || tried[0] != "a:1" || tried[1] != "b:2" || tried[2] != "a:1" {
		t.Fatalf("dial order %v: want a failed dial to move on to the next address", tried)
	}
}

package openshell_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	facade "github.com/tetherfleet/tether/coordinator/facade/openshell"
	osh "github.com/tetherfleet/tether/protocol/openshell"
)

// health calls Health through cc.
func health(t testing.TB, cc grpc.ClientConnInterface) error {
	t.Helper()
	_, err := unary[osh.HealthResponse](testCtx(t), cc, osh.MethodHealth, &osh.HealthRequest{})
	return err
}

// TestForeignAuthorityRefused: a call whose :authority names another host
// (what a rebinding page's name, or a misdirected client, would send) is
// refused with PERMISSION_DENIED naming that authority, before it reaches
// a gateway; the loopback names a local client dials pass. On dfbdcef every
// authority passed.
func TestForeignAuthorityRefused(t *testing.T) {
	e := newEnv(t, envConfig{})
	_, port, _ := net.SplitHostPort(e.addr)
	for _, auth := range []string{"attacker.example:" + port, "attacker.example", "10.0.0.1:" + port} {
		cc := dialFacade(t, e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithAuthority(auth))
		err := health(t, cc)
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), `"`+auth+`"`) {
			t.Errorf("Health with :authority %s: %v, want PERMISSION_DENIED naming it", auth, err)
		}
	}
	if n := e.gws["node-a"].Calls(osh.MethodHealth); n != 0 {
		t.Errorf("refused calls reached the gateway %d times", n)
	}
	for _, auth := range []string{"", "localhost:" + port, "127.0.0.1:" + port, "[::1]:" + port} {
		opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		if auth != "" {
			opts = append(opts, grpc.WithAuthority(auth))
		}
		if err := health(t, dialFacade(t, e.addr, opts...)); err != nil {
			t.Errorf("Health with :authority %q: %v", auth, err)
		}
	}
}

// HTTP/2 frame types, flags, settings and error codes this file uses
// (RFC 9113).
const (
	frameData         = 0x0
	frameHeaders      = 0x1
	frameRSTStream    = 0x3
	frameSettings     = 0x4
	framePing         = 0x6
	frameGoAway       = 0x7
	flagAck           = 0x1
	flagEndHeaders    = 0x4
	settingMaxStreams = 0x3
	errRefusedStream  = 0x7
	errEnhanceCalm    = 0xb
	clientPreface     = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
)

// h2frame is one HTTP/2 frame.
type h2frame struct {
	typ, flags byte
	stream     uint32
	payload    []byte
}

// h2conn is a hand-driven HTTP/2 client connection: it does only what a
// test tells it, so that it can misbehave (stay silent, ping too often,
// open more streams than allowed).
type h2conn struct {
	t testing.TB
	c net.Conn
}

// dialH2 connects to addr; with handshake, it sends the client preface and
// an empty SETTINGS frame and returns the server's settings after
// acknowledging them.
func dialH2(t testing.TB, addr string, handshake bool) (*h2conn, map[uint16]uint32) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h := &h2conn{t: t, c: c}
	c.SetDeadline(time.Now().Add(defaultTestTimeout))
	if !handshake {
		return h, nil
	}
	if _, err := io.WriteString(c, clientPreface); err != nil {
		t.Fatal(err)
	}
	h.write(frameSettings, 0, 0, nil)
	for {
		f, err := h.read()
		if err != nil {
			t.Fatalf("read the server's SETTINGS: %v", err)
		}
		if f.typ != frameSettings || f.flags&flagAck != 0 {
			continue
		}
		settings := map[uint16]uint32{}
		for i := 0; i+6 <= len(f.payload); i += 6 {
			settings[binary.BigEndian.Uint16(f.payload[i:])] = binary.BigEndian.Uint32(f.payload[i+2:])
		}
		h.write(frameSettings, flagAck, 0, nil)
		return h, settings
	}
}

func (h *h2conn) write(typ, flags byte, stream uint32, payload []byte) {
	h.t.Helper()
	b := make([]byte, 9, 9+len(payload))
	n := len(payload)
	b[0], b[1], b[2], b[3], b[4] = byte(n>>16), byte(n>>8), byte(n), typ, flags
	binary.BigEndian.PutUint32(b[5:], stream)
	if _, err := h.c.Write(append(b, payload...)); err != nil {
		h.t.Fatalf("write frame %d: %v", typ, err)
	}
}

func (h *h2conn) read() (h2frame, error) {
	var hdr [9]byte
	if _, err := io.ReadFull(h.c, hdr[:]); err != nil {
		return h2frame{}, err
	}
	f := h2frame{typ: hdr[3], flags: hdr[4], stream: binary.BigEndian.Uint32(hdr[5:]) & 0x7fffffff}
	f.payload = make([]byte, int(hdr[0])<<16|int(hdr[1])<<8|int(hdr[2]))
	_, err := io.ReadFull(h.c, f.payload)
	return f, err
}

// headersBlock HPACK-encodes fields (name, value pairs) as literals
// without indexing (RFC 7541 §6.2.2); every string is shorter than 127.
func headersBlock(fields ...string) []byte {
	var b []byte
	for i := 0; i+1 < len(fields); i += 2 {
		b = append(b, 0x00, byte(len(fields[i])))
		b = append(b, fields[i]...)
		b = append(b, byte(len(fields[i+1])))
		b = append(b, fields[i+1]...)
	}
	return b
}

// openCall sends the HEADERS of a call of method on stream, without ending
// it (the call stays in flight).
func (h *h2conn) openCall(stream uint32, authority, method string) {
	h.t.Helper()
	h.write(frameHeaders, flagEndHeaders, stream, headersBlock(
		":method", "POST", ":scheme", "http", ":path", method, ":authority", authority,
		"content-type", "application/grpc", "te", "trailers"))
}

// closedWithin reads until the server closes the connection, and fails
// the test if that takes longer than d. It returns the GOAWAY frames it
// saw.
func (h *h2conn) closedWithin(d time.Duration) []h2frame {
	h.t.Helper()
	start := time.Now()
	h.c.SetDeadline(start.Add(d))
	var goaways []h2frame
	for {
		f, err := h.read()
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			h.t.Fatalf("the connection was still open after %v", time.Since(start).Round(time.Millisecond))
		case err != nil:
			return goaways
		case f.typ == frameGoAway:
			goaways = append(goaways, f)
		}
	}
}

// TestMaxConcurrentStreamsAdvertised: the facade caps the calls in flight
// on one caller connection and says so in its HTTP/2 SETTINGS (callers
// queue further calls, they do not fail). On dfbdcef it sent no cap
// (unlimited).
func TestMaxConcurrentStreamsAdvertised(t *testing.T) {
	e := newEnv(t, envConfig{})
	_, settings := dialH2(t, e.addr, true)
	got, ok := settings[settingMaxStreams]
	if !ok || got != 1000 {
		t.Fatalf("SETTINGS_MAX_CONCURRENT_STREAMS = %d (sent: %v), want 1000", got, ok)
	}
}

// TestSilentConnectionClosed: a connection that never completes its
// handshake (here: sends nothing at all) is closed within the facade's
// 10 s handshake timeout. On dfbdcef it was held for grpc's default of
// 120 s.
func TestSilentConnectionClosed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envConfig{})
	h, _ := dialH2(t, e.addr, false)
	start := time.Now()
	h.closedWithin(defaultTestTimeout)
	t.Logf("silent connection closed after %v", time.Since(start).Round(time.Millisecond))
}

// blockingGateway is a gRPC server whose every call stays in flight until
// the caller goes; it counts the calls that reached it.
func blockingGateway(t testing.TB) (addr string, calls func() int) {
	t.Helper()
	var mu sync.Mutex
	n := 0
	gs := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		mu.Lock()
		n++
		mu.Unlock()
		<-ss.Context().Done()
		return ss.Context().Err()
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	return ln.Addr().String(), func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
}

// TestStreamCapEnforced: with two streams in flight on a connection whose
// cap is two, a third is refused (RST_STREAM REFUSED_STREAM, which gRPC
// clients retry once a stream is free) and never reaches a gateway.
func TestStreamCapEnforced(t *testing.T) {
	gw, calls := blockingGateway(t)
	e := newEnv(t, envConfig{nodes: []string{}, cfg: func(c *facade.Config) { c.MaxConcurrentStreams = 2 }})
	e.fleet.add("node-a", gw, nil)
	h, settings := dialH2(t, e.addr, true)
	if settings[settingMaxStreams] != 2 {
		t.Fatalf("SETTINGS_MAX_CONCURRENT_STREAMS = %d, want 2", settings[settingMaxStreams])
	}
	const method = "/openshell.v1.OpenShell/ListProviders"
	for _, id := range []uint32{1, 3, 5} {
		h.openCall(id, e.addr, method)
	}
	for {
		f, err := h.read()
		if err != nil {
			t.Fatalf("no RST_STREAM for the third stream: %v", err)
		}
		if f.typ != frameRSTStream {
			continue
		}
		code := binary.BigEndian.Uint32(f.payload)
		if f.stream != 5 || code != errRefusedStream {
			t.Fatalf("RST_STREAM on stream %d with code %d, want stream 5 REFUSED_STREAM", f.stream, code)
		}
		break
	}
	checkFor(t, defaultTestTimeout, func() error {
		if n := calls(); n != 2 {
			return fmt.Errorf("%d calls reached the gateway, want the 2 in flight", n)
		}
		return nil
	})
}

// TestIdleConnectionClosed: a connection that completed its handshake but
// carries no call is told GOAWAY and closed after MaxConnectionIdle (plus
// grpc's grace for the GOAWAY ping, at most 5 s), even though it answers
// nothing.
func TestIdleConnectionClosed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envConfig{cfg: func(c *facade.Config) { c.MaxConnectionIdle = 100 * time.Millisecond }})
	h, _ := dialH2(t, e.addr, true)
	if g := h.closedWithin(defaultTestTimeout); len(g) == 0 {
		t.Fatal("the idle connection was closed without GOAWAY")
	}
}

// TestPingPolicy: a caller may ping as often as MinPingInterval, with no
// call in flight, and keep its connection; one that pings faster gets
// GOAWAY too_many_pings (ENHANCE_YOUR_CALM) after three strikes.
func TestPingPolicy(t *testing.T) {
	const interval = 50 * time.Millisecond
	e := newEnv(t, envConfig{cfg: func(c *facade.Config) { c.MinPingInterval = interval }})

	polite, _ := dialH2(t, e.addr, true)
	for i := range 6 {
		polite.write(framePing, 0, 0, []byte{0, 0, 0, 0, 0, 0, 0, byte(i)})
		for {
			f, err := polite.read()
			if err != nil {
				t.Fatalf("ping %d at twice the minimum interval: connection ended: %v", i, err)
			}
			if f.typ == frameGoAway {
				t.Fatalf("ping %d at twice the minimum interval: GOAWAY %q", i, f.payload[8:])
			}
			if f.typ == framePing && f.flags&flagAck != 0 {
				break
			}
		}
		// The server took ping i before it acknowledged it: the next one
		// comes at least twice the minimum interval after it.
		<-time.After(2 * interval)
	}

	rude, _ := dialH2(t, e.addr, true)
	for i := range 4 {
		rude.write(framePing, 0, 0, []byte{1, 0, 0, 0, 0, 0, 0, byte(i)})
	}
	g := rude.closedWithin(defaultTestTimeout)
	if len(g) == 0 || binary.BigEndian.Uint32(g[0].payload[4:]) != errEnhanceCalm || !strings.Contains(string(g[0].payload[8:]), "too_many_pings") {
		t.Fatalf("GOAWAY after a burst of pings: %v, want ENHANCE_YOUR_CALM too_many_pings", g)
	}
}

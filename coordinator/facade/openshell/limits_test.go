package openshell_test

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

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

// http2 frame types and settings this file reads.
const (
	frameSettings            = 0x4
	settingMaxConcurrentStrs = 0x3
	clientPreface            = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
)

// serverSettings opens a plaintext HTTP/2 connection to addr, sends the
// client preface and an empty SETTINGS frame, and returns the settings of
// the server's first SETTINGS frame.
func serverSettings(t testing.TB, addr string) map[uint16]uint32 {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(defaultTestTimeout))
	if _, err := io.WriteString(c, clientPreface+"\x00\x00\x00\x04\x00\x00\x00\x00\x00"); err != nil {
		t.Fatal(err)
	}
	for {
		var hdr [9]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			t.Fatalf("read frame header: %v", err)
		}
		n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
		payload := make([]byte, n)
		if _, err := io.ReadFull(c, payload); err != nil {
			t.Fatalf("read frame payload: %v", err)
		}
		if hdr[3] != frameSettings || hdr[4]&0x1 != 0 { // not SETTINGS, or an ACK
			continue
		}
		out := map[uint16]uint32{}
		for i := 0; i+6 <= len(payload); i += 6 {
			out[binary.BigEndian.Uint16(payload[i:])] = binary.BigEndian.Uint32(payload[i+2:])
		}
		return out
	}
}

// TestMaxConcurrentStreamsAdvertised: the facade caps the calls in flight
// on one caller connection and says so in its HTTP/2 SETTINGS (callers
// queue further calls, they do not fail). On dfbdcef it sent no cap
// (unlimited).
func TestMaxConcurrentStreamsAdvertised(t *testing.T) {
	e := newEnv(t, envConfig{})
	got, ok := serverSettings(t, e.addr)[settingMaxConcurrentStrs]
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
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	c.SetReadDeadline(start.Add(defaultTestTimeout))
	_, err = io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("a silent connection was still open after %v", time.Since(start).Round(time.Second))
	}
	t.Logf("silent connection closed after %v (%v)", time.Since(start).Round(time.Millisecond), err)
}

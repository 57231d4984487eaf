//go:build linux

package peeruid_test

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/tetherfleet/tether/coordinator/facade/peeruid"
	"github.com/tetherfleet/tether/internal/sockdiag/sockdiagtest"
)

// accepted dials ln with dial and returns the server's end.
func accepted(t *testing.T, ln net.Listener, dial func(context.Context, string) (net.Conn, error)) net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestLookupNamesTheSocketOwner(t *testing.T) {
	var plain net.Dialer
	own := func(ctx context.Context, addr string) (net.Conn, error) { return plain.DialContext(ctx, "tcp", addr) }
	for _, network := range []string{"127.0.0.1:0", "[::1]:0"} {
		ln, err := net.Listen("tcp", network)
		if err != nil {
			t.Logf("%s: %v (skipped)", network, err)
			continue
		}
		defer ln.Close()
		t.Run(network, func(t *testing.T) {
			s := accepted(t, ln, own)
			uid, err := peeruid.Lookup(s.LocalAddr(), s.RemoteAddr())
			if err != nil || uid != uint32(os.Geteuid()) {
				t.Fatalf("own connection: uid %d, %v; want %d", uid, err, os.Geteuid())
			}
			s = accepted(t, ln, sockdiagtest.Dialer(t, sockdiagtest.Nobody))
			p := peeruid.NewPeer(s)
			uid, err = p.UID()
			if err != nil || uid != sockdiagtest.Nobody {
				t.Fatalf("nobody's connection: uid %d, %v; want %d", uid, err, sockdiagtest.Nobody)
			}
		})
	}
}

func TestLookupRefusesWhatItCannotKnow(t *testing.T) {
	lo := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7082}
	far := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 40000}
	if _, err := peeruid.Lookup(lo, far); !errors.Is(err, peeruid.ErrNotLoopback) {
		t.Errorf("remote caller: %v, want ErrNotLoopback", err)
	}
	if _, err := peeruid.Lookup(lo, &net.UnixAddr{Name: "/x", Net: "unix"}); !errors.Is(err, peeruid.ErrNotLoopback) {
		t.Errorf("unix caller: %v, want ErrNotLoopback", err)
	}
	// A loopback port nobody holds: no row, an error rather than a guess.
	if uid, err := peeruid.Lookup(lo, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}); err == nil {
		t.Errorf("no socket: uid %d, want an error", uid)
	}
	if _, err := peeruid.FromContext(context.Background()); err == nil {
		t.Error("FromContext without ConnContext: want an error")
	}
}

func TestIdentityIsAPolicyName(t *testing.T) {
	if got := peeruid.Identity(1000).String(); got != "token:loopback-uid-1000" {
		t.Errorf("Identity(1000) = %s", got)
	}
}

// BenchmarkLookup: one lookup (a connection's first call that needs it)
// with the host's sockets as they are plus 200 of this test's.
func BenchmarkLookup(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var last net.Conn
	for range 200 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		s, err := ln.Accept()
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, c, s)
		last = s
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := peeruid.Lookup(last.LocalAddr(), last.RemoteAddr()); err != nil {
			b.Fatal(err)
		}
	}
}

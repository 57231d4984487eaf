//go:build linux

package sockdiag_test

import (
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/tetherfleet/tether/internal/sockdiag"
	"github.com/tetherfleet/tether/internal/sockdiag/sockdiagtest"
)

func addrPort(t *testing.T, a net.Addr) netip.AddrPort {
	t.Helper()
	ap := a.(*net.TCPAddr).AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// listen listens on addr or skips t where the address family is missing.
func listen(t *testing.T, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("listen on %s: %v", addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func TestListenersFindsOwnListener(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0", "0.0.0.0:0", "[::]:0"} {
		t.Run(addr, func(t *testing.T) {
			network := "tcp"
			if addr == "0.0.0.0:0" {
				network = "tcp4" // "tcp" listens on a dual-stack :: for it
			}
			ln, err := net.Listen(network, addr)
			if err != nil {
				t.Skipf("listen on %s: %v", addr, err)
			}
			defer ln.Close()
			ap := addrPort(t, ln.Addr())
			ls, err := sockdiag.Listeners(ap.Port())
			if err != nil {
				t.Fatal(err)
			}
			if len(ls) != 1 {
				t.Fatalf("Listeners(%d) = %+v, want exactly the test's", ap.Port(), ls)
			}
			l := ls[0]
			if l.Local != ap || l.UID != uint32(os.Geteuid()) || l.State != sockdiag.StateListen {
				t.Errorf("listener %+v, want %s of uid %d", l, ap, os.Geteuid())
			}
			if want := ap.Addr().Is6(); l.IPv6 != want {
				t.Errorf("listener %+v: IPv6 %v, want %v", l, l.IPv6, want)
			}
			lo4 := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), ap.Port())
			lo6 := netip.AddrPortFrom(netip.IPv6Loopback(), ap.Port())
			other := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), ap.Port())
			switch addr {
			case "127.0.0.1:0":
				if !l.Serves(lo4) || l.Serves(lo6) || l.Serves(other) {
					t.Errorf("127.0.0.1 listener serves: %v %v %v", l.Serves(lo4), l.Serves(lo6), l.Serves(other))
				}
			case "[::1]:0":
				if l.Serves(lo4) || !l.Serves(lo6) {
					t.Errorf("::1 listener serves: %v %v", l.Serves(lo4), l.Serves(lo6))
				}
			case "0.0.0.0:0":
				if !l.Serves(lo4) || !l.Serves(other) || l.Serves(lo6) {
					t.Errorf("0.0.0.0 listener serves: %v %v %v", l.Serves(lo4), l.Serves(other), l.Serves(lo6))
				}
			case "[::]:0":
				if !l.Serves(lo4) || !l.Serves(lo6) {
					t.Errorf(":: listener serves: %v %v", l.Serves(lo4), l.Serves(lo6))
				}
			}
			if l.Serves(netip.AddrPortFrom(lo4.Addr(), ap.Port()+1)) {
				t.Error("listener serves another port")
			}
		})
	}
}

func TestListenersNobodyListens(t *testing.T) {
	ln := listen(t, "127.0.0.1:0")
	port := addrPort(t, ln.Addr()).Port()
	ln.Close()
	ls, err := sockdiag.Listeners(port)
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 0 {
		t.Errorf("Listeners(%d) of a closed listener = %+v, want none", port, ls)
	}
}

// A connected socket is not a listener, and Owner finds the accepted side
// (its owner the listener's) but not a pair that does not exist.
func TestOwnerOfConnection(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0", "[::]:0"} {
		t.Run(addr, func(t *testing.T) {
			ln := listen(t, addr)
			dst := addrPort(t, ln.Addr())
			if dst.Addr().IsUnspecified() {
				dst = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), dst.Port()) // IPv4-mapped on the server side
			}
			c, err := net.Dial("tcp", dst.String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			s, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			got, found, err := sockdiag.Owner(addrPort(t, s.LocalAddr()), addrPort(t, s.RemoteAddr()))
			if err != nil || !found {
				t.Fatalf("Owner of the accepted side: %+v %v %v", got, found, err)
			}
			if got.UID != uint32(os.Geteuid()) || got.State != sockdiag.StateEstablished || got.Local != addrPort(t, s.LocalAddr()) {
				t.Errorf("accepted side %+v, want established of uid %d", got, os.Geteuid())
			}
			ls, err := sockdiag.Listeners(dst.Port())
			if err != nil || len(ls) != 1 {
				t.Errorf("Listeners with a connection open: %+v %v, want the listener only", ls, err)
			}
			none := netip.AddrPortFrom(addrPort(t, s.RemoteAddr()).Addr(), 1)
			if got, found, err := sockdiag.Owner(addrPort(t, s.LocalAddr()), none); err != nil || found {
				t.Errorf("Owner of no connection = %+v %v %v, want not found (not the listener)", got, found, err)
			}
		})
	}
}

// Sockets of another uid are reported as that uid's: the listener and the
// connections it accepts.
func TestOtherUIDs(t *testing.T) {
	ln := sockdiagtest.Listen(t, sockdiagtest.Nobody, "127.0.0.1:0")
	ap := addrPort(t, ln.Addr())
	ls, err := sockdiag.Listeners(ap.Port())
	if err != nil || len(ls) != 1 || ls[0].UID != sockdiagtest.Nobody {
		t.Fatalf("Listeners of nobody's listener: %+v %v", ls, err)
	}
	c, err := net.Dial("tcp", ap.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Before accept(2) the accepted side has no socket file: kernels that
	// take the owner from it report 0, newer ones the listener's uid.
	peer, found, err := sockdiag.Owner(addrPort(t, c.RemoteAddr()), addrPort(t, c.LocalAddr()))
	if err != nil || !found || peer.UID != 0 && peer.UID != sockdiagtest.Nobody {
		t.Errorf("accepted side of nobody's listener before accept: %+v %v %v", peer, found, err)
	}
	var s net.Conn
	if err := sockdiagtest.Do(t, sockdiagtest.Nobody, func() (err error) { s, err = ln.Accept(); return err }); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Seen from the dialer's side: the peer is (local=remote end, remote=ours).
	peer, found, err = sockdiag.Owner(addrPort(t, c.RemoteAddr()), addrPort(t, c.LocalAddr()))
	if err != nil || !found || peer.UID != sockdiagtest.Nobody {
		t.Errorf("accepted side of nobody's listener: %+v %v %v", peer, found, err)
	}
	mine, found, err := sockdiag.Owner(addrPort(t, c.LocalAddr()), addrPort(t, c.RemoteAddr()))
	if err != nil || !found || mine.UID != uint32(os.Geteuid()) {
		t.Errorf("dialer's side: %+v %v %v, want uid %d", mine, found, err, os.Geteuid())
	}
}

// BenchmarkListeners: one Listeners query (a dump of both families'
// listeners, filtered to one port) with the host's sockets as they are.
func BenchmarkListeners(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	for b.Loop() {
		if ls, err := sockdiag.Listeners(port); err != nil || len(ls) != 1 {
			b.Fatal(ls, err)
		}
	}
}

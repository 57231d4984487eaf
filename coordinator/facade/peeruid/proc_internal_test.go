//go:build linux

package peeruid

import (
	"net"
	"net/netip"
	"os"
	"testing"
)

// TestProcLookup: the fallback where sock_diag is not available finds the
// same owner through /proc/net/tcp{,6}.
func TestProcLookup(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0"} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Logf("%s: %v (skipped)", addr, err)
			continue
		}
		defer ln.Close()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		l, r := s.LocalAddr().(*net.TCPAddr).AddrPort(), s.RemoteAddr().(*net.TCPAddr).AddrPort()
		l, r = netip.AddrPortFrom(l.Addr().Unmap(), l.Port()), netip.AddrPortFrom(r.Addr().Unmap(), r.Port())
		uid, err := procLookup(l, r)
		if err != nil || uid != uint32(os.Geteuid()) {
			t.Errorf("%s: procLookup = %d, %v; want %d", addr, uid, err, os.Geteuid())
		}
		if _, err := procLookup(l, netip.AddrPortFrom(r.Addr(), 1)); err == nil {
			t.Errorf("%s: procLookup of no socket: want an error", addr)
		}
	}
}

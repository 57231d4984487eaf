package coordinator

import (
	"bytes"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func TestSourceOf(t *testing.T) {
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	tests := []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.ParseIP("192.0.2.7"), Port: 1}, "192.0.2.7/32"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.7"), Port: 1}, "192.0.2.7/32"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:aaaa::1"), Port: 1}, "2001:db8:1:2::/64"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:bbbb::9"), Port: 1}, "2001:db8:1:2::/64"},
		{&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 1, Zone: "eth0"}, "fe80::/64"},
		{&net.UDPAddr{IP: net.ParseIP("192.0.2.8"), Port: 1}, "192.0.2.8/32"},
		{c1.RemoteAddr(), "invalid Prefix"},
		{nil, "invalid Prefix"},
	}
	for _, tt := range tests {
		if got := sourceOf(tt.addr).String(); got != tt.want {
			t.Errorf("sourceOf(%v) = %s, want %s", tt.addr, got, tt.want)
		}
	}
}

func TestAdmissionIsFairAcrossSources(t *testing.T) {
	src := func(i int) netip.Prefix { return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), 32) }
	conn := func(i int) *agentConn {
		c, _ := net.Pipe()
		return &agentConn{conn: c, source: src(i)}
	}
	a := newAdmission(4, 3)
	var held []*agentConn
	// One source fills its share, then is refused.
	for range 3 {
		ac := conn(1)
		if v, r := a.enter(ac); v != nil || r != "" {
			t.Fatalf("enter = %v, %q; want admitted", v, r)
		}
		held = append(held, ac)
	}
	if _, r := a.enter(conn(1)); r != reasonSourceLimit {
		t.Fatalf("fourth from one source: %q, want %s", r, reasonSourceLimit)
	}
	// Another source takes the last place.
	b := conn(2)
	if v, r := a.enter(b); v != nil || r != "" {
		t.Fatalf("enter = %v, %q", v, r)
	}
	// Full: a third source takes the place of source 1's oldest (3 > 0+1).
	c := conn(3)
	v, r := a.enter(c)
	if r != "" || v != held[0] || !v.evicted.Load() {
		t.Fatalf("enter when full = %v, %q; want source 1's oldest cut", v, r)
	}
	// Now 2, 1, 1: a fourth source cuts source 1 again (2 > 0+1).
	if v, r := a.enter(conn(4)); r != "" || v != held[1] {
		t.Fatalf("enter = %v, %q; want source 1's next oldest cut", v, r)
	}
	// 1, 1, 1, 1: nobody holds more than one, so a newcomer is refused and
	// no source loses its only handshake.
	if v, r := a.enter(conn(5)); r != reasonOverload || v != nil {
		t.Fatalf("enter = %v, %q; want %s", v, r, reasonOverload)
	}
	// Leaving frees a place; leaving twice, or after a cut, frees nothing.
	a.leave(b)
	a.leave(b)
	a.leave(held[0])
	if a.total != 3 {
		t.Fatalf("total = %d, want 3", a.total)
	}
	if v, r := a.enter(conn(6)); v != nil || r != "" {
		t.Fatalf("enter after leave = %v, %q", v, r)
	}
}

func TestRateLimitedHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		log := slog.New(newRateLimitedHandler(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}), 10*time.Second, 3))
		perConn := log.With("remote_addr", "192.0.2.1:1") // shares the limiter
		for range 100 {
			perConn.Warn("refused")
			log.Debug("health check")
		}
		time.Sleep(10 * time.Second)
		log.Warn("refused")
		out := buf.String()
		if n := strings.Count(out, "msg=refused"); n != 4 {
			t.Errorf("%d refused lines, want 3 then 1 after the interval:\n%s", n, out)
		}
		if n := strings.Count(out, `msg="health check"`); n != 3 {
			t.Errorf("%d health check lines, want 3 (its own limiter)", n)
		}
		if !strings.Contains(out, "suppressed=97") {
			t.Errorf("the line after the pause does not count the 97 dropped:\n%s", out)
		}
		// Past preauthLogKeys distinct messages, the rest share one limiter.
		buf.Reset()
		for i := range 200 {
			log.Info("yamux: failed to read header from peer " + strings.Repeat("x", i))
		}
		if n := strings.Count(buf.String(), "\n"); n > preauthLogKeys*3+3 {
			t.Errorf("%d lines of 200 distinct messages, want at most %d", n, preauthLogKeys*3+3)
		}
	})
}

package admission

import (
	"net"
	"net/netip"
	"testing"
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
		if got := SourceOf(tt.addr).String(); got != tt.want {
			t.Errorf("SourceOf(%v) = %s, want %s", tt.addr, got, tt.want)
		}
	}
}

func TestAdmissionIsFairAcrossSources(t *testing.T) {
	src := func(i int) netip.Prefix { return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), 32) }
	ticket := func(i int) *Ticket { return &Ticket{Source: src(i)} }
	a := New(4, 3)
	var held []*Ticket
	// One source fills its share, then is refused.
	for range 3 {
		tk := ticket(1)
		if v, r := a.Enter(tk); v != nil || r != "" {
			t.Fatalf("Enter = %v, %q; want admitted", v, r)
		}
		held = append(held, tk)
	}
	if _, r := a.Enter(ticket(1)); r != SourceLimit {
		t.Fatalf("fourth from one source: %q, want %s", r, SourceLimit)
	}
	// Another source takes the last place.
	b := ticket(2)
	if v, r := a.Enter(b); v != nil || r != "" {
		t.Fatalf("Enter = %v, %q", v, r)
	}
	// Full: a third source takes the place of source 1's oldest (3 > 0+1).
	v, r := a.Enter(ticket(3))
	if r != "" || v != held[0] || !v.Evicted() {
		t.Fatalf("Enter when full = %v, %q; want source 1's oldest cut", v, r)
	}
	// Now 2, 1, 1: a fourth source cuts source 1 again (2 > 0+1).
	if v, r := a.Enter(ticket(4)); r != "" || v != held[1] {
		t.Fatalf("Enter = %v, %q; want source 1's next oldest cut", v, r)
	}
	// 1, 1, 1, 1: nobody holds more than one, so a newcomer is refused and
	// no source loses its only handshake.
	if v, r := a.Enter(ticket(5)); r != Overload || v != nil {
		t.Fatalf("Enter = %v, %q; want %s", v, r, Overload)
	}
	// Leaving frees a place; leaving twice, or after a cut, frees nothing.
	a.Leave(b)
	a.Leave(b)
	a.Leave(held[0])
	if a.total != 3 {
		t.Fatalf("total = %d, want 3", a.total)
	}
	if v, r := a.Enter(ticket(6)); v != nil || r != "" {
		t.Fatalf("Enter after Leave = %v, %q", v, r)
	}
}

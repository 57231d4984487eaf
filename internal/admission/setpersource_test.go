package admission

import (
	"net/netip"
	"testing"
	"time"
)

// SetPerSource applies to the next handshake: lowered below what a source
// holds, the source is refused until it is back under the new bound;
// raised, it is admitted again. Admitted handshakes keep their places.
func TestSetPerSource(t *testing.T) {
	src := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, 0, 1}), 32)
	c := New(100, 3)
	var held []*Ticket
	for range 3 {
		tk := &Ticket{Source: src}
		if _, refused := c.Enter(tk); refused != "" {
			t.Fatalf("Enter under the bound: %s", refused)
		}
		held = append(held, tk)
	}
	c.SetPerSource(2)
	if c.InProgress() != 3 {
		t.Fatalf("InProgress after lowering = %d, want the 3 admitted", c.InProgress())
	}
	if _, refused := c.Enter(&Ticket{Source: src}); refused != SourceLimit {
		t.Fatalf("Enter over the lowered bound: refused %q, want %q", refused, SourceLimit)
	}
	c.Leave(held[0])
	c.Leave(held[1])
	if _, refused := c.Enter(&Ticket{Source: src}); refused != "" {
		t.Fatalf("Enter back under the lowered bound: refused %q", refused)
	}
	c.SetPerSource(5)
	for i := range 3 {
		if _, refused := c.Enter(&Ticket{Source: src}); refused != "" {
			t.Fatalf("Enter %d under the raised bound: refused %q", i, refused)
		}
	}
	if _, refused := c.Enter(&Ticket{Source: src}); refused != SourceLimit {
		t.Fatalf("Enter past the raised bound: refused %q, want %q", refused, SourceLimit)
	}
	c.SetPerSource(0) // at least 1
	if c.perSource != 1 {
		t.Fatalf("SetPerSource(0): perSource = %d, want 1", c.perSource)
	}
}

// SetRate changes the rate from now on: the refill and the retry-after
// follow the new rate; the bucket keeps its tokens.
func TestSetRate(t *testing.T) {
	now := time.Unix(1000, 0)
	p := NewPacer(1, 1, time.Hour, func() time.Time { return now })
	src := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, 0, 1}), 32)
	if ok, _ := p.Admit(src); !ok {
		t.Fatal("first Admit refused with a full bucket")
	}
	_, wait := p.Admit(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, 0, 2}), 32))
	if wait < 500*time.Millisecond {
		t.Fatalf("retry-after at 1/s = %v, want about 1s", wait)
	}
	p.SetRate(100)
	if p.Rate() != 100 || p.Burst() != 1 {
		t.Fatalf("Rate, Burst = %v, %d after SetRate(100), want 100, 1", p.Rate(), p.Burst())
	}
	now = now.Add(2 * time.Second) // past every slot promised at the old rate
	if ok, _ := p.Admit(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, 0, 3}), 32)); !ok {
		t.Fatal("Admit refused after a refill")
	}
	_, wait = p.Admit(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, 0, 4}), 32))
	if wait > 100*time.Millisecond {
		t.Fatalf("retry-after at 100/s = %v, want about 10ms", wait)
	}
}

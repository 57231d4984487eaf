package admission

import (
	"net/netip"
	"testing"
	"time"
)

// src returns the i-th test source, a distinct IPv4 /32.
func src(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 32)
}

// fakeClock is a settable clock.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time      { return c.t }
func (c *fakeClock) add(d time.Duration) { c.t = c.t.Add(d) }

// (Refused newcomers past the burst are a storm, storm.go: their slots
// are points spread over the storm window, never closer than 1/rate.)
func TestPacerAdmitsBurstThenPromisesSlotsInTurn(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := NewPacer(100, 10, time.Minute, clk.now) // 10 ms a slot
	for i := range 10 {
		if ok, _ := p.Admit(src(i)); !ok {
			t.Fatalf("handshake %d of the burst refused", i)
		}
	}
	// The refused get successive slots, at least 10 ms apart, the first
	// when the bucket has a token again.
	start := clk.t
	var waits []time.Duration
	for i := range 50 {
		ok, wait := p.Admit(src(100 + i))
		if ok {
			t.Fatalf("refused %d admitted with an empty bucket", i)
		}
		if i == 0 && (wait < 9*time.Millisecond || wait > 11*time.Millisecond) {
			t.Fatalf("first refused told %v, want about 10ms", wait)
		}
		if i > 0 && wait < waits[i-1]+10*time.Millisecond-time.Millisecond {
			t.Fatalf("refused %d told %v, not a slot (10 ms) after the previous %v", i, wait, waits[i-1])
		}
		waits = append(waits, wait)
	}
	if last := waits[len(waits)-1]; last > StormWindow {
		t.Fatalf("the last refused told %v, past the storm window %v", last, StormWindow)
	}
	// Each one coming back at its slot finds a token.
	for i, w := range waits {
		clk.t = start.Add(w)
		if ok, wait := p.Admit(src(100 + i)); !ok {
			t.Fatalf("refused %d came back at its slot and was refused again (wait %v)", i, wait)
		}
	}
}

func TestPacerBoundsTheWait(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := NewPacer(1, 1, 3*time.Second, clk.now)
	p.Admit(src(0))
	for range 20 {
		if _, wait := p.Admit(src(0)); wait > 3*time.Second {
			t.Fatalf("told to wait %v, over the 3 s bound", wait)
		}
	}
}

func TestPacerQueueEmptiesWithTime(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := NewPacer(10, 1, time.Minute, clk.now)
	p.Admit(src(0))
	for range 30 {
		p.Admit(src(0))
	}
	// Long after every promised slot passed, the bucket is full again.
	clk.add(time.Minute)
	if ok, _ := p.Admit(src(0)); !ok {
		t.Fatal("refused after the queue emptied")
	}
	if _, wait := p.Admit(src(0)); wait > 150*time.Millisecond {
		t.Fatalf("told to wait %v after the queue emptied, want one slot", wait)
	}
}

func TestHandshakeCostMeasured(t *testing.T) {
	c := HandshakeCost()
	if c <= 0 || c > time.Second {
		t.Fatalf("HandshakeCost %v, want a positive fraction of a second", c)
	}
	if r := RateFor(0.5); r < 1 {
		t.Fatalf("RateFor(0.5) = %v", r)
	}
}

// A source that connects as fast as it can takes at most the upper half of
// the bucket: an agent of another source finds a token at once, however
// long the flood goes on.
func TestPacerFloodFromOneSourceLeavesRoomForOthers(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := NewPacer(100, 20, time.Minute, clk.now)
	flooder := src(1)
	for round := range 200 {
		clk.add(time.Millisecond)
		for range 5 {
			p.Admit(flooder)
		}
		if round%20 == 19 {
			if ok, wait := p.Admit(src(1000 + round)); !ok {
				t.Fatalf("round %d: an agent of another source refused during the flood (told to wait %v)", round, wait)
			}
		}
	}
}

// Many agents behind one address are paced, not locked out: they get the
// whole rate when no one else wants it.
func TestPacerOneHeavySourceGetsTheRate(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := NewPacer(100, 10, time.Minute, clk.now)
	admitted := 0
	for range 1000 { // 10 s, a try every 10 ms
		clk.add(10 * time.Millisecond)
		if ok, _ := p.Admit(src(7)); ok {
			admitted++
		}
	}
	if admitted < 900 {
		t.Fatalf("one source admitted %d times in 10 s at 100/s, want about 1000", admitted)
	}
}

// A flood's refusals are queued apart: an agent of a light source that
// finds the bucket empty waits behind the light sources only.
func TestPacerFloodDoesNotQueueLightSourcesBehindIt(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := NewPacer(10, 4, time.Minute, clk.now)
	for range 500 {
		p.Admit(src(1)) // 50 s of slots, promised to the flood
	}
	for i := range 4 {
		p.Admit(src(10 + i)) // the lower half of the bucket, then empty
	}
	// Behind the three light ones refused before it (100 ms a slot), not
	// behind the flood's 50 s.
	if ok, wait := p.Admit(src(99)); ok || wait > 500*time.Millisecond {
		t.Fatalf("light source after a flood: admitted %v, wait %v; want a few slots", ok, wait)
	}
}

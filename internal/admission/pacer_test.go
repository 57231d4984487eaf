package admission

import (
	"testing"
	"time"
)

// fakeClock is a settable clock.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time      { return c.t }
func (c *fakeClock) add(d time.Duration) { c.t = c.t.Add(d) }

func TestPacerAdmitsBurstThenPromisesSlotsInTurn(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := NewPacer(100, 10, time.Minute, clk.now) // 10 ms a slot
	for i := range 10 {
		if ok, _ := p.Admit(); !ok {
			t.Fatalf("handshake %d of the burst refused", i)
		}
	}
	// The refused get successive slots, 10 ms apart.
	var prev time.Duration
	for i := range 50 {
		ok, wait := p.Admit()
		if ok {
			t.Fatalf("refused %d admitted with an empty bucket", i)
		}
		if want := time.Duration(i+1) * 10 * time.Millisecond; wait < want-time.Millisecond || wait > want+time.Millisecond {
			t.Fatalf("refused %d told %v, want about %v", i, wait, want)
		}
		if wait <= prev {
			t.Fatalf("refused %d told %v, not after the previous %v", i, wait, prev)
		}
		prev = wait
	}
	// Each one coming back at its slot finds a token.
	for i := range 50 {
		clk.add(10 * time.Millisecond)
		if ok, wait := p.Admit(); !ok {
			t.Fatalf("refused %d came back at its slot and was refused again (wait %v)", i, wait)
		}
	}
}

func TestPacerBoundsTheWait(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := NewPacer(1, 1, 3*time.Second, clk.now)
	p.Admit()
	for range 20 {
		if _, wait := p.Admit(); wait > 3*time.Second {
			t.Fatalf("told to wait %v, over the 3 s bound", wait)
		}
	}
}

func TestPacerQueueEmptiesWithTime(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := NewPacer(10, 1, time.Minute, clk.now)
	p.Admit()
	for range 30 {
		p.Admit()
	}
	// Long after every promised slot passed, the bucket is full again.
	clk.add(time.Minute)
	if ok, _ := p.Admit(); !ok {
		t.Fatal("refused after the queue emptied")
	}
	if _, wait := p.Admit(); wait > 150*time.Millisecond {
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

package admission

import (
	"container/heap"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// simAgent is one agent of a simulated storm.
type simAgent struct {
	src      int
	at       time.Time // its next attempt
	attempts int
	admitted time.Time
}

type agentQueue []*simAgent

func (q agentQueue) Len() int           { return len(q) }
func (q agentQueue) Less(i, j int) bool { return q[i].at.Before(q[j].at) }
func (q agentQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *agentQueue) Push(x any)        { *q = append(*q, x.(*simAgent)) }
func (q *agentQueue) Pop() any {
	old := *q
	a := old[len(old)-1]
	*q = old[:len(old)-1]
	return a
}

// simulate runs agents, each first asking at its at, against p on clk,
// in time order, until every one is admitted. A refused agent comes back
// after the wait it was told plus up to 1% (at most 50 ms) of jitter, as
// tunnel.Redialer does. It fails t when an agent needs more than 50
// attempts.
func simulate(t *testing.T, p *Pacer, clk *fakeClock, agents []*simAgent, rng *rand.Rand) {
	t.Helper()
	q := agentQueue(slices.Clone(agents))
	heap.Init(&q)
	for q.Len() > 0 {
		a := heap.Pop(&q).(*simAgent)
		if a.at.After(clk.t) {
			clk.t = a.at
		}
		a.attempts++
		ok, wait := p.Admit(src(a.src))
		if ok {
			a.admitted = clk.t
			continue
		}
		if a.attempts > 50 {
			t.Fatalf("agent %d refused %d times", a.src, a.attempts)
		}
		wait = max(wait.Truncate(time.Millisecond), minRetryAfterSim)
		a.at = clk.t.Add(wait + time.Duration(rng.Float64()*float64(min(wait/100, 50*time.Millisecond))))
		heap.Push(&q, a)
	}
}

// minRetryAfterSim is tunnel's floor on a busy refusal's wait.
const minRetryAfterSim = 20 * time.Millisecond

// storm returns n agents of distinct sources first asking uniformly over
// spread from start.
func stormAgents(n int, start time.Time, spread time.Duration, rng *rand.Rand) []*simAgent {
	as := make([]*simAgent, n)
	for i := range as {
		as[i] = &simAgent{src: 1000 + i, at: start.Add(time.Duration(rng.Float64() * float64(spread)))}
	}
	return as
}

// stormStats returns the time from the first attempt to the last
// admission, and the largest share of the agents admitted within one
// second.
func stormStats(agents []*simAgent, start time.Time) (total time.Duration, share float64) {
	ts := make([]time.Time, len(agents))
	for i, a := range agents {
		ts[i] = a.admitted
	}
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	best, j := 0, 0
	for i := range ts {
		for ts[i].Sub(ts[j]) >= time.Second {
			j++
		}
		best = max(best, i-j+1)
	}
	return ts[len(ts)-1].Sub(start), float64(best) / float64(len(ts))
}

// A restart storm announced with Expect: however large, no one-second
// window holds more than 40% of it, and all of it is in within the
// window (plus the agents' jitter), when the rate allows.
func TestStormSpreadsAnnouncedRestart(t *testing.T) {
	for _, n := range []int{101, 250, 1000, 5000, 10000} {
		for seed := range uint64(3) {
			rng := rand.New(rand.NewPCG(seed, uint64(n)))
			clk := &fakeClock{t: time.Unix(1000, 0)}
			p := NewPacer(50000, 100, 30*time.Second, clk.now)
			p.Expect(n)
			start := clk.t
			agents := stormAgents(n, start, time.Second, rng)
			simulate(t, p, clk, agents, rng)
			total, share := stormStats(agents, start)
			if share > 0.40 {
				t.Errorf("n=%d seed %d: %.1f%% admitted within one second, want at most 40%%", n, seed, 100*share)
			}
			if limit := StormWindow + StormWindow/100 + 10*time.Millisecond; total > limit {
				t.Errorf("n=%d seed %d: all in after %v, want within %v", n, seed, total, limit)
			}
			if p.StormSpread(n) != StormWindow {
				t.Errorf("StormSpread(%d) = %v, want %v", n, p.StormSpread(n), StormWindow)
			}
			t.Logf("n=%d seed %d: all in after %v, largest one-second share %.1f%%", n, seed, total.Round(time.Millisecond), 100*share)
		}
	}
}

// Without pacing the same storm is all admitted within one second: the
// simulation can tell a spread storm from one that is not.
func TestStormSimulationSeesAnUnspreadStorm(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := NewPacer(50000, 50000, 30*time.Second, clk.now) // a bucket the storm fits in
	p.Expect(1000)
	agents := stormAgents(1000, clk.t, time.Second, rng)
	simulate(t, p, clk, agents, rng)
	if _, share := stormStats(agents, time.Unix(1000, 0)); share < 0.99 {
		t.Fatalf("a storm that fits in the bucket: largest one-second share %.1f%%, want all", 100*share)
	}
}

// A storm no larger than the burst is no storm: every agent is admitted
// at its first attempt, announced or not.
func TestStormSmallFleetIsAdmittedAtOnce(t *testing.T) {
	for _, announce := range []bool{true, false} {
		rng := rand.New(rand.NewPCG(3, 4))
		clk := &fakeClock{t: time.Unix(1000, 0)}
		p := NewPacer(1000, 100, 30*time.Second, clk.now)
		if announce {
			p.Expect(100)
		}
		agents := stormAgents(100, clk.t, 10*time.Millisecond, rng)
		simulate(t, p, clk, agents, rng)
		for _, a := range agents {
			if a.attempts != 1 {
				t.Fatalf("announced %v: agent %d of 100 needed %d attempts, want 1", announce, a.src, a.attempts)
			}
		}
		if p.InStorm() || p.StormSpread(100) != 0 {
			t.Fatalf("announced %v: 100 agents with a burst of 100 taken for a storm", announce)
		}
	}
}

// One agent reconnecting after a restart that announced a large fleet is
// admitted at once, and so is one that comes after the announcement
// lapsed.
func TestStormOneAgentAfterRestartIsAdmittedAtOnce(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := NewPacer(1000, 100, 30*time.Second, clk.now)
	p.Expect(1000)
	if ok, wait := p.Admit(src(1)); !ok {
		t.Fatalf("the first agent after the restart told to wait %v", wait)
	}
	// The fleet did not follow: the announced storm ends with its window.
	clk.add(StormWindow + time.Millisecond)
	if ok, wait := p.Admit(src(2)); !ok {
		t.Fatalf("an agent after the window told to wait %v", wait)
	}
	if p.InStorm() {
		t.Fatal("storm still in progress after its window")
	}
	// An announcement nobody follows lapses.
	p.Expect(1000)
	clk.add(2 * StormWindow)
	for i := range 50 {
		if ok, wait := p.Admit(src(10 + i)); !ok {
			t.Fatalf("agent %d after a lapsed announcement told to wait %v", i, wait)
		}
	}
}

// Each refused agent of a storm is told its own point: the waits are
// distinct and spread over the window, not one time for all.
func TestStormGivesEachAgentItsOwnPoint(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := NewPacer(50000, 100, 30*time.Second, clk.now)
	p.Expect(1000)
	var waits []time.Duration
	for i := range 1000 {
		ok, wait := p.Admit(src(i))
		if !ok {
			waits = append(waits, wait)
		}
	}
	if len(waits) != 999 {
		t.Fatalf("%d of 1000 agents asking at once refused, want all but the first", len(waits))
	}
	for i := 1; i < len(waits); i++ {
		if waits[i] <= waits[i-1] {
			t.Fatalf("agent %d told %v, not after the previous %v", i+1, waits[i], waits[i-1])
		}
	}
	if last := waits[len(waits)-1]; last >= StormWindow || last < StormWindow*9/10 {
		t.Fatalf("the last agent told %v, want just under the window %v", last, StormWindow)
	}
	// Back at its point (a millisecond early, as the refusal's whole
	// milliseconds make it), the agent is admitted; a point is kept for
	// its source.
	clk.add(waits[0] - time.Millisecond)
	if ok, wait := p.Admit(src(1)); !ok {
		t.Fatalf("agent back at its point told to wait %v", wait)
	}
}

// The handshake rate stays the upper bound: a storm larger than the rate
// can admit within the window is admitted at the rate.
func TestStormNeverExceedsTheRate(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := NewPacer(200, 20, 30*time.Second, clk.now)
	p.Expect(1000)
	start := clk.t
	agents := stormAgents(1000, start, time.Second, rng)
	simulate(t, p, clk, agents, rng)
	total, share := stormStats(agents, start)
	// 1000 at 200 a second: 5 s, no second over 200 (+ the bucket, 20).
	if share > 0.22 {
		t.Errorf("largest one-second share %.1f%%, over the rate's 20%% (+ burst)", 100*share)
	}
	if total < 4900*time.Millisecond || total > 5500*time.Millisecond {
		t.Errorf("all in after %v, want about 5 s (1000 at 200 a second)", total)
	}
	if got := p.StormSpread(1000); got != 5*time.Second {
		t.Errorf("StormSpread(1000) at 200 a second = %v, want 5s", got)
	}
}

// A storm nobody announced (a graceful restart's agents, or a failover's)
// is recognised by its newcomers and spread too, its size extrapolated
// from its arrivals: no second holds much more than 40% of it (less
// precisely the smaller it is), and it is all in within about the window.
func TestStormRecognisedFromDemand(t *testing.T) {
	for _, n := range []int{200, 1000, 5000} {
		for seed := range uint64(5) {
			rng := rand.New(rand.NewPCG(seed, uint64(n)))
			clk := &fakeClock{t: time.Unix(1000, 0)}
			p := NewPacer(50000, 32, 30*time.Second, clk.now)
			start := clk.t
			agents := stormAgents(n, start, time.Second, rng)
			simulate(t, p, clk, agents, rng)
			total, share := stormStats(agents, start)
			t.Logf("n=%d seed %d unannounced: all in after %v, largest one-second share %.1f%%", n, seed, total.Round(time.Millisecond), 100*share)
			// Unannounced, the first burst is admitted before the storm is
			// recognised and its size is a guess from its first arrivals:
			// the share is nearer 40% the larger the storm.
			if limit := 0.40 + 6/math.Sqrt(float64(n)); share > limit {
				t.Errorf("n=%d seed %d: %.1f%% admitted within one second, want at most %.1f%%", n, seed, 100*share, 100*limit)
			}
			if limit := StormWindow + demandWindow/2; total > limit {
				t.Errorf("n=%d seed %d: all in after %v, want within %v", n, seed, total, limit)
			}
		}
	}
}

// A flood from one address during a storm takes none of the storm's
// points (one per source at a time; the bucket paces the rest, in debt
// for the storm's admissions): the storm's agents are all in within the
// window still.
func TestStormFloodFromOneSourceTakesNoPoints(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := NewPacer(1000, 100, 30*time.Second, clk.now)
	p.Expect(1000)
	start := clk.t
	agents := stormAgents(1000, start, time.Second, rng)
	// The flooder: 3000 attempts over the window, ignoring every wait.
	for i := range 3000 {
		agents = append(agents, &simAgent{src: 1, at: start.Add(time.Duration(i) * StormWindow / 3000)})
	}
	q := agentQueue(slices.Clone(agents))
	heap.Init(&q)
	for q.Len() > 0 {
		a := heap.Pop(&q).(*simAgent)
		if a.at.After(clk.t) {
			clk.t = a.at
		}
		ok, wait := p.Admit(src(a.src))
		if ok || a.src == 1 {
			a.admitted = clk.t
			continue
		}
		a.at = clk.t.Add(max(wait.Truncate(time.Millisecond), minRetryAfterSim))
		heap.Push(&q, a)
	}
	total, _ := stormStats(agents[:1000], start)
	if limit := StormWindow + StormWindow/100 + 10*time.Millisecond; total > limit {
		t.Fatalf("the storm's agents all in after %v during a flood, want within %v", total, limit)
	}
}

// Agents back for their points late (timers fire late on a loaded host)
// are admitted all the same, and are not taken for the newcomers of
// another storm: their waits were longer than a newcomer's absence.
func TestStormLateReturnsAreAdmitted(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := NewPacer(50000, 100, 30*time.Second, clk.now)
	p.Expect(1000)
	start := clk.t
	waits := make([]time.Duration, 1000)
	for i := range waits {
		_, waits[i] = p.Admit(src(i))
	}
	for i, w := range waits {
		if w == 0 {
			continue // admitted at once
		}
		clk.t = start.Add(w + 500*time.Millisecond)
		if ok, wait := p.Admit(src(i)); !ok {
			t.Fatalf("agent %d back 500ms after its point (%v) told to wait %v", i, w, wait)
		}
	}
}
